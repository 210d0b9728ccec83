// The communicators of one rank, one per group kind of the mesh rank map (no MPI here: the MPI groups
// come from mpi.hpp's make_mpi_groups, NCCL's from nccl.hpp's make_nccl_groups, a single process's from
// make_local_groups).
#pragma once
#include <array>
#include <functional>
#include <memory>

#include "meshrun/comm/comm.hpp"
#include "meshrun/rank_map.hpp"

namespace meshrun::comm {

// One communicator per group kind, indexed by GroupKind, and the world.
struct Groups {
  std::array<std::unique_ptr<Comm>, kGroupKinds.size()> by_kind;
  std::unique_ptr<Comm> world;
  // Every communicator moves the device backend's buffers itself (NCCL: make_nccl_groups in nccl.hpp); otherwise
  // only host memory (MPI) or copies within one process.
  bool device_memory = false;
  Comm& operator[](GroupKind k) const { return *by_kind[static_cast<int>(k)]; }
};
// Every group of size 1 (a single-process run, no MPI needed).
Groups make_local_groups();
// The same groups with host access to `backend` for every operation and outstanding request
// (HostAccessComm); `g` and `backend` must outlive them.
Groups bracket_groups(const Groups& g, device::Backend& backend);
// For a backend whose memory the host cannot address (CUDA): every group of `g` must have one process; each
// becomes a DeviceLocalComm on `backend`. Throws std::invalid_argument naming a larger group.
Groups device_local_groups(const Groups& g, device::Backend& backend);

}  // namespace meshrun::comm
