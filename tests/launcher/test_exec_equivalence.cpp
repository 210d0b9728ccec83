// `meshrun exec` under faked Slurm variables, for every rank of a 2-node layout on a DGX-H100-like topology,
// gives each task exactly the environment the SPANK plugin computes for that rank (the plugin's own planning
// and task_init path, called in-process). Both end in compute_task_env(); this proves that nothing between
// the Slurm variables and the exec'd program adds, drops or changes a value.
#include <sched.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>

#include "meshrun/rank_map.hpp"
#include "step_plan.hpp"
#include "task_setup.hpp"

using namespace meshrun;

namespace {

const std::string kSrc = MESHRUN_SOURCE_DIR;
const std::string kFixture = kSrc + "/tests/topology/fixtures/dgx-h100.xml";
constexpr int kNodes = 2, kPerNode = 8;

std::string write_template() {
  auto path = std::filesystem::temp_directory_path() / ("meshrun-exec-eq-" + std::to_string(::getpid()) + ".toml");
  std::ofstream(path) << "[cluster]\nnodes = 2\nnode_type = \"dgx-h100\"\nhostlist = \"gpu[01-02]\"\n"
                         "[parallel]\ntp = 2\npp = 2\ndp = \"auto\"\n"
                         "[training]\nglobal_batch_size = 8\nmicro_batch_size = 1\n"
                         "[env]\nNCCL_DEBUG = \"WARN\"\nOMP_NUM_THREADS = \"4\"\n";
  return path.string();
}

std::map<std::string, std::string> slurm_env(int rank) {
  return {{"SLURM_PROCID", std::to_string(rank)},     {"SLURM_NTASKS", std::to_string(kNodes * kPerNode)},
          {"SLURM_LOCALID", std::to_string(rank % kPerNode)}, {"SLURM_NODEID", std::to_string(rank / kPerNode)},
          {"SLURM_JOB_ID", "4242"},                    {"SLURM_STEP_ID", "3"},
          {"SLURM_JOB_NUM_NODES", "2"},                {"SLURM_STEP_NUM_NODES", "2"},
          {"SLURM_JOB_NODELIST", "gpu[01-02]"},        {"SLURM_STEP_NODELIST", "gpu[01-02]"},
          {"SLURM_STEP_TASKS_PER_NODE", "8(x2)"},      {"SLURM_TASKS_PER_NODE", "8(x2)"},
          {"SLURM_STEP_GPUS", "0,1,2,3,4,5,6,7"},      {"CUDA_VISIBLE_DEVICES", "0,1,2,3,4,5,6,7"},
          {"SLURMD_NODENAME", rank < kPerNode ? "gpu01" : "gpu02"}};
}

// Runs `meshrun exec ... -- /usr/bin/env` in exactly `env` and returns the environment the program saw.
std::map<std::string, std::string> exec_env(const std::string& tmpl, const std::map<std::string, std::string>& env,
                                            const std::string& site = "") {
  std::string cmd = "env -i";
  for (const auto& [k, v] : env) cmd += " '" + k + "=" + v + "'";
  cmd += std::string(" '") + MESHRUN_BIN + "' exec " + (site.empty() ? "--no-site" : "--site '" + site + "'") +
         " --template '" + tmpl + "' --topology '" + kFixture + "' -- /usr/bin/env";
  std::map<std::string, std::string> out;
  FILE* p = ::popen(cmd.c_str(), "r");
  REQUIRE(p);
  char line[8192];
  while (std::fgets(line, sizeof line, p)) {
    std::string s(line);
    if (!s.empty() && s.back() == '\n') s.pop_back();
    auto eq = s.find('=');
    if (eq != std::string::npos) out[s.substr(0, eq)] = s.substr(eq + 1);
  }
  int status = ::pclose(p);
  REQUIRE(status == 0);
  return out;
}

CpuSet own_cpus() {
  cpu_set_t mask;
  CPU_ZERO(&mask);
  REQUIRE(sched_getaffinity(0, sizeof mask, &mask) == 0);
  CpuSet s;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &mask)) s.cpus.push_back(c);
  return s;
}

