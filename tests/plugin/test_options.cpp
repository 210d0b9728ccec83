// Option and plugstack-argument parsing (no Slurm needed).
#include <catch2/catch.hpp>
#include <set>

#include "mesh_options.hpp"
#include "plugstack_args.hpp"
#include "preflight_step.hpp"

using namespace meshrun::plugin;

TEST_CASE("every option carries the mesh- prefix (getopt prefix hazard)") {
  for (const auto& s : option_specs()) {
    CHECK(std::string(s.name).rfind("mesh-", 0) == 0);
    CHECK(std::string(s.usage).rfind("[meshrun]", 0) == 0);
  }
  CHECK(option_specs().size() == 11);
}

TEST_CASE("sizes are positive integers, dp also auto, and later values win") {
  MeshOptions o;
  std::string err;
  REQUIRE(set_option(o, OptionId::tp, "2", &err));
  REQUIRE(set_option(o, OptionId::tp, "4", &err));  // inherited value, then the step's own
  CHECK(*o.tp == 4);
  REQUIRE(set_option(o, OptionId::dp, "auto", &err));
  CHECK(*o.dp == 0);
  REQUIRE(set_option(o, OptionId::dp, "8", &err));
  CHECK(*o.dp == 8);
  CHECK(o.active());
}

TEST_CASE("garbage sizes are refused with the option name and a fix") {
  for (const char* bad : {"abc", "0", "-2", "2x", "", "99999999999", "auto"}) {
    MeshOptions o;
    std::string err;
    CHECK_FALSE(set_option(o, OptionId::pp, bad, &err));
    CHECK(err.find("--mesh-pp") != std::string::npos);
    CHECK(err.find("positive integer") != std::string::npos);
    CHECK_FALSE(o.pp);
  }
  MeshOptions o;
  std::string err;
  CHECK_FALSE(set_option(o, OptionId::dp, "half", &err));
  CHECK(err.find("'auto'") != std::string::npos);
  CHECK_FALSE(set_option(o, OptionId::tp, nullptr, &err));
}

TEST_CASE("order and template values are checked") {
  MeshOptions o;
  std::string err;
  CHECK(set_option(o, OptionId::order, "tp-cp-pp-dp", &err));
  CHECK_FALSE(set_option(o, OptionId::order, "tp-xx-pp", &err));
  CHECK(err.find("--mesh-order") != std::string::npos);
  CHECK(*o.order == "tp-cp-pp-dp");
  // A required argument swallows the next token ("--mesh-template --wrap"): refuse it.
  CHECK_FALSE(set_option(o, OptionId::template_file, "--wrap", &err));
  CHECK(err.find("--mesh-template") != std::string::npos);
  CHECK(set_option(o, OptionId::template_file, "job.toml", &err));
}

TEST_CASE("the plugin stays out of jobs that use no mesh option and --mesh-off wins") {
  MeshOptions o;
  CHECK_FALSE(o.active());
  std::string err;
  set_option(o, OptionId::dry_run, nullptr, &err);
  CHECK(o.active());
  set_option(o, OptionId::off, nullptr, &err);
  CHECK_FALSE(o.active());
}

namespace {
bool parse(std::vector<std::string> words, PlugstackArgs* a, std::string* err) {
  std::vector<char*> av;
  for (auto& w : words) av.push_back(w.data());
  return parse_plugstack_args(static_cast<int>(av.size()), av.data(), a, err);
}
}  // namespace

TEST_CASE("plugstack arguments") {
  PlugstackArgs a;
  std::string err;
  REQUIRE(parse({"default_order=tp-cp-pp-dp", "topology_xml=/etc/meshrun/node.xml", "nccl=off",
                 "allow_env=HF_HOME,WANDB_PROJECT"}, &a, &err));
  CHECK(a.default_order == "tp-cp-pp-dp");
  CHECK(a.topology_xml == "/etc/meshrun/node.xml");
  CHECK_FALSE(a.nccl);
  CHECK(a.allow_env == std::vector<std::string>{"HF_HOME", "WANDB_PROJECT"});
  REQUIRE(parse({}, &a, &err));
  CHECK(a.nccl);
  CHECK(a.allow_env.empty());
  CHECK(a.cpu_bind);
  CHECK(a.hca_per_node);  // one NCCL_IB_HCA per node unless the site says otherwise (NVIDIA/nccl#1478)
  REQUIRE(parse({"hca=rank", "cpu_bind=none", "socket_ifname=^docker,lo"}, &a, &err));
  CHECK_FALSE(a.hca_per_node);
  CHECK_FALSE(a.cpu_bind);
  CHECK(a.socket_ifname == "^docker,lo");
  REQUIRE(parse({"hca=node"}, &a, &err));
  CHECK(a.hca_per_node);
  CHECK(a.given == std::set<std::string>{"hca"});  // only given keys override the site file
  REQUIRE(parse({"site=/etc/meshrun/site.toml"}, &a, &err));
  CHECK(a.site_file == "/etc/meshrun/site.toml");
  CHECK_FALSE(parse({"site=site.toml"}, &a, &err));
  CHECK(err.find("absolute path") != std::string::npos);
}

