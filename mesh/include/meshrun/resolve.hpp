// One resolve: from a built configuration (build_config merges defaults, the site file, the template, the
// environment, flags and --set, recording each value's source) and the allocation, to the cluster, the layout,
// the checks that ran, the problems and the warnings. `meshrun plan`, `plot`, `sbatch`, `run`, `exec`, the
// SPANK plugin and meshrun-train call it; the rules themselves are written once (check_rules, check_job_env,
// layout_warnings).
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "meshrun/config.hpp"
#include "meshrun/layout.hpp"
#include "meshrun/task_env.hpp"

namespace meshrun {

struct ResolveOptions {
  RuleSet rules = RuleSet::trainer;
  int64_t world = 0;                      // ranks the allocation holds; 0: the cluster's GPUs
  const EnvPolicy* env_policy = nullptr;  // the site's policy: the job's [env] and --mesh-env checked when given
  bool warnings = true;                   // false: skip layout_warnings (it walks the rank map's groups), where
                                          // nothing prints them (slurmstepd, meshrun-train)
};

struct Resolution {
  Cluster cluster;
  std::optional<Layout> layout;       // set once the cluster and the layout resolved
  RuleSet rules = RuleSet::trainer;   // the set applied (rule_set_name for output)
  std::vector<std::string> checks;    // every check that ran
  std::vector<Problem> problems;      // empty: the job is valid
  std::vector<std::string> warnings;  // set only when valid
  bool ok() const { return layout.has_value() && problems.empty(); }
};

// Non-fatal observations (e.g. TP on PCIe, EP crossing the network): resolve_job's warnings.
std::vector<std::string> layout_warnings(const JobConfig& cfg, const Layout& layout, const Cluster& cluster);

// Stops at the first stage with problems (cluster, then layout, then the rules and the environment policy),
// so a message never depends on an earlier one's failure. Throws nothing but std::bad_alloc.
Resolution resolve_job(const Config& cfg, const ResolveOptions& options = {});

}  // namespace meshrun
