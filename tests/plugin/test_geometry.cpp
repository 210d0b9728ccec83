// The job shape sbatch/salloc will ask for, read from their arguments and #SBATCH lines.
#include <catch2/catch.hpp>

#include "job_geometry.hpp"

using namespace meshrun::plugin;

namespace {
JobGeometry geo(std::vector<std::string> args, const std::string& script = "", const std::string& prog = "sbatch") {
  JobGeometry g;
  parse_job_args(prog, args, &g);
  if (!script.empty()) apply_sbatch_lines(script, args, &g);
  return g;
}
TaskShape shape(const JobGeometry& g) {
  TaskShape t;
  std::string why;
  REQUIRE(task_shape(g, &t, &why));
  return t;
}
}  // namespace

TEST_CASE("command-line forms of nodes, tasks and GPUs") {
  auto g = geo({"-N", "2", "--ntasks-per-node=4", "--mesh-tp=2", "--gpus-per-node=h100:8", "job.sh", "-N", "9"});
  CHECK(g.nodes == 2);  // arguments after the script belong to the script
  CHECK(g.operand == "job.sh");
  auto t = shape(g);
  CHECK(t.tasks == 8);
  CHECK(t.tasks_per_node == 4);
  CHECK(t.gpus_per_node == 8);

  g = geo({"-N4", "-n", "16", "--gres=gpu:a100:4,nic:1", "--wrap", "srun true"});
  CHECK(g.wrap);
  CHECK(g.operand.empty());
  t = shape(g);
  CHECK(t.nodes == 4);
  CHECK(t.tasks_per_node == 4);
  CHECK(t.gpus_per_node == 4);

  g = geo({"--nodes", "2", "-o", "out.txt", "--exclusive", "-G", "16", "run.sh"});
  CHECK(g.operand == "run.sh");
  t = shape(g);
  CHECK(t.tasks == 2);  // Slurm's default: one task per node
  CHECK(t.gpus_per_node == 8);
}

TEST_CASE("SBATCH lines count unless the command line says otherwise") {
  std::string script =
      "#!/bin/bash\n#SBATCH -N 4\n#SBATCH --ntasks-per-node=8   # comment\n\n#SBATCH --mesh-tp=8\n"
      "srun hostname\n#SBATCH -N 9\n";
  auto g = geo({"job.sh"}, script);
  CHECK(g.nodes == 4);  // the #SBATCH after the first command is ignored, as sbatch does
  CHECK(g.ntasks_per_node == 8);
  g = geo({"-N", "2", "job.sh"}, script);
  CHECK(g.nodes == 2);
  CHECK(g.ntasks_per_node == 8);
}

TEST_CASE("unknown or uneven shapes") {
  JobGeometry g = geo({"-N", "2-4", "-n", "8", "job.sh"});
  TaskShape t;
  std::string why;
  CHECK_FALSE(task_shape(g, &t, &why));  // a node range: the job's srun steps check
  CHECK(why.empty());
  g = geo({"-N", "3", "-n", "8", "job.sh"});
  CHECK_FALSE(task_shape(g, &t, &why));
  CHECK(why.find("do not spread evenly") != std::string::npos);
  g = geo({"-N", "2", "-n", "8", "--ntasks-per-node=2", "job.sh"});
  CHECK_FALSE(task_shape(g, &t, &why));
  CHECK(why.find("disagree") != std::string::npos);
}

TEST_CASE("srun's own short options, unknown flags and missing operands") {
  auto g = geo({"-W", "5", "-N", "2", "-n4", "--label", "hostname"}, "", "srun");
  CHECK(g.operand == "hostname");
  CHECK(g.nodes == 2);
  CHECK(shape(g).tasks_per_node == 2);
  // An unknown long flag must not swallow the next option.
  g = geo({"--future-flag", "-N", "3", "job.sh"});
  CHECK(g.nodes == 3);
  // sbatch reading its script from stdin: the #SBATCH lines are unknown, so is the shape.
  g = geo({"-N", "2"});
  TaskShape t;
  std::string why;
  CHECK_FALSE(task_shape(g, &t, &why));
  CHECK(why.empty());
  // salloc needs no command.
  g = geo({"-N", "2", "--ntasks-per-node=2"}, "", "salloc");
  CHECK(shape(g).tasks == 4);
}

