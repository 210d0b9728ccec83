// Layout checks against a step's shape, with and without a template; the dry-run text.
#include <catch2/catch.hpp>

#include <cstdio>
#include <fstream>

#include "dry_run.hpp"
#include "step_plan.hpp"

using namespace meshrun::plugin;

namespace {
MeshOptions opts(std::optional<int> tp, std::optional<int> pp, std::optional<int> dp) {
  MeshOptions o;
  o.tp = tp;
  o.pp = pp;
  o.dp = dp;
  return o;
}
StepShape step(int nodes, int tasks, int gpus = 0) {
  StepShape s;
  s.nodes = nodes;
  s.tasks = tasks;
  s.gpus_per_node = gpus;
  return s;
}
bool mentions(const StepPlan& p, const std::string& text) { return p.error_text().find(text) != std::string::npos; }
}  // namespace

TEST_CASE("a matching layout resolves and dp=auto fills the rest") {
  auto p = plan_step(opts(2, 2, 2), {}, step(2, 8, 8));
  REQUIRE(p.problems.empty());
  REQUIRE(p.layout);
  CHECK(p.layout->world() == 8);
  CHECK(p.cluster.gpus_per_node == 4);
  p = plan_step(opts(2, 2, 0), {}, step(4, 16));
  REQUIRE(p.layout);
  CHECK(p.layout->dp == 4);
  CHECK(p.config.origin_of("parallel.tp").str().find("--mesh-tp=2") != std::string::npos);
}

TEST_CASE("bad layouts name the problem in --mesh-* terms") {
  auto p = plan_step(opts(2, 2, 4), {}, step(2, 8));
  CHECK_FALSE(p.layout);
  CHECK(mentions(p, "16 ranks but the job has 8 tasks"));
  CHECK(mentions(p, "--mesh-dp=auto"));
  p = plan_step(opts(8, 1, 0), {}, step(2, 8));
  CHECK(mentions(p, "tp=8 spans more than one node"));
  p = plan_step(opts(1, 1, 0), {}, step(2, 16, 4));
  CHECK(mentions(p, "8 tasks per node but only 4 GPUs per node"));
  p = plan_step(opts(1, 1, 0), {}, step(3, 8));
  CHECK(mentions(p, "do not spread evenly"));
  MeshOptions ep = opts(1, 1, 0);
  ep.ep = 3;
  p = plan_step(ep, {}, step(1, 4));
  CHECK(mentions(p, "ep=3 does not divide"));
}

// What the plugin logs in slurmstepd (root) is printable: a template string with a newline and ESC is echoed
// escaped, each problem stays on its line (error_text joins problems with '\n', one per line).
TEST_CASE("a template value with a newline and ESC is echoed escaped in the step plan's error") {
  const std::string path = "meshrun-test-escape.toml";
  std::ofstream(path) << "[parallel]\norder = \"tp-dp\\u001b[2J\\nx\"\n";
  MeshOptions o;
  o.template_file = path;
  auto p = plan_step(o, {}, step(2, 8));
  std::remove(path.c_str());
  const std::string text = p.error_text();
  INFO(text);
  CHECK_FALSE(p.layout);
  CHECK(mentions(p, "tp-dp\\x1b[2J\\nx"));
  CHECK(text.find('\x1b') == std::string::npos);
  for (size_t start = 0; start < text.size();) {  // every line is one "meshrun: " problem
    CHECK(text.compare(start, 9, "meshrun: ") == 0);
    const size_t end = text.find('\n', start);
    if (end == std::string::npos) break;
    start = end + 1;
  }
}

TEST_CASE("without a template the placeholder model is not checked") {
  // tp=8 does not divide the default model's 4 heads; that must not matter without a template.
  auto p = plan_step(opts(8, 1, 0), {}, step(1, 8));
  CHECK(p.problems.empty());
}

