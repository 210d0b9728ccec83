// Rank math: checked against an independent enumeration (nested loops in the order's digit sequence),
// for every one of the 120 axis orders and many shapes.
#include <algorithm>
#include <catch2/catch.hpp>
#include <map>
#include <numeric>
#include <set>

#include "meshrun/rank_map.hpp"

using namespace meshrun;

namespace {

Layout make(int tp, int cp, int pp, int dp, int ep, const std::string& order) {
  std::string err;
  auto o = parse_order(order, &err);
  REQUIRE(o);
  Layout l;
  l.tp = tp, l.cp = cp, l.pp = pp, l.dp = dp, l.ep = ep;
  l.order = *o;
  return l;
}

// Oracle: walk all coordinate tuples with the order's first axis innermost and hand out consecutive ranks.
std::vector<Coord> enumerate(const Layout& l) {
  std::vector<Axis> dense;
  for (Axis a : l.order.axes)
    if (a != Axis::ep) dense.push_back(a);
  std::vector<Coord> out;
  std::vector<int> digit(dense.size(), 0);
  int world = l.world();
  for (int r = 0; r < world; ++r) {
    Coord c;
    for (size_t i = 0; i < dense.size(); ++i) {
      switch (dense[i]) {
        case Axis::tp: c.tp = digit[i]; break;
        case Axis::cp: c.cp = digit[i]; break;
        case Axis::dp: c.dp = digit[i]; break;
        case Axis::pp: c.pp = digit[i]; break;
        default: break;
      }
    }
    out.push_back(c);
    for (size_t i = 0; i < dense.size(); ++i) {  // increment, first axis fastest
      if (++digit[i] < l.size(dense[i])) break;
      digit[i] = 0;
    }
  }
  return out;
}

std::vector<std::string> all_orders() {
  std::vector<std::string> names{"cp", "dp", "ep", "pp", "tp"};
  std::vector<std::string> out;
  do {
    std::string s;
    for (auto& n : names) s += (s.empty() ? "" : "-") + n;
    out.push_back(s);
  } while (std::next_permutation(names.begin(), names.end()));
  return out;
}

}  // namespace

TEST_CASE("rank <-> coordinates round trip for every order and many shapes", "[rank]") {
  const int shapes[][5] = {{1, 1, 1, 1, 1}, {2, 1, 1, 1, 1}, {2, 2, 2, 2, 1}, {4, 1, 2, 3, 3},
                           {8, 2, 4, 2, 4}, {3, 5, 2, 2, 5},  {1, 3, 1, 4, 6}, {2, 2, 3, 4, 8}};
  auto orders = all_orders();
  REQUIRE(orders.size() == 120);
  for (const auto& order : orders) {
    for (const auto& s : shapes) {
      Layout l = make(s[0], s[1], s[2], s[3], s[4], order);
      RankGrid g(l);
      auto oracle = enumerate(l);
      REQUIRE(g.world() == static_cast<int>(oracle.size()));
      for (int r = 0; r < g.world(); ++r) {
        Coord c = g.coords(r);
        INFO("order " << order << " rank " << r);
        REQUIRE(c.tp == oracle[r].tp);
        REQUIRE(c.cp == oracle[r].cp);
        REQUIRE(c.dp == oracle[r].dp);
        REQUIRE(c.pp == oracle[r].pp);
        REQUIRE(g.rank(c) == r);
        REQUIRE(c.ep < l.ep);
        REQUIRE(c.edp < l.cp * l.dp / l.ep);
      }
    }
  }
}