namespace {
std::map<std::string, std::string> alloc_env(std::map<std::string, std::string> more) {
  std::map<std::string, std::string> env = {{"SLURM_JOB_ID", "7"}};
  env.insert(more.begin(), more.end());
  return env;
}
bool srun_shape(std::vector<std::string> args, const std::map<std::string, std::string>& env, TaskShape* t,
                std::string* why) {
  return srun_step_shape(geo(std::move(args), "", "srun"), env, t, why);
}
}  // namespace

TEST_CASE("srun inside an allocation: the step's shape from its arguments and SLURM_* defaults") {
  TaskShape t;
  std::string why;
  // salloc -N1 -n2; srun --mesh-tp=2 --mesh-dry-run true (the ghost-step reproducer): 2 tasks on 1 node.
  REQUIRE(srun_shape({"--mesh-tp=2", "--mesh-dry-run", "true"},
                     alloc_env({{"SLURM_NNODES", "1"}, {"SLURM_NTASKS", "2"}, {"SLURM_TASKS_PER_NODE", "2"}}), &t, &why));
  CHECK(t.nodes == 1);
  CHECK(t.tasks == 2);
  // sbatch -N2 --ntasks-per-node=2 (observed on 22.05): srun -n2 -> 2 nodes x 1; srun alone -> 4 tasks.
  auto job = alloc_env({{"SLURM_NNODES", "2"}, {"SLURM_NTASKS", "4"}, {"SLURM_NTASKS_PER_NODE", "2"},
                        {"SLURM_GPUS_PER_NODE", "gpu:4"}});
  REQUIRE(srun_shape({"-n2", "true"}, job, &t, &why));
  CHECK((t.nodes == 2 && t.tasks == 2 && t.gpus_per_node == 4));
  REQUIRE(srun_shape({"true"}, job, &t, &why));
  CHECK((t.nodes == 2 && t.tasks == 4 && t.tasks_per_node == 2));
  REQUIRE(srun_shape({"-n1", "true"}, job, &t, &why));  // "can't run 1 processes on 2 nodes, setting nnodes to 1"
  CHECK((t.nodes == 1 && t.tasks == 1));
  // salloc -N2 without tasks: one per node; srun -N1: one task.
  REQUIRE(srun_shape({"-N1", "true"}, alloc_env({{"SLURM_NNODES", "2"}}), &t, &why));
  CHECK((t.nodes == 1 && t.tasks == 1));
  // Uneven over the allocation's nodes: refused with the reason.
  CHECK_FALSE(srun_shape({"-n3", "true"}, job, &t, &why));
  CHECK_THAT(why, Catch::Contains("3 tasks do not spread evenly over 2 nodes"));
  // What the parser does not model leaves the shape to the step (no refusal).
  for (auto args : std::vector<std::vector<std::string>>{{"-w", "n1", "true"}, {"--relative=1", "true"},
                                                         {"-n2", "a", ":", "-n2", "b"}, {"-N", "1-2", "true"},
                                                         {"--multi-prog", "conf"}}) {
    CHECK_FALSE(srun_shape(args, job, &t, &why));
    CHECK(why.empty());
  }
  // Outside an allocation only the arguments count.
  REQUIRE(srun_shape({"-N2", "--ntasks-per-node=4", "true"}, {{"SLURM_NTASKS", "99"}}, &t, &why));
  CHECK(t.tasks == 8);
}

