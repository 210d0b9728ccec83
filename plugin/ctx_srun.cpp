// srun (S_CTX_LOCAL): refuse a bad layout before the step launches, and print the dry run.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>

#include "dry_run.hpp"
#include "job_geometry.hpp"
#include "local_shape.hpp"
#include "spank_state.hpp"

namespace meshrun::plugin {
namespace {

// "[type:]N" as Slurm writes SLURM_GPUS_PER_NODE; 0 when absent or not a single count.
int gpus_per_node_from_env() {
  std::string v = env_or_empty("SLURM_GPUS_PER_NODE");
  if (v.empty()) v = env_or_empty("SLURM_GPUS_ON_NODE");
  size_t colon = v.rfind(':');
  if (colon != std::string::npos) v = v.substr(colon + 1);
  return (!v.empty() && v.find_first_not_of("0123456789") == std::string::npos) ? std::atoi(v.c_str()) : 0;
}

}  // namespace

// srun, before Slurm creates the step. This is the last point where a refusal leaves nothing behind: inside an
// allocation, failing local_user_init (after the step exists) leaves a step Slurm keeps RUNNING with its CPUs
// until the time limit, and every later step waits ("Requested nodes are busy"). Slurm reports node and task
// counts only in local_user_init, so the step's shape is read here from srun's own arguments and, inside an
// allocation, the SLURM_* variables srun takes its defaults from.
int srun_init_post_opt(spank_t, PluginState& st) {
  if (!st.opts.active()) return 0;
  ::unsetenv(kStepRefused);  // never inherited: only this srun's own verdict counts
  ::unsetenv(kStepDryRun);
  StepShape shape = local_step_shape();
  bool known = false;
  // Where Slurm ignores the refusal (an `optional` plugin) the step still starts: the marker ends its tasks.
  auto refuse = [&] {
    ::setenv(kStepRefused, "1", 1);
    st.local_verdict = true;
    return -1;
  };
  if (std::string why = add_own_submission_shape(&shape, &known, nullptr, &st.opts); !why.empty()) {
    slurm_error("meshrun: %s", meshrun::cut_long_values(why).c_str());
    return refuse();
  }
  if (known && shape.gpus_per_node == 0) shape.gpus_per_node = gpus_per_node_from_env();
  if (known) {
    shape.hostlist = env_or_empty("SLURM_JOB_NODELIST");  // names the nodes only when the step spans the job
  }
  StepPlan plan = plan_step(st.opts, st.args, shape);
  if (!plan.problems.empty()) {
    log_error_lines(plan.error_text());
    return refuse();
  }
  // A heterogeneous step checked as a whole here: local_user_init sees one component at a time, whose counts
  // alone would not fit the layout.
  if (known) {
    const auto argv = read_own_cmdline();
    if (argv.size() > 1 && het_components({argv.begin() + 1, argv.end()}).size() > 1) st.local_verdict = true;
  }
  if (known && st.opts.dry_run && plan.layout) {
    std::fputs(render_dry_run(plan).c_str(), stdout);
    std::fflush(stdout);
    ::setenv(kStepDryRun, "1", 1);
    st.local_verdict = true;
    return -1;  // no step is created
  }
  return 0;
}

// srun, after Slurm created the step (its shape is known now). Never fails: a failure here would leave the
// step behind (see above). Whatever init_post_opt could not check is reported here once, and the step's
// tasks end before their command runs (slurmstepd sees the marker in their environment).
int srun_local_user_init(spank_t sp, PluginState& st) {
  if (!st.opts.active() || st.local_verdict) return 0;
  uint32_t nnodes = 0, ntasks = 0;
  if (spank_get_item(sp, S_JOB_NNODES, &nnodes) != ESPANK_SUCCESS ||
      spank_get_item(sp, S_JOB_TOTAL_TASK_COUNT, &ntasks) != ESPANK_SUCCESS) {
    slurm_error("meshrun: srun did not report the step's node and task counts; run without --mesh-* options");
    ::setenv(kStepRefused, "1", 1);
    return 0;
  }
  StepShape shape = local_step_shape();
  shape.nodes = static_cast<int>(nnodes);
  shape.tasks = static_cast<int>(ntasks);
  shape.gpus_per_node = gpus_per_node_from_env();
  // A heterogeneous step: srun calls this once per component with that component's counts. The rank map spans
  // all of them, so wait for the last one and check the whole step once.
  const auto argv = read_own_cmdline();
  const size_t components = argv.size() > 1 ? het_components({argv.begin() + 1, argv.end()}).size() : 1;
  if (components > 1) {
    TaskShape c;
    c.nodes = shape.nodes;
    c.tasks = shape.tasks;
    c.tasks_per_node = shape.nodes > 0 && shape.tasks % shape.nodes == 0 ? shape.tasks / shape.nodes : -1;
    st.het_seen.push_back(c);
    if (st.het_seen.size() < components) return 0;
    std::string flags;
    auto add = [&](const std::optional<int>& v, const char* name) {
      if (v) flags += (flags.empty() ? "" : " ") + std::string(name) + "=" + std::to_string(*v);
    };
    add(st.opts.tp, "--mesh-tp");
    add(st.opts.cp, "--mesh-cp");
    add(st.opts.pp, "--mesh-pp");
    const int group = st.opts.tp.value_or(1) * st.opts.cp.value_or(1) * st.opts.pp.value_or(1);
    TaskShape total;
    if (std::string why = het_shape_problem(st.het_seen, group, flags, &total); !why.empty()) {
      slurm_error("meshrun: %s", meshrun::cut_long_values(why).c_str());
      ::setenv(kStepRefused, "1", 1);
      return 0;
    }
    shape.nodes = total.nodes;
    shape.tasks = total.tasks;
    shape.hostlist.clear();
  }
  if (components == 1) {
    shape.hostlist = env_or_empty("SLURM_STEP_NODELIST");
    for (const char* name : {"SLURM_JOB_NODELIST", "SLURM_NODELIST"})
      if (shape.hostlist.empty()) shape.hostlist = env_or_empty(name);
  }
  StepPlan plan = plan_step(st.opts, st.args, shape);
  if (!plan.problems.empty()) {
    log_error_lines(plan.error_text());
    ::setenv(kStepRefused, "1", 1);
    return 0;
  }
  if (st.opts.dry_run) {
    std::fputs(render_dry_run(plan).c_str(), stdout);
    std::fflush(stdout);
    ::setenv(kStepDryRun, "1", 1);
  }
  return 0;
}

}  // namespace meshrun::plugin
