// Target 4: the SPANK plugin's strict parsers: plugstack.conf arguments and --mesh-* option values.
// Input byte 0 selects: even = a plugstack line (split at white space into argv), odd = one --mesh-* option
// (byte 1 picks which) with the rest as its value.
// Contracts: a refusal is a one-line message; an accepted plugstack line yields values the plugin can use
// (orders parse, paths are absolute (site, topology_xml, meshrun), every given key is a known one); an accepted size is within [1, 2^20]
// (dp: 0 = auto), an accepted order parses, accepted --mesh-env pairs have valid names.
#include <cctype>
#include <set>

#include "fuzz_common.hpp"
#include "meshrun/layout.hpp"
#include "mesh_options.hpp"
#include "plugstack_args.hpp"

using namespace meshrun;
using namespace meshrun::plugin;

namespace {

void plugstack(std::string_view line) {
  std::vector<std::string> words;
  size_t i = 0;
  while (words.size() < 64) {
    i = line.find_first_not_of(" \t\n", i);
    if (i == line.npos) break;
    const size_t j = line.find_first_of(" \t\n", i);
    words.emplace_back(line.substr(i, j == line.npos ? line.npos : j - i));
    i = j;
  }
  std::vector<char*> av;
  for (auto& w : words) av.push_back(w.data());
  PlugstackArgs args;
  std::string error;
  if (!parse_plugstack_args(static_cast<int>(av.size()), av.data(), &args, &error)) {
    FUZZ_CHECK(!error.empty() && error.find('\n') == error.npos, "plugstack refusal message");
    return;
  }
  static const std::set<std::string> known{"site", "default_order", "topology_xml", "nccl", "allow_env", "hca",
                                           "cpu_bind", "socket_ifname", "meshrun"};
  for (const auto& k : args.given) FUZZ_CHECK(known.count(k), "unknown key accepted: " + k);
  std::string why;
  if (!args.default_order.empty()) FUZZ_CHECK(parse_order(args.default_order, &why), args.default_order);
  if (!args.topology_xml.empty()) FUZZ_CHECK(args.topology_xml[0] == '/', args.topology_xml);
  if (!args.site_file.empty()) FUZZ_CHECK(args.site_file[0] == '/', args.site_file);
  if (!args.meshrun.empty()) FUZZ_CHECK(args.meshrun[0] == '/', args.meshrun);
  for (const auto& n : args.allow_env) FUZZ_CHECK(!n.empty() && n.find_first_of("=, ") == n.npos, "allow_env " + n);
}

void option(OptionId id, const std::string& value) {
  MeshOptions o;
  std::string error;
  if (!set_option(o, id, value.c_str(), &error)) {
    FUZZ_CHECK(fuzz::one_line_message(error, value.find('\n') != value.npos), "option refusal message");
    return;
  }
  for (const auto& v : {o.tp, o.cp, o.pp, o.ep})
    if (v) FUZZ_CHECK(*v >= 1 && *v <= (1 << 20), "accepted size " + std::to_string(*v));
  if (o.dp) FUZZ_CHECK(*o.dp >= 0 && *o.dp <= (1 << 20), "accepted dp " + std::to_string(*o.dp));
  std::string why;
  if (o.order) FUZZ_CHECK(parse_order(*o.order, &why), "accepted order " + *o.order);
  if (o.template_file) FUZZ_CHECK(!o.template_file->empty() && (*o.template_file)[0] != '-', *o.template_file);
  for (const auto& [name, val] : o.env) {
    FUZZ_CHECK(!name.empty() && !(name[0] >= '0' && name[0] <= '9'), "env name " + name);
    for (char c : name) FUZZ_CHECK(std::isalnum(static_cast<unsigned char>(c)) || c == '_', "env name " + name);
    FUZZ_CHECK(val.find(',') == val.npos, "env value with a comma " + val);
  }
  FUZZ_CHECK(o.active() || id == OptionId::off, "an accepted option leaves the plugin inactive");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const std::string rest(reinterpret_cast<const char*>(data) + 2, size - 2);
  if (data[0] % 2 == 0) {
    plugstack(std::string_view(reinterpret_cast<const char*>(data) + 1, size - 1));
  } else {
    const auto& specs = option_specs();
    // A C string: Slurm hands the plugin NUL-terminated values.
    option(specs[data[1] % specs.size()].id, rest.substr(0, rest.find('\0')));
  }
  return 0;
}
