// Per-process plugin state and small helpers over the SPANK API. Included only by the spank_*.cpp and
// ctx_*.cpp files, which are compiled into spank_meshrun.so (never into the unit tests).
#pragma once
extern "C" {
#include <slurm/spank.h>  // its hook declarations sit outside its own extern "C" block
}

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "job_geometry.hpp"
#include "mesh_options.hpp"
#include "plugstack_args.hpp"
#include "step_plan.hpp"
#include "task_setup.hpp"

namespace meshrun::plugin {

// One per process (srun, sbatch, or one slurmstepd per node and step). SPANK option callbacks receive no
// user pointer, so this is the one place state can live; every function below takes it explicitly.
struct PluginState {
  PlugstackArgs args;
  MeshOptions opts;
  // slurmstepd: errors found before task_init. Failing user_init would report rc=0 to srun and drain the
  // node for a batch step, so they are carried here and raised in task_init, which fails the task cleanly.
  // Only jobs that asked for meshrun see it: a bad remote option value counts as asking.
  std::string deferred_error;
  bool bad_option = false;
  // The deferred error is about the whole step (its layout or shape), the same on every node: only the task of
  // rank 0 prints it, the others end quietly, so the user reads it once.
  bool deferred_step_wide = false;
  bool special_step = false;   // batch, extern or interactive step: not training tasks
  bool local_verdict = false;  // srun: init_post_opt refused the step, printed its dry run, or checked it whole
  std::vector<TaskShape> het_seen;  // srun: the components of a heterogeneous step seen by local_user_init
  std::optional<StepPlan> plan;
  std::optional<NodeSetup> node;
};
PluginState& plugin_state();

// Markers srun puts into its environment in local_user_init when it refused the step or printed its dry run
// there (too late to stop the step without leaving it behind); srun forwards that environment to the tasks,
// so slurmstepd ends them before their command runs, without printing the message again.
inline constexpr const char* kStepRefused = "MESHRUN_STEP_REFUSED";
inline constexpr const char* kStepDryRun = "MESHRUN_STEP_DRY_RUN";

// srun (S_CTX_LOCAL)
int srun_init_post_opt(spank_t sp, PluginState& st);
int srun_local_user_init(spank_t sp, PluginState& st);
// sbatch and salloc (S_CTX_ALLOCATOR)
int alloc_init_post_opt(spank_t sp, PluginState& st);
// slurmstepd (S_CTX_REMOTE)
int stepd_user_init(spank_t sp, PluginState& st);
int stepd_task_init(spank_t sp, PluginState& st);

// spank_getenv into a string; nullopt when unset.
std::optional<std::string> job_getenv(spank_t sp, const char* name);
// Logs every line of `text` with slurm_error ("meshrun: " is already part of each line).
void log_error_lines(const std::string& text);

}  // namespace meshrun::plugin
