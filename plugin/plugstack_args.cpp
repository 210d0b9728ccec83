#include "plugstack_args.hpp"

#include <string_view>

#include "meshrun/layout.hpp"

namespace meshrun::plugin {
namespace {

bool valid_env_name(std::string_view n) {
  if (n.empty() || (n[0] >= '0' && n[0] <= '9')) return false;
  for (char c : n)
    if (!((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_')) return false;
  return true;
}

}  // namespace

bool parse_plugstack_args(int ac, char** av, PlugstackArgs* out, std::string* error) {
  PlugstackArgs a;
  for (int i = 0; i < ac; ++i) {
    std::string_view arg = av[i] ? av[i] : "";
    auto eq = arg.find('=');
    std::string_view key = arg.substr(0, eq);
    std::string_view value = eq == std::string_view::npos ? std::string_view() : arg.substr(eq + 1);
    auto bad = [&](const std::string& fix) {
      *error = "plugstack.conf: bad argument '" + std::string(arg) + "'; " + fix;
      return false;
    };
    if (eq == std::string_view::npos)
      return bad("arguments are key=value: site=FILE, default_order=, topology_xml=, nccl=auto|off, allow_env=A,B, "
                 "hca=node|rank, cpu_bind=numa|none, socket_ifname=IF, meshrun=PATH");
    if (!key.empty()) a.given.insert(std::string(key));
    if (key == "site") {
      if (value.empty() || value[0] != '/') return bad("site needs an absolute path to the site file, e.g. site=/etc/meshrun/site.toml");
      a.site_file = value;
    } else if (key == "default_order") {
      std::string why;
      if (!parse_order(value, &why)) return bad(why + "; e.g. default_order=tp-cp-ep-dp-pp");
      a.default_order = value;
    } else if (key == "topology_xml") {
      if (value.empty() || value[0] != '/') return bad("topology_xml needs an absolute path to an hwloc XML file");
      a.topology_xml = value;
    } else if (key == "nccl") {
      if (value != "auto" && value != "off") return bad("use nccl=auto or nccl=off");
      a.nccl = value == "auto";
    } else if (key == "allow_env") {
      size_t start = 0;
      while (start <= value.size()) {
        size_t comma = value.find(',', start);
        std::string_view name = value.substr(start, comma == std::string_view::npos ? value.npos : comma - start);
        if (!valid_env_name(name)) return bad("allow_env takes variable names separated by commas, e.g. allow_env=HF_HOME,WANDB_PROJECT");
        a.allow_env.emplace_back(name);
        if (comma == std::string_view::npos) break;
        start = comma + 1;
      }
    } else if (key == "hca") {
      if (value != "rank" && value != "node") return bad("use hca=node (every GPU-paired NIC of the node, the default) or hca=rank (the rank's own NIC; NCCL advises against it)");
      a.hca_per_node = value == "node";
    } else if (key == "cpu_bind") {
      if (value != "numa" && value != "none") return bad("use cpu_bind=numa or cpu_bind=none");
      a.cpu_bind = value == "numa";
    } else if (key == "meshrun") {
      if (value.empty() || value[0] != '/') return bad("meshrun needs an absolute path to the meshrun CLI, e.g. meshrun=/usr/bin/meshrun");
      a.meshrun = value;
    } else if (key == "socket_ifname") {
      if (value.empty() || value.find_first_of(" \t") != std::string_view::npos)
        return bad("socket_ifname needs an interface name or NCCL prefix list, e.g. socket_ifname=eth0");
      a.socket_ifname = value;
    } else {
      return bad("unknown key '" + std::string(key) +
                 "'; known: site, default_order, topology_xml, nccl, allow_env, hca, cpu_bind, socket_ifname, meshrun");
    }
  }
  *out = std::move(a);
  return true;
}

}  // namespace meshrun::plugin
