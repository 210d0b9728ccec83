// meshrun run: launch a template now. Inside a Slurm allocation: one srun step with the layout's geometry.
// Outside: every rank on this machine under Open MPI's mpirun, each through `meshrun exec`.
#include <sched.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "batch_script.hpp"
#include "commands.hpp"
#include "config_flags.hpp"
#include "slurm_probe.hpp"

extern char** environ;

namespace {

// More local ranks than this is a cluster job, not something to start on one machine.
constexpr int kMaxLocalRanks = 64;

const char* kRunHelp =
    "usage: meshrun run TEMPLATE.toml [options] [-- COMMAND ARGS...]\n"
    "\n"
    "Launches every rank of the template now, each through `meshrun exec` (rank, GPU, CPU binding, NCCL):\n"
    "  inside a Slurm allocation (salloc, or a batch script): srun --nodes=N --ntasks-per-node=GPUS\n"
    "    with the allocation's node count; the SPANK plugin's --mesh-* options replace meshrun exec\n"
    "    when the plugin is installed;\n"
    "  outside Slurm: mpirun -np WORLD on this machine (all ranks folded onto this one node;\n"
    "    --oversubscribe when it has fewer cores than ranks, --allow-run-as-root as root).\n"
    "COMMAND defaults to the trainer: meshrun-train TEMPLATE (with the same --set overrides); a COMMAND that\n"
    "runs meshrun-train gets the overrides after its own arguments, and may not name another template.\n"
    "Words after -- that start with '-' are flags for meshrun-train: -- --metrics m.jsonl --trace t.\n"
    "\n"
    "options:\n"
    "  --dry-run              print the launch command and the plan; run nothing\n"
    "  --plugin auto|yes|no   inside an allocation: use the SPANK plugin (auto: `sbatch --help` decides)\n"
    "%s"
    "\n"
    "examples:\n"
    "  meshrun run templates/tiny.toml\n"
    "  meshrun run templates/tiny.toml --set training.steps=5 --dry-run\n"
    "  meshrun run templates/tiny.toml -- --metrics m.jsonl\n"
    "  salloc -N2 --ntasks-per-node=4 --gpus-per-node=4 meshrun run templates/tiny.toml --nodes 2\n"
    "  meshrun run templates/tiny.toml -- python -c 'import os; print(os.environ[\"RANK\"])'\n"
    "\n"
    "Outside Slurm, a run of meshrun-train with checkpoint.dir takes Ctrl-C (SIGINT) or SIGTERM as\n"
    "checkpoint.signal: the ranks save after the current step and stop, and meshrun run exits 75; a second\n"
    "Ctrl-C aborts the job.\n"
    "\n"
    "exit status: the launched command's (75 after a signal-driven save); 2 bad input (one line on stderr);\n"
    "1 launcher not found\n";

int fail(const std::string& msg, int code = 2) {
  std::fputs(meshrun::message_lines("meshrun run: ", msg).c_str(), stderr);
  return code;
}

// A local run of meshrun-train with checkpoint.dir under mpirun: Ctrl-C (SIGINT) or SIGTERM to meshrun run asks
// the ranks for the save-and-stop of checkpoint.signal instead of letting mpirun abort the job (mpirun sends
// the ranks SIGTERM and SIGKILL 1 s later, odls_base_sigkill_timeout, then exits 1 with its abort banner).
// mpirun runs in its own process group, so the terminal's SIGINT reaches only this process, which relays the
// signal through mpirun (it forwards SIGUSR1/SIGUSR2 to every rank, ess_base_forward_signals). The ranks exit 0
// after the save (MESHRUN_STOP_EXIT_STATUS=0: no abort, no banner) and this process exits 75 when DIR/status
// says "saved". A second signal aborts the job through mpirun as before.
volatile sig_atomic_t g_signals = 0;
volatile sig_atomic_t g_last_signal = 0;
pid_t g_mpirun = -1;
int g_relay = SIGUSR1;
extern "C" void on_run_signal(int sig) {
  g_last_signal = sig;
  if (g_mpirun > 0) ::kill(g_mpirun, g_signals == 0 ? g_relay : SIGTERM);
  g_signals = g_signals + 1;
}

int supervise(std::vector<char*>& cargv, const std::string& ckdir, const std::string& relay_name) {
  g_relay = relay_name == "USR2" ? SIGUSR2 : SIGUSR1;
  struct sigaction sa{};
  sa.sa_handler = on_run_signal;
  sigemptyset(&sa.sa_mask);
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) ::sigaction(sig, &sa, nullptr);
  const pid_t child = ::fork();
  if (child < 0) return fail(std::string("cannot fork mpirun: ") + std::strerror(errno), 1);
  if (child == 0) {
    ::setpgid(0, 0);
    for (int sig : {SIGINT, SIGTERM, SIGHUP}) ::signal(sig, SIG_DFL);
    ::execvp(cargv[0], cargv.data());
    std::fprintf(stderr, "meshrun run: cannot run %s: %s; install Open MPI (apt-get install openmpi-bin)\n", cargv[0],
                 std::strerror(errno));
    ::_exit(1);
  }
  ::setpgid(child, child);  // both sides, so no signal finds it still in ours
  g_mpirun = child;
  int status = 0, told = 0;
  while (::waitpid(child, &status, 0) < 0) {
    if (errno != EINTR) return fail(std::string("waitpid: ") + std::strerror(errno), 1);
    if (g_signals > told) {
      told = g_signals;
      const char* name = g_last_signal == SIGINT ? "SIGINT" : g_last_signal == SIGTERM ? "SIGTERM" : "SIGHUP";
      if (told == 1)
        std::fprintf(stderr, "meshrun run: %s: asking the ranks to save and stop after this step (SIG%s through "
                             "mpirun); send it again to abort without saving\n", name, relay_name.c_str());
      else
        std::fprintf(stderr, "meshrun run: %s again: aborting the job (SIGTERM to mpirun)\n", name);
    }
  }
  const int rc = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  if (rc != 0) return rc;
  std::string line;
  std::getline(std::ifstream(std::filesystem::path(ckdir) / "status"), line);
  if (line.rfind("saved ", 0) != 0) return 0;
  std::fprintf(stderr, "meshrun run: %s/status says \"%s\": exit 75; run the same command again to resume\n",
               ckdir.c_str(), line.c_str());
  return 75;
}

