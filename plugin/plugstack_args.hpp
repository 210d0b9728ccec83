// Site configuration from the plugin's plugstack.conf line, e.g.
//   required /usr/lib/x86_64-linux-gnu/slurm/spank_meshrun.so default_order=tp-cp-ep-dp-pp nccl=auto
// Keys: site=FILE, default_order=, topology_xml=, nccl=auto|off, allow_env=A,B, hca=node|rank, cpu_bind=numa|none,
// socket_ifname=IF, meshrun=PATH. The site file's [site] section is the policy; nccl/allow_env/hca/cpu_bind/socket_ifname
// given here override it.
// Parsed in every context (each is its own process); an unknown or malformed argument is an error.
#pragma once
#include <set>
#include <string>
#include <vector>

namespace meshrun::plugin {

struct PlugstackArgs {
  std::string default_order;             // empty = the mesh core's default
  std::string topology_xml;              // absolute path of an hwloc XML export; empty = live discovery
  bool nccl = true;                      // nccl=off: set no NCCL_* variables
  std::vector<std::string> allow_env;    // extra variable names templates may set through [env]
  bool hca_per_node = true;              // hca=node (default): every GPU-paired NIC of the node, on every rank;
                                         // hca=rank: only the rank's paired NIC (NCCL advises against; warned)
  bool cpu_bind = true;                  // cpu_bind=none: leave CPU affinity to Slurm
  std::string socket_ifname;             // socket_ifname=eth0: NCCL_SOCKET_IFNAME instead of the topology's guess
  // site=/etc/meshrun/site.toml: the site file (the one policy source, also read by `meshrun exec`); empty =
  // $MESHRUN_SITE_CONFIG, else /etc/meshrun/site.toml when it exists.
  std::string site_file;
  // meshrun=/usr/bin/meshrun: the meshrun CLI --mesh-preflight runs; empty = `meshrun` on srun's $PATH.
  std::string meshrun;
  // The keys given on the plugstack line: they override the site file's [site] values; the others come from it.
  std::set<std::string> given;
};

// Returns false with a one-line *error ("plugstack.conf: ...; fix") on the first bad argument.
bool parse_plugstack_args(int ac, char** av, PlugstackArgs* out, std::string* error);

}  // namespace meshrun::plugin
