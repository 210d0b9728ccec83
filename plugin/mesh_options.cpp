#include "mesh_options.hpp"

#include <cctype>
#include <charconv>
#include <string_view>

#include "meshrun/bounded_file.hpp"
#include "meshrun/layout.hpp"

namespace meshrun::plugin {
namespace {

constexpr int kMaxSize = 1 << 20;  // far above any real axis size; stops overflow in products

bool parse_size(std::string_view name, const char* arg, bool allow_auto, int* out, std::string* error) {
  std::string_view s = arg ? arg : "";
  if (allow_auto && s == "auto") {
    *out = 0;
    return true;
  }
  int v = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || ec != std::errc() || end != s.data() + s.size() || v < 1 || v > kMaxSize) {
    *error = "--" + std::string(name) + "='" + cut_value(std::string(s)) + "' is not a valid size; use a positive integer" +
             (allow_auto ? " or 'auto'" : "") + ", e.g. --" + std::string(name) + "=2";
    return false;
  }
  *out = v;
  return true;
}

}  // namespace

const std::vector<OptionSpec>& option_specs() {
  static const std::vector<OptionSpec> specs = {
      {OptionId::tp, "mesh-tp", "N", "[meshrun] tensor-parallel size"},
      {OptionId::cp, "mesh-cp", "N", "[meshrun] context-parallel size"},
      {OptionId::pp, "mesh-pp", "N", "[meshrun] pipeline-parallel size"},
      {OptionId::dp, "mesh-dp", "N|auto", "[meshrun] data-parallel size (auto = tasks / (tp*cp*pp))"},
      {OptionId::ep, "mesh-ep", "N", "[meshrun] expert-parallel size (folds into dp*cp)"},
      {OptionId::order, "mesh-order", "ORDER", "[meshrun] rank order, fastest axis first, e.g. tp-cp-ep-dp-pp"},
      {OptionId::template_file, "mesh-template", "FILE", "[meshrun] TOML job template; --mesh-* flags override it"},
      {OptionId::env, "mesh-env", "NAME=VALUE,...",
       "[meshrun] extra task variables, allow-listed like a template's [env], e.g. --mesh-env=NCCL_DEBUG=INFO"},
      {OptionId::dry_run, "mesh-dry-run", nullptr, "[meshrun] srun: print the step's rank map, launch nothing"},
      {OptionId::off, "mesh-off", nullptr, "[meshrun] disable meshrun for this job or step"},
      {OptionId::preflight, "mesh-preflight", nullptr,
       "[meshrun] srun (every srun of an sbatch/salloc job): first run `meshrun preflight` on the step's nodes; "
       "a failing node refuses the step"},
  };
  return specs;
}

bool MeshOptions::active() const {
  if (off) return false;
  return tp || cp || pp || dp || ep || order || template_file || !env.empty() || dry_run || preflight;
}

bool set_option(MeshOptions& o, OptionId id, const char* arg, std::string* error) {
  int v = 0;
  switch (id) {
    case OptionId::tp: if (!parse_size("mesh-tp", arg, false, &v, error)) return false; o.tp = v; return true;
    case OptionId::cp: if (!parse_size("mesh-cp", arg, false, &v, error)) return false; o.cp = v; return true;
    case OptionId::pp: if (!parse_size("mesh-pp", arg, false, &v, error)) return false; o.pp = v; return true;
    case OptionId::ep: if (!parse_size("mesh-ep", arg, false, &v, error)) return false; o.ep = v; return true;
    case OptionId::dp: if (!parse_size("mesh-dp", arg, true, &v, error)) return false; o.dp = v; return true;
    case OptionId::order: {
      std::string why;
      if (!arg || !parse_order(arg, &why)) {
        *error = "--mesh-order is not a rank order (" + cut_long_values(why) +
                 "); use the five axes fastest first, e.g. --mesh-order=tp-cp-ep-dp-pp";
        return false;
      }
      o.order = arg;
      return true;
    }
    case OptionId::template_file:
      if (!arg || !*arg || arg[0] == '-') {
        // A required argument swallows the next token: "--mesh-template --wrap ..." would take "--wrap".
        *error = "--mesh-template needs a TOML file, got '" + cut_value(arg ? arg : "") +
                 "'; use --mesh-template=path/to/job.toml";
        return false;
      }
      o.template_file = arg;
      return true;
    case OptionId::env: {
      std::vector<std::pair<std::string, std::string>> vars;
      std::string_view s = arg ? arg : "";
      while (!s.empty() || vars.empty()) {
        const size_t comma = s.find(',');
        const std::string_view item = s.substr(0, comma);
        const size_t eq = item.find('=');
        const std::string name(item.substr(0, eq == std::string_view::npos ? 0 : eq));
        bool valid = eq != std::string_view::npos && !name.empty() && !(name[0] >= '0' && name[0] <= '9') && vars.size() < 256;
        for (char c : name) valid = valid && (std::isalnum(static_cast<unsigned char>(c)) || c == '_');
        if (!valid) {
          *error = "--mesh-env='" + cut_value(std::string(arg ? arg : "")) +
                   "' is not a list of NAME=VALUE; use e.g. --mesh-env=NCCL_DEBUG=INFO,OMP_NUM_THREADS=4 (values "
                   "without ','; put others in the template's [env])";
          return false;
        }
        vars.emplace_back(name, std::string(item.substr(eq + 1)));
        if (comma == std::string_view::npos) break;
        s.remove_prefix(comma + 1);
      }
      o.env = std::move(vars);
      return true;
    }
    case OptionId::dry_run: o.dry_run = true; return true;
    case OptionId::off: o.off = true; return true;
    case OptionId::preflight: o.preflight = true; return true;
  }
  *error = "unknown meshrun option";
  return false;
}

}  // namespace meshrun::plugin
