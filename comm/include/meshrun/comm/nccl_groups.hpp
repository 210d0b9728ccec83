// The groups of a CUDA run over NCCL (docs/gpu.md, "NCCL"): one NCCL communicator per group kind, split from a
// world communicator bootstrapped over MPI, each an NcclComm (nccl.hpp) whose host buffers go to the group's MPI
// communicator.
#pragma once
#include <mpi.h>

#include "meshrun/comm/groups.hpp"
#include "meshrun/comm/nccl.hpp"
#include "meshrun/rank_map.hpp"

namespace meshrun::comm {

// Collective over `base` (whose ranks are the grid's): the MPI groups, then ncclGetUniqueId on rank 0, its
// broadcast, ncclCommInitRank and one ncclCommSplit per group kind. `backend` (the CUDA backend of this rank's
// device) must outlive the groups' operations. Throws std::runtime_error naming the NCCL call and its error,
// and std::invalid_argument when two ranks of one host use the same device (NCCL's "Duplicate GPU detected").
Groups make_nccl_groups(MPI_Comm base, const RankGrid& grid, device::Backend& backend, int device_index);

}  // namespace meshrun::comm
