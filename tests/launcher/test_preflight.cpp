// meshrun preflight's pure parts (launcher/preflight_core.cpp) and the host-list compression its exclude list
// uses (mesh/src/hostlist.cpp): the verdict against the median or the site's figures, the blame for a slow
// link, the phases that keep probes of one machine apart, the `srun --exclude` line, and the batch script of
// `meshrun sbatch --preflight` (golden files; MESHRUN_UPDATE_GOLDEN=1 build/tests/launcher/test_preflight
// "[golden]" rewrites them after an intended change).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "batch_script.hpp"
#include "meshrun/hostlist.hpp"
#include "preflight_core.hpp"

using namespace meshrun;
using namespace meshrun::preflight;

namespace {

// Four nodes of two devices each, every device at `gflops[node]`, a ring of links at `gbs[i]` (i <-> i+1).
Measurements four_nodes(const std::vector<double>& gflops, const std::vector<double>& gbs) {
  Measurements m;
  for (int n = 0; n < 4; ++n) {
    NodeResult node;
    node.name = "n" + std::to_string(n + 1);
    node.ranks = {2 * n, 2 * n + 1};
    node.checks.push_back({"cpus", "8 CPUs", Status::pass, ""});
    node.devices = {{2 * n, gflops[static_cast<size_t>(n)]}, {2 * n + 1, gflops[static_cast<size_t>(n)] * 1.02}};
    m.nodes.push_back(node);
  }
  for (int i = 0; i < 4; ++i) m.links.push_back({i, (i + 1) % 4, gbs[static_cast<size_t>(i)]});
  m.allreduce_gbs = 1.5;
  return m;
}

const Check* find(const Report& r, const std::string& node, const std::string& check) {
  for (const auto& n : r.nodes)
    if (n.name == node)
      for (const auto& c : n.checks)
        if (c.name == check) return &c;
  return nullptr;
}

}  // namespace

TEST_CASE("preflight: a healthy allocation passes against its median", "[preflight]") {
  const Report r = judge(four_nodes({40, 42, 41, 39}, {2.0, 2.1, 1.9, 2.0}), Expected{});
  CHECK(r.failing.empty());
  CHECK(exit_status(r) == 0);
  const std::string text = render(r);
  CHECK(text.find("all 4 nodes passed\n") != std::string::npos);
  CHECK(text.find("failing nodes") == std::string::npos);
  REQUIRE(find(r, "n2", "gemm"));
  CHECK(find(r, "n2", "gemm")->status == Status::pass);
  CHECK(find(r, "n2", "gemm")->verdict.find("of the median") != std::string::npos);
  // One figure for the whole allocation and no site figure: shown, not judged.
  REQUIRE(r.allocation.size() == 1);
  CHECK(r.allocation[0].status == Status::info);
}

TEST_CASE("preflight: a slow node fails, its neighbours pass, and it is named for srun --exclude", "[preflight]") {
  // n3 at 0.12 of the others' GEMM; both of its links (n2-n3 and n3-n4) slow, the other two fine.
  const Report r = judge(four_nodes({40, 42, 5, 39}, {2.0, 0.3, 0.25, 2.1}), Expected{});
  REQUIRE(r.failing == std::vector<std::string>{"n3"});
  CHECK(exit_status(r) == 1);
  CHECK(find(r, "n3", "gemm")->status == Status::fail);
  CHECK(find(r, "n3", "p2p")->status == Status::fail);
  // n2 and n4 each keep one good link: the slow link is n3's, not theirs.
  CHECK(find(r, "n2", "p2p")->status == Status::pass);
  CHECK(find(r, "n4", "p2p")->status == Status::pass);
  CHECK(render(r).find("failing nodes: n3\n") != std::string::npos);
}

TEST_CASE("preflight: the verdict follows --min-fraction", "[preflight]") {
  Measurements m = four_nodes({40, 40, 26, 40}, {2, 2, 2, 2});  // n3 at 0.65 of the median
  Expected e;
  CHECK(judge(m, e).failing.empty());
  e.min_fraction = 0.7;
  CHECK(judge(m, e).failing == std::vector<std::string>{"n3"});
}

