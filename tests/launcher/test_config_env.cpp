// The SLURM_*/SBATCH_* layer of the configuration, and conflicts between layers named with their sources.
#include <catch2/catch.hpp>

#include "launch_common.hpp"

using namespace meshrun;

namespace {

const std::string kTiny = std::string(MESHRUN_SOURCE_DIR) + "/templates/tiny.toml";

Config with_env(const std::map<std::string, std::string>& env, const std::string& tmpl = kTiny,
                std::vector<std::string> sets = {}) {
  ConfigRequest req;
  req.template_path = tmpl;
  req.use_site = false;
  req.environment = &env;
  req.sets = std::move(sets);
  return build_config(req);
}

}  // namespace

TEST_CASE("sbatch's input variables set the job section") {
  Config c = with_env({{"SBATCH_PARTITION", "gpu"}, {"SBATCH_ACCOUNT", "proj1"}, {"SBATCH_TIMELIMIT", "02:00:00"}});
  CHECK(c.job.job.partition == "gpu");
  CHECK(c.job.job.account == "proj1");
  CHECK(c.job.job.time == "02:00:00");
  CHECK(c.origin_of("job.partition").str() == "environment SBATCH_PARTITION");
  // --set wins over the environment.
  Config s = with_env({{"SBATCH_PARTITION", "gpu"}}, kTiny, {"job.partition=debug"});
  CHECK(s.job.job.partition == "debug");
  CHECK(s.origin_of("job.partition").kind == SourceKind::set);
}

TEST_CASE("the step's nodes and tasks override the job's and the template's") {
  Config job = with_env({{"SLURM_JOB_NUM_NODES", "4"}, {"SLURM_JOB_NODELIST", "n[1-4]"}, {"SLURM_NTASKS_PER_NODE", "2"}});
  CHECK(job.job.cluster.nodes == 4);
  CHECK(job.job.cluster.hostlist == "n[1-4]");
  CHECK(job.job.cluster.gpus_per_node == 2);
  CHECK(job.origin_of("cluster.gpus_per_node").where == "SLURM_NTASKS_PER_NODE");

  Config step = with_env({{"SLURM_JOB_NUM_NODES", "4"}, {"SLURM_JOB_NODELIST", "n[1-4]"},
                          {"SLURM_STEP_NUM_NODES", "2"}, {"SLURM_STEP_NODELIST", "n[3-4]"},
                          {"SLURM_STEP_TASKS_PER_NODE", "2(x2)"}});
  CHECK(step.job.cluster.nodes == 2);
  CHECK(step.job.cluster.hostlist == "n[3-4]");
  CHECK(step.job.cluster.gpus_per_node == 2);
  CHECK(step.origin_of("cluster.nodes").where == "SLURM_STEP_NUM_NODES");
}

TEST_CASE("ranks per node come only from variables that count requested tasks or GPUs") {
  // A bare `salloc -N2` says one task per node; that is not the GPU count.
  Config salloc = with_env({{"SLURM_JOB_NUM_NODES", "2"}, {"SLURM_TASKS_PER_NODE", "1(x2)"}});
  CHECK(salloc.job.cluster.gpus_per_node == 4);  // the template's
  Config gres = with_env({{"SLURM_GPUS_PER_NODE", "a100:8"}});
  CHECK(gres.job.cluster.gpus_per_node == 8);
  CHECK(gres.origin_of("cluster.gpus_per_node").where == "SLURM_GPUS_PER_NODE");
}

TEST_CASE("uneven or malformed task counts are refused with the variable's name") {
  CHECK_THROWS_WITH(with_env({{"SLURM_STEP_TASKS_PER_NODE", "2(x3),1"}}),
                    Catch::Contains("SLURM_STEP_TASKS_PER_NODE=2(x3),1") && Catch::Contains("--ntasks-per-node"));
  CHECK_THROWS_WITH(with_env({{"SLURM_NTASKS_PER_NODE", "lots"}}), Catch::Contains("SLURM_NTASKS_PER_NODE=lots"));
  CHECK_THROWS_WITH(with_env({{"SLURM_JOB_NUM_NODES", "two"}}), Catch::Contains("SLURM_JOB_NUM_NODES"));
}

TEST_CASE("a conflict between layers names each layer's value and location") {
  // tiny fixes tp=2 and dp=auto on 1 node x 4; an allocation of 3 nodes x 2 tasks gives 6 ranks: fine for
  // dp=auto (3); with dp fixed by --set it cannot match.
  std::map<std::string, std::string> env{{"SLURM_JOB_NUM_NODES", "3"}, {"SLURM_NTASKS_PER_NODE", "2"}};
  Config ok = with_env(env, kTiny, {"training.global_batch_size=24"});
  CHECK(launch::resolve(ok).layout.dp == 3);

  Config bad = with_env(env, kTiny, {"parallel.dp=2", "training.global_batch_size=24"});
  try {
    launch::resolve(bad);
    FAIL("expected a ConfigError");
  } catch (const ConfigError& e) {
    std::string m = e.what();
    CHECK_THAT(m, Catch::Contains("4 ranks but the cluster has 6 GPUs"));
    CHECK_THAT(m, Catch::Contains("cluster.nodes=3 from environment SLURM_JOB_NUM_NODES"));
    CHECK_THAT(m, Catch::Contains("cluster.gpus_per_node=2 from environment SLURM_NTASKS_PER_NODE"));
    CHECK_THAT(m, Catch::Contains("parallel.dp=2 from set --set parallel.dp=2"));
    CHECK_THAT(m, Catch::Contains("parallel.tp=2 from template") && Catch::Contains("tiny.toml:"));
    CHECK(m.find('\n') == std::string::npos);
  }
}

TEST_CASE("every problem of a resolved layout is a ConfigError, not a crash") {
  CHECK_THROWS_AS(launch::resolve(with_env({}, kTiny, {"parallel.tp=3"})), ConfigError);
  CHECK_THROWS_AS(launch::resolve(with_env({}, kTiny, {"parallel.order=tp-pp-xx"})), ConfigError);
  CHECK_THROWS_AS(launch::resolve(with_env({}, kTiny, {"cluster.hostlist=n[1-"})), ConfigError);
  CHECK_NOTHROW(launch::resolve(with_env({}, kTiny)));
}
