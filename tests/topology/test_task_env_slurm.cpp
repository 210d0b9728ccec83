// TaskContext and GpuAllocation from Slurm's variables.
#include <catch2/catch.hpp>

#include "meshrun/task_env.hpp"

using namespace meshrun;
using Env = std::map<std::string, std::string>;

namespace {
Env base() {
  return {{"SLURM_PROCID", "11"},       {"SLURM_NTASKS", "16"},          {"SLURM_LOCALID", "3"},
          {"SLURM_NODEID", "1"},        {"SLURM_JOB_ID", "4242"},        {"SLURM_STEP_ID", "3"},
          {"SLURM_STEP_TASKS_PER_NODE", "8(x2)"}, {"SLURM_STEP_NODELIST", "dgx[07-08]"},
          {"SLURM_JOB_NODELIST", "dgx[01-08]"}};
}
}  // namespace

TEST_CASE("task context from Slurm variables") {
  const TaskContext c = task_context_from_slurm(base());
  CHECK(c.rank == 11);
  CHECK(c.world == 16);
  CHECK(c.local_rank == 3);
  CHECK(c.local_world == 8);
  CHECK(c.node_id == 1);
  CHECK(c.master_addr == "dgx07");  // first host of the step, not of the job
  CHECK(c.job_id == 4242);
  CHECK(c.step_id == 3);
  Env e = base();
  e.erase("SLURM_STEP_TASKS_PER_NODE");
  e["SLURM_TASKS_PER_NODE"] = "2,2(x3)";
  e["SLURM_NODEID"] = "3";
  e["SLURM_LOCALID"] = "1";
  CHECK(task_context_from_slurm(e).local_world == 2);
  e["SLURM_NODEID"] = "1";
  CHECK(task_context_from_slurm(e).local_world == 2);
  e.erase("SLURM_STEP_NODELIST");
  CHECK(task_context_from_slurm(e).master_addr == "dgx01");
}

TEST_CASE("task context errors name the variable") {
  Env e = base();
  e.erase("SLURM_PROCID");
  CHECK_THROWS_WITH(task_context_from_slurm(e), Catch::Contains("SLURM_PROCID is not set"));
  e = base();
  e["SLURM_PROCID"] = "x1";
  CHECK_THROWS_WITH(task_context_from_slurm(e), Catch::Contains("SLURM_PROCID='x1'"));
  e["SLURM_PROCID"] = "16";
  CHECK_THROWS_AS(task_context_from_slurm(e), TaskEnvError);
  e = base();
  e["SLURM_STEP_TASKS_PER_NODE"] = "8(x";
  CHECK_THROWS_WITH(task_context_from_slurm(e), Catch::Contains("--ntasks-per-node"));
  e = base();
  e["SLURM_STEP_NODELIST"] = "dgx[07-";
  CHECK_THROWS_WITH(task_context_from_slurm(e), Catch::Contains("SLURM_STEP_NODELIST"));
}

TEST_CASE("GPU allocation: ConstrainDevices inferred from CUDA_VISIBLE_DEVICES") {
  GpuAllocation a = gpu_allocation_from_slurm({{"SLURM_STEP_GPUS", "4,5,6,7"}, {"CUDA_VISIBLE_DEVICES", "0,1,2,3"}});
  CHECK(a.managed);
  CHECK(a.step_gpus == std::vector<int>{4, 5, 6, 7});
  CHECK(a.constrained);
  a = gpu_allocation_from_slurm({{"SLURM_STEP_GPUS", "4,5,6,7"}, {"CUDA_VISIBLE_DEVICES", "4,5,6,7"}});
  CHECK_FALSE(a.constrained);
  a = gpu_allocation_from_slurm({{"SLURM_STEP_GPUS", "4,5,6,7"}, {"CUDA_VISIBLE_DEVICES", "4,5,6,7"},
                                 {"MESHRUN_CONSTRAIN_DEVICES", "1"}});
  CHECK(a.constrained);
  // Batch step: only SLURM_JOB_GPUS.
  a = gpu_allocation_from_slurm({{"SLURM_JOB_GPUS", "0-3"}});
  CHECK(a.step_gpus == std::vector<int>{0, 1, 2, 3});
  // Per-task binding: task 3 sees "0" under a per-task cgroup, "3" without.
  Env per_task = {{"SLURM_STEP_GPUS", "0,1,2,3,4,5,6,7"}, {"SLURM_GPUS_PER_TASK", "h100:1"},
                  {"SLURM_LOCALID", "3"}, {"CUDA_VISIBLE_DEVICES", "0"}};
  a = gpu_allocation_from_slurm(per_task);
  CHECK(a.gpus_per_task == 1);
  CHECK(a.constrained);
  per_task["CUDA_VISIBLE_DEVICES"] = "3";
  CHECK_FALSE(gpu_allocation_from_slurm(per_task).constrained);
  // No gres variables: the launcher's CUDA_VISIBLE_DEVICES, else nothing managed.
  a = gpu_allocation_from_slurm({{"CUDA_VISIBLE_DEVICES", "3,2"}});
  CHECK(a.managed);
  CHECK(a.step_gpus == std::vector<int>{2, 3});
  CHECK_FALSE(gpu_allocation_from_slurm({}).managed);
  CHECK_THROWS_WITH(gpu_allocation_from_slurm({{"SLURM_STEP_GPUS", "MIG-1234"}}), Catch::Contains("MIG"));
}

