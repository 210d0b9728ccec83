// sbatch and salloc (S_CTX_ALLOCATOR): refuse a bad layout before the job is queued.
//
// Slurm tells this context nothing about nodes or tasks, so the job's shape is read from the command's own
// arguments (/proc/self/cmdline) and, for sbatch, the script's #SBATCH lines. When the shape cannot be known
// (node ranges, tasks without nodes) only the options and the template are checked; the job's srun steps
// check the rest.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>

#include "dry_run.hpp"
#include "local_shape.hpp"
#include "spank_state.hpp"

namespace meshrun::plugin {

int alloc_init_post_opt(spank_t, PluginState& st) {
  if (!st.opts.active()) return 0;
  StepShape shape = local_step_shape();
  if (std::string why = add_own_submission_shape(&shape); !why.empty()) {
    slurm_error("meshrun: %s", why.c_str());
    return -1;
  }
  StepPlan plan = plan_step(st.opts, st.args, shape);
  if (!plan.problems.empty()) {
    log_error_lines(plan.error_text());
    return -1;
  }
  if (st.opts.dry_run) {
    if (plan.layout) std::fputs(render_dry_run(plan).c_str(), stdout);
    else std::puts("meshrun: options and template are valid; node and task counts unknown until srun");
    std::fflush(stdout);
    return -1;  // nothing is queued
  }
  return 0;
}

}  // namespace meshrun::plugin
