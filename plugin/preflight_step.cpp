#include "preflight_step.hpp"

namespace meshrun::plugin {

std::vector<std::string> preflight_srun_args(const MeshOptions& opts, const PlugstackArgs& args, const StepShape& shape,
                                             const StepPlan& plan, const std::string& meshrun) {
  std::vector<std::string> v{"srun", "--mpi=pmix", "--wait=30"};
  if (shape.nodes > 0) v.push_back("--nodes=" + std::to_string(shape.nodes));
  if (shape.nodes > 0 && shape.tasks > 0 && shape.tasks % shape.nodes == 0)
    v.push_back("--ntasks-per-node=" + std::to_string(shape.tasks / shape.nodes));
  v.insert(v.end(), {meshrun, "preflight"});
  if (opts.template_file) v.push_back(resolve_template(*opts.template_file, shape.cwd));
  auto size = [&](const std::optional<int>& value, const char* flag) {
    if (value) v.insert(v.end(), {flag, *value == 0 ? std::string("auto") : std::to_string(*value)});
  };
  size(opts.tp, "--mesh-tp");
  size(opts.cp, "--mesh-cp");
  size(opts.pp, "--mesh-pp");
  size(opts.dp, "--mesh-dp");  // 0 = auto
  size(opts.ep, "--mesh-ep");
  v.insert(v.end(), {"--mesh-order", plan.config.job.parallel.order});
  if (!args.site_file.empty()) v.insert(v.end(), {"--site", args.site_file});
  if (!args.topology_xml.empty()) v.insert(v.end(), {"--topology", args.topology_xml});
  return v;
}

}  // namespace meshrun::plugin
