#include "meshrun/rank_map.hpp"

#include <algorithm>
#include <stdexcept>

namespace meshrun {

int Coord::get(Axis a) const {
  switch (a) {
    case Axis::tp: return tp;
    case Axis::cp: return cp;
    case Axis::ep: return ep;
    case Axis::dp: return dp;
    case Axis::pp: return pp;
  }
  return 0;
}

const char* group_name(GroupKind k) {
  switch (k) {
    case GroupKind::tp: return "tp";
    case GroupKind::cp: return "cp";
    case GroupKind::pp: return "pp";
    case GroupKind::dp: return "dp";
    case GroupKind::ep: return "ep";
    case GroupKind::dp_cp: return "dp_cp";
    case GroupKind::edp: return "edp";
  }
  return "?";
}

const char* link_name(Link l) {
  switch (l) {
    case Link::self: return "self";
    case Link::nvlink: return "nvlink";
    case Link::pcie: return "pcie";
    case Link::network: return "network";
  }
  return "?";
}

RankGrid::RankGrid(const Layout& layout) : layout_(layout) {
  int64_t running = 1;
  for (Axis a : layout_.order.axes) {
    if (a == Axis::ep) {
      stride_[static_cast<int>(a)] = 0;  // ep is not a dense-grid digit
      continue;
    }
    stride_[static_cast<int>(a)] = static_cast<int>(running);
    running *= layout_.size(a);
  }
  if (running > (int64_t(1) << 30)) throw std::invalid_argument("world size exceeds 2^30 ranks");
  world_ = static_cast<int>(running);
  ep_inner_ = layout_.order.position(Axis::ep) < layout_.order.position(Axis::dp);
  cp_before_dp_ = layout_.order.position(Axis::cp) < layout_.order.position(Axis::dp);
}

int RankGrid::stride(Axis a) const { return stride_[static_cast<int>(a)]; }

int RankGrid::cp_dp_index(const Coord& c) const {
  return cp_before_dp_ ? c.cp + layout_.cp * c.dp : c.dp + layout_.dp * c.cp;
}

Coord RankGrid::coords(int rank) const {
  Coord c;
  c.tp = (rank / stride(Axis::tp)) % layout_.tp;
  c.cp = (rank / stride(Axis::cp)) % layout_.cp;
  c.dp = (rank / stride(Axis::dp)) % layout_.dp;
  c.pp = (rank / stride(Axis::pp)) % layout_.pp;
  int j = cp_dp_index(c);
  int ep = layout_.ep, edp = layout_.cp * layout_.dp / std::max(1, layout_.ep);
  if (ep_inner_) {
    c.ep = j % ep;
    c.edp = j / ep;
  } else {
    c.edp = j % edp;
    c.ep = j / edp;
  }
  return c;
}

int RankGrid::rank(const Coord& c) const {
  return c.tp * stride(Axis::tp) + c.cp * stride(Axis::cp) + c.dp * stride(Axis::dp) + c.pp * stride(Axis::pp);
}

int RankGrid::along(int rank, Axis axis, int coordinate) const {
  if (axis == Axis::ep) throw std::invalid_argument("RankGrid::along: ep is not a dense axis");
  const int size = layout_.size(axis);
  if (coordinate < 0 || coordinate >= size)
    throw std::invalid_argument(std::string("RankGrid::along: coordinate out of range on ") + axis_name(axis));
  return rank + (coordinate - coords(rank).get(axis)) * stride(axis);
}

RankGrid::RingPeers RankGrid::ring_peers(int rank, Axis axis) const {
  const int size = layout_.size(axis), own = coords(rank).get(axis);
  return {along(rank, axis, (own + size - 1) % size), along(rank, axis, (own + 1) % size)};
}

int RankGrid::group_size(GroupKind k) const {
  switch (k) {
    case GroupKind::tp: return layout_.tp;
    case GroupKind::cp: return layout_.cp;
    case GroupKind::pp: return layout_.pp;
    case GroupKind::dp: return layout_.dp;
    case GroupKind::ep: return layout_.ep;
    case GroupKind::dp_cp: return layout_.dp * layout_.cp;
    case GroupKind::edp: return layout_.dp * layout_.cp / layout_.ep;
  }
  return 1;
}

std::vector<int> RankGrid::group_of(int rank, GroupKind kind) const {
  Coord c = coords(rank);
  std::vector<int> members;
  members.reserve(group_size(kind));
  auto along = [&](Axis a, int size) {
    int base = rank - c.get(a) * stride(a);
    for (int k = 0; k < size; ++k) members.push_back(base + k * stride(a));
  };
  // Rank of the member with (cp, dp) index j and c's tp and pp.
  auto from_j = [&](int j) {
    Coord m = c;
    if (cp_before_dp_) {
      m.cp = j % layout_.cp;
      m.dp = j / layout_.cp;
    } else {
      m.dp = j % layout_.dp;
      m.cp = j / layout_.dp;
    }
    return this->rank(m);
  };
  int ep = layout_.ep, edp = layout_.cp * layout_.dp / std::max(1, layout_.ep);
  switch (kind) {
    case GroupKind::tp: along(Axis::tp, layout_.tp); break;
    case GroupKind::cp: along(Axis::cp, layout_.cp); break;
    case GroupKind::pp: along(Axis::pp, layout_.pp); break;
    case GroupKind::dp: along(Axis::dp, layout_.dp); break;
    case GroupKind::dp_cp:
      for (int j = 0; j < layout_.cp * layout_.dp; ++j) members.push_back(from_j(j));
      break;
    case GroupKind::ep:
      for (int e = 0; e < ep; ++e) members.push_back(from_j(ep_inner_ ? e + ep * c.edp : c.edp + edp * e));
      break;
    case GroupKind::edp:
      for (int d = 0; d < edp; ++d) members.push_back(from_j(ep_inner_ ? c.ep + ep * d : d + edp * c.ep));
      break;
  }
  std::sort(members.begin(), members.end());
  return members;
}

int RankGrid::index_in_group(int rank, GroupKind kind) const {
  auto g = group_of(rank, kind);
  return static_cast<int>(std::lower_bound(g.begin(), g.end(), rank) - g.begin());
}

void RankGrid::for_each_group(GroupKind kind, const std::function<void(const std::vector<int>&)>& each) const {
  // A group is met at its smallest member: the rank whose coordinate on the group's axes is 0.
  for (int r = 0; r < world_; ++r) {
    Coord c = coords(r);
    bool first = false;
    switch (kind) {
      case GroupKind::tp: first = c.tp == 0; break;
      case GroupKind::cp: first = c.cp == 0; break;
      case GroupKind::pp: first = c.pp == 0; break;
      case GroupKind::dp: first = c.dp == 0; break;
      case GroupKind::dp_cp: first = c.cp == 0 && c.dp == 0; break;
      case GroupKind::ep: first = c.ep == 0; break;   // rank grows with the (cp, dp) index, so ep = 0 is the
      case GroupKind::edp: first = c.edp == 0; break; // smallest member
    }
    if (first) each(group_of(r, kind));
  }
}

std::vector<std::vector<int>> RankGrid::groups(GroupKind kind) const {
  std::vector<std::vector<int>> out;
  out.reserve(world_ / std::max(1, group_size(kind)));
  for_each_group(kind, [&](const std::vector<int>& g) { out.push_back(g); });
  return out;
}

RankMap::RankMap(const Layout& layout, const Cluster& cluster) : grid_(layout), cluster_(cluster) {
  if (grid_.world() != cluster_.gpus())
    throw std::invalid_argument("rank map: layout world " + std::to_string(grid_.world()) + " != cluster GPUs " +
                                std::to_string(cluster_.gpus()));
}

Placement RankMap::placement(int rank) const {
  Placement p;
  p.node = rank / cluster_.gpus_per_node;
  p.local_rank = rank % cluster_.gpus_per_node;
  p.gpu = p.local_rank;
  return p;
}

Link link_between(const Cluster& cluster, int64_t a, int64_t b) {
  if (a == b) return Link::self;
  const int gpn = std::max(1, cluster.gpus_per_node);
  const int node_a = static_cast<int>(a / gpn), node_b = static_cast<int>(b / gpn);
  if (cluster.nvlink_domain_gpus > 1 &&
      cluster.nvlink_domain_of(node_a, static_cast<int>(a % gpn)) ==
          cluster.nvlink_domain_of(node_b, static_cast<int>(b % gpn)))
    return Link::nvlink;
  return node_a == node_b ? Link::pcie : Link::network;
}

Link RankMap::link_of(const std::vector<int>& group) const {
  // The slowest link from the first member to any other (links are nested: domain within node within network).
  Link worst = Link::self;
  for (int r : group) worst = std::max(worst, link_between(cluster_, group.front(), r));
  return worst;
}

GroupSummary summarize_group(const RankMap& map, GroupKind kind,
                             const std::function<void(const std::vector<int>&)>& each) {
  GroupSummary s;
  s.kind = kind;
  s.size = map.grid().group_size(kind);
  map.grid().for_each_group(kind, [&](const std::vector<int>& g) {
    ++s.count;
    ++s.by_link[static_cast<int>(map.link_of(g))];
    if (each) each(g);
  });
  return s;
}

std::vector<GroupSummary> summarize_groups(const RankMap& map) {
  std::vector<GroupSummary> out;
  for (GroupKind k : kGroupKinds) out.push_back(summarize_group(map, k));
  return out;
}

}  // namespace meshrun
