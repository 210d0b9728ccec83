// NCCL for the CUDA backend (docs/gpu.md, "NCCL"): NcclComm (src/nccl_comm.cpp) moves the backend's device buffers
// with NCCL on the backend's comm stream and hands host buffers (counts, metadata, metric sums) to a host
// communicator. Built with MESHRUN_CUDA=ON (libnccl) or EMULATED (the fake NCCL of device/emulator); this header
// names neither, so the rest of the tree compiles the same in both. No MPI here: the groups of a run, bootstrapped
// over MPI, are nccl_groups.hpp's.
#pragma once
#include <memory>
#include <string>

#include "meshrun/comm/comm.hpp"

namespace meshrun::device {
class Backend;
}

namespace meshrun::comm {

// A communicator of this rank alone over NCCL (ncclCommInitRank with one rank, no bootstrap): every operation
// runs through NCCL on `backend`'s comm stream, send/receive to itself included (what the device check runs at
// world 1). Throws std::runtime_error naming the NCCL call and its error.
std::unique_ptr<Comm> make_nccl_self_comm(device::Backend& backend);

// The NCCL library's version, e.g. "2.28.9" (the fake's: "2.28.9 (meshrun fake NCCL)").
std::string nccl_version();

// Aborts every NCCL communicator this process made (ncclCommAbort, callable from any thread): a rank's blocked
// operation returns, so that a watchdog can end the job with its own line instead of a hang.
void abort_nccl_communicators();

// The first asynchronous error an NCCL communicator of this process reports (ncclCommGetAsyncError: how NCCL
// surfaces a lost peer or link, from any thread), as one phrase naming the group; "" when none.
std::string nccl_async_error();

}  // namespace meshrun::comm
