// TaskContext and GpuAllocation from a map of Slurm variables (pure: the caller passes the environment).
#include <algorithm>
#include <charconv>

#include "meshrun/hostlist.hpp"
#include "meshrun/task_env.hpp"

namespace meshrun {
namespace {

const std::string* find(const std::map<std::string, std::string>& env, const char* name) {
  auto it = env.find(name);
  return it == env.end() ? nullptr : &it->second;
}

bool to_long(const std::string& s, long long* v) {
  auto r = std::from_chars(s.data(), s.data() + s.size(), *v);
  return r.ec == std::errc() && r.ptr == s.data() + s.size();
}

long long require_int(const std::map<std::string, std::string>& env, const char* name, long long lo, long long hi) {
  const std::string* v = find(env, name);
  long long x = 0;
  if (!v) throw TaskEnvError(std::string(name) + " is not set; run the task with srun inside a Slurm allocation");
  if (!to_long(*v, &x) || x < lo || x > hi)
    throw TaskEnvError(std::string(name) + "='" + *v + "' is not an integer in " + std::to_string(lo) + ".." +
                       std::to_string(hi) + "; check the Slurm environment");
  return x;
}

long long optional_int(const std::map<std::string, std::string>& env, const char* name, long long fallback) {
  const std::string* v = find(env, name);
  long long x = 0;
  return v && to_long(*v, &x) ? x : fallback;
}

// "2(x3),1" -> tasks on node `node`; -1 if malformed or too short.
int tasks_on_node(const std::string& spec, int node) {
  const auto runs = parse_task_counts(spec);
  return runs ? meshrun::tasks_on_node(*runs, node) : -1;
}

// "0,1,2" or "0-3,6" -> ids; nullopt for anything else (MIG or GPU UUIDs).
std::optional<std::vector<int>> id_list(const std::string& text) {
  if (text.empty()) return std::vector<int>{};
  auto set = parse_cpuset(text);
  if (!set || set->count() > 4096) return std::nullopt;
  return set->cpus;
}

std::string cut(const std::string& v) { return v.size() > 60 ? v.substr(0, 60) + "…" : v; }

// The rank map is Slurm's block distribution with the same task count on every node. Every task of the step
// checks the step-wide facts (so all of them refuse together, never a partial launch): the distribution, the
// task count of every node, and that this node's global task ids are one consecutive block.
void check_block_placement(const std::map<std::string, std::string>& env, const TaskContext& ctx) {
  if (const std::string* d = find(env, "SLURM_DISTRIBUTION")) {
    const std::string node_part = d->substr(0, d->find_first_of(":,"));
    if (!node_part.empty() && node_part != "block" && node_part != "*")
      throw TaskEnvError("SLURM_DISTRIBUTION=" + cut(*d) + " places tasks on nodes out of rank order; meshrun's "
                         "rank map is Slurm's block distribution: use --distribution=block (the default)");
  }
  for (const char* name : {"SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"}) {
    const std::string* v = find(env, name);
    if (!v) continue;
    // "2(x3),1": every node's count must be the same (malformed: the local count check reports it).
    if (const auto runs = parse_task_counts(*v))
      for (const TaskCountRun& r : *runs)
        if (r.count != runs->front().count)
          throw TaskEnvError(std::string(name) + "=" + cut(*v) + ": the step's nodes run different task counts; "
                             "meshrun places ranks in equal blocks per node: use --ntasks-per-node");
    break;
  }
  if (const std::string* g = find(env, "SLURM_GTIDS")) {
    auto ids = id_list(*g);
    if (ids && !ids->empty()) {
      std::vector<int> listed;  // id_list sorts; compare with the order Slurm wrote
      for (size_t pos = 0; pos <= g->size();) {
        size_t comma = g->find(',', pos);
        long long x = 0;
        if (!to_long(g->substr(pos, comma == std::string::npos ? std::string::npos : comma - pos), &x)) break;
        listed.push_back(static_cast<int>(x));
        if (comma == std::string::npos) break;
        pos = comma + 1;
      }
      for (size_t i = 1; i < listed.size(); ++i)
        if (listed[i] != listed[i - 1] + 1)
          throw TaskEnvError("this node runs tasks " + cut(*g) + " (SLURM_GTIDS), not one consecutive block; "
                             "meshrun's rank map is Slurm's block distribution: use --distribution=block");
    }
  }
  (void)ctx;
}

}  // namespace

TaskContext task_context_from_slurm(const std::map<std::string, std::string>& env) {
  TaskContext ctx;
  ctx.world = static_cast<int>(require_int(env, "SLURM_NTASKS", 1, 1 << 24));
  ctx.rank = static_cast<int>(require_int(env, "SLURM_PROCID", 0, ctx.world - 1));
  ctx.local_rank = static_cast<int>(require_int(env, "SLURM_LOCALID", 0, 1 << 20));
  ctx.node_id = static_cast<int>(optional_int(env, "SLURM_NODEID", 0));
  ctx.job_id = static_cast<uint32_t>(optional_int(env, "SLURM_JOB_ID", optional_int(env, "SLURM_JOBID", 0)));
  ctx.step_id = static_cast<uint32_t>(optional_int(env, "SLURM_STEP_ID", optional_int(env, "SLURM_STEPID", 0)));
  ctx.omp_threads_given = find(env, "OMP_NUM_THREADS") != nullptr;

  ctx.local_world = -1;
  for (const char* name : {"SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"})
    if (const std::string* v = find(env, name); v && ctx.local_world < 0) ctx.local_world = tasks_on_node(*v, ctx.node_id);
  if (ctx.local_world < 0) ctx.local_world = static_cast<int>(optional_int(env, "SLURM_NTASKS_PER_NODE", -1));
  if (ctx.local_world < 0 && optional_int(env, "SLURM_NNODES", -1) == 1) ctx.local_world = ctx.world;
  if (ctx.local_world <= ctx.local_rank)
    throw TaskEnvError("cannot tell how many tasks run on this node (SLURM_STEP_TASKS_PER_NODE missing or "
                       "malformed); launch with srun --ntasks-per-node=N");

  check_block_placement(env, ctx);

  for (const char* name : {"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"}) {
    const std::string* v = find(env, name);
    if (!v || v->empty()) continue;
    std::string error;
    auto hosts = expand_hostlist(*v, &error);
    if (!hosts || hosts->empty())
      throw TaskEnvError(std::string(name) + "='" + *v + "' is not a Slurm hostlist (" + error + ")");
    ctx.master_addr = hosts->front();  // rank 0 runs on the step's first host (block distribution)
    break;
  }
  return ctx;
}

GpuAllocation gpu_allocation_from_slurm(const std::map<std::string, std::string>& env) {
  GpuAllocation a;
  for (const char* name : {"SLURM_STEP_GPUS", "SLURM_JOB_GPUS"}) {
    const std::string* v = find(env, name);
    if (!v) continue;
    auto ids = id_list(*v);
    if (!ids) throw TaskEnvError(std::string(name) + "='" + *v + "' is not a list of GPU indices; MIG/UUID "
                                 "allocations are not supported, request whole GPUs");
    a.step_gpus = *ids;
    a.managed = true;
    break;
  }
  if (const std::string* v = find(env, "SLURM_GPUS_PER_TASK")) {
    const size_t colon = v->rfind(':');  // "a100:1"
    long long n = 0;
    if (to_long(colon == std::string::npos ? *v : v->substr(colon + 1), &n) && n > 0) a.gpus_per_task = int(n);
  }
  const std::string* cvd = find(env, "CUDA_VISIBLE_DEVICES");
  std::optional<std::vector<int>> visible = cvd ? id_list(*cvd) : std::nullopt;
  if (!a.managed && visible && !visible->empty()) {  // no gres variables, but the launcher picked devices
    a.step_gpus = *visible;
    a.managed = true;
    std::sort(a.step_gpus.begin(), a.step_gpus.end());
  }
  if (const std::string* v = find(env, "MESHRUN_CONSTRAIN_DEVICES")) {
    a.constrained = *v == "1" || *v == "yes" || *v == "true";
    return a;
  }
  // Inference: CUDA_VISIBLE_DEVICES holds cgroup-relative 0..k-1 under ConstrainDevices and global ids
  // otherwise (local-slurm.md section 8).
  if (!visible || visible->empty() || a.step_gpus.empty()) return a;
  const auto& s = a.step_gpus;
  const bool subset = std::all_of(visible->begin(), visible->end(),
                                  [&](int id) { return std::find(s.begin(), s.end(), id) != s.end(); });
  std::vector<int> zero_based(visible->size());
  for (size_t i = 0; i < zero_based.size(); ++i) zero_based[i] = static_cast<int>(i);
  if (!subset) {
    a.constrained = true;
  } else if (a.gpus_per_task > 0 && *visible == zero_based) {
    // Per-task binding: unconstrained, task L sees step[L*g ..]; constrained, every task sees 0..g-1.
    const long long local = optional_int(env, "SLURM_LOCALID", 0);
    const size_t first = static_cast<size_t>(local) * a.gpus_per_task;
    std::vector<int> own;
    for (size_t i = first; i < first + a.gpus_per_task && i < s.size(); ++i) own.push_back(s[i]);
    a.constrained = own != *visible;
  }
  return a;
}

}  // namespace meshrun

namespace meshrun {

TaskEnv task_env_from_slurm(const RankMap& map, const std::map<std::string, std::string>& slurm_env,
                            const NodeTopology& topo, const EnvPolicy& policy,
                            const std::map<std::string, std::string>& extra_env, const CpuSet& allowed_cpus) {
  TaskContext ctx = task_context_from_slurm(slurm_env);
  ctx.allowed_cpus = allowed_cpus;
  return compute_task_env(map, ctx, topo, gpu_allocation_from_slurm(slurm_env), policy, extra_env);
}

}  // namespace meshrun