TEST_CASE("groups partition the world on every axis, for every order", "[rank][groups]") {
  for (const auto& order : all_orders()) {
    Layout l = make(2, 2, 3, 4, 4, order);
    RankGrid g(l);
    for (GroupKind k : kGroupKinds) {
      INFO("order " << order << " group " << group_name(k));
      auto groups = g.groups(k);
      std::vector<int> seen(g.world(), 0);
      for (const auto& grp : groups) {
        REQUIRE(static_cast<int>(grp.size()) == g.group_size(k));
        REQUIRE(std::is_sorted(grp.begin(), grp.end()));
        for (int r : grp) {
          ++seen[r];
          REQUIRE(g.group_of(r, k) == grp);  // every member agrees on its group
        }
      }
      REQUIRE(std::all_of(seen.begin(), seen.end(), [](int n) { return n == 1; }));
      REQUIRE(static_cast<int>(groups.size()) * g.group_size(k) == g.world());
      // Groups come ordered by their first member.
      for (size_t i = 1; i < groups.size(); ++i) REQUIRE(groups[i - 1][0] < groups[i][0]);
    }
  }
}

TEST_CASE("members of a group differ only along its axis", "[rank][groups]") {
  Layout l = make(2, 2, 2, 3, 2, "tp-cp-ep-dp-pp");
  RankGrid g(l);
  for (int r = 0; r < g.world(); ++r) {
    Coord c = g.coords(r);
    for (int m : g.group_of(r, GroupKind::dp)) {
      Coord o = g.coords(m);
      REQUIRE((o.tp == c.tp && o.cp == c.cp && o.pp == c.pp));
    }
    for (int m : g.group_of(r, GroupKind::ep)) {
      Coord o = g.coords(m);
      REQUIRE((o.tp == c.tp && o.pp == c.pp && o.edp == c.edp));
    }
    for (int m : g.group_of(r, GroupKind::edp)) {
      Coord o = g.coords(m);
      REQUIRE((o.tp == c.tp && o.pp == c.pp && o.ep == c.ep));
    }
    // index_in_group is the axis coordinate for the single axes.
    REQUIRE(g.index_in_group(r, GroupKind::tp) == c.tp);
    REQUIRE(g.index_in_group(r, GroupKind::pp) == c.pp);
    REQUIRE(g.index_in_group(r, GroupKind::dp) == c.dp);
    REQUIRE(g.index_in_group(r, GroupKind::ep) == c.ep);
  }
}

TEST_CASE("Megatron's worked example: W=16, TP=CP=DP=PP=2, default order", "[rank][megatron]") {
  RankGrid g(make(2, 2, 2, 2, 1, "tp-cp-ep-dp-pp"));
  using G = std::vector<std::vector<int>>;
  REQUIRE(g.groups(GroupKind::tp) == G{{0, 1}, {2, 3}, {4, 5}, {6, 7}, {8, 9}, {10, 11}, {12, 13}, {14, 15}});
  REQUIRE(g.groups(GroupKind::cp) == G{{0, 2}, {1, 3}, {4, 6}, {5, 7}, {8, 10}, {9, 11}, {12, 14}, {13, 15}});
  REQUIRE(g.groups(GroupKind::dp) == G{{0, 4}, {1, 5}, {2, 6}, {3, 7}, {8, 12}, {9, 13}, {10, 14}, {11, 15}});
  REQUIRE(g.groups(GroupKind::dp_cp) == G{{0, 2, 4, 6}, {1, 3, 5, 7}, {8, 10, 12, 14}, {9, 11, 13, 15}});
  REQUIRE(g.groups(GroupKind::pp) == G{{0, 8}, {1, 9}, {2, 10}, {3, 11}, {4, 12}, {5, 13}, {6, 14}, {7, 15}});
}

