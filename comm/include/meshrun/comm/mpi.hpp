// The MPI backend of Comm, and the per-axis communicators built from the mesh rank map.
#pragma once
#include <mpi.h>

#include <array>
#include <memory>
#include <vector>

#include "meshrun/comm/comm.hpp"
#include "meshrun/comm/groups.hpp"
#include "meshrun/rank_map.hpp"

namespace meshrun::comm {

class MpiComm final : public Comm {
 public:
  using Comm::all_gather;  // keep the typed conveniences visible
  using Comm::all_reduce;
  using Comm::reduce_scatter;
  using Comm::ireduce_scatter;
  using Comm::iall_gather;
  // owned: MPI_Comm_free on destruction. `label` names the group in wait reports (wait_state.hpp);
  // world_ranks[r] is member r's world rank (empty: the ranks are world ranks).
  MpiComm(MPI_Comm comm, bool owned, const char* label = "world", std::vector<int> world_ranks = {});
  ~MpiComm() override;
  MpiComm(const MpiComm&) = delete;
  MpiComm& operator=(const MpiComm&) = delete;
  int size() const override { return size_; }
  int rank() const override { return rank_; }
  void all_reduce(Buf buf, ReduceOp op) override;
  void reduce_scatter(Buf send, Buf recv, ReduceOp op) override;
  void all_gather(Buf send, Buf recv) override;
  void broadcast(Buf buf, int root) override;
  Request ireduce_scatter(Buf send, Buf recv, ReduceOp op) override;
  Request iall_gather(Buf send, Buf recv) override;
  Request isend(Buf buf, int peer, int tag) override;
  Request irecv(Buf buf, int peer, int tag) override;
  int max_tag() const override { return tag_ub_; }
  void all_to_all(Buf send, const std::int64_t* send_counts, Buf recv, const std::int64_t* recv_counts) override;
  void barrier() override;
  MPI_Comm handle() const { return comm_; }

 private:
  int world_rank(int peer) const { return world_ranks_.empty() ? peer : world_ranks_[static_cast<std::size_t>(peer)]; }
  MPI_Comm comm_;
  bool owned_;
  const char* label_;
  std::vector<int> world_ranks_;
  int size_ = 1, rank_ = 0;
  int tag_ub_ = 32767;  // MPI_TAG_UB (the standard guarantees at least 32767)
};

// The groups of the grid, built collectively over `base` (whose ranks are the grid's ranks): color = the
// group's first member, key = index_in_group.
Groups make_mpi_groups(MPI_Comm base, const RankGrid& grid);

}  // namespace meshrun::comm
