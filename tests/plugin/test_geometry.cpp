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
