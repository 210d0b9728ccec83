#include "batch_script.hpp"

#include <algorithm>
#include <filesystem>
#include <sstream>

namespace meshrun::launch {
namespace {

// A value that lands on an #SBATCH line: no whitespace or control characters (they would end the option or
// inject a script line).
void check_option_value(const Resolved& r, const std::string& key) {
  std::string v = value_text(r.cfg.job, key);
  for (char c : v) {
    if (static_cast<unsigned char>(c) <= ' ' || c == 0x7f)
      throw ConfigError(r.cfg.origin_of(key).str() + ": " + key + " = \"" + v +
                        "\" contains a space or control character, which an #SBATCH line cannot carry; use a "
                        "single word such as \"my-run\"");
  }
}

// "SIGUSR1" / "usr1" / "USR1" -> "USR1"; only signals a trainer can catch and Slurm's --signal accepts.
std::string checkpoint_signal(const Resolved& r) {
  std::string s = r.cfg.job.checkpoint.signal;
  for (auto& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  if (s.rfind("SIG", 0) == 0) s = s.substr(3);
  for (const char* ok : {"USR1", "USR2", "TERM", "INT", "HUP", "URG"})
    if (s == ok) return s;
  throw ConfigError(r.cfg.origin_of("checkpoint.signal").str() + ": checkpoint.signal = \"" +
                    r.cfg.job.checkpoint.signal + "\" is not a signal a trainer can catch; use \"USR1\" (default), "
                    "\"USR2\" or \"TERM\"");
}

std::string layout_line(const Resolved& r) {
  const Layout& l = r.layout;
  std::ostringstream o;
  o << r.cfg.job.model.name << ", tp·cp·pp·dp = " << l.tp << "·" << l.cp << "·" << l.pp << "·" << l.dp << " = "
    << l.world() << " ranks";
  if (l.ep > 1) o << " (ep " << l.ep << ")";
  o << ", order " << l.order.str() << ", " << r.cluster.nodes << " node" << (r.cluster.nodes == 1 ? "" : "s")
    << " × " << r.cluster.gpus_per_node << " GPUs (" << r.cluster.type.name << ")";
  return o.str();
}

std::vector<std::string> mesh_options(const Resolved& r, const BatchOptions& opt) {
  const Layout& l = r.layout;
  std::vector<std::string> v = {"--mesh-template=" + opt.template_path, "--mesh-tp=" + std::to_string(l.tp),
                                "--mesh-cp=" + std::to_string(l.cp),    "--mesh-pp=" + std::to_string(l.pp),
                                "--mesh-dp=" + std::to_string(l.dp),    "--mesh-ep=" + std::to_string(l.ep),
                                "--mesh-order=" + l.order.str()};
  // --set env.* (and --mesh-* flags' env) reach the plugin's task environment too, not only the trainer.
  std::string env;
  for (const auto& [name, value] : r.cfg.job.env) {
    const SourceKind kind = r.cfg.origin_of("env." + name).kind;
    if (kind != SourceKind::set && kind != SourceKind::flag) continue;  // the template's [env] the plugin reads itself
    if (value.find_first_of(", \t\n'\"\\$`") != std::string::npos || value.empty())
      throw ConfigError("--set env." + name + "=" + value + ": the plugin's --mesh-env cannot carry an empty value, "
                        "',', spaces, quotes or '$'; put it in the template's [env] or use --plugin no");
    env += (env.empty() ? "" : ",") + name + "=" + value;
  }
  if (!env.empty()) v.push_back("--mesh-env=" + env);
  return v;
}

}  // namespace

std::vector<std::string> rank_command(const BatchOptions& opt) {
  std::vector<std::string> cmd = opt.command;
  // `-- --metrics m.jsonl`: flags for the bundled trainer (no program name starts with '-').
  if (!cmd.empty() && starts_with_dash(cmd.front())) cmd.insert(cmd.begin(), opt.trainer);
  if (cmd.empty()) cmd = {opt.trainer, opt.template_path};
  else if (std::filesystem::path(cmd[0]).filename() != "meshrun-train") return cmd;
  // meshrun-train's arguments (parse_args in trainer/src/run/cli_train.cpp): one positional template; --set,
  // --metrics, --site, --trace and --trace-steps take a value.
  std::size_t positional = 0;
  for (std::size_t i = 1; i < cmd.size() && positional == 0; ++i) {
    const std::string& a = cmd[i];
    if (a == "--set" || a == "--metrics" || a == "--site" || a == "--trace" || a == "--trace-steps") ++i;
    else if (a.empty() || a[0] != '-') positional = i;
  }
  if (positional == 0) {
    cmd.insert(cmd.begin() + 1, opt.template_path);
  } else {
    namespace fs = std::filesystem;
    std::error_code ec;
    const fs::path theirs = fs::weakly_canonical(fs::absolute(cmd[positional]), ec);
    const fs::path ours = fs::weakly_canonical(opt.template_path, ec);
    if (theirs != ours)
      throw ConfigError("the command after -- trains " + cmd[positional] + " but the job is laid out from " + opt.template_path +
                        "; meshrun-train must train the job's template: give the same file to both (or drop it from the "
                        "command: it is added)");
  }
  cmd.insert(cmd.end(), opt.site_options.begin(), opt.site_options.end());
  cmd.insert(cmd.end(), opt.sets.begin(), opt.sets.end());
  return cmd;
}

std::vector<std::string> srun_command(const Resolved& r, const BatchOptions& opt, bool mesh_options_on_srun) {
  if (opt.plugin && opt.template_path.find_first_of(" \t\n") != std::string::npos)
    throw ConfigError(opt.template_path + ": the plugin's --mesh-template cannot carry a path with spaces; move "
                      "the template or use --plugin no");
  std::vector<std::string> v{"srun", "--mpi=pmix", "--kill-on-bad-exit=1",
                             "--nodes=" + std::to_string(r.cluster.nodes),
                             "--ntasks-per-node=" + std::to_string(r.cluster.gpus_per_node)};
  // Slurm 22.05 srun no longer inherits SLURM_CPUS_PER_TASK from the batch step: pass it explicitly.
  if (opt.cpus_per_task > 0) v.push_back("--cpus-per-task=" + std::to_string(opt.cpus_per_task));
  const std::vector<std::string> cmd = rank_command(opt);
  if (opt.plugin) {
    // The plugin computes each task's environment in slurmstepd from these options.
    if (mesh_options_on_srun) {
      auto m = mesh_options(r, opt);
      v.insert(v.end(), m.begin(), m.end());
    }
  } else {
    v.insert(v.end(), {opt.meshrun, "exec", "--template", opt.template_path});
    v.insert(v.end(), opt.site_options.begin(), opt.site_options.end());
    v.insert(v.end(), opt.sets.begin(), opt.sets.end());
    v.push_back("--");
  }
  v.insert(v.end(), cmd.begin(), cmd.end());
  return v;
}

std::vector<std::string> preflight_srun_command(const Resolved& r, const BatchOptions& opt) {
  BatchOptions p = opt;
  p.command = {opt.meshrun, "preflight", opt.template_path};
  p.command.insert(p.command.end(), opt.site_options.begin(), opt.site_options.end());
  p.command.insert(p.command.end(), opt.sets.begin(), opt.sets.end());
  std::vector<std::string> v = srun_command(r, p, /*mesh_options_on_srun=*/false);
  std::replace(v.begin(), v.end(), std::string("--kill-on-bad-exit=1"), std::string("--wait=30"));
  return v;
}

std::string render_batch_script(const Resolved& r, const BatchOptions& opt) {
  for (const char* key : {"job.name", "job.time", "job.partition", "job.account", "job.qos"}) check_option_value(r, key);
  const JobSpec& job = r.cfg.job.job;
  const CheckpointSpec& ck = r.cfg.job.checkpoint;
  bool checkpoints = !ck.dir.empty();
  bool requeue = checkpoints && ck.resume;
  std::string sig = checkpoints ? checkpoint_signal(r) : "";

  std::ostringstream s;
  s << "#!/bin/bash\n";
  s << "# Generated by `meshrun sbatch` from " << opt.template_path << "\n";
  s << "# " << layout_line(r) << "\n";
  s << "# Regenerate instead of editing: `meshrun sbatch TEMPLATE --dry-run` also lists each value's source.\n";
  auto sb = [&](const std::string& line) { s << "#SBATCH " << line << "\n"; };
  sb("--job-name=" + job.name);
  sb("--nodes=" + std::to_string(r.cluster.nodes));
  // One task per GPU (launch pattern B): srun starts every rank, so nothing may spawn per-GPU processes again.
  sb("--ntasks-per-node=" + std::to_string(r.cluster.gpus_per_node));
  sb("--gpus-per-node=" + std::to_string(r.cluster.gpus_per_node));
  if (opt.cpus_per_task > 0) sb("--cpus-per-task=" + std::to_string(opt.cpus_per_task));
  sb("--time=" + job.time);
  if (!job.partition.empty()) sb("--partition=" + job.partition);
  if (!job.account.empty()) sb("--account=" + job.account);
  if (!job.qos.empty()) sb("--qos=" + job.qos);
  sb("--output=" + opt.output);
  sb("--open-mode=append");  // a requeued run appends to the same log instead of truncating it
  if (checkpoints) sb("--signal=B:" + sig + "@" + std::to_string(ck.signal_lead_s));
  if (requeue) sb("--requeue");
  // An NVLink domain that spans nodes (GB200 NVL72: 72 GPUs = 18 trays): TP/EP groups assume the job's nodes
  // come in whole domains. Slurm 24.05 added --segment (with topology/block) to allocate nodes in such blocks.
  const int per_domain = r.cluster.gpus_per_node > 0 ? r.cluster.nvlink_domain_gpus / r.cluster.gpus_per_node : 1;
  if (per_domain > 1) {
    const int segment = std::min(per_domain, r.cluster.nodes);
    const std::string what = "--segment=" + std::to_string(segment) + " (" + std::to_string(segment) +
                             " nodes of one " + std::to_string(r.cluster.nvlink_domain_gpus) + "-GPU NVLink domain)";
    if (r.cluster.nodes % segment != 0)
      s << "# " << what << " not rendered: " << r.cluster.nodes << " nodes are not a multiple of " << segment << "\n";
    else if (opt.slurm_version >= 2405)
      sb("--segment=" + std::to_string(segment));
    else
      s << "# " << what << " not rendered: "
        << (opt.slurm_version > 0 ? "the local Slurm is " + std::to_string(opt.slurm_version / 100) + "." +
                                        (opt.slurm_version % 100 < 10 ? "0" : "") + std::to_string(opt.slurm_version % 100)
                                  : std::string("the local Slurm's version is unknown"))
        << "; --segment needs Slurm 24.05 or later (topology/block). Ask for whole NVLink domains another way "
           "(e.g. --constraint or --switches).\n";
  }
  if (opt.plugin)
    for (const auto& m : mesh_options(r, opt)) sb(m);  // validated by the plugin at submission
  for (const auto& x : opt.extra) {
    bool word = x.rfind("-", 0) == 0;
    for (char ch : x) word = word && static_cast<unsigned char>(ch) > ' ' && ch != 0x7f;
    if (!word)
      throw ConfigError("--sbatch-option '" + x + "': expected one sbatch option without spaces, e.g. "
                        "--sbatch-option=--exclusive");
    sb(x);
  }
  s << "\n";
  s << "echo \"meshrun: job ${SLURM_JOB_ID} restart ${SLURM_RESTART_COUNT:-0} on ${SLURM_JOB_NODELIST}: "
    << r.layout.world() << " ranks\"\n";

  if (opt.preflight) {
    s << "\n";
    s << "# --preflight: every node is checked before the job step (devices, CPU binding, GEMM, bandwidth; see\n"
      << "# `meshrun preflight --help`). A failing node stops the job here; the table above names it.\n";
    s << shell_join(preflight_srun_command(r, opt)) << "\n";
    s << "preflight=$?\n";
    s << "if [ \"$preflight\" -ne 0 ]; then\n";
    s << "  echo \"meshrun: preflight failed (exit $preflight); the job step was not started. Resubmit with\" \\\n"
      << "       \"--sbatch-option=--exclude=HOSTLIST, HOSTLIST from the 'failing nodes' line above\"\n";
    s << "  exit \"$preflight\"\n";
    s << "fi\n";
    s << "\n";
  }
  // With the plugin the srun step inherits the #SBATCH --mesh-* options; without it meshrun exec computes
  // each task's environment.
  std::string srun_line = shell_join(srun_command(r, opt, /*mesh_options_on_srun=*/false));

  if (!checkpoints) {
    s << "exec " << srun_line << "\n";
    return s.str();
  }
  s << "\n";
  s << "# " << sig << " arrives " << ck.signal_lead_s << " s before the time limit at this shell only (B:). The trap\n"
    << "# relays it through srun to every rank; meshrun-train saves a checkpoint, writes checkpoint.dir/status\n"
    << "# (\"saved STEP SIGNAL\", \"not-saved STEP ...\" or \"finished STEP\") and exits 75. This shell decides from\n"
    << "# that file, not from srun's exit status: "
    << (requeue ? "it requeues the job only when the file says the save was committed." : "no requeue (checkpoint.resume is off).")
    << "\n";
  s << "status=" << shell_quote((std::filesystem::path(ck.dir) / "status").string()) << "\n";
  s << "rm -f \"$status\"\n";
  s << "requested=0\n";
  s << "trap 'requested=1; kill -" << sig << " \"$step\" 2>/dev/null' " << sig << "\n";
  s << srun_line << " &\n";
  s << "step=$!\n";
  s << "while :; do\n";
  s << "  wait \"$step\"; rc=$?\n";
  s << "  kill -0 \"$step\" 2>/dev/null || break  # wait returns early when the trap runs\n";
  s << "done\n";
  s << "state=; at=; how=; why=\n";
  s << "[ -r \"$status\" ] && read -r state at how why <\"$status\"\n";
  s << "case \"$state\" in\n";
  s << "  saved)\n";
  if (requeue) {
    s << "    if [ \"${SLURM_RESTART_COUNT:-0}\" -lt " << kMaxRequeues << " ]; then\n";
    s << "      echo \"meshrun: the trainer committed checkpoint step-${at} after SIG${how} ($status); requeueing job ${SLURM_JOB_ID}\"\n";
    s << "      scontrol requeue \"$SLURM_JOB_ID\" || echo \"meshrun: scontrol requeue failed (exit $?); resubmit to continue from step-${at}\"\n";
    s << "    else\n";
    s << "      echo \"meshrun: the trainer committed checkpoint step-${at}, but the job was already requeued ${SLURM_RESTART_COUNT} times; resubmit to continue\"\n";
    s << "    fi\n";
  } else {
    s << "    echo \"meshrun: the trainer committed checkpoint step-${at} after SIG${how} ($status); not requeueing (checkpoint.resume = false)\"\n";
  }
  s << "    ;;\n";
  s << "  finished) echo \"meshrun: training finished at step ${at}\" ;;\n";
  s << "  not-saved) echo \"meshrun: the trainer stopped after step ${at} on SIG${how} without saving a checkpoint: ${why}; not requeueing\" ;;\n";
  s << "  *) [ \"$requested\" = 1 ] && echo \"meshrun: " << sig
    << " was relayed to the job step, but no status file says a checkpoint was saved ($status; srun exit $rc); not requeueing\" ;;\n";
  s << "esac\n";
  s << "exit \"$rc\"\n";
  return s.str();
}

}  // namespace meshrun::launch
