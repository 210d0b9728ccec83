#include "dry_run.hpp"

#include "meshrun/rank_map.hpp"

namespace meshrun::plugin {

std::string render_dry_run(const StepPlan& plan, int max_nodes) {
  std::string out;
  if (!plan.layout) return plan.error_text() + "\n";
  const Layout& l = *plan.layout;
  RankMap map(l, plan.cluster);
  auto s = [](int v) { return std::to_string(v); };
  out += "meshrun dry run: " + s(map.world()) + " ranks on " + s(plan.cluster.nodes) + " nodes × " +
         s(plan.cluster.gpus_per_node) + " tasks, order " + l.order.str() + "\n";
  out += std::string("  rules: ") + rule_set_name(plan.rules) +
         (plan.rules == RuleSet::layout    ? " (no --mesh-template: no model to check)\n"
          : plan.rules == RuleSet::trainer ? " (the template's model, as meshrun-train checks it)\n"
                                           : " (the template's model, as its job.trainer checks it)\n");
  for (const char* key : {"parallel.tp", "parallel.cp", "parallel.pp", "parallel.dp", "parallel.ep", "parallel.order"})
    out += "  " + std::string(key) + " = " + value_text(plan.config.job, key) + "  (" +
           plan.config.origin_of(key).str() + ")\n";
  // Outside an allocation Slurm has not chosen the nodes yet: number them, never show made-up host names.
  const bool hosts_known = !plan.config.job.cluster.hostlist.empty();
  if (!hosts_known)
    out += "  hosts: not chosen yet (no allocation); node i is the i-th node Slurm allocates to the step\n";
  int nodes = plan.cluster.nodes;
  for (int n = 0; n < nodes; ++n) {
    if (n == max_nodes - 1 && nodes > max_nodes) {
      out += "  ... " + s(nodes - max_nodes) + " more nodes\n";
      n = nodes - 1;
    }
    out += "  node " + s(n) + (hosts_known ? " (" + plan.cluster.hosts[n] + ")" : std::string()) + ":";
    for (int local = 0; local < plan.cluster.gpus_per_node; ++local) {
      int r = map.rank_at(n, local);
      Coord c = map.coords(r);
      out += " r" + s(r) + "[gpu" + s(map.placement(r).gpu) + " tp" + s(c.tp) + " cp" + s(c.cp) + " pp" + s(c.pp) +
             " dp" + s(c.dp) + " ep" + s(c.ep) + "]";
    }
    out += "\n";
  }
  for (const auto& g : summarize_groups(map)) {
    out += "  group " + std::string(group_name(g.kind)) + ": " + s(g.count) + " × size " + s(g.size);
    for (int k = 0; k < 4; ++k)
      if (g.by_link[k]) out += ", " + s(g.by_link[k]) + " " + link_name(static_cast<Link>(k));
    out += "\n";
  }
  for (const auto& w : plan.warnings) out += "  warning: " + w + "\n";
  // The last line says this was asked for: Slurm's "init_post_opt() failed" and exit 1 follow a dry run as
  // they follow a refusal (the only way a plugin stops a step), and a refusal's last meshrun line is its reason.
  out += "meshrun: dry run only, nothing launched (as asked: the 'init_post_opt() failed' and exit 1 that Slurm adds are how a plugin stops a step)\n";
  return out;
}

}  // namespace meshrun::plugin
