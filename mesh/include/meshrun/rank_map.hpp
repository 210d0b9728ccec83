// The rank map: global rank <-> 5D coordinates <-> (node, host, local rank, GPU), and every axis's groups.
//
// Rank math is pure integer arithmetic (Megatron-Core's RankGenerator convention). The dense grid is the
// mixed-radix number over the order's axes with ep removed (ep has size 1 there), leftmost fastest:
//   default order tp-cp-ep-dp-pp:  rank = tp + TP·(cp + CP·(dp + DP·pp)).
// Expert parallelism folds into the cp·dp ranks of each pipeline stage: with j the (cp, dp) index in the
// order in which cp and dp appear, ep = j mod EP and edp = j / EP when ep is written before dp, otherwise
// edp = j mod EDP and ep = j / EDP (Megatron's expert grid etp-ep-edp-pp with ETP = TP, EDP = CP·DP/EP).
//
// Placement follows Slurm's block distribution, which the plugin cannot change: rank r runs on node
// r / gpus_per_node as local rank r mod gpus_per_node, using GPU slot `local rank`.
#pragma once
#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "meshrun/layout.hpp"

namespace meshrun {

struct Coord {
  int tp = 0, cp = 0, pp = 0, dp = 0, ep = 0;
  int edp = 0;  // expert-data-parallel index (ranks holding the same experts)
  int get(Axis a) const;
  bool operator==(const Coord&) const = default;
};

// Group kinds the map exposes. dp_cp is the gradient-reduction group (CP ranks share weights);
// edp reduces expert gradients.
enum class GroupKind { tp, cp, pp, dp, ep, dp_cp, edp };
inline constexpr std::array<GroupKind, 7> kGroupKinds{GroupKind::tp, GroupKind::cp, GroupKind::pp, GroupKind::dp,
                                                      GroupKind::ep, GroupKind::dp_cp, GroupKind::edp};
const char* group_name(GroupKind k);

// Pure rank math over a layout.
class RankGrid {
 public:
  explicit RankGrid(const Layout& layout);
  const Layout& layout() const { return layout_; }
  int world() const { return world_; }
  Coord coords(int rank) const;
  int rank(const Coord& c) const;          // ep/edp of c are ignored (derived from cp, dp)
  int stride(Axis a) const;                // dense-grid stride; 0 for ep
  // Members of the group of `kind` that contains `rank`, ascending.
  std::vector<int> group_of(int rank, GroupKind kind) const;
  // Index of `rank` inside its group of `kind` (its rank in that communicator).
  int index_in_group(int rank, GroupKind kind) const;
  // All groups of `kind`, each ascending, ordered by their first member. They partition the world.
  std::vector<std::vector<int>> groups(GroupKind kind) const;
  // The same groups in the same order, one at a time (a million-rank dry run lists them without holding
  // them all).
  void for_each_group(GroupKind kind, const std::function<void(const std::vector<int>&)>& each) const;
  int group_size(GroupKind kind) const;
  // The rank whose coordinate on dense `axis` (tp, cp, dp, pp) is `coordinate`, all others as `rank`'s.
  int along(int rank, Axis axis, int coordinate) const;
  // Ring neighbours on a dense axis: coordinate −1 and +1 modulo the axis size. Pipeline peers are a
  // ring too (interleaving sends chunk c of the last pp rank to chunk c+1 on the first); the CP ring
  // passes K/V blocks the same way.
  struct RingPeers {
    int prev = 0, next = 0;
  };
  RingPeers ring_peers(int rank, Axis axis) const;

 private:
  Layout layout_;
  int world_;
  std::array<int, kAxes> stride_{};  // indexed by Axis
  bool ep_inner_;                     // ep varies faster than edp inside a stage
  bool cp_before_dp_;
  int cp_dp_index(const Coord& c) const;
};

// Where a rank runs.
struct Placement {
  int node = 0;
  int local_rank = 0;
  int gpu = 0;  // GPU slot on the node (the task environment maps it to a device id)
};

// How a group's traffic travels.
enum class Link { self, nvlink, pcie, network };
const char* link_name(Link l);

// The link between two ranks under block placement (rank r on node r / gpus_per_node): nvlink when both sit in
// one NVLink domain, pcie when they share a node without it, network otherwise; self for the same rank.
Link link_between(const Cluster& cluster, int64_t rank_a, int64_t rank_b);

class RankMap {
 public:
  RankMap(const Layout& layout, const Cluster& cluster);  // requires layout.world() == cluster.gpus()
  const RankGrid& grid() const { return grid_; }
  const Layout& layout() const { return grid_.layout(); }
  const Cluster& cluster() const { return cluster_; }
  int world() const { return grid_.world(); }
  Coord coords(int rank) const { return grid_.coords(rank); }
  Placement placement(int rank) const;
  const std::string& host(int rank) const { return cluster_.hosts[placement(rank).node]; }
  int rank_at(int node, int local_rank) const { return node * cluster_.gpus_per_node + local_rank; }
  // The slowest link any two members of `group` use.
  Link link_of(const std::vector<int>& group) const;

 private:
  RankGrid grid_;
  Cluster cluster_;
};

// Summary of one group kind for the dry run.
struct GroupSummary {
  GroupKind kind;
  int size = 1;
  int count = 0;
  std::array<int, 4> by_link{};  // number of groups per Link value
};
// One kind's summary; `each` (optional) sees every group as it is counted, so callers that also list the
// groups (the JSON dry run) enumerate them once. Streams (RankGrid::for_each_group): one group held at a time.
GroupSummary summarize_group(const RankMap& map, GroupKind kind,
                             const std::function<void(const std::vector<int>&)>& each = {});
std::vector<GroupSummary> summarize_groups(const RankMap& map);

}  // namespace meshrun
