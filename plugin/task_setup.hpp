// slurmstepd's per-node facts (loaded once in user_init) and the per-task step (task_init), over the mesh
// core's compute_task_env(): the plugin computes no rank, GPU, CPU or NCCL value itself.
#pragma once
#include <map>
#include <string>

#include "meshrun/config.hpp"
#include "meshrun/task_env.hpp"
#include "meshrun/topology.hpp"
#include "plugstack_args.hpp"

namespace meshrun::plugin {

struct NodeSetup {
  NodeTopology topology;
  EnvPolicy policy;
  std::map<std::string, std::string> user_env;  // the job's [env] (template, flags), allow-listed per task
};

// The site policy the tasks get: the site file's [site] and [env] (what `meshrun exec` reads too, via
// env_inputs()), then the plugstack arguments given explicitly (args.given) on top.
EnvPolicy site_policy(const PlugstackArgs& args, const Config& config);

// Loads the node topology (topology_xml= or live hwloc) and the policy (site_policy()). Throws TopologyError.
NodeSetup load_node_setup(const PlugstackArgs& args, const NodeType& node_type, const Config& config);

// The environment and CPU set of one task. `env` is the task's Slurm environment (SLURM_PROCID, ...), `allowed`
// the CPUs the task may use now. Throws TaskEnvError with a one-line message.
TaskEnv task_environment(const RankMap& map, const NodeSetup& node, const std::map<std::string, std::string>& env,
                         const CpuSet& allowed, const std::map<std::string, std::string>& extra_env);

}  // namespace meshrun::plugin
