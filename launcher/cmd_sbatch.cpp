// meshrun sbatch: render a batch script for a template and submit it (or, with --dry-run, print it with the
// plan and submit nothing).
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "batch_script.hpp"
#include "commands.hpp"
#include "config_flags.hpp"
#include "slurm_probe.hpp"

extern char** environ;

namespace {

const char* kSbatchHelp =
    "usage: meshrun sbatch TEMPLATE.toml [options] [-- COMMAND ARGS...]\n"
    "\n"
    "Renders a batch script for the template (one task per GPU, CPUs per task, time limit, a checkpoint\n"
    "signal before the limit and --requeue when [checkpoint] dir is set, logs appended across requeues) and\n"
    "submits it with sbatch. Each rank runs `meshrun exec -- meshrun-train TEMPLATE` (or COMMAND), or, when\n"
    "the meshrun SPANK plugin is installed, the trainer directly with #SBATCH --mesh-* options. A COMMAND that\n"
    "runs meshrun-train gets the --mesh-*/--set overrides after its own arguments (and the template if it names\n"
    "none); one naming another template is refused. Other programs read the layout from their environment.\n"
    "Words after -- that start with '-' are flags for meshrun-train: -- --metrics m.jsonl.\n"
    "\n"
    "options:\n"
    "  --dry-run              print the script and the plan (each value with its source); submit nothing\n"
    "  --plugin auto|yes|no   use the SPANK plugin: auto (default) asks `sbatch --help`, else plugstack.conf\n"
    "  --cpus-per-task N      CPUs per rank (default: the partition's CPUs per node / ranks per node, from sinfo)\n"
    "  --output PATTERN       log file (default %%x-%%j.out: job name and id; appended across requeues)\n"
    "  --sbatch-option OPT    one more #SBATCH line, e.g. --sbatch-option=--exclusive (repeatable)\n"
    "  --preflight            run `meshrun preflight` on the job's nodes first; the job stops there when a node\n"
    "                         fails, naming it (the job step is not started)\n"
    "%s"
    "\n"
    "examples:\n"
    "  meshrun sbatch templates/llama3-70b.toml --dry-run\n"
    "  meshrun sbatch templates/llama3-8b.toml --set job.partition=gpu --set training.steps=100\n"
    "  meshrun sbatch templates/tiny.toml --plugin no -- python train.py --epochs 1\n"
    "  meshrun sbatch templates/llama3-405b.toml --sbatch-option=--exclusive --sbatch-option=--constraint=h100\n"
    "  meshrun sbatch templates/llama3-70b.toml --preflight\n"
    "\n"
    "exit status: 0 submitted (prints 'Submitted batch job ID') or printed; 2 bad input; 1 sbatch failed\n";

int fail(const std::string& msg, int code = 2) {
  std::fputs(meshrun::message_lines("meshrun sbatch: ", msg).c_str(), stderr);
  return code;
}

}  // namespace