TEST_CASE("preflight: site figures replace the median", "[preflight]") {
  Measurements m = four_nodes({40, 42, 41, 39}, {2.0, 2.1, 1.9, 2.0});
  Expected e;
  e.gemm_gflops = 100;  // every node is at 0.4 of what the site expects
  e.site = "/etc/meshrun/site.toml";
  Report r = judge(m, e);
  CHECK(r.failing.size() == 4);
  CHECK(find(r, "n1", "gemm")->verdict.find("the site's 100.0 (/etc/meshrun/site.toml)") != std::string::npos);
  CHECK(render(r).find("failing nodes: n[1-4]\n") != std::string::npos);
  // The all-reduce is judged only against a site figure, and then fails the allocation without blaming a node.
  e = Expected{};
  e.allreduce_gbs = 10;
  r = judge(m, e);
  CHECK(r.failing.empty());
  CHECK(r.allocation_failed);
  CHECK(exit_status(r) == 1);
  CHECK(render(r).find("failing nodes: none attributable") != std::string::npos);
}

TEST_CASE("preflight: too few figures for a median are shown, not judged", "[preflight]") {
  Measurements m;
  m.nodes.push_back({"a", {0}, {}, {{0, 50}}});
  m.nodes.push_back({"b", {1}, {}, {{1, 5}}});
  m.links.push_back({0, 1, 0.1});
  m.allreduce_gbs = 0.1;
  const Report r = judge(m, Expected{});
  // Two devices: the slow one is below half their median (27.5).
  CHECK(find(r, "b", "gemm")->status == Status::fail);
  // One link between two nodes cannot be compared with anything.
  CHECK(find(r, "a", "p2p")->status == Status::info);
  CHECK(find(r, "b", "p2p")->status == Status::info);
  CHECK(r.failing == std::vector<std::string>{"b"});
  Measurements one;
  one.nodes.push_back({"solo", {0}, {}, {{0, 50}}});
  const Report s = judge(one, Expected{});
  CHECK(find(s, "solo", "gemm")->status == Status::info);
  CHECK(find(s, "solo", "p2p")->status == Status::skipped);
  CHECK(s.allocation[0].status == Status::skipped);
  CHECK(render(s).find("all 1 node passed\n") != std::string::npos);
}

TEST_CASE("preflight: a failed node check (devices, binding) fails the node, skipped never passes", "[preflight]") {
  Measurements m = four_nodes({40, 42, 41, 39}, {2, 2, 2, 2});
  m.nodes[1].checks.push_back({"gpus", "0", Status::skipped, "skipped: no GPU on this node"});
  m.nodes[3].checks.push_back({"binding", "rank 6: CPUs 0-1", Status::fail, "the map says 0"});
  const Report r = judge(m, Expected{});
  CHECK(r.failing == std::vector<std::string>{"n4"});
  const std::string text = render(r);
  CHECK(text.find("skipped: no GPU on this node") != std::string::npos);
  CHECK(text.find("FAIL: the map says 0") != std::string::npos);
}

TEST_CASE("preflight: ring links, phases per machine, rank lists, --min-fraction", "[preflight]") {
  CHECK(ring_links(1).empty());
  CHECK(ring_links(2) == std::vector<std::pair<int, int>>{{0, 1}});
  CHECK(ring_links(4) == std::vector<std::pair<int, int>>{{0, 1}, {1, 2}, {2, 3}, {3, 0}});
  // The local cluster: four nodes on one machine, one phase each; four machines: all at once.
  CHECK(phases({{"vm"}, {"vm"}, {"vm"}, {"vm"}}) == std::vector<int>{0, 1, 2, 3});
  CHECK(phases({{"a"}, {"b"}, {"c"}, {"d"}}) == std::vector<int>{0, 0, 0, 0});
  // Ring links of four machines: no machine in two links of one phase.
  CHECK(phases({{"a", "b"}, {"b", "c"}, {"c", "d"}, {"d", "a"}}) == std::vector<int>{0, 1, 0, 1});
  CHECK(rank_list({0, 1, 2, 3, 6}) == "0-3,6");
  CHECK(rank_list({4, 5}) == "4,5");
  CHECK(parse_fraction("0.5") == 0.5);
  CHECK(parse_fraction("1") == 1.0);
  for (const char* bad : {"0", "1.5", "-0.2", "x", "0.5x", "", "nan"}) CHECK_THROWS_AS(parse_fraction(bad), std::invalid_argument);
  CHECK(median({3, 1, 2}) == 2);
  CHECK(median({4, 1, 2, 3}) == 2.5);
}