// Differences between what the plugin sets and what exec's program saw; MESHRUN_*/torchrun names that exec
// set beyond the plugin's list count as differences too.
std::vector<std::string> differences(const TaskEnv& plugin, const std::map<std::string, std::string>& seen) {
  std::vector<std::string> d;
  std::map<std::string, std::string> expected(plugin.vars.begin(), plugin.vars.end());
  for (const auto& [k, v] : expected) {
    auto it = seen.find(k);
    if (it == seen.end()) d.push_back(k + " missing (plugin: " + v + ")");
    else if (it->second != v) d.push_back(k + "=" + it->second + " (plugin: " + v + ")");
  }
  for (const auto& [k, v] : seen)
    if ((k.rfind("MESHRUN_", 0) == 0 || k.rfind("NCCL_", 0) == 0 || k == "RANK" || k == "LOCAL_RANK" ||
         k == "MASTER_PORT") && !expected.count(k))
      d.push_back(k + "=" + v + " not set by the plugin");
  return d;
}

}  // namespace

TEST_CASE("meshrun exec sets, for every rank, the plugin's environment") {
  std::string tmpl = write_template();
  plugin::MeshOptions opts;
  opts.template_file = tmpl;
  plugin::PlugstackArgs args;
  args.topology_xml = kFixture;
  plugin::StepShape shape;
  shape.nodes = kNodes;
  shape.tasks = kNodes * kPerNode;
  shape.gpus_per_node = kPerNode;
  shape.hostlist = "gpu[01-02]";
  plugin::StepPlan plan = plugin::plan_step(opts, args, shape);
  INFO(plan.error_text());
  REQUIRE(plan.problems.empty());
  REQUIRE(plan.layout);
  RankMap map(*plan.layout, plan.cluster);
  REQUIRE(map.world() == kNodes * kPerNode);
  plugin::NodeSetup node = plugin::load_node_setup(args, plan.cluster.type, plan.config);
  CpuSet allowed = own_cpus();

  std::map<std::string, std::string> first;
  for (int rank = 0; rank < map.world(); ++rank) {
    auto env = slurm_env(rank);
    TaskEnv expected = plugin::task_environment(map, node, env, allowed, node.user_env);
    auto seen = exec_env(tmpl, env);
    INFO("rank " << rank);
    auto diff = differences(expected, seen);
    for (const auto& x : diff) UNSCOPED_INFO(x);
    CHECK(diff.empty());
    // The values are real, not vacuous: rank, TP coordinate, GPU and NIC are per rank (all GPUs stay visible
    // so CUDA IPC/NVLink P2P keep working; MESHRUN_CUDA_DEVICE names the task's device).
    CHECK(seen["RANK"] == std::to_string(rank));
    CHECK(seen["MESHRUN_TP_RANK"] == std::to_string(rank % 2));
    CHECK(seen["MESHRUN_GPU"] == std::to_string(rank % kPerNode));
    CHECK(seen["MESHRUN_CUDA_DEVICE"] == std::to_string(rank % kPerNode));
    CHECK(seen["NCCL_IB_HCA"].rfind("=mlx5_", 0) == 0);
    CHECK(seen["NCCL_DEBUG"] == "WARN");
    if (rank == 0) first = seen;
  }
  // Negative control: the comparison notices a task that is not the rank the plugin computed.
  TaskEnv rank1 = plugin::task_environment(map, node, slurm_env(1), allowed, node.user_env);
  CHECK_FALSE(differences(rank1, first).empty());
  std::filesystem::remove(tmpl);
}