TEST_CASE("with a template, flags win, model checks apply, bad files are reported") {
  std::string path = std::string(MESHRUN_TEMPLATES_DIR) + "/tiny.toml";
  MeshOptions o;
  o.template_file = path;
  auto p = plan_step(o, {}, step(1, 4));
  REQUIRE(p.layout);
  CHECK(p.layout->tp == 2);  // from the template
  o.tp = 4;
  p = plan_step(o, {}, step(1, 4));
  CHECK(mentions(p, "kv_heads"));  // tiny has 2 KV heads: tp=4 is a model error
  o.tp = 1;
  p = plan_step(o, {}, step(2, 4));
  REQUIRE(p.layout);
  CHECK(p.layout->tp == 1);
  CHECK(p.layout->dp == 4);

  MeshOptions missing;
  missing.template_file = "no/such/file.toml";
  p = plan_step(missing, {}, StepShape{});
  CHECK(p.problems.size() == 1);
  CHECK(mentions(p, "no/such/file.toml"));

  std::string bad = "plugin_bad_template.toml";
  std::ofstream(bad) << "[parallel]\ntp = 2\nbogus = 1\n";
  MeshOptions b;
  b.template_file = bad;
  p = plan_step(b, {}, step(1, 2));
  CHECK(mentions(p, "bogus"));
  std::remove(bad.c_str());
}

TEST_CASE("a template's job.trainer picks the rules the step is held to") {
  // megatron-gpt-1.7b: GELU, tied embeddings, vocab 50257 (Megatron pads it; meshrun-train would refuse all three).
  MeshOptions o;
  o.template_file = std::string(MESHRUN_TEMPLATES_DIR) + "/megatron-gpt-1.7b.toml";
  o.tp = 8;
  auto p = plan_step(o, {}, step(4, 32, 8));
  REQUIRE(p.layout);
  CHECK(p.rules == meshrun::RuleSet::megatron);
  CHECK(render_dry_run(p, 4).find("rules: layout+model+megatron (the template's model, as its job.trainer checks it)") !=
        std::string::npos);
  // Megatron's own rules still apply: a rank order its groups cannot follow.
  o.order = "tp-dp-cp-ep-pp";
  p = plan_step(o, {}, step(4, 32, 8));
  CHECK(mentions(p, "Megatron-LM builds its groups in the order tp-cp-ep-dp-pp"));
}

TEST_CASE("relative template paths start at the step's directory") {
  CHECK(resolve_template("a.toml", "/home/u") == "/home/u/a.toml");
  CHECK(resolve_template("/x/a.toml", "/home/u") == "/x/a.toml");
  CHECK(resolve_template("a.toml", "") == "a.toml");
}

TEST_CASE("plugstack default_order is below the template and the flags") {
  PlugstackArgs site;
  site.default_order = "tp-cp-pp-dp";
  auto p = plan_step(opts(2, 2, 0), site, step(1, 8));
  REQUIRE(p.layout);
  CHECK(p.layout->order.str().rfind("tp-cp-", 0) == 0);
  CHECK(p.layout->order.position(meshrun::Axis::pp) < p.layout->order.position(meshrun::Axis::dp));
  MeshOptions o = opts(2, 2, 0);
  o.order = "tp-cp-ep-dp-pp";
  p = plan_step(o, site, step(1, 8));
  REQUIRE(p.layout);
  CHECK(p.layout->order.position(meshrun::Axis::dp) < p.layout->order.position(meshrun::Axis::pp));
}

TEST_CASE("dry run lists every node's ranks and the groups") {
  auto p = plan_step(opts(2, 2, 0), {}, step(2, 8));
  std::string text = render_dry_run(p);
  CHECK(text.find("8 ranks on 2 nodes") != std::string::npos);
  // No allocation, so no host names: nodes are numbered, never given made-up names.
  CHECK(text.find("  node 1: r4[") != std::string::npos);
  CHECK(text.find("hosts: not chosen yet (no allocation)") != std::string::npos);
  CHECK(text.find("(node000") == std::string::npos);
  CHECK(text.find("r7[gpu3 tp1 cp0 pp1 dp1") != std::string::npos);
  CHECK(text.find("group tp: 4 × size 2") != std::string::npos);
  CHECK(text.find("nothing launched") != std::string::npos);
  // Its last line tells it from a refusal, whose last meshrun line is the reason.
  CHECK(text.substr(text.rfind('\n', text.size() - 2) + 1).rfind("meshrun: dry run only, nothing launched (as asked", 0) == 0);
  auto bad = plan_step(opts(2, 2, 4), {}, step(2, 8));
  CHECK(render_dry_run(bad).find("meshrun: tp·cp·pp·dp") == 0);
}

