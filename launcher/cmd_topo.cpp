// `meshrun topo [--xml FILE] [--format table|json] [--node-type NAME] [--no-nvml]`: this node's (or an hwloc
// export's) GPUs, NICs, NVLink, the nvidia-smi-style matrix and the GPU-NIC pairing.
#include <cstdio>
#include <cstring>
#include <string>

#include "commands.hpp"
#include "meshrun/config.hpp"
#include "meshrun/task_env.hpp"
#include "meshrun/topology.hpp"

extern char** environ;

namespace {

void topo_usage(std::FILE* out) {
  std::fprintf(out,
               "usage: meshrun topo [--xml FILE] [--format table|json] [--node-type NAME] [--no-nvml]\n"
               "                    [--site FILE | --no-site]\n\n"
               "  --xml FILE        read an hwloc XML export (lstopo --of xml) instead of this machine\n"
               "  --format F        table (default) or json\n"
               "  --node-type NAME  NVLink facts when neither hwloc nor NVML tell (dgx-h100, dgx-h200,\n"
               "                    dgx-a100, gb200-nvl72, generic)\n"
               "  --no-nvml         do not query NVML on a live node\n"
               "  --site FILE       site file whose [site] policy is checked (default $MESHRUN_SITE_CONFIG, else\n"
               "                    /etc/meshrun/site.toml); warns when hca_scope = rank\n"
               "  --no-site         ignore the site file\n\n"
               "examples:\n  meshrun topo\n  meshrun topo --xml node.xml --format json\n");
}

int bad(const std::string& line) {
  std::fprintf(stderr, "meshrun topo: %s\n", meshrun::cut_long_values(line).c_str());
  return 2;
}

}  // namespace

int cmd_topo(int argc, char** argv) {
  meshrun::TopologyRequest req;
  meshrun::ConfigRequest site;  // only the site layer: its [site] policy decides the HCA warning
  std::string format = "table";
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&]() -> const char* { return i + 1 < argc ? argv[++i] : nullptr; };
    if (arg == "--help" || arg == "-h") {
      topo_usage(stdout);
      return 0;
    } else if (arg == "--xml" || arg == "--format" || arg == "--node-type") {
      const char* v = value();
      if (!v) return bad(arg + " needs a value; see meshrun topo --help");
      if (arg == "--xml") req.xml_path = v;
      else if (arg == "--format") format = v;
      else if (!(req.node_type = meshrun::find_node_type(v)))
        return bad(std::string("unknown node type '") + v + "'; use dgx-h100, dgx-h200, dgx-a100, gb200-nvl72 or generic");
    } else if (arg == "--no-nvml") {
      req.use_nvml = false;
    } else if (arg == "--site") {
      const char* v = value();
      if (!v) return bad("--site needs a file; see meshrun topo --help");
      site.site_path = v;
    } else if (arg == "--no-site") {
      site.use_site = false;
    } else {
      return bad("unknown option '" + arg + "'; see meshrun topo --help");
    }
  }
  if (format != "table" && format != "json") return bad("--format '" + format + "' is not table or json");
  try {
    const auto env = meshrun::environment_map(environ);
    site.environment = &env;
    if (meshrun::build_config(site).job.site.hca_scope == "rank")
      std::fprintf(stderr, "meshrun topo: warning: %s\n", meshrun::hca_rank_warning().c_str());
  } catch (const meshrun::ConfigError& e) {
    return bad(e.what());
  }
  try {
    const meshrun::NodeTopology topo = meshrun::load_topology(req);
    const std::string text = format == "json" ? meshrun::topology_json(topo) : meshrun::topology_table(topo);
    std::fwrite(text.data(), 1, text.size(), stdout);
    return 0;
  } catch (const meshrun::TopologyError& e) {
    return bad(e.what());
  }
}
