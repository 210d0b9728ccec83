// The plugin's user options (--mesh-tp ... --mesh-off) as plain values, parsed without Slurm.
//
// Every option carries the "mesh-" prefix: Slurm's commands parse with getopt_long, which accepts unique
// prefixes, so a bare --ep=4 on a node without the plugin would silently become --epilog=4.
#pragma once
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace meshrun::plugin {

enum class OptionId { tp, cp, pp, dp, ep, order, template_file, env, dry_run, off, preflight };

struct OptionSpec {
  OptionId id;
  const char* name;     // without the leading "--"
  const char* arginfo;  // nullptr for flags
  const char* usage;
};
const std::vector<OptionSpec>& option_specs();

// What the user asked for. Unset values fall back to the template, then to the defaults.
struct MeshOptions {
  std::optional<int> tp, cp, pp, ep;
  std::optional<int> dp;  // 0 = "auto"
  std::optional<std::string> order;
  std::optional<std::string> template_file;
  // --mesh-env=NAME=VALUE,NAME=VALUE: task variables like a template's [env] (allow-listed the same way);
  // `meshrun sbatch` renders the --set env.* overrides here in its plugin variant.
  std::vector<std::pair<std::string, std::string>> env;
  bool dry_run = false;
  bool off = false;
  // --mesh-preflight: srun runs a `meshrun preflight` step on the step's nodes first and refuses the step when a
  // node fails (preflight_step.hpp); from sbatch/salloc it reaches every srun of the job.
  bool preflight = false;
  // True when any --mesh-* option asks for a layout; without one the plugin leaves jobs alone.
  bool active() const;
};

// Checks and stores one option value. Later values win: Slurm calls the callback for the value inherited
// from the environment first, then for the command line, and a step may override an sbatch option.
// Returns false with a one-line *error naming the problem and the fix.
bool set_option(MeshOptions& opts, OptionId id, const char* arg, std::string* error);

}  // namespace meshrun::plugin
