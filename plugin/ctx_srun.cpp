// srun (S_CTX_LOCAL): refuse a bad layout before the step launches, and print the dry run.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>

#include "dry_run.hpp"
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

int srun_init_post_opt(spank_t, PluginState& st) {
  if (!st.opts.active()) return 0;
  // Slurm reports node and task counts only in local_user_init, after srun has created its job. Outside an
  // allocation, read them from srun's own arguments now so a bad layout creates no job; inside one, no job
  // is created anyway and local_user_init checks the step.
  StepShape shape = local_step_shape();
  if (env_or_empty("SLURM_JOB_ID").empty()) {
    if (std::string why = add_own_submission_shape(&shape); !why.empty()) {
      slurm_error("meshrun: %s", why.c_str());
      return -1;
    }
  }
  StepPlan plan = plan_step(st.opts, st.args, shape);
  if (plan.problems.empty()) return 0;
  log_error_lines(plan.error_text());
  return -1;
}

int srun_local_user_init(spank_t sp, PluginState& st) {
  if (!st.opts.active()) return 0;
  uint32_t nnodes = 0, ntasks = 0;
  if (spank_get_item(sp, S_JOB_NNODES, &nnodes) != ESPANK_SUCCESS ||
      spank_get_item(sp, S_JOB_TOTAL_TASK_COUNT, &ntasks) != ESPANK_SUCCESS) {
    slurm_error("meshrun: srun did not report the step's node and task counts; run without --mesh-* options");
    return -1;
  }
  StepShape shape = local_step_shape();
  shape.nodes = static_cast<int>(nnodes);
  shape.tasks = static_cast<int>(ntasks);
  shape.gpus_per_node = gpus_per_node_from_env();
  shape.hostlist = env_or_empty("SLURM_STEP_NODELIST");
  for (const char* name : {"SLURM_JOB_NODELIST", "SLURM_NODELIST"})
    if (shape.hostlist.empty()) shape.hostlist = env_or_empty(name);
  StepPlan plan = plan_step(st.opts, st.args, shape);
  if (!plan.problems.empty()) {
    log_error_lines(plan.error_text());
    return -1;
  }
  if (st.opts.dry_run) {
    std::fputs(render_dry_run(plan).c_str(), stdout);
    std::fflush(stdout);
    return -1;  // the only way a plugin can stop srun from launching the step
  }
  return 0;
}

}  // namespace meshrun::plugin