// checkpoint.signal as mpirun forwards it by default ("USR1", "USR2"; the trainer reads "sigusr1" too), else "".
std::string relay_signal(std::string name) {
  for (auto& c : name) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  if (name.rfind("SIG", 0) == 0) name = name.substr(3);
  return name == "USR1" || name == "USR2" ? name : "";
}

int usable_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) != 0) return 1;
  return CPU_COUNT(&set);
}

}  // namespace

int cmd_run(int argc, char** argv) {
  using namespace meshrun;
  std::vector<std::string> args(argv + 1, argv + argc);
  launch::BatchOptions opt;
  launch::LaunchArgs la;
  try {
    auto own = [](const std::vector<std::string>&, size_t&) { return false; };
    if (!launch::parse_launch_args(args, "run", "meshrun run templates/tiny.toml", la, own)) {
      std::printf(kRunHelp, cli::config_flags_help());
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
  bool in_allocation = env.count("SLURM_JOB_ID") > 0;
  // Inside a step every task would start a whole new step of its own.
  if (auto step = env.find("SLURM_STEP_ID"); step != env.end() && env.count("OMPI_COMM_WORLD_RANK") == 0)
    return fail("running inside job step " + step->second + " (SLURM_STEP_ID is set): every task would launch " +
                "all ranks again; call meshrun run from the batch script or the salloc shell, or use " +
                "`srun meshrun exec -- CMD` per task");
  std::vector<std::string> argv_out;
  launch::Resolved r;
  bool supervised = false;  // a local trainer run with checkpoint.dir: supervise() above
  std::string relay;        // its checkpoint.signal, when mpirun forwards it
  try {
    r = launch::resolve(build_config(req), launch::is_trainer_command(opt.command));
    opt.template_path = std::filesystem::absolute(req.template_path).lexically_normal().string();
    opt.meshrun = launch::self_path();
    opt.trainer = launch::trainer_path();
    if (in_allocation) {
      opt.sets = launch::overrides_as_sets(req);
      opt.site_options = launch::site_options(req);
      opt.plugin = plugin_mode == "auto" ? launch::detect_plugin(env).installed : plugin_mode == "yes";
      if (auto it = env.find("SLURM_CPUS_PER_TASK"); it != env.end()) opt.cpus_per_task = std::atoi(it->second.c_str());
      argv_out = launch::srun_command(r, opt);
    } else {
      // Every rank on this machine: fold the template's nodes into one node of world-size slots.
      int world = r.layout.world();
      if (world > kMaxLocalRanks)
        throw ConfigError("the layout has " + std::to_string(world) + " ranks; meshrun run starts at most " +
                          std::to_string(kMaxLocalRanks) + " on one machine: use meshrun sbatch, or shrink it "
                          "(e.g. --nodes 1 --gpus-per-node 4 --mesh-dp auto)");
      if (r.cluster.nodes != 1) {
        std::fprintf(stderr, "meshrun run: no Slurm allocation; running the %d ranks of %d nodes × %d on this machine\n",
                     world, r.cluster.nodes, r.cluster.gpus_per_node);
        req.flags.push_back({"cluster.nodes", "1", "meshrun run (local)"});
        req.flags.push_back({"cluster.gpus_per_node", std::to_string(world), "meshrun run (local)"});
        if (!r.cfg.job.cluster.hostlist.empty()) req.sets.push_back("cluster.hostlist=");
        r = launch::resolve(build_config(req), launch::is_trainer_command(opt.command));
      }
      opt.sets = launch::overrides_as_sets(req);
      opt.site_options = launch::site_options(req);
      const std::vector<std::string> cmd = launch::rank_command(opt);
      // mpirun's own binding is off: meshrun exec binds each rank from the node topology.
      argv_out = {"mpirun", "-np", std::to_string(world), "--bind-to", "none"};
      if (usable_cores() < world) argv_out.push_back("--oversubscribe");
      if (::geteuid() == 0) argv_out.push_back("--allow-run-as-root");
      const CheckpointSpec& ck = r.cfg.job.checkpoint;
      relay = relay_signal(ck.signal);
      supervised = launch::is_trainer_command(opt.command) && !ck.dir.empty() && !relay.empty();
      // In its own process group mpirun must not read the terminal (SIGTTIN would stop it); the ranks exit 0
      // after a signal-driven save, and this process turns that into 75.
      if (supervised) argv_out.insert(argv_out.end(), {"--stdin", "none", "-x", "MESHRUN_STOP_EXIT_STATUS=0"});
      argv_out.insert(argv_out.end(), {opt.meshrun, "exec", "--template", opt.template_path});
      argv_out.insert(argv_out.end(), opt.site_options.begin(), opt.site_options.end());
      argv_out.insert(argv_out.end(), opt.sets.begin(), opt.sets.end());
      argv_out.push_back("--");
      argv_out.insert(argv_out.end(), cmd.begin(), cmd.end());
    }
  } catch (const ConfigError& e) {
    return fail(e.what());
  }

  if (dry_run) {
    std::printf("%s\n", launch::shell_join(argv_out).c_str());
    std::fputs(launch::plan_as_comment(r, req.template_path).c_str(), stdout);
    return 0;
  }
  for (const auto& w : r.warnings) std::fprintf(stderr, "meshrun run: warning: %s\n", meshrun::cut_long_values(w).c_str());
  std::fflush(stdout);
  std::vector<char*> cargv;
  for (auto& s : argv_out) cargv.push_back(s.data());
  cargv.push_back(nullptr);
  if (supervised) return supervise(cargv, r.cfg.job.checkpoint.dir, relay);
  ::execvp(cargv[0], cargv.data());
  return fail("cannot run " + argv_out[0] + ": " + std::strerror(errno) +
                  (in_allocation ? "; is Slurm's srun on $PATH?" : "; install Open MPI (apt-get install openmpi-bin)"),
              1);
}