TEST_CASE("expert parallelism folds into the cp·dp ranks of each stage", "[rank][ep]") {
  // Default order: ep is written before dp, so it takes the innermost (cp, dp) index, like Megatron.
  RankGrid g(make(2, 1, 2, 4, 2, "tp-cp-ep-dp-pp"));
  using G = std::vector<std::vector<int>>;
  REQUIRE(g.groups(GroupKind::ep) == G{{0, 2}, {1, 3}, {4, 6}, {5, 7}, {8, 10}, {9, 11}, {12, 14}, {13, 15}});
  REQUIRE(g.groups(GroupKind::edp) == G{{0, 4}, {1, 5}, {2, 6}, {3, 7}, {8, 12}, {9, 13}, {10, 14}, {11, 15}});
  // ep written after dp: ep becomes the outer part of the (cp, dp) index.
  RankGrid h(make(2, 1, 2, 4, 2, "tp-cp-dp-ep-pp"));
  REQUIRE(h.groups(GroupKind::ep) == G{{0, 4}, {1, 5}, {2, 6}, {3, 7}, {8, 12}, {9, 13}, {10, 14}, {11, 15}});
  // EP and pipeline groups never mix stages.
  for (const auto& grp : g.groups(GroupKind::ep))
    for (int r : grp) REQUIRE(g.coords(r).pp == g.coords(grp[0]).pp);
}

TEST_CASE("Llama 3's order [TP, CP, PP, DP] is accepted and puts DP outermost", "[rank][order]") {
  std::string err;
  auto o = parse_order("TP,CP,PP,DP", &err);
  REQUIRE(o);
  REQUIRE(o->str() == "tp-cp-ep-pp-dp");
  Layout l = make(8, 16, 16, 8, 1, "tp-cp-pp-dp");
  RankGrid g(l);
  Coord c{3, 5, 7, 2, 0, 0};  // tp, cp, pp, dp
  REQUIRE(g.rank(c) == 3 + 8 * (5 + 16 * (7 + 16 * 2)));
}

TEST_CASE("bad orders are rejected with a fix", "[order]") {
  std::string err;
  REQUIRE_FALSE(parse_order("tp-cp-dp", &err));
  REQUIRE(err.find("does not name pp") != std::string::npos);
  REQUIRE_FALSE(parse_order("tp-tp-cp-dp-pp", &err));
  REQUIRE(err.find("appears twice") != std::string::npos);
  REQUIRE_FALSE(parse_order("tp-cp-xp-dp-pp", &err));
  REQUIRE(err.find("unknown axis 'xp'") != std::string::npos);
}

TEST_CASE("ring peers and along() move one coordinate, wrapping, for every order", "[rank][neighbors]") {
  for (const char* order : {"tp-cp-ep-dp-pp", "tp-cp-pp-dp", "dp-tp-cp-ep-pp", "pp-dp-cp-tp"}) {
    Layout l;
    l.tp = 2;
    l.cp = 3;
    l.pp = 4;
    l.dp = 2;
    std::string err;
    l.order = *parse_order(order, &err);
    const RankGrid g(l);
    for (int r = 0; r < g.world(); ++r) {
      const Coord c = g.coords(r);
      for (Axis a : {Axis::tp, Axis::cp, Axis::dp, Axis::pp}) {
        const int size = l.size(a);
        const auto peers = g.ring_peers(r, a);
        Coord next = g.coords(peers.next), prev = g.coords(peers.prev);
        INFO(order << " rank " << r << " axis " << axis_name(a));
        CHECK(next.get(a) == (c.get(a) + 1) % size);
        CHECK(prev.get(a) == (c.get(a) + size - 1) % size);
        for (Axis other : {Axis::tp, Axis::cp, Axis::dp, Axis::pp})
          if (other != a) {
            CHECK(next.get(other) == c.get(other));
            CHECK(prev.get(other) == c.get(other));
          }
        // The neighbours are members of r's group on that axis.
        const GroupKind kind = a == Axis::tp ? GroupKind::tp : a == Axis::cp ? GroupKind::cp
                               : a == Axis::dp ? GroupKind::dp : GroupKind::pp;
        const auto members = g.group_of(r, kind);
        CHECK(std::count(members.begin(), members.end(), peers.next) == 1);
        CHECK(g.index_in_group(peers.next, kind) == (g.index_in_group(r, kind) + 1) % size);
      }
    }
  }
  Layout l;
  l.pp = 2;
  const RankGrid g(l);
  CHECK_THROWS_WITH(g.along(0, Axis::pp, 2), Catch::Contains("out of range"));
  CHECK_THROWS(g.along(0, Axis::ep, 0));
}
