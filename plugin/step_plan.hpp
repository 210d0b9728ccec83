// The layout a job or step gets: options + template + site defaults, checked against the task shape
// Slurm gives it. Used by sbatch (from its arguments), srun (from the step) and slurmstepd (re-check).
#pragma once
#include <optional>
#include <string>
#include <vector>

#include "meshrun/config.hpp"
#include "meshrun/layout.hpp"
#include "mesh_options.hpp"
#include "plugstack_args.hpp"

namespace meshrun::plugin {

// What Slurm gives the job or step. 0 = unknown.
struct StepShape {
  int nodes = 0;
  int tasks = 0;
  int gpus_per_node = 0;         // GPUs allocated per node, when known
  std::string hostlist;          // the step's nodes, when known
  std::string cwd;               // where relative --mesh-template paths start; empty = process cwd
  std::string site_config;       // $MESHRUN_SITE_CONFIG, if set
};

struct StepPlan {
  Config config;
  std::optional<Layout> layout;
  Cluster cluster;
  std::vector<Problem> problems;   // empty = valid
  std::vector<std::string> warnings;
  RuleSet rules = RuleSet::layout;  // the rule set applied (a template adds the model's and the trainer's)
  std::string error_text() const;  // problems, one line each, prefixed "meshrun: "
};

// Builds the configuration (defaults < site file < plugstack default_order < template < --mesh-* flags)
// and runs every layout check. Without a template only layout checks run (the default model is a
// placeholder, not the user's model).
// with_warnings = false where nothing prints them (slurmstepd): no walk over the rank map's groups there.
StepPlan plan_step(const MeshOptions& opts, const PlugstackArgs& args, const StepShape& shape, bool with_warnings = true);

// The template path the user meant: absolute, or relative to `cwd`.
std::string resolve_template(const std::string& path, const std::string& cwd);

}  // namespace meshrun::plugin