TEST_CASE("hostlist: compress_hostlist writes srun --exclude lists that expand back", "[preflight][hostlist]") {
  CHECK(compress_hostlist({}) == "");
  CHECK(compress_hostlist({"n3"}) == "n3");
  CHECK(compress_hostlist({"n3", "n1", "n2", "n7"}) == "n[1-3,7]");
  CHECK(compress_hostlist({"n9", "n10", "n11"}) == "n[9-11]");
  CHECK(compress_hostlist({"node001", "node002", "node100"}) == "node[001-002,100]");
  CHECK(compress_hostlist({"n01", "n2"}) == "n[01,2]");
  CHECK(compress_hostlist({"n1", "n1", "n2"}) == "n[1-2]");
  CHECK(compress_hostlist({"login", "gpu-a1", "gpu-a2", "x"}) == "gpu-a[1-2],login,x");
  CHECK(compress_hostlist({"rack1-n4", "rack2-n4"}) == "rack1-n4,rack2-n4");
  const std::vector<std::vector<std::string>> lists = {
      {"n1", "n2", "n3", "n7"}, {"node001", "node002", "node100", "node0999"}, {"a9", "a10", "a09", "b"},
      {"gpu-1-ib", "gpu-2-ib"}, {"x00", "x01", "x1", "x2"}};
  for (const auto& list : lists) {
    std::string error;
    auto back = expand_hostlist(compress_hostlist(list), &error);
    REQUIRE(back);
    std::vector<std::string> want = list, got = *back;
    std::sort(want.begin(), want.end());
    std::sort(got.begin(), got.end());
    CHECK(got == want);
  }
}

TEST_CASE("preflight: meshrun sbatch --preflight runs it before the job step and stops on a failure", "[golden]") {
  const std::string src = MESHRUN_SOURCE_DIR;
  meshrun::ConfigRequest req;
  req.template_path = src + "/templates/tiny.toml";
  req.use_site = false;
  const meshrun::launch::Resolved r = meshrun::launch::resolve(meshrun::build_config(req));
  for (bool plugin : {false, true}) {
    meshrun::launch::BatchOptions o;
    o.template_path = "/srv/meshrun/templates/tiny.toml";
    o.meshrun = "/opt/meshrun/bin/meshrun";
    o.trainer = "/opt/meshrun/bin/meshrun-train";
    o.plugin = plugin;
    o.cpus_per_task = 16;
    o.preflight = true;
    o.sets = {"--set", "training.steps=3"};
    const std::string script = meshrun::launch::render_batch_script(r, o);
    const std::string path = src + "/tests/launcher/golden/tiny.preflight" + (plugin ? ".plugin" : "") + ".sbatch";
    if (const char* u = std::getenv("MESHRUN_UPDATE_GOLDEN"); u && std::string(u) == "1") std::ofstream(path) << script;
    std::ifstream in(path);
    std::stringstream golden;
    golden << in.rdbuf();
    INFO("golden file " << path << " (MESHRUN_UPDATE_GOLDEN=1 rewrites it)");
    CHECK(golden.str() == script);
    // The preflight step comes before the job step, on the same geometry, and its failure ends the script.
    const size_t pre = script.find("meshrun preflight /srv/meshrun/templates/tiny.toml --set training.steps=3\n");
    const size_t job = script.find("exec srun ");
    REQUIRE(pre != std::string::npos);
    REQUIRE(job != std::string::npos);
    CHECK(pre < job);
    CHECK(script.find("srun --mpi=pmix --wait=30 --nodes=1 --ntasks-per-node=4 --cpus-per-task=16 ") != std::string::npos);
    CHECK(script.find("exit \"$preflight\"") < job);
    CHECK((script.find("meshrun exec --template /srv/meshrun/templates/tiny.toml --set training.steps=3 -- "
                       "/opt/meshrun/bin/meshrun preflight") != std::string::npos) == !plugin);
  }
}
