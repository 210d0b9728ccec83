// The batch script `meshrun sbatch` submits: #SBATCH geometry from the resolved layout (one task per GPU),
// checkpoint signal and requeue, logs that survive requeue, and one srun step that starts every rank through
// `meshrun exec` (or directly, with --mesh-* options, when the SPANK plugin is installed).
// A pure function of its inputs, so the golden tests pin it byte for byte.
#pragma once
#include <string>
#include <vector>

#include "launch_common.hpp"

namespace meshrun::launch {

struct BatchOptions {
  std::string template_path;           // absolute: the job may start in another directory
  std::vector<std::string> sets;       // "--set" "key=value" pairs the job's commands receive
  std::vector<std::string> site_options;  // --site FILE / --no-site, for meshrun exec and the trainer
  std::vector<std::string> command;    // the program per rank; empty = trainer + template + sets
  std::string meshrun = "meshrun";     // the meshrun binary the job calls
  std::string trainer = "meshrun-train";
  bool plugin = false;                 // the meshrun SPANK plugin is installed: pass --mesh-* to Slurm
  int cpus_per_task = 0;               // 0 = leave Slurm's default
  std::string output = "%x-%j.out";    // %x job name, %j job id
  std::vector<std::string> extra;      // more #SBATCH options, verbatim ("--exclusive", "--constraint=h100")
  // The local Slurm's release (major * 100 + minor, 0 = unknown): --segment (24.05+) keeps the nodes of one
  // multi-node NVLink domain (GB200 NVL72) together.
  int slurm_version = 0;
  // --preflight: a `meshrun preflight` step on the job's geometry before the job step; the job stops there
  // when a node fails (docs/launcher.md, "meshrun preflight").
  bool preflight = false;
};

// The program every rank runs: opt.command, or the bundled trainer with the template, the site options and
// the overrides. The bundled trainer reads its configuration from its arguments, not from the task
// environment, so a command that runs meshrun-train gets the job's site options and --set overrides (the
// --mesh-* flags among them) appended after its own (the job's win), and the template is inserted where it
// names none; a command naming another template is refused (ConfigError: its layout would not be the one
// the ranks are placed by). Any other program reads the layout from its environment and runs as given.
std::vector<std::string> rank_command(const BatchOptions& opt);

// Requeues the script allows itself after a checkpoint at the time limit (SLURM_RESTART_COUNT counts them).
inline constexpr int kMaxRequeues = 5;

std::string render_batch_script(const Resolved& r, const BatchOptions& opt);

// The srun line of the step (also used by `meshrun run` inside an allocation): geometry, then the per-rank
// command. Arguments unquoted; the caller quotes them for a script or passes them to execvp. With the plugin,
// the --mesh-* options go on the srun line unless the step inherits them (#SBATCH lines of the script).
std::vector<std::string> srun_command(const Resolved& r, const BatchOptions& opt, bool mesh_options_on_srun = true);

// The preflight step of --preflight: the same geometry and task set-up (meshrun exec, or the plugin's --mesh-*
// options the step inherits) running `meshrun preflight TEMPLATE` with the job's site options and overrides.
// `--wait=30` instead of --kill-on-bad-exit: every task ends with the verdict's status at about the same time,
// and a stopped node's tasks are ended 30 s after the first task's watchdog gives up.
std::vector<std::string> preflight_srun_command(const Resolved& r, const BatchOptions& opt);

}  // namespace meshrun::launch
