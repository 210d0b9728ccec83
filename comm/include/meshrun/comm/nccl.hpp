// The groups of a CUDA run over NCCL (docs/gpu.md, "NCCL"): one NCCL communicator per group kind, split from a
// world communicator bootstrapped over MPI, each wrapped in an NcclComm (src/nccl_comm.cpp) that moves the
// backend's device buffers with NCCL on the backend's comm stream and hands host buffers (counts, metadata,
// metric sums) to the group's MPI communicator. Built with MESHRUN_CUDA=ON (libnccl) or EMULATED (the fake
// NCCL of device/emulator); this header names neither, so the rest of the tree compiles the same in both.
#pragma once
#include <mpi.h>

#include <string>

#include "meshrun/comm/groups.hpp"
#include "meshrun/rank_map.hpp"

namespace meshrun::device {
class Backend;
}

namespace meshrun::comm {

// Collective over `base` (whose ranks are the grid's): the MPI groups, then ncclGetUniqueId on rank 0, its
// broadcast, ncclCommInitRank and one ncclCommSplit per group kind. `backend` (the CUDA backend of this rank's
// device) must outlive the groups' operations. Throws std::runtime_error naming the NCCL call and its error,
// and std::invalid_argument when two ranks of one host use the same device (NCCL's "Duplicate GPU detected").
Groups make_nccl_groups(MPI_Comm base, const RankGrid& grid, device::Backend& backend, int device_index);

// The NCCL library's version, e.g. "2.28.9" (the fake's: "2.28.9 (meshrun fake NCCL)").
std::string nccl_version();

// Aborts every NCCL communicator this process made (ncclCommAbort, callable from any thread): a rank's blocked
// operation returns, so that a watchdog can end the job with its own line instead of a hang.
void abort_nccl_communicators();

// The first asynchronous error an NCCL communicator of this process reports (ncclCommGetAsyncError: how NCCL
// surfaces a lost peer or link, from any thread), as one phrase naming the group; "" when none.
std::string nccl_async_error();

}  // namespace meshrun::comm
