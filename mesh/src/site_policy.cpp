#include "meshrun/site_policy.hpp"

namespace meshrun {

EnvInputs env_inputs(const Config& cfg) {
  EnvInputs in;
  const SiteSpec& site = cfg.job.site;
  in.policy.nccl = site.nccl == "off" ? EnvPolicy::Nccl::off : EnvPolicy::Nccl::automatic;
  in.policy.hca_scope = site.hca_scope == "rank" ? EnvPolicy::HcaScope::rank : EnvPolicy::HcaScope::node;
  in.policy.cpu_bind = site.cpu_bind == "none" ? EnvPolicy::CpuBind::none : EnvPolicy::CpuBind::numa;
  in.policy.socket_ifname = site.socket_ifname;
  in.policy.port_base = site.port_base;
  std::string item;
  for (char c : site.allow_env + ",") {
    if (c == ',' || c == ' ') {
      if (!item.empty()) in.policy.allow.push_back(item);
      item.clear();
    } else {
      item += c;
    }
  }
  // The site file's [env] is the site's own (trusted); everything else is the job's.
  for (const auto& [name, value] : cfg.job.env) {
    if (cfg.origin_of("env." + name).kind == SourceKind::site) in.policy.site_env[name] = value;
    else in.user_env[name] = value;
  }
  return in;
}

std::vector<Problem> check_job_env(const Config& cfg, const EnvPolicy& policy) {
  std::vector<Problem> out;
  for (const auto& [name, value] : env_inputs(cfg).user_env) {
    const Origin o = cfg.origin_of("env." + name);
    const std::string source = o.kind == SourceKind::flag && o.where.rfind("--mesh-env", 0) == 0 ? std::string("--mesh-env")
                               : o.kind == SourceKind::template_file ? "[env] (" + o.where + ")"
                               : o.kind == SourceKind::set ? "--set env." + name
                                                           : std::string("[env]");
    if (std::string why = check_extra_var(name, policy, source); !why.empty()) out.push_back({"env", why});
  }
  return out;
}

}  // namespace meshrun