TEST_CASE("non-block distributions are refused before the step, from -m or SLURM_DISTRIBUTION") {
  TaskShape t;
  std::string why;
  CHECK_FALSE(srun_shape({"-N2", "-n4", "--distribution=cyclic", "true"}, {}, &t, &why));
  CHECK_THAT(why, Catch::StartsWith("--distribution=cyclic places tasks on nodes out of rank order") &&
                      Catch::Contains("use --distribution=block"));
  CHECK_FALSE(srun_shape({"-m", "plane=2", "true"}, alloc_env({{"SLURM_NNODES", "2"}}), &t, &why));
  CHECK_THAT(why, Catch::Contains("plane=2"));
  CHECK_FALSE(srun_shape({"-w", "n1", "true"}, alloc_env({{"SLURM_NNODES", "2"}, {"SLURM_DISTRIBUTION", "arbitrary"}}),
                         &t, &why));
  CHECK_THAT(why, Catch::StartsWith("SLURM_DISTRIBUTION=arbitrary"));
  for (const char* ok : {"block", "block:cyclic", "block:block,Pack", "*:cyclic"}) {
    CHECK(distribution_problem(ok, "x").empty());
  }
  // A 10,000-character value is cut to 60 characters and "…".
  std::string huge(10000, 'c');
  std::string msg = distribution_problem(huge, "--distribution=" + huge);
  CHECK(msg.size() < 300);
  CHECK_THAT(msg, Catch::Contains("…"));
}

TEST_CASE("node ranges (-N MIN-MAX): every node count of the range") {
  JobGeometry g = geo({"-N", "2-4", "--ntasks-per-node=2", "--wrap", "true"});
  CHECK((g.nodes == 0 && g.nodes_min == 2 && g.nodes_max == 4));
  TaskShape t;
  std::string why;
  CHECK_FALSE(task_shape(g, &t, &why));  // not "one node": the count is unknown
  std::vector<TaskShape> shapes;
  REQUIRE(range_shapes(g, 64, &shapes));
  REQUIRE(shapes.size() == 3);
  CHECK((shapes[0].tasks == 4 && shapes[1].tasks == 6 && shapes[2].tasks == 8));
  g = geo({"--nodes=2-4", "-n", "8", "--wrap", "true"});
  REQUIRE(range_shapes(g, 64, &shapes));
  REQUIRE(shapes.size() == 2);  // 3 nodes do not divide 8 tasks
  CHECK((shapes[0].nodes == 2 && shapes[1].nodes == 4));
  g = geo({"-N", "1-1000", "--wrap", "true"});
  CHECK_FALSE(range_shapes(g, 64, &shapes));  // too wide: the steps check
}

TEST_CASE("heterogeneous steps: components, and one message naming their sizes and a layout that fits") {
  auto comps = het_components({"-n2", "--mesh-tp=2", "a", ":", "-n4", "b", ":", "x"});
  REQUIRE(comps.size() == 2);  // the last ':' is an argument of b (not followed by an option)
  CHECK(comps[1] == std::vector<std::string>{"-n4", "b", ":", "x"});
  CHECK(het_components({"echo", ":"}).size() == 1);
  TaskShape a{1, 2, 2, 0}, b{1, 4, 4, 0}, total;
  std::string why = het_shape_problem({a, b}, 2, "--mesh-tp=2", &total);
  CHECK(why == "a heterogeneous step with components of 2 tasks on 1 node and 4 tasks on 1 node (2 and 4 tasks per "
               "node): meshrun places all components' ranks as one block map, so every component needs the same "
               "tasks per node; e.g. srun -N1 --ntasks-per-node=2 --mesh-tp=2 : -N2 --ntasks-per-node=2 (6 ranks: "
               "tp·cp·pp = 2, dp = 3)");
  CHECK_THAT(het_shape_problem({a, b}, 2, "", &total, true), Catch::StartsWith("a heterogeneous step whose nodes run 2 and 4 tasks"));
  TaskShape c{2, 4, 2, 0};
  CHECK(het_shape_problem({a, c}, 2, "", &total).empty());
  CHECK((total.nodes == 3 && total.tasks == 6 && total.tasks_per_node == 2));
}