TEST_CASE("huge sizes are refused without integer overflow") {
  auto p = plan_step(opts(1 << 20, 1 << 20, 1 << 20), {}, step(2, 8));
  CHECK_FALSE(p.layout);
  CHECK(mentions(p, "ranks but the job has 8 tasks"));
  p = plan_step(opts(2, 3, 0), {}, step(2, 8));
  CHECK(mentions(p, "tp·cp·pp = 2·1·3 = 6 does not divide the job's 8 tasks"));
}

TEST_CASE("the step's hostlist names the nodes only when it matches the node count") {
  StepShape s = step(2, 4);
  s.hostlist = "n[1-2]";
  auto p = plan_step(opts(2, 1, 0), {}, s);
  REQUIRE(p.layout);
  CHECK(p.cluster.hosts == std::vector<std::string>{"n1", "n2"});
  CHECK(render_dry_run(p).find("  node 1 (n2): r2[") != std::string::npos);
  CHECK(render_dry_run(p).find("hosts: not chosen yet") == std::string::npos);
  s.hostlist = "n[1-4]";  // the job's nodes, not the step's
  p = plan_step(opts(2, 1, 0), {}, s);
  REQUIRE(p.layout);
  CHECK(p.cluster.hosts.size() == 2);
  CHECK(p.cluster.hosts[0] != "n1");
  CHECK(render_dry_run(p).find("  node 0: r0[") != std::string::npos);
}

TEST_CASE("dry run of a big step shows the first and last nodes only") {
  auto p = plan_step(opts(8, 16, 0), {}, step(256, 2048));
  REQUIRE(p.layout);
  std::string text = render_dry_run(p, 4);
  CHECK(text.find("node 2:") != std::string::npos);
  CHECK(text.find("node 3:") == std::string::npos);
  CHECK(text.find("... 252 more nodes") != std::string::npos);
  CHECK(text.find("node 255:") != std::string::npos);
  CHECK(text.find("r2047[") != std::string::npos);
}

// The reproducers of tests/mesh/robustness_cases.txt as the plugin reads them (--mesh-template): refused
// with a line naming the key, never an abort. Cases that need --set, --schedule or --estimate (the schedule
// bound of the view and the planner) are the CLI's.
TEST_CASE("hostile templates are refused in the step plan, naming the key") {
  std::ifstream cases(MESHRUN_ROBUSTNESS_CASES);
  REQUIRE(cases);
  auto field = [](std::string& line) {
    size_t bar = line.find('|');
    std::string f = line.substr(0, bar);
    line = bar == std::string::npos ? "" : line.substr(bar + 1);
    f.erase(0, f.find_first_not_of(' '));
    f.erase(f.find_last_not_of(' ') + 1);
    return f;
  };
  int seen = 0;
  for (std::string line; std::getline(cases, line);) {
    if (line.empty() || line[0] == '#') continue;
    std::string name = field(line), key = field(line), args = field(line), bytes = line.substr(1);
    if (args.find("--set") != std::string::npos || args.find("--schedule") != std::string::npos ||
        args.find("--estimate") != std::string::npos)
      continue;
    std::string text;  // printf %b: the cases use \n only
    for (size_t i = 0; i < bytes.size(); ++i) {
      if (bytes[i] == '\\' && i + 1 < bytes.size() && bytes[i + 1] == 'n') text += '\n', ++i;
      else text += bytes[i];
    }
    const std::string path = "meshrun-test-robust.toml";
    std::ofstream(path) << text;
    MeshOptions o;
    o.template_file = path;
    auto p = plan_step(o, {}, step(2, 8));
    std::remove(path.c_str());
    INFO(name << ": " << p.error_text());
    CHECK_FALSE(p.layout);
    CHECK(mentions(p, key));
    ++seen;
  }
  CHECK(seen >= 15);
}

TEST_CASE("an early refusal still returns a well-defined cluster") {
  auto p = plan_step(opts(2, 2, 0), {}, step(3, 8));  // tasks do not spread: returns before the cluster is resolved
  REQUIRE_FALSE(p.problems.empty());
  CHECK(p.cluster.nodes == 1);
  CHECK(p.cluster.type.gpus_per_node == 1);
  CHECK(p.cluster.type.nvlink_domain_gpus == 1);
  CHECK(p.cluster.type.nics_per_node == 0);
  CHECK_FALSE(p.cluster.type.rail_optimized);
}
