#include "task_setup.hpp"

#include "meshrun/site_policy.hpp"

namespace meshrun::plugin {

EnvPolicy site_policy(const PlugstackArgs& args, const Config& config) {
  EnvPolicy p = env_inputs(config).policy;  // the site file, as meshrun exec reads it
  auto given = [&](const char* key) { return args.given.count(key) > 0; };
  if (given("nccl")) p.nccl = args.nccl ? EnvPolicy::Nccl::automatic : EnvPolicy::Nccl::off;
  if (given("allow_env")) p.allow = args.allow_env;
  if (given("hca")) p.hca_scope = args.hca_per_node ? EnvPolicy::HcaScope::node : EnvPolicy::HcaScope::rank;
  if (given("cpu_bind")) p.cpu_bind = args.cpu_bind ? EnvPolicy::CpuBind::numa : EnvPolicy::CpuBind::none;
  if (given("socket_ifname")) p.socket_ifname = args.socket_ifname;
  return p;
}

NodeSetup load_node_setup(const PlugstackArgs& args, const NodeType& node_type, const Config& config) {
  NodeSetup n;
  TopologyRequest req;
  req.xml_path = args.topology_xml;
  req.node_type = &node_type;
  n.topology = load_topology(req);
  n.policy = site_policy(args, config);
  n.user_env = env_inputs(config).user_env;
  return n;
}

TaskEnv task_environment(const RankMap& map, const NodeSetup& node, const std::map<std::string, std::string>& env,
                         const CpuSet& allowed, const std::map<std::string, std::string>& extra_env) {
  return task_env_from_slurm(map, env, node.topology, node.policy, extra_env, allowed);
}

}  // namespace meshrun::plugin