int cmd_sbatch(int argc, char** argv) {
  using namespace meshrun;
  std::vector<std::string> args(argv + 1, argv + argc);
  launch::BatchOptions opt;
  launch::LaunchArgs la;
  try {
    auto own = [&](const std::vector<std::string>& a, size_t& i) {
      std::string v;
      if (cli::take_value(a, i, "--cpus-per-task", &v)) {
        try {
          opt.cpus_per_task = std::stoi(v);
        } catch (...) {
          opt.cpus_per_task = 0;
        }
        if (opt.cpus_per_task < 1) throw ConfigError("--cpus-per-task " + v + ": expected a positive count");
        return true;
      }
      if (cli::take_value(a, i, "--output", &v)) {
        opt.output = v;
        return true;
      }
      if (cli::take_value(a, i, "--sbatch-option", &v)) {
        opt.extra.push_back(v);
        return true;
      }
      if (a[i] == "--preflight") {
        opt.preflight = true;
        ++i;
        return true;
      }
      return false;
    };
    if (!launch::parse_launch_args(args, "sbatch", "meshrun sbatch templates/tiny.toml --dry-run", la, own)) {
      std::printf(kSbatchHelp, cli::config_flags_help());
      return 0;
    }
  } catch (const ConfigError& e) {
    return fail(e.what());
  }
  ConfigRequest req = std::move(la.req);
  opt.command = std::move(la.command);
  const bool dry_run = la.dry_run;
  const std::string plugin_mode = la.plugin_mode;

  auto env = environment_map(environ);
  req.environment = &env;
  launch::Resolved r;
  std::string script;
  std::string plugin_note;
  try {
    r = launch::resolve(build_config(req), launch::is_trainer_command(opt.command));
    opt.template_path = std::filesystem::absolute(req.template_path).lexically_normal().string();
    opt.sets = launch::overrides_as_sets(req);
    opt.site_options = launch::site_options(req);
    opt.meshrun = launch::self_path();
    opt.trainer = launch::trainer_path();
    if (plugin_mode == "auto") {
      launch::PluginProbe probe = launch::detect_plugin(env);
      opt.plugin = probe.installed;
      plugin_note = std::string(probe.installed ? "installed" : "not installed") + " (" + probe.evidence + ")";
    } else {
      opt.plugin = plugin_mode == "yes";
      plugin_note = std::string(opt.plugin ? "used" : "not used") + " (--plugin " + plugin_mode + ")";
    }
    if (r.cluster.nvlink_domain_gpus > r.cluster.gpus_per_node) opt.slurm_version = launch::slurm_version();
    std::string cpus_note = "--cpus-per-task";
    if (opt.cpus_per_task == 0) {
      if (auto cpus = launch::partition_cpus(r.cfg.job.job.partition)) {
        opt.cpus_per_task = std::max(1, *cpus / r.cluster.gpus_per_node);
        cpus_note = "sinfo: " + std::to_string(*cpus) + " CPUs per node / " + std::to_string(r.cluster.gpus_per_node) +
                    " ranks";
      } else {
        cpus_note = "Slurm's default (sinfo gave no CPU count; pass --cpus-per-task)";
      }
    }
    script = launch::render_batch_script(r, opt);
    if (dry_run) {
      std::fputs(script.c_str(), stdout);
      std::string note = "#\n# --dry-run: nothing submitted\n# plugin: " + plugin_note + "\n# cpus-per-task: " +
                         (opt.cpus_per_task ? std::to_string(opt.cpus_per_task) + " from " : std::string()) +
                         cpus_note + "\n#\n";
      std::fputs(note.c_str(), stdout);
      std::fputs(launch::plan_as_comment(r, req.template_path).c_str(), stdout);
      return 0;
    }
    // The dry run shows them in the plan; a real submission says them on the terminal (TP crossing the
    // network, TP on PCIe, …), as `meshrun plan` does.
    for (const auto& w : r.warnings) std::fprintf(stderr, "meshrun sbatch: warning: %s\n", meshrun::cut_long_values(w).c_str());
  } catch (const ConfigError& e) {
    return fail(e.what());
  }

  // Submit through a temporary file: sbatch stores the script, so the file can go right after.
  char path[] = "/tmp/meshrun-sbatch-XXXXXX";
  int fd = ::mkstemp(path);
  if (fd < 0) return fail("cannot create a temporary file in /tmp for the script; check /tmp", 1);
  bool written = ::write(fd, script.data(), script.size()) == static_cast<ssize_t>(script.size());
  ::close(fd);
  if (!written) {
    ::unlink(path);
    return fail("cannot write the script to " + std::string(path) + "; check free space in /tmp", 1);
  }
  int rc = -1;
  std::string out = launch::run_capture({"sbatch", "--parsable", path}, 120, &rc, /*show_stderr=*/true);
  ::unlink(path);
  if (rc != 0)
    return fail("sbatch failed (" + (rc < 0 ? std::string("not found or timed out") : "exit " + std::to_string(rc)) +
                    "); its message is above. `meshrun sbatch " + req.template_path + " --dry-run` shows the script",
                1);
  std::string id = out.substr(0, out.find_first_of(";\n"));
  std::printf("Submitted batch job %s\n", id.c_str());
  // Where the log will be: %x and %j filled in (other patterns are left for Slurm to expand).
  std::string log = opt.output;
  for (auto [pat, val] : {std::pair<std::string, std::string>{"%x", r.cfg.job.job.name}, {"%j", id}})
    for (size_t p = log.find(pat); p != std::string::npos; p = log.find(pat, p + val.size())) log.replace(p, 2, val);
  std::fprintf(stderr, "meshrun sbatch: %d ranks on %d node%s, plugin %s, log %s\n", static_cast<int>(r.layout.world()),
               r.cluster.nodes, r.cluster.nodes == 1 ? "" : "s", plugin_note.c_str(), log.c_str());
  return 0;
}
