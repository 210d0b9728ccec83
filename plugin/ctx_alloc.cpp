// sbatch and salloc (S_CTX_ALLOCATOR): refuse a bad layout before the job is queued.
//
// Slurm tells this context nothing about nodes or tasks, so the job's shape is read from the command's own
// arguments (/proc/self/cmdline) and, for sbatch, the script's #SBATCH lines. When the shape cannot be known
// (node ranges, tasks without nodes) only the options and the template are checked; the job's srun steps
// check the rest.
#include <unistd.h>

#include <cstdio>
#include <algorithm>
#include <cstdlib>
#include <vector>

#include "dry_run.hpp"
#include "local_shape.hpp"
#include "spank_state.hpp"

namespace meshrun::plugin {

namespace {

// -N MIN-MAX: Slurm may start the job on any count in the range, so refuse only when none fits the layout.
// Returns "" when some count fits (the job's srun steps check the real allocation), else the refusal.
std::string check_node_range(const PluginState& st, const StepShape& base, const JobGeometry& geo) {
  constexpr int kMaxCounts = 64;  // wider ranges: options and template only, the steps check
  std::vector<TaskShape> shapes;
  if (!range_shapes(geo, kMaxCounts, &shapes)) return "";
  auto fits = [&](const TaskShape& t, std::string* problem) {
    StepShape one = base;
    one.nodes = t.nodes;
    one.tasks = t.tasks;
    one.gpus_per_node = t.gpus_per_node;
    StepPlan plan = plan_step(st.opts, st.args, one);
    if (problem && !plan.problems.empty()) *problem = plan.problems.front().message;
    return plan.problems.empty();
  };
  std::string first_problem;
  for (const auto& t : shapes)
    if (fits(t, first_problem.empty() ? &first_problem : nullptr)) return "";
  // Which node counts would fit, outside the range (at most 3, counts up to 4x the range's top).
  std::vector<int> would;
  for (int n = 1; n <= std::min(4 * geo.nodes_max, 4096) && would.size() < 3; ++n) {
    if (n >= geo.nodes_min && n <= geo.nodes_max) continue;
    JobGeometry one = geo;
    one.nodes = one.nodes_min = one.nodes_max = n;
    TaskShape t;
    std::string why;
    if (task_shape(one, &t, &why) && fits(t, nullptr)) would.push_back(n);
  }
  std::string counts;
  for (int n : would) counts += (counts.empty() ? "" : ", ") + std::to_string(n);
  std::string range = std::to_string(geo.nodes_min) + "-" + std::to_string(geo.nodes_max);
  return "no node count in -N " + range + " fits the layout (" +
         (shapes.empty() ? std::string("the tasks do not spread evenly over any of them")
                         : "with " + std::to_string(shapes.front().nodes) + " nodes: " + first_problem) +
         "); " + (would.empty() ? "change the --mesh-* sizes or the task options"
                                : "node counts that would fit: " + counts + "; change -N or the --mesh-* sizes");
}

}  // namespace

// Slurm forwards option values as _SLURM_SPANK_OPTION_<plugin>_<option> (plugstack.c, "_option_setenv"):
// into this process's environment and the job-control environment, which the batch script receives as
// SLURM_SPANK__SLURM_SPANK_OPTION_... and its srun steps read again. A relative template path there would be
// resolved again on the nodes against the step's working directory, although sbatch already found and
// checked the file here: replace it by the absolute path.
void make_template_absolute(spank_t sp, const PluginState& st, const StepShape& shape) {
  if (!st.opts.template_file || st.opts.template_file->empty() || (*st.opts.template_file)[0] == '/') return;
  const std::string abs = resolve_template(*st.opts.template_file, shape.cwd);
  const char* name = "_SLURM_SPANK_OPTION_meshrun_mesh_template";
  ::setenv(name, abs.c_str(), 1);
  if (spank_job_control_setenv(sp, name, abs.c_str(), 1) != ESPANK_SUCCESS)
    slurm_info("meshrun: could not record the template's absolute path %s; steps resolve it again",
               meshrun::cut_long_values(abs).c_str());
}

int alloc_init_post_opt(spank_t sp, PluginState& st) {
  if (!st.opts.active()) return 0;
  StepShape shape = local_step_shape();
  bool known = false;
  JobGeometry geo;
  if (std::string why = add_own_submission_shape(&shape, &known, &geo); !why.empty()) {
    slurm_error("meshrun: %s", meshrun::cut_long_values(why).c_str());
    return -1;
  }
  if (!known && geo.nodes_min > 0 && geo.nodes_max > geo.nodes_min) {
    if (std::string why = check_node_range(st, shape, geo); !why.empty()) {
      slurm_error("meshrun: %s", meshrun::cut_long_values(why).c_str());
      return -1;
    }
  }
  StepPlan plan = plan_step(st.opts, st.args, shape);
  if (!plan.problems.empty()) {
    log_error_lines(plan.error_text());
    return -1;
  }
  make_template_absolute(sp, st, shape);
  if (st.opts.dry_run) {
    if (plan.layout) std::fputs(render_dry_run(plan).c_str(), stdout);
    else std::puts("meshrun: options and template are valid; node and task counts unknown until srun");
    std::fflush(stdout);
    return -1;  // nothing is queued
  }
  return 0;
}

}  // namespace meshrun::plugin
