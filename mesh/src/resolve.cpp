#include "meshrun/resolve.hpp"

#include <string>

#include "meshrun/rank_map.hpp"
#include "meshrun/site_policy.hpp"

namespace meshrun {

std::vector<std::string> layout_warnings(const JobConfig& cfg, const Layout& l, const Cluster& cluster) {
  std::vector<std::string> w;
  if (l.sequence_parallel && l.tp == 1)
    w.push_back("parallel.sequence_parallel has no effect with tp = 1");
  if (cluster.nvlink_domain_gpus <= 1 && l.tp > 1)
    w.push_back("tp=" + std::to_string(l.tp) + " runs over PCIe: node type '" + cluster.type.name +
                "' has no NVLink; expect TP all-reduces to dominate");
  if (cfg.site.hca_scope == "rank") w.push_back(hca_rank_warning());
  if (cfg.model.experts > 0 && l.ep == 1)
    w.push_back("MoE model with ep = 1: every rank holds all " + std::to_string(cfg.model.experts) + " experts");
  // Where the groups land: streamed over the rank map, one group at a time (any world size).
  const RankMap map(l, cluster);
  const int network = static_cast<int>(Link::network);
  if (GroupSummary tp = summarize_group(map, GroupKind::tp); tp.by_link[network] > 0)
    w.push_back(std::to_string(tp.by_link[network]) + " of " + std::to_string(tp.count) +
                " TP groups cross the network with order " + l.order.str() + "; put tp first in parallel.order");
  if (l.ep > 1)
    if (GroupSummary ep = summarize_group(map, GroupKind::ep); ep.by_link[network] > 0)
      w.push_back("EP all-to-all crosses the network in " + std::to_string(ep.by_link[network]) + " of " +
                  std::to_string(ep.count) + " EP groups; keep ep·tp within a node where the model allows");
  return w;
}

Resolution resolve_job(const Config& cfg, const ResolveOptions& options) {
  Resolution r;
  r.rules = options.rules;
  r.cluster = resolve_cluster(cfg.job.cluster, &r.problems);
  if (!r.problems.empty()) return r;
  r.layout = resolve_layout(cfg.job.parallel, options.world > 0 ? options.world : r.cluster.gpus(), &r.problems);
  if (!r.layout || !r.problems.empty()) return r;
  r.problems = check_rules(cfg.job, *r.layout, r.cluster, options.rules, &r.checks);
  if (options.env_policy)
    for (auto& p : check_job_env(cfg, *options.env_policy)) r.problems.push_back(std::move(p));
  if (r.problems.empty() && options.warnings) r.warnings = layout_warnings(cfg.job, *r.layout, r.cluster);
  return r;
}

}  // namespace meshrun
