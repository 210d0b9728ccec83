// What the local side (srun, sbatch, salloc) knows of a step before Slurm tells it anything.
#pragma once
#include <string>

#include "job_geometry.hpp"
#include "step_plan.hpp"

namespace meshrun::plugin {

std::string env_or_empty(const char* name);

// The working directory (relative --mesh-template paths start there) and $MESHRUN_SITE_CONFIG.
StepShape local_step_shape();

// Adds nodes, tasks and GPUs per node read from this process's own command line (and, for sbatch, the
// script's #SBATCH lines; for srun inside an allocation, the SLURM_* variables srun takes its defaults from).
// Returns "" when added (*known = true) or when the shape cannot be known (*known = false: the step checks it
// later); otherwise the refusal, one line. `geometry` (optional) receives what was parsed.
// A heterogeneous srun step whose components all have known shapes: *het_flags (the --mesh-* sizes, for the
// suggestion) and `group` come from `opts`; a mismatch between components is returned as the refusal.
std::string add_own_submission_shape(StepShape* shape, bool* known = nullptr, JobGeometry* geometry = nullptr,
                                     const MeshOptions* opts = nullptr);

}  // namespace meshrun::plugin
