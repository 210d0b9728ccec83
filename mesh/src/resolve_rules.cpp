// check_rules: the rule sets of layout.hpp, applied in one place.
#include <algorithm>

#include "meshrun/layout.hpp"

namespace meshrun {

const char* rule_set_name(RuleSet set) {
  switch (set) {
    case RuleSet::layout: return "layout";
    case RuleSet::model: return "layout+model";
    case RuleSet::trainer: return "layout+model+trainer";
  }
  return "layout+model+trainer";
}

std::vector<Problem> check_rules(const JobConfig& cfg, const Layout& layout, const Cluster& cluster, RuleSet set,
                                 std::vector<std::string>* checks_run) {
  std::vector<std::string> checks;
  std::vector<Problem> problems = validate(cfg, layout, cluster, &checks);
  if (set == RuleSet::layout) {  // no template: no model or batch to hold the job to
    std::erase_if(problems, [](const Problem& p) { return !is_layout_rule(p.check); });
    std::erase_if(checks, [](const std::string& c) { return !is_layout_rule(c); });
  }
  if (set == RuleSet::trainer)
    for (auto& p : validate_trainer(cfg, layout, &checks)) problems.push_back(std::move(p));
  if (checks_run) checks_run->insert(checks_run->end(), checks.begin(), checks.end());
  return problems;
}

}  // namespace meshrun
