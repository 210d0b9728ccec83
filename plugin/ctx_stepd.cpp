// slurmstepd (S_CTX_REMOTE): re-check the layout on the node, load the topology once (user_init), then give
// each task its environment and CPU binding (task_init). Errors never fail user_init: they fail task_init,
// which Slurm reports to the user without draining the node.
#include <sched.h>
#include <unistd.h>
#include <time.h>

#include <chrono>
#include <cstdlib>
#include <vector>

#include "meshrun/hostlist.hpp"
#include "meshrun/rank_map.hpp"
#include "spank_state.hpp"

namespace meshrun::plugin {
namespace {

// Batch script, extern and interactive steps (slurm.h): no training tasks run there.
constexpr uint32_t kFirstSpecialStep = 0xfffffffa;

int env_int(const std::optional<std::string>& v) {
  return (v && !v->empty() && v->find_first_not_of("0123456789") == std::string::npos) ? std::atoi(v->c_str()) : 0;
}

int count_list(const std::optional<std::string>& v) {  // "0,1,2,3" -> 4
  if (!v || v->empty()) return 0;
  int n = 1;
  for (char c : *v) n += c == ',';
  return n;
}

CpuSet current_affinity() {
  cpu_set_t set;
  CPU_ZERO(&set);
  CpuSet out;
  if (sched_getaffinity(0, sizeof set, &set) != 0) return out;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &set)) out.cpus.push_back(c);
  return out;
}

bool apply_affinity(const CpuSet& cpus, std::string* error) {
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int c : cpus.cpus)
    if (c >= 0 && c < CPU_SETSIZE) CPU_SET(c, &set);
  if (sched_setaffinity(0, sizeof set, &set) == 0) return true;
  *error = "meshrun: cannot bind the task to CPUs " + cpus.str() + "; set cpu binding off in the site policy";
  return false;
}

// Ends the task before its command runs. Returning -1 from task_init fails the launch only when the plugin is
// `required`; Slurm ignores an `optional` plugin's failure and would start the task without (or with a wrong)
// environment, so the task child exits here instead, in both modes.
[[noreturn]] void end_task(const std::string& message, int code) {
  if (!message.empty()) log_error_lines(message);
  _exit(code);
}

}  // namespace

int stepd_user_init(spank_t sp, PluginState& st) {
  uint32_t step = 0;
  if (spank_get_item(sp, S_JOB_STEPID, &step) != ESPANK_SUCCESS || step >= kFirstSpecialStep) {
    // The batch step only carries the options: sbatch left them in the script's environment, so its srun
    // steps inherit them.
    st.special_step = true;
    return 0;
  }
  if (!st.deferred_error.empty() || !st.opts.active()) return 0;  // task_init reports or ignores
  // The environment's counts span every component of a heterogeneous step; S_JOB_NNODES is per component.
  uint32_t nnodes = 0;
  spank_get_item(sp, S_JOB_NNODES, &nnodes);
  StepShape shape;
  shape.nodes = env_int(job_getenv(sp, "SLURM_NNODES"));
  if (shape.nodes <= 0) shape.nodes = static_cast<int>(nnodes);
  shape.tasks = env_int(job_getenv(sp, "SLURM_NTASKS"));
  shape.gpus_per_node = count_list(job_getenv(sp, "SLURM_STEP_GPUS"));
  shape.hostlist = job_getenv(sp, "SLURM_STEP_NODELIST").value_or("");
  auto cwd = job_getenv(sp, "PWD");
  if (!cwd) cwd = job_getenv(sp, "SLURM_SUBMIT_DIR");
  shape.cwd = cwd.value_or("");
  shape.site_config = job_getenv(sp, "MESHRUN_SITE_CONFIG").value_or("");
  // A heterogeneous step whose components put different task counts on their nodes (srun -n2 : -n4): the
  // rank map is one block map over all of them. Say so with the sizes and a layout that fits, rather than the
  // layout error the combined counts give ("tp=2 does not divide gpus_per_node=3").
  auto het_size = env_int(job_getenv(sp, "SLURM_HET_SIZE"));
  auto per_node = job_getenv(sp, "SLURM_STEP_TASKS_PER_NODE");
  if (het_size > 1 && per_node) {
    std::vector<TaskShape> parts;  // one per run of equal counts: "2,4" -> 2 tasks on 1 node, 4 on 1 node
    if (const auto runs = parse_task_counts(*per_node); runs && runs->size() <= 64)
      for (const TaskCountRun& r : *runs) {
        if (r.count <= 0 || static_cast<long long>(r.count) * r.repeat > (1 << 24)) { parts.clear(); break; }
        TaskShape t;
        t.tasks_per_node = r.count;
        t.nodes = r.repeat;
        t.tasks = r.count * r.repeat;
        parts.push_back(t);
      }
    std::string flags;
    if (st.opts.tp) flags = "--mesh-tp=" + std::to_string(*st.opts.tp);
    if (st.opts.pp) flags += (flags.empty() ? "" : " ") + std::string("--mesh-pp=") + std::to_string(*st.opts.pp);
    TaskShape total;
    if (parts.size() > 1) {
      if (std::string why = het_shape_problem(parts, st.opts.tp.value_or(1) * st.opts.cp.value_or(1) *
                                                         st.opts.pp.value_or(1), flags, &total, true);
          !why.empty()) {
        st.deferred_error = "meshrun: " + why;
        st.deferred_step_wide = true;
        return 0;
      }
    }
  }
  StepPlan plan = plan_step(st.opts, st.args, shape, /*with_warnings=*/false);
  if (!plan.problems.empty() || !plan.layout) {
    st.deferred_error = plan.problems.empty() ? "meshrun: the step's node or task count is unknown"
                                              : plan.error_text();
    st.deferred_step_wide = true;
    return 0;
  }
  try {
    auto start = std::chrono::steady_clock::now();
    st.node = load_node_setup(st.args, plan.cluster.type, plan.config);
    auto ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    slurm_debug("meshrun: user_init loaded the topology (%s) in %.1f ms", st.node->topology.source.c_str(), ms);
  } catch (const std::exception& e) {
    st.deferred_error = std::string("meshrun: ") + e.what();
    return 0;
  }
  st.plan = std::move(plan);
  return 0;
}

