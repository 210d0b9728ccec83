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
  e["SLURM_TASKS_PER_NODE"] = "2(x3),1";
  e["SLURM_NODEID"] = "3";
  e["SLURM_LOCALID"] = "0";
  CHECK(task_context_from_slurm(e).local_world == 1);
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
