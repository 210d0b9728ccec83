// What `meshrun exec`, `meshrun sbatch` and `meshrun run` share beyond the lead's config_flags.hpp: passing
// the same overrides on to commands that run inside the job, resolving a Config into a checked layout with
// the sources of conflicting values, shell quoting, and finding the meshrun and trainer binaries.
#pragma once
#include <functional>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "meshrun/config.hpp"
#include "meshrun/layout.hpp"
#include "meshrun/rank_map.hpp"
#include "meshrun/task_env.hpp"

namespace meshrun::launch {

// The arguments `meshrun sbatch` and `meshrun run` share: TEMPLATE.toml, the configuration flags, --dry-run,
// --plugin auto|yes|no and `-- CMD ARGS...` (the command each rank runs instead of the trainer).
struct LaunchArgs {
  ConfigRequest req;
  std::vector<std::string> command;
  bool dry_run = false;
  std::string plugin_mode = "auto";
};
// `own` takes a subcommand's own flags: given args and i, it consumes args[i] (advancing i) and returns
// true, or returns false. Throws ConfigError on bad input; `name` and `example` shape the messages.
// Returns false when --help was asked for (the caller prints it).
bool parse_launch_args(const std::vector<std::string>& args, const std::string& name, const std::string& example,
                       LaunchArgs& out, const std::function<bool(const std::vector<std::string>&, size_t&)>& own);

// The flags (--mesh-*, --nodes ...) and --set assignments of a request as "--set" "key=value" argument
// pairs, lowest priority first, for passing the same configuration to a command that runs later (inside the job).
std::vector<std::string> overrides_as_sets(const ConfigRequest& request);

// --site FILE / --no-site of a request, passed on to `meshrun exec` and the trainer inside the job.
std::vector<std::string> site_options(const ConfigRequest& request);

// A configuration with everything the launcher derives from it.
struct Resolved {
  Config cfg;
  Cluster cluster;
  Layout layout;
  RuleSet rules = RuleSet::trainer;   // the rule set applied
  std::vector<std::string> checks;    // checks run (all passed)
  std::vector<std::string> warnings;
};
// Resolves the cluster and the layout and runs every check. Throws ConfigError with the first problem on
// one line, followed by the source of each value it involves ("[parallel.tp=8 from template t.toml:3:6; ...]")
// so a conflict between layers names both layers.
// trainer_job: the job runs meshrun-train (is_trainer_command), so its template's model gets the bundled
// trainer's rules too (validate_trainer), as meshrun-train will check them.
// trainer_job also checks the data's input files (data_input_problems): one line per missing file.
Resolved resolve(const Config& cfg, bool trainer_job = false);
// Where a data key was set, for data_input_problems: a template's file:line:col, else "" (a --set names itself).
std::function<std::string(const std::string&)> data_key_location(const Config& cfg);
// The command is meshrun-train: empty (sbatch's and run's default), flags for it (`-- --metrics m.jsonl`: the
// first word starts with '-', which no program name does), or a program of that name.
bool is_trainer_command(const std::vector<std::string>& command);
inline bool starts_with_dash(const std::string& word) { return !word.empty() && word[0] == '-'; }

// The dry-run report (`meshrun plan`'s table: values with sources, rank map summary, groups, warnings), each
// line commented with "# " so that it can follow a script without changing what the script does.
std::string plan_as_comment(const Resolved& r, const std::string& template_path);

// Single-quotes a word for a POSIX shell unless it is plainly safe ("a-b/c.toml" stays as is).
std::string shell_quote(const std::string& word);
std::string shell_join(const std::vector<std::string>& words);

// Absolute path of the running meshrun binary (/proc/self/exe), "meshrun" when unknown.
std::string self_path();
// The trainer: `meshrun-train` next to this binary (install tree), in ../trainer (build tree), else the bare
// name for $PATH.
std::string trainer_path();
// The task as mpirun describes it (OMPI_COMM_WORLD_{RANK,SIZE,LOCAL_RANK,LOCAL_SIZE}; the job id for MASTER_PORT
// from OMPI_MCA_ess_base_jobid). MASTER_ADDR is left to the caller. Throws ConfigError naming a missing or
// malformed variable. `meshrun exec` and `meshrun preflight` read a task the same way.
TaskContext context_from_mpirun(const std::map<std::string, std::string>& env);

// First directory of $PATH (from `env`) holding an executable `name`; nullopt when none does.
std::optional<std::string> find_in_path(const std::string& name, const std::map<std::string, std::string>& env);

}  // namespace meshrun::launch
