#include "task_setup.hpp"

namespace meshrun::plugin {

NodeSetup load_node_setup(const PlugstackArgs& args, const NodeType& node_type) {
  NodeSetup n;
  TopologyRequest req;
  req.xml_path = args.topology_xml;
  req.node_type = &node_type;
  n.topology = load_topology(req);
  n.policy.nccl = args.nccl ? EnvPolicy::Nccl::automatic : EnvPolicy::Nccl::off;
  n.policy.allow = args.allow_env;
  n.policy.hca_scope = args.hca_per_node ? EnvPolicy::HcaScope::node : EnvPolicy::HcaScope::rank;
  n.policy.cpu_bind = args.cpu_bind ? EnvPolicy::CpuBind::numa : EnvPolicy::CpuBind::none;
  n.policy.socket_ifname = args.socket_ifname;
  return n;
}

TaskEnv task_environment(const RankMap& map, const NodeSetup& node, const std::map<std::string, std::string>& env,
                         const CpuSet& allowed, const std::map<std::string, std::string>& extra_env) {
  return task_env_from_slurm(map, env, node.topology, node.policy, extra_env, allowed);
}

}  // namespace meshrun::plugin
