// --mesh-preflight: srun (S_CTX_LOCAL, the user's srun process, before Slurm creates the step) runs a
// `meshrun preflight` step on the same nodes and tasks first, and refuses its own step when a node fails. The
// check runs in that child step's tasks, never in slurmstepd or in the plugin. From sbatch or salloc the option
// reaches every srun of the job (Slurm forwards plugin options to the job's steps), so each step is checked
// before it starts. The child srun carries kPreflightStep in its environment, so its own plugin does not start
// another preflight.
#pragma once
#include <string>
#include <vector>

#include "mesh_options.hpp"
#include "plugstack_args.hpp"
#include "step_plan.hpp"

namespace meshrun::plugin {

inline constexpr const char* kPreflightStep = "MESHRUN_PREFLIGHT_STEP";
// How long srun waits for the preflight step: its own watchdog (45 s) and srun --wait=30, with margin.
inline constexpr int kPreflightLimitS = 120;

// The child srun's arguments: the step's geometry (when srun's arguments gave it; else the allocation's
// defaults, the same the step itself gets), pmix, --wait=30 (every task ends with the verdict; a stopped node's
// tasks are ended after rank 0's watchdog), and `meshrun preflight` with the options' template (resolved
// against `cwd`) and sizes, the plan's order (the template's, the option's or the plugstack default), and the
// plugstack site file and topology, so that it computes the rank map and binding the plugin computes. The --mesh-* options themselves reach the child step through the
// environment srun forwards, so the plugin sets up and binds its tasks as it will the real step's.
std::vector<std::string> preflight_srun_args(const MeshOptions& opts, const PlugstackArgs& args, const StepShape& shape,
                                             const StepPlan& plan, const std::string& meshrun);

}  // namespace meshrun::plugin