TEST_CASE("from Slurm variables to a task environment") {
  Env e = base();
  e["SLURM_STEP_GPUS"] = "0,1,2,3,4,5,6,7";
  e["CUDA_VISIBLE_DEVICES"] = "0,1,2,3,4,5,6,7";
  const TaskContext c = task_context_from_slurm(e);
  const GpuAllocation a = gpu_allocation_from_slurm(e);
  ClusterSpec cs;
  cs.node_type = "dgx-h100";
  cs.nodes = 2;
  std::vector<Problem> problems;
  const Cluster cluster = resolve_cluster(cs, &problems);
  LayoutSpec ls;
  ls.tp = 8;
  const auto layout = resolve_layout(ls, cluster.gpus(), &problems);
  REQUIRE(layout);
  NodeTopology cpu;
  cpu.source = "test";
  const TaskEnv env = compute_task_env(RankMap(*layout, cluster), c, cpu, a, EnvPolicy{}, {});
  CHECK(*env.get("RANK") == "11");
  CHECK(*env.get("MASTER_ADDR") == "dgx07");
  CHECK(*env.get("CUDA_VISIBLE_DEVICES") == "0,1,2,3,4,5,6,7");
  CHECK(*env.get("MESHRUN_CUDA_DEVICE") == "3");
}

TEST_CASE("a step Slurm did not place in equal blocks is refused by every task, not only the misplaced ones") {
  // 2 nodes x 2 tasks, cyclic: node 0 runs tasks 0,2 and node 1 runs 1,3. Ranks 0 and 3 sit where the block
  // map puts them; they must refuse too (a partial launch would leave them running).
  for (const char* rank : {"0", "2"}) {
    Env e = {{"SLURM_PROCID", rank}, {"SLURM_NTASKS", "4"}, {"SLURM_LOCALID", rank[0] == '0' ? "0" : "1"},
             {"SLURM_NODEID", "0"}, {"SLURM_STEP_TASKS_PER_NODE", "2(x2)"}, {"SLURM_STEP_NODELIST", "n[1-2]"},
             {"SLURM_GTIDS", "0,2"}};
    CHECK_THROWS_WITH(task_context_from_slurm(e), Catch::Contains("SLURM_GTIDS") && Catch::Contains("--distribution=block"));
    e.erase("SLURM_GTIDS");
    e["SLURM_DISTRIBUTION"] = "cyclic";
    CHECK_THROWS_WITH(task_context_from_slurm(e), Catch::StartsWith("SLURM_DISTRIBUTION=cyclic places tasks"));
    e["SLURM_DISTRIBUTION"] = "block:cyclic";  // the part after ':' is about sockets inside the node
    CHECK_NOTHROW(task_context_from_slurm(e));
    e["SLURM_GTIDS"] = "0,1";
    CHECK_NOTHROW(task_context_from_slurm(e));
  }
  // Uneven counts (3 + 1): the node with the "right" count must refuse too.
  Env e = {{"SLURM_PROCID", "3"}, {"SLURM_NTASKS", "4"}, {"SLURM_LOCALID", "0"}, {"SLURM_NODEID", "1"},
           {"SLURM_STEP_TASKS_PER_NODE", "3,1"}, {"SLURM_STEP_NODELIST", "n[1-2]"}};
  CHECK_THROWS_WITH(task_context_from_slurm(e), Catch::Contains("different task counts"));
  // A 10,000-character value is cut in the message.
  std::string many = "3";
  for (int i = 0; i < 5000; ++i) many += ",1";
  e["SLURM_STEP_TASKS_PER_NODE"] = many;
  try {
    task_context_from_slurm(e);
    FAIL("accepted");
  } catch (const TaskEnvError& x) {
    CHECK(std::string(x.what()).size() < 300);
    CHECK_THAT(x.what(), Catch::Contains("…"));
  }
}

TEST_CASE("task_env_from_slurm is the three-call path the plugin and exec share") {
  TopologyRequest r;
  r.xml_path = std::string(MESHRUN_TOPO_FIXTURES) + "/dgx-h100.xml";
  r.node_type = find_node_type("dgx-h100");
  const NodeTopology topo = load_topology(r);
  ClusterSpec cs;
  cs.node_type = "dgx-h100";
  cs.nodes = 2;
  cs.hostlist = "dgx[07-08]";
  std::vector<Problem> problems;
  const Cluster cluster = resolve_cluster(cs, &problems);
  LayoutSpec ls;
  ls.tp = 8;
  const auto layout = resolve_layout(ls, cluster.gpus(), &problems);
  REQUIRE(layout);
  const RankMap map(*layout, cluster);
  Env e = base();
  e["SLURM_STEP_GPUS"] = "0,1,2,3,4,5,6,7";
  TaskContext ctx = task_context_from_slurm(e);
  const TaskEnv three = compute_task_env(map, ctx, topo, gpu_allocation_from_slurm(e), EnvPolicy{}, {});
  const TaskEnv one = task_env_from_slurm(map, e, topo, EnvPolicy{}, {}, CpuSet{});
  CHECK(one.vars == three.vars);
  CHECK(*one.get("RANK") == "11");
  CHECK(*one.get("MESHRUN_TP_RANK") == "3");
  e["SLURM_DISTRIBUTION"] = "cyclic";
  CHECK_THROWS_AS(task_env_from_slurm(map, e, topo, EnvPolicy{}, {}, CpuSet{}), TaskEnvError);
}
