// Placement and links: TP inside NVLink domains for the 405B layout and for a GB200 NVL72 cluster.
#include <catch2/catch.hpp>
#include <set>

#include "meshrun/rank_map.hpp"

using namespace meshrun;

namespace {
struct Built {
  Cluster cluster;
  Layout layout;
};
Built build(const JobConfig& cfg) {
  std::vector<Problem> problems;
  Cluster c = resolve_cluster(cfg.cluster, &problems);
  auto l = resolve_layout(cfg.parallel, c.gpus(), &problems);
  REQUIRE(problems.empty());
  REQUIRE(l);
  auto v = validate(cfg, *l, c);
  INFO((v.empty() ? "" : v.front().message));
  REQUIRE(v.empty());
  return {c, *l};
}
JobConfig llama405b() {
  JobConfig cfg;
  cfg.cluster.nodes = 2048;
  cfg.cluster.node_type = "dgx-h100";
  cfg.model.layers = 126;
  cfg.model.hidden = 16384;
  cfg.model.ffn_hidden = 53248;
  cfg.model.heads = 128;
  cfg.model.kv_heads = 8;
  cfg.model.vocab = 128256;
  cfg.parallel.tp = 8;
  cfg.parallel.pp = 16;
  cfg.training.seq_len = 8192;
  cfg.training.global_batch_size = 2048;
  return cfg;
}
}  // namespace

TEST_CASE("405B on 16,384 GPUs: every TP group on one node, every (node, GPU) used once", "[placement]") {
  auto [cluster, layout] = build(llama405b());
  REQUIRE(layout.dp == 128);
  RankMap map(layout, cluster);
  REQUIRE(map.world() == 16384);
  std::set<std::pair<int, int>> slots;
  for (int r = 0; r < map.world(); ++r) {
    Placement p = map.placement(r);
    REQUIRE(slots.insert({p.node, p.gpu}).second);
    REQUIRE(map.rank_at(p.node, p.local_rank) == r);
  }
  REQUIRE(slots.size() == 16384);
  for (const auto& g : map.grid().groups(GroupKind::tp)) {
    REQUIRE(map.link_of(g) == Link::nvlink);
    for (int r : g) REQUIRE(map.placement(r).node == map.placement(g[0]).node);
  }
  for (const auto& g : map.grid().groups(GroupKind::dp)) REQUIRE(map.link_of(g) == Link::network);
}

TEST_CASE("GB200 NVL72: TP groups spanning trays stay inside one 72-GPU domain", "[placement][nvl72]") {
  JobConfig cfg = llama405b();
  cfg.cluster.node_type = "gb200-nvl72";
  cfg.cluster.nodes = 36;  // two NVL72 racks of 18 trays × 4 GPUs
  cfg.parallel.tp = 8;
  cfg.parallel.pp = 9;
  cfg.model.layers = 126;   // 14 per stage
  cfg.training.global_batch_size = 36;
  auto [cluster, layout] = build(cfg);
  REQUIRE(cluster.gpus_per_node == 4);
  REQUIRE(cluster.nvlink_domain_gpus == 72);
  RankMap map(layout, cluster);
  for (const auto& g : map.grid().groups(GroupKind::tp)) {
    REQUIRE(map.link_of(g) == Link::nvlink);
    REQUIRE(map.placement(g.front()).node != map.placement(g.back()).node);  // crosses trays, not domains
  }
  // A TP size that does not divide the domain is refused: its groups would straddle two racks.
  cfg.parallel.tp = 16;
  cfg.model.heads = 128;
  cfg.model.kv_heads = 16;
  cfg.parallel.pp = 9;
  std::vector<Problem> problems;
  Cluster c = resolve_cluster(cfg.cluster, &problems);
  auto l = resolve_layout(cfg.parallel, c.gpus(), &problems);
  REQUIRE(l);
  auto v = validate(cfg, *l, c);
  REQUIRE(std::any_of(v.begin(), v.end(), [](const Problem& p) { return p.check == "tp-nvlink"; }));
}

TEST_CASE("an order that does not put tp first sends TP over the network", "[placement]") {
  JobConfig cfg = llama405b();
  cfg.cluster.nodes = 4;
  cfg.parallel.tp = 8;
  cfg.parallel.pp = 1;
  cfg.parallel.order = "dp-tp-cp-ep-pp";
  cfg.training.global_batch_size = 4;
  auto [cluster, layout] = build(cfg);
  RankMap map(layout, cluster);
  auto s = summarize_groups(map);
  REQUIRE(s[0].kind == GroupKind::tp);
  REQUIRE(s[0].by_link[static_cast<int>(Link::network)] == s[0].count);
}

TEST_CASE("links: self, nvlink, pcie, network", "[placement]") {
  JobConfig cfg;
  cfg.cluster.nodes = 2;
  cfg.cluster.gpus_per_node = 4;
  cfg.cluster.node_type = "generic";
  cfg.parallel.tp = 2;
  cfg.training.global_batch_size = 16;
  auto [cluster, layout] = build(cfg);
  RankMap map(layout, cluster);
  REQUIRE(map.link_of({3}) == Link::self);
  REQUIRE(map.link_of({0, 1}) == Link::pcie);      // generic nodes have no NVLink
  REQUIRE(map.link_of({0, 4}) == Link::network);
  cfg.cluster.node_type = "dgx-h100";
  cfg.cluster.gpus_per_node = 0;
  auto b = build(cfg);
  RankMap dgx(b.layout, b.cluster);
  REQUIRE(dgx.link_of({0, 7}) == Link::nvlink);
  REQUIRE(dgx.link_of({7, 8}) == Link::network);
}