TEST_CASE("unknown or malformed plugstack arguments fail with the argument named") {
  struct Case { const char* arg; const char* expect; };
  for (auto c : {Case{"colour=blue", "unknown key 'colour'"}, Case{"nccl=maybe", "nccl=auto or nccl=off"},
                 Case{"topology_xml=node.xml", "absolute path"}, Case{"default_order=tp-zz", "default_order"},
                 Case{"allow_env=OK,bad-name", "allow_env"}, Case{"verbose", "key=value"},
                 Case{"hca=all", "hca=node"}, Case{"cpu_bind=cores", "cpu_bind=numa"}, Case{"socket_ifname=", "interface"}}) {
    PlugstackArgs a;
    std::string err;
    CHECK_FALSE(parse({c.arg}, &a, &err));
    CHECK(err.find("plugstack.conf") == 0);
    CHECK(err.find(c.arg) != std::string::npos);
    CHECK(err.find(c.expect) != std::string::npos);
  }
}

TEST_CASE("mesh-env: NAME=VALUE pairs, refused with the fix otherwise") {
  MeshOptions o;
  std::string err;
  REQUIRE(set_option(o, OptionId::env, "NCCL_DEBUG=INFO,OMP_NUM_THREADS=4", &err));
  CHECK(o.env == std::vector<std::pair<std::string, std::string>>{{"NCCL_DEBUG", "INFO"}, {"OMP_NUM_THREADS", "4"}});
  CHECK(o.active());
  REQUIRE(set_option(o, OptionId::env, "A=x=y", &err));  // the first '=' splits
  CHECK(o.env == std::vector<std::pair<std::string, std::string>>{{"A", "x=y"}});
  for (const char* bad : {"", "NOEQUALS", "=1", "1A=2", "A=1,,B=2", "BAD-NAME=1"}) {
    INFO(bad);
    CHECK_FALSE(set_option(o, OptionId::env, bad, &err));
    CHECK(err.find("--mesh-env=") == 0);
  }
}

TEST_CASE("the preflight option asks for meshrun; the preflight step srun starts for it") {
  MeshOptions o;
  std::string err;
  CHECK_FALSE(o.active());
  REQUIRE(set_option(o, OptionId::preflight, nullptr, &err));
  CHECK(o.preflight);
  CHECK(o.active());
  REQUIRE(set_option(o, OptionId::tp, "2", &err));
  REQUIRE(set_option(o, OptionId::dp, "auto", &err));
  REQUIRE(set_option(o, OptionId::template_file, "job.toml", &err));
  PlugstackArgs args;
  char a1[] = "topology_xml=/etc/meshrun/node.xml", a2[] = "meshrun=/opt/meshrun/bin/meshrun", a3[] = "site=/etc/meshrun/site.toml";
  char* av[] = {a1, a2, a3};
  REQUIRE(parse_plugstack_args(3, av, &args, &err));
  CHECK(args.meshrun == "/opt/meshrun/bin/meshrun");
  StepShape shape;
  shape.nodes = 4;
  shape.tasks = 8;
  shape.cwd = "/home/u/run";
  StepPlan plan;
  plan.config.job.parallel.order = "tp-cp-pp-dp";
  const auto v = preflight_srun_args(o, args, shape, plan, args.meshrun);
  const std::vector<std::string> want{"srun", "--mpi=pmix", "--wait=30", "--nodes=4", "--ntasks-per-node=2",
                                      "/opt/meshrun/bin/meshrun", "preflight", "/home/u/run/job.toml", "--mesh-tp", "2",
                                      "--mesh-dp", "auto", "--mesh-order", "tp-cp-pp-dp", "--site",
                                      "/etc/meshrun/site.toml", "--topology", "/etc/meshrun/node.xml"};
  CHECK(v == want);
  // Unknown geometry (srun's arguments do not say): the allocation's defaults, as for the step itself.
  const auto bare = preflight_srun_args(MeshOptions{}, PlugstackArgs{}, StepShape{}, plan, "meshrun");
  CHECK(bare == std::vector<std::string>{"srun", "--mpi=pmix", "--wait=30", "meshrun", "preflight", "--mesh-order", "tp-cp-pp-dp"});
  char bad[] = "meshrun=relative/meshrun";
  char* bv[] = {bad};
  CHECK_FALSE(parse_plugstack_args(1, bv, &args, &err));
  CHECK(err.find("meshrun needs an absolute path") != std::string::npos);
}