int stepd_task_init(spank_t sp, PluginState& st) {
  if (st.special_step || st.opts.off || !(st.opts.active() || st.bad_option)) return 0;
  // srun already said why (once, on the user's terminal) or printed the dry run: end quietly.
  if (job_getenv(sp, kStepRefused)) {
    slurm_info("meshrun: srun refused this step after it was created; ending the task before its command");
    end_task("", 1);
  }
  if (job_getenv(sp, kStepDryRun)) end_task("", 0);
  if (!st.deferred_error.empty()) {
    if (st.deferred_step_wide && job_getenv(sp, "SLURM_PROCID").value_or("0") != "0") {
      slurm_info("meshrun: ending the task: %s (rank 0 prints it)", meshrun::cut_long_values(st.deferred_error).c_str());
      end_task("", 1);
    }
    end_task(st.deferred_error, 1);
  }
  if (!st.plan || !st.node) end_task("meshrun: the step was not prepared in user_init (see the slurmd log)", 1);
  // Reached only when srun could not stop the step itself (an `optional` plugin): still run nothing.
  if (st.opts.dry_run) end_task("", 0);
  auto start = std::chrono::steady_clock::now();
  timespec cpu0{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &cpu0);  // CPU time too: on a busy node wall time includes waiting
  char** envp = nullptr;
  if (spank_get_item(sp, S_JOB_ENV, &envp) != ESPANK_SUCCESS) end_task("meshrun: cannot read the task's environment", 1);
  RankMap map(*st.plan->layout, st.plan->cluster);
  TaskEnv env;
  try {
    env = task_environment(map, *st.node, environment_map(envp), current_affinity(), st.node->user_env);
  } catch (const std::exception& e) {
    end_task(std::string("meshrun: ") + e.what(), 1);
  }
  // Multi-node NVLink without an IMEX channel fails inside NCCL's init, far from the cause: say it here.
  if (const std::string* mnnvl = env.get("NCCL_MNNVL_ENABLE"); mnnvl && *mnnvl == "1")
    if (std::string why = imex_channel_problem(); !why.empty()) end_task("meshrun: " + why, 1);
  for (const auto& [name, value] : env.vars)
    if (spank_setenv(sp, name.c_str(), value.c_str(), 1) != ESPANK_SUCCESS)
      end_task("meshrun: cannot set " + name + " for the task", 1);
  std::string error;
  if (!env.cpus.empty() && !apply_affinity(env.cpus, &error)) end_task(error, 1);
  for (const auto& w : env.warnings) slurm_info("meshrun: %s", meshrun::cut_long_values(w).c_str());
  if (const std::string* rank = env.get("RANK"); rank && *rank == "0")  // once per job
    for (const auto& n : env.notes) slurm_info("meshrun: note: %s", meshrun::cut_long_values(n).c_str());
  auto us = std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - start).count();
  timespec cpu1{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &cpu1);
  long long cpu_us = (cpu1.tv_sec - cpu0.tv_sec) * 1000000LL + (cpu1.tv_nsec - cpu0.tv_nsec) / 1000;
  slurm_debug("meshrun: task_init rank %s took %lld us (cpu %lld us)", env.get("RANK") ? env.get("RANK")->c_str() : "?",
              static_cast<long long>(us), cpu_us);
  return 0;
}

}  // namespace meshrun::plugin
