// check_rules: the rule sets of layout.hpp, applied in one place.
#include <algorithm>

#include "meshrun/bridges.hpp"
#include "meshrun/geometry.hpp"
#include "meshrun/layout.hpp"

namespace meshrun {

const char* rule_set_name(RuleSet set) {
  switch (set) {
    case RuleSet::layout: return "layout";
    case RuleSet::model: return "layout+model";
    case RuleSet::trainer: return "layout+model+trainer";
    case RuleSet::megatron: return "layout+model+megatron";
    case RuleSet::torchtitan: return "layout+model+torchtitan";
  }
  return "layout+model+trainer";
}

RuleSet rules_for_job(const JobConfig& cfg, bool has_template) {
  if (!has_template) return RuleSet::layout;
  if (cfg.job.trainer == "megatron") return RuleSet::megatron;
  if (cfg.job.trainer == "torchtitan") return RuleSet::torchtitan;
  return RuleSet::trainer;
}

std::string meshrun_train_refusal(const JobConfig& cfg, const std::string& where) {
  const auto f = parse_framework(cfg.job.trainer);
  if (!f) return "";
  const std::string& name = cfg.job.trainer;
  return "job.trainer = \"" + name + "\"" + (where.empty() ? "" : " (" + where + ")") + ": the template is for " +
         framework_name(*f) + ", which meshrun-train does not run; give " + framework_name(*f) +
         "'s command after -- (meshrun run T -- CMD, meshrun sbatch T -- CMD; `meshrun exec --for " + name +
         "` adds the layout's flags to it), or set job.trainer = \"meshrun\" to train with meshrun-train";
}

namespace {

// A framework's own rules beyond validate()'s: its model family, and whether its flags express the layout
// (framework_flags' refusal, with the template's batch geometry when the batch splits; when it does not,
// validate() has said why already).
void framework_rules(Framework f, const JobConfig& cfg, const Layout& layout, std::vector<Problem>& problems,
                     std::vector<std::string>& checks) {
  if (f == Framework::megatron) {  // Megatron pads the vocabulary itself (megatron_padded_vocab)
    std::erase_if(problems, [](const Problem& p) { return p.check == "vocab-tp"; });
    std::erase(checks, "vocab-tp");
  }
  if (f == Framework::torchtitan) {
    checks.push_back("framework-mlp");
    if (cfg.model.mlp != "swiglu")
      problems.push_back({"framework-mlp", "model.mlp = \"" + cfg.model.mlp + "\": torchtitan's models (llama3, llama4, "
                                           "deepseek_v3, qwen3) have SwiGLU MLPs; set model.mlp = \"swiglu\", or set "
                                           "job.trainer = \"megatron\" (Megatron-LM builds GELU MLPs)"});
  }
  checks.push_back("framework-bridge");
  const auto geometry = batch_geometry(cfg.training, layout, static_cast<std::string*>(nullptr));
  if (!geometry) return;
  const FrameworkFlags ff = framework_flags(f, cfg, layout, &*geometry);
  if (!ff.refusal.empty())
    problems.push_back({"framework-bridge", ff.refusal});  // each names the framework
}

}  // namespace

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
  if (set == RuleSet::megatron) framework_rules(Framework::megatron, cfg, layout, problems, checks);
  if (set == RuleSet::torchtitan) framework_rules(Framework::torchtitan, cfg, layout, problems, checks);
  if (checks_run) checks_run->insert(checks_run->end(), checks.begin(), checks.end());
  return problems;
}

}  // namespace meshrun
