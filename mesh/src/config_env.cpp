// The SLURM_*/SBATCH_* environment layer: an allocation's facts override the template's guesses.
//
// Precedence inside the layer follows how specific a variable is: the job's values first, then the
// step's (a step may run on a subset of the job's nodes), so the map a task computes is its step's map.
// Ranks per node (the rank map's "gpus_per_node": one task per GPU) is taken only from variables that
// count tasks the user asked for; SLURM_TASKS_PER_NODE of a bare `salloc -N2` says 1 and would be wrong.
#include <charconv>
#include <string>
#include <string_view>

#include "meshrun/config.hpp"
#include "meshrun/hostlist.hpp"

namespace meshrun {
namespace {

// "4" -> 4, "4(x2)" -> 4; a list of different counts ("2(x3),1") -> 0 = not uniform.
int uniform_count(std::string_view text) {  // the same count on every node: it; uneven: 0; malformed: -1
  const auto runs = parse_task_counts(text);
  if (!runs || runs->front().count < 1) return -1;
  for (const TaskCountRun& r : *runs)
    if (r.count != runs->front().count) return 0;
  return runs->front().count;
}

// SLURM_GPUS_PER_NODE may carry a type: "a100:4" -> "4".
std::string strip_gres_type(const std::string& v) {
  auto colon = v.rfind(':');
  return colon == std::string::npos ? v : v.substr(colon + 1);
}

}  // namespace

void apply_environment(Config& cfg, const std::map<std::string, std::string>& env) {
  auto get = [&](const char* var) -> const std::string* {
    auto it = env.find(var);
    return it == env.end() || it->second.empty() ? nullptr : &it->second;
  };
  auto set = [&](const char* var, const char* key, const std::string& value) {
    apply_value(cfg, key, value, Origin{SourceKind::environment, var});
  };

  // sbatch's own input variables (sbatch.1 "INPUT ENVIRONMENT VARIABLES").
  static const std::pair<const char*, const char*> sbatch_vars[] = {
      {"SBATCH_JOB_NAME", "job.name"},   {"SBATCH_TIMELIMIT", "job.time"}, {"SBATCH_PARTITION", "job.partition"},
      {"SBATCH_ACCOUNT", "job.account"}, {"SBATCH_QOS", "job.qos"},
  };
  for (const auto& [var, key] : sbatch_vars)
    if (const std::string* v = get(var)) set(var, key, *v);

  // Node count and names: job, then step.
  for (const char* var : {"SLURM_NNODES", "SLURM_JOB_NUM_NODES", "SLURM_STEP_NUM_NODES"})
    if (const std::string* v = get(var)) set(var, "cluster.nodes", *v);
  for (const char* var : {"SLURM_JOB_NODELIST", "SLURM_STEP_NODELIST"})
    if (const std::string* v = get(var)) set(var, "cluster.hostlist", *v);

  // Ranks per node, least specific first.
  if (const std::string* v = get("SLURM_GPUS_PER_NODE")) set("SLURM_GPUS_PER_NODE", "cluster.gpus_per_node", strip_gres_type(*v));
  for (const char* var : {"SLURM_NTASKS_PER_NODE", "SLURM_STEP_TASKS_PER_NODE"}) {
    const std::string* v = get(var);
    if (!v) continue;
    int n = uniform_count(*v);
    if (n == 0)
      throw ConfigError(std::string(var) + "=" + *v +
                        ": the tasks are spread unevenly over the nodes; meshrun places one task per GPU with the "
                        "same count on every node: use --ntasks-per-node (and -N) instead of -n");
    if (n < 0)
      throw ConfigError(std::string(var) + "=" + *v + ": not a Slurm task count like 8 or 8(x4); unset it or fix it");
    set(var, "cluster.gpus_per_node", std::to_string(n));
  }
}

}  // namespace meshrun
