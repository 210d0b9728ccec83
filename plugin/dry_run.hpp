// `srun --mesh-dry-run`: the step's rank map as text, printed by srun before anything launches.
#pragma once
#include <string>

#include "step_plan.hpp"

namespace meshrun::plugin {

// Layout with the source of each value, one line per node (rank: local rank, GPU slot, coordinates),
// group sizes and links, and warnings. `max_nodes` caps the node lines ("..." for the rest).
std::string render_dry_run(const StepPlan& plan, int max_nodes = 8);

}  // namespace meshrun::plugin
