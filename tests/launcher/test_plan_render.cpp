// The dry run's streamed group listing (rank_map.hpp, summarize_group over RankGrid::for_each_group): every
// group exactly once, met at its smallest member (the order of RankGrid::groups), each equal to group_of of
// its members, on layouts of every axis order and with expert parallelism folded both ways. The reference
// enumerates by group_of over the ranks not yet seen, independently of the first-member rule.
#include <catch2/catch.hpp>

#include <array>

#include "launch_common.hpp"
#include "plan_render.hpp"

using namespace meshrun;

TEST_CASE("plan: the streamed group listing equals the enumeration by group_of") {
  struct Case {
    const char* name;
    std::vector<std::string> sets;
  };
  const std::vector<Case> cases = {
      {"tiny", {}},
      {"tiny-moe", {}},
      {"mixtral-8x7b", {}},
      {"mixtral-8x7b", {"parallel.order=tp-cp-dp-ep-pp"}},  // ep after dp: the other folding
      {"llama3-70b", {}},
      {"llama3-405b-128k", {"cluster.nodes=64", "cluster.hostlist=", "training.global_batch_size=32",
                            "parallel.order=tp-dp-pp-cp", "parallel.dp=auto", "parallel.cp=4", "parallel.pp=2"}},
  };
  for (const Case& c : cases) {
    INFO(c.name);
    ConfigRequest req;
    req.template_path = std::string(MESHRUN_SOURCE_DIR) + "/templates/" + c.name + ".toml";
    req.use_site = false;
    req.sets = c.sets;
    launch::Resolved r = launch::resolve(build_config(req));
    RankMap map(r.layout, r.cluster);
    for (GroupKind kind : kGroupKinds) {
      INFO(group_name(kind));
      std::vector<std::vector<int>> whole, streamed;
      std::vector<bool> seen(size_t(map.world()), false);
      std::array<int, 4> by_link{};
      for (int r = 0; r < map.world(); ++r) {
        if (seen[size_t(r)]) continue;
        whole.push_back(map.grid().group_of(r, kind));
        for (int member : whole.back()) seen[size_t(member)] = true;
        ++by_link[static_cast<int>(map.link_of(whole.back()))];
      }
      const GroupSummary b = summarize_group(map, kind, [&](const std::vector<int>& g) { streamed.push_back(g); });
      REQUIRE(streamed == whole);
      REQUIRE(map.grid().groups(kind) == whole);
      REQUIRE(b.kind == kind);
      REQUIRE(b.size == map.grid().group_size(kind));
      REQUIRE(b.count == int(whole.size()));
      REQUIRE(b.by_link == by_link);
      REQUIRE(int64_t(whole.size()) * b.size == map.world());
    }
  }
}
