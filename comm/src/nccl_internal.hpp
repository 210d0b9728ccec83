// Between nccl_comm.cpp (NcclComm, no MPI) and nccl_groups.cpp (the groups, bootstrapped over MPI).
#pragma once
#include <nccl.h>

#include <memory>
#include <string>

#include "meshrun/comm/comm.hpp"

namespace meshrun::comm {

// Throws std::runtime_error naming `what` and NCCL's error (and its last message) unless r is ncclSuccess.
void check(ncclResult_t r, const std::string& what, ncclComm_t c = nullptr);
// An NcclComm over `nc` (owned: destroyed with it) whose host buffers go to `host`.
std::unique_ptr<Comm> wrap_nccl(ncclComm_t nc, std::unique_ptr<Comm> host, device::Backend& backend, const char* label);
// Adds `nc` to what abort_nccl_communicators and nccl_async_error see (removed when its NcclComm is destroyed).
void register_nccl(ncclComm_t nc, const char* label);

}  // namespace meshrun::comm
