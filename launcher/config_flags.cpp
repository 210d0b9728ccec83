#include "config_flags.hpp"

namespace meshrun::cli {
namespace {
struct FlagKey {
  const char* flag;
  const char* key;
};
constexpr FlagKey kFlags[] = {
    {"--mesh-tp", "parallel.tp"},       {"--mesh-cp", "parallel.cp"},   {"--mesh-pp", "parallel.pp"},
    {"--mesh-dp", "parallel.dp"},       {"--mesh-ep", "parallel.ep"},   {"--mesh-order", "parallel.order"},
    {"--nodes", "cluster.nodes"},       {"--gpus-per-node", "cluster.gpus_per_node"},
};
}  // namespace

bool take_value(const std::vector<std::string>& args, size_t& i, const std::string& flag, std::string* out) {
  const std::string& a = args[i];
  if (a == flag) {
    if (i + 1 >= args.size()) throw ConfigError(flag + ": missing value; write " + flag + " VALUE");
    *out = args[i + 1];
    i += 2;
    return true;
  }
  if (a.size() > flag.size() && a.compare(0, flag.size(), flag) == 0 && a[flag.size()] == '=') {
    *out = a.substr(flag.size() + 1);
    ++i;
    return true;
  }
  return false;
}

bool take_config_flag(const std::vector<std::string>& args, size_t& i, ConfigRequest& req) {
  std::string v;
  if (take_value(args, i, "--set", &v)) {
    req.sets.push_back(v);
    return true;
  }
  if (take_value(args, i, "--site", &v)) {
    req.site_path = v;
    return true;
  }
  if (args[i] == "--no-site") {
    req.use_site = false;
    ++i;
    return true;
  }
  for (const auto& f : kFlags) {
    if (take_value(args, i, f.flag, &v)) {
      req.flags.push_back({f.key, v, f.flag});
      return true;
    }
  }
  return false;
}

const char* config_flags_help() {
  return "  --mesh-tp N, --mesh-cp N, --mesh-pp N, --mesh-dp N|auto, --mesh-ep N, --mesh-order ORDER\n"
         "                       layout sizes and axis order (override the template)\n"
         "  --nodes N            node count (cluster.nodes)\n"
         "  --gpus-per-node G    GPUs per node (cluster.gpus_per_node)\n"
         "  --set SECTION.KEY=V  set any template key, e.g. --set training.seq_len=4096 (repeatable)\n"
         "  --site FILE          site defaults file (default: $MESHRUN_SITE_CONFIG or /etc/meshrun/site.toml)\n"
         "  --no-site            ignore the site defaults file\n";
}

}  // namespace meshrun::cli
