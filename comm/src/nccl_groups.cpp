// make_nccl_groups (nccl_groups.hpp): a CUDA run's groups over NCCL, bootstrapped over MPI.
#include <nccl.h>
#include <unistd.h>

#include <algorithm>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "meshrun/comm/mpi.hpp"
#include "meshrun/comm/nccl_groups.hpp"
#include "nccl_internal.hpp"

namespace meshrun::comm {

using device::Backend;

Groups make_nccl_groups(MPI_Comm base, const RankGrid& grid, Backend& backend, int device_index) {
  Groups host = make_mpi_groups(base, grid);
  int rank = 0, size = 0;
  MPI_Comm_rank(base, &rank);
  MPI_Comm_size(base, &size);
  // One device per rank: NCCL refuses two ranks of a communicator on one GPU ("Duplicate GPU detected").
  char name[256] = {};
  gethostname(name, sizeof name - 1);
  std::vector<char> names(sizeof name * static_cast<std::size_t>(size));
  std::vector<int> devices(static_cast<std::size_t>(size));
  MPI_Allgather(name, sizeof name, MPI_CHAR, names.data(), sizeof name, MPI_CHAR, base);
  MPI_Allgather(&device_index, 1, MPI_INT, devices.data(), 1, MPI_INT, base);
  // Every rank checks every pair, so that all of them refuse together (none goes on into ncclCommInitRank alone).
  for (int a = 0; a < size; ++a)
    for (int b = a + 1; b < size; ++b) {
      const char* host_a = names.data() + sizeof name * static_cast<std::size_t>(a);
      if (devices[static_cast<std::size_t>(a)] == devices[static_cast<std::size_t>(b)] &&
          std::string(host_a) == names.data() + sizeof name * static_cast<std::size_t>(b))
        throw std::invalid_argument("ranks " + std::to_string(a) + " and " + std::to_string(b) + " both use CUDA device " +
                                    std::to_string(devices[static_cast<std::size_t>(a)]) + " of host " + host_a +
                                    ": NCCL needs one device per rank; give each rank its own (MESHRUN_CUDA_DEVICE, or "
                                    "one task per GPU so that the node-local rank picks it)");
    }
  ncclUniqueId id{};
  if (rank == 0) check(ncclGetUniqueId(&id), "ncclGetUniqueId");
  MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, base);
  ncclComm_t world = nullptr;
  check(ncclCommInitRank(&world, size, id, rank), "ncclCommInitRank");
  Groups out;
  std::vector<std::pair<ncclComm_t, const char*>> made{{world, "world"}};
  for (GroupKind k : kGroupKinds) {
    const std::vector<int> members = grid.group_of(rank, k);
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.commName = group_name(k);
    ncclComm_t sub = nullptr;
    check(ncclCommSplit(world, members.front(), grid.index_in_group(rank, k), &sub, &config),
          std::string("ncclCommSplit for group ") + group_name(k), world);
    made.push_back({sub, group_name(k)});
    const int i = static_cast<int>(k);
    out.by_kind[i] = wrap_nccl(sub, std::move(host.by_kind[i]), backend, group_name(k));
  }
  out.world = wrap_nccl(world, std::move(host.world), backend, "world");
  out.device_memory = true;
  for (const auto& [c, label] : made) register_nccl(c, label);
  return out;
}

}  // namespace meshrun::comm