TEST_CASE("meshrun exec refuses a task that does not fit the layout") {
  std::string tmpl = write_template();
  auto env = slurm_env(3);
  env["SLURM_NTASKS"] = "12";  // the layout needs 16
  std::string cmd = "env -i";
  for (const auto& [k, v] : env) cmd += " '" + k + "=" + v + "'";
  cmd += std::string(" '") + MESHRUN_BIN + "' exec --no-site --template '" + tmpl + "' --topology '" + kFixture +
         "' -- /bin/echo SHOULD-NOT-RUN 2>&1";
  FILE* p = ::popen(cmd.c_str(), "r");
  REQUIRE(p);
  std::string out;
  char buf[4096];
  while (std::fgets(buf, sizeof buf, p)) out += buf;
  int status = ::pclose(p);
  CHECK(WEXITSTATUS(status) == 2);
  CHECK_THAT(out, Catch::Contains("meshrun exec:") && !Catch::Contains("SHOULD-NOT-RUN"));
  std::filesystem::remove(tmpl);
}

TEST_CASE("one site policy: the plugin (site=) and meshrun exec (--site) give the same environment") {
  std::string tmpl = write_template();
  {
    std::ofstream(tmpl, std::ios::app) << "MY_VAR = \"from-template\"\n";
  }
  const std::string site = (std::filesystem::temp_directory_path() /
                            ("meshrun-exec-eq-site-" + std::to_string(::getpid()) + ".toml")).string();
  std::ofstream(site) << "[site]\nhca_scope = \"rank\"\nport_base = 20500\nallow_env = \"MY_VAR\"\n"
                         "socket_ifname = \"=eth9\"\ncpu_bind = \"none\"\n[env]\nSITE_VAR = \"site-value\"\n";
  plugin::MeshOptions opts;
  opts.template_file = tmpl;
  plugin::PlugstackArgs args;
  args.topology_xml = kFixture;
  args.site_file = site;
  plugin::StepShape shape;
  shape.nodes = kNodes;
  shape.tasks = kNodes * kPerNode;
  shape.gpus_per_node = kPerNode;
  shape.hostlist = "gpu[01-02]";
  plugin::StepPlan plan = plugin::plan_step(opts, args, shape);
  INFO(plan.error_text());
  REQUIRE(plan.problems.empty());
  RankMap map(*plan.layout, plan.cluster);
  plugin::NodeSetup node = plugin::load_node_setup(args, plan.cluster.type, plan.config);
  CpuSet allowed = own_cpus();
  for (int rank : {0, 5, 13}) {
    INFO("rank " << rank);
    TaskEnv expected = plugin::task_environment(map, node, slurm_env(rank), allowed, node.user_env);
    auto seen = exec_env(tmpl, slurm_env(rank), site);
    auto diff = differences(expected, seen);
    for (const auto& x : diff) UNSCOPED_INFO(x);
    CHECK(diff.empty());
    // The site file's whole policy reached both: per-rank HCA (its choice), its port range, its variables,
    // its allow-list (MY_VAR from the template), its socket interface, no CPU binding.
    CHECK(seen["NCCL_IB_HCA"] == "=" + seen["MESHRUN_NIC"]);
    CHECK(seen["MASTER_PORT"] == std::to_string(20500 + (4242 % 750) * 16 + 3));
    CHECK(seen["SITE_VAR"] == "site-value");
    CHECK(seen["MY_VAR"] == "from-template");
    CHECK(seen["NCCL_SOCKET_IFNAME"] == "=eth9");
    CHECK(seen.count("MESHRUN_CPUS") == 0);
  }
  // A plugstack argument given explicitly overrides the site file (documented), so here the two differ.
  args.given.insert("hca");
  args.hca_per_node = true;
  plugin::NodeSetup overridden = plugin::load_node_setup(args, plan.cluster.type, plan.config);
  TaskEnv node_wide = plugin::task_environment(map, overridden, slurm_env(0), allowed, overridden.user_env);
  CHECK(*node_wide.get("NCCL_IB_HCA") == "=mlx5_0,mlx5_3,mlx5_4,mlx5_5,mlx5_6,mlx5_9,mlx5_10,mlx5_11");
  CHECK_FALSE(differences(node_wide, exec_env(tmpl, slurm_env(0), site)).empty());
  std::filesystem::remove(tmpl);
  std::filesystem::remove(site);
}
