#include "step_plan.hpp"

#include <algorithm>

#include "meshrun/resolve.hpp"
#include "meshrun/bounded_file.hpp"
#include "meshrun/hostlist.hpp"
#include "meshrun/limits.hpp"
#include "meshrun/site_policy.hpp"
#include "task_setup.hpp"

namespace meshrun::plugin {
namespace {

// The core's message speaks of template keys; here the user typed --mesh-* flags and -N/-n.
std::string world_message(const LayoutSpec& spec, const std::optional<Layout>& l, const StepShape& shape) {
  auto s = [](int64_t v) { return std::to_string(v); };
  std::string job = s(shape.tasks) + " tasks (" + s(shape.nodes) + " nodes × " + s(shape.tasks / shape.nodes) + ")";
  if (!l)  // dp = auto and tp·cp·pp does not divide the task count
    return "tp·cp·pp = " + s(spec.tp) + "·" + s(spec.cp) + "·" + s(spec.pp) + " = " + s(limits::product({spec.tp, spec.cp, spec.pp})) +
           " does not divide the job's " + job + "; change --mesh-tp/--mesh-cp/--mesh-pp or -N/--ntasks-per-node";
  return "tp·cp·pp·dp = " + s(l->tp) + "·" + s(l->cp) + "·" + s(l->pp) + "·" + s(l->dp) + " = " + s(l->world()) +
         " ranks but the job has " + job + "; use --mesh-dp=auto or change -N/--ntasks-per-node";
}

}  // namespace

std::string StepPlan::error_text() const {
  std::string s;
  for (const auto& p : problems) s += (s.empty() ? "" : "\n") + std::string("meshrun: ") + cut_long_values(p.message);
  return s;
}

std::string resolve_template(const std::string& path, const std::string& cwd) {
  if (path.empty() || path[0] == '/' || cwd.empty()) return path;
  return cwd + "/" + path;
}

StepPlan plan_step(const MeshOptions& opts, const PlugstackArgs& args, const StepShape& shape, bool with_warnings) {
  StepPlan plan;
  try {
    ConfigRequest req;
    if (opts.template_file) req.template_path = resolve_template(*opts.template_file, shape.cwd);
    std::map<std::string, std::string> env;
    if (!shape.site_config.empty()) env["MESHRUN_SITE_CONFIG"] = shape.site_config;
    if (!args.site_file.empty()) req.site_path = args.site_file;  // the admin's plugstack site= wins
    req.environment = &env;
    plan.config = build_config(req);
    if (!args.default_order.empty() && !plan.config.origins.count("parallel.order"))
      apply_value(plan.config, "parallel.order", args.default_order,
                  Origin{SourceKind::site, "plugstack.conf default_order"});
    // The options stay typed from parsing to the layout (no text round trip); the origin shows the flag.
    auto put = [&](const std::optional<int>& v, const char* key, const char* flag) {
      if (v) apply_int(plan.config, key, *v, Origin{SourceKind::flag, std::string(flag) + "=" + std::to_string(*v)});
    };
    put(opts.tp, "parallel.tp", "--mesh-tp");
    put(opts.cp, "parallel.cp", "--mesh-cp");
    put(opts.pp, "parallel.pp", "--mesh-pp");
    put(opts.ep, "parallel.ep", "--mesh-ep");
    if (opts.dp && *opts.dp == 0)  // 0 = auto
      apply_value(plan.config, "parallel.dp", "auto", Origin{SourceKind::flag, "--mesh-dp=auto"});
    else
      put(opts.dp, "parallel.dp", "--mesh-dp");
    if (opts.order)
      apply_value(plan.config, "parallel.order", *opts.order, Origin{SourceKind::flag, "--mesh-order=" + *opts.order});
    for (const auto& [name, value] : opts.env)  // the job's variables (allow-listed in compute_task_env)
      apply_value(plan.config, "env." + name, "\"" + value + "\"", Origin{SourceKind::flag, "--mesh-env " + name});
    if (shape.nodes > 0) {
      apply_value(plan.config, "cluster.nodes", std::to_string(shape.nodes), Origin{SourceKind::environment, "Slurm nodes"});
      // The template's hostlist describes another cluster; use the step's when it names exactly its nodes.
      std::string unused;
      auto hosts = expand_hostlist(shape.hostlist, &unused);
      bool fits = hosts && static_cast<int>(hosts->size()) == shape.nodes;
      plan.config.job.cluster.hostlist = fits ? shape.hostlist : "";
    }
    if (shape.nodes > 0 && shape.tasks > 0)
      apply_value(plan.config, "cluster.gpus_per_node", std::to_string(std::max(1, shape.tasks / shape.nodes)),
                  Origin{SourceKind::environment, "Slurm tasks per node"});
    // --mesh-env and the template's [env] against the site's policy here, at submission, not per task in
    // slurmstepd after the job was queued (compute_task_env() checks again there).
    for (auto& p : check_job_env(plan.config, site_policy(args, plan.config))) plan.problems.push_back(std::move(p));
    if (!plan.problems.empty()) return plan;
  } catch (const ConfigError& e) {
    plan.problems.push_back({"config", e.what()});
    return plan;
  }
  if (shape.nodes <= 0 || shape.tasks <= 0) return plan;  // options and template only

  if (shape.tasks % shape.nodes != 0) {
    plan.problems.push_back({"tasks-per-node", std::to_string(shape.tasks) + " tasks do not spread evenly over " +
                                                   std::to_string(shape.nodes) +
                                                   " nodes; meshrun places ranks in equal blocks per node: use --ntasks-per-node"});
    return plan;
  }
  int per_node = shape.tasks / shape.nodes;
  if (shape.gpus_per_node > 0 && per_node > shape.gpus_per_node)
    plan.problems.push_back({"gpus-per-node", std::to_string(per_node) + " tasks per node but only " +
                                                  std::to_string(shape.gpus_per_node) +
                                                  " GPUs per node; meshrun runs one rank per GPU: use --ntasks-per-node=" +
                                                  std::to_string(shape.gpus_per_node) + " or request more GPUs"});

  const LayoutSpec& ls = plan.config.job.parallel;
  const int64_t product = limits::product({ls.tp, ls.cp, ls.pp, std::max(ls.dp, 1)});
  if (product > shape.tasks && product > limits::kWorld) {  // beyond the limits: say so in the job's terms
    plan.problems.push_back({"world-size", "tp·cp·pp·dp > " + std::to_string(limits::kWorld) +
                                               " ranks but the job has " + std::to_string(shape.tasks) +
                                               " tasks; use smaller --mesh-* sizes (meshrun lays out at most " +
                                               std::to_string(limits::kWorld) + " ranks)"});
    return plan;
  }
  // The template's model is meshrun-train's unless its job.trainer names a framework (that framework's rules):
  // what the plugin accepts, the trainer runs. Without a template, the layout's rules alone. The [env] policy
  // was checked above, before the job shape is known.
  const bool full = opts.template_file.has_value();
  Resolution res = resolve_job(plan.config, {rules_for_job(plan.config.job, full), shape.tasks, nullptr, with_warnings});
  plan.rules = res.rules;
  plan.cluster = std::move(res.cluster);
  plan.layout = std::move(res.layout);
  for (auto& p : res.problems) {
    if (p.check == "world-size") p.message = world_message(plan.config.job.parallel, plan.layout, shape);
    plan.problems.push_back(std::move(p));
  }
  plan.warnings = std::move(res.warnings);
  if (!plan.problems.empty()) plan.layout.reset();
  return plan;
}

}  // namespace meshrun::plugin
