// The dry run's streamed group listing (plan_render.hpp, summarize_group_streamed): the same groups in the
// same order and the same summary as the rank map's summarize_group, on layouts of every axis order and with
// expert parallelism folded both ways.
#include <catch2/catch.hpp>

#include "launch_common.hpp"
#include "plan_render.hpp"

using namespace meshrun;

TEST_CASE("plan: the streamed group listing equals summarize_group") {
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
      const GroupSummary a = summarize_group(map, kind, [&](const std::vector<int>& g) { whole.push_back(g); });
      const GroupSummary b = cli::summarize_group_streamed(map, kind, [&](const std::vector<int>& g) { streamed.push_back(g); });
      REQUIRE(streamed == whole);
      REQUIRE(b.kind == a.kind);
      REQUIRE(b.size == a.size);
      REQUIRE(b.count == a.count);
      REQUIRE(b.by_link == a.by_link);
      REQUIRE(int64_t(whole.size()) * a.size == map.world());
    }
  }
}
