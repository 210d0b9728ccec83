// srun (S_CTX_LOCAL): refuse a bad layout before the step launches, and print the dry run.
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "dry_run.hpp"
#include "job_geometry.hpp"
#include "local_shape.hpp"
#include "preflight_step.hpp"
#include "spank_state.hpp"

namespace meshrun::plugin {
namespace {

// "[type:]N" as Slurm writes SLURM_GPUS_PER_NODE; 0 when absent or not a single count.
int gpus_per_node_from_env() {
  std::string v = env_or_empty("SLURM_GPUS_PER_NODE");
  if (v.empty()) v = env_or_empty("SLURM_GPUS_ON_NODE");
  size_t colon = v.rfind(':');
  if (colon != std::string::npos) v = v.substr(colon + 1);
  return (!v.empty() && v.find_first_not_of("0123456789") == std::string::npos) ? std::atoi(v.c_str()) : 0;
}

// --mesh-preflight: runs the preflight step (preflight_step.hpp) from this srun, before its own step exists, and
// waits for it (bounded). "" when every node passed, else the refusal.
std::string run_preflight(const PluginState& st, const StepShape& shape, const StepPlan& plan) {
  if (env_or_empty("SLURM_JOB_ID").empty())
    return "--mesh-preflight runs a preflight step inside the job before this step, so it needs an allocation: use "
           "it with sbatch or salloc (or inside them), or run srun --mpi=pmix ... meshrun preflight yourself";
  std::string meshrun = st.args.meshrun;
  if (meshrun.empty()) {
    const std::string path = env_or_empty("PATH");
    size_t pos = 0;
    while (meshrun.empty() && pos <= path.size()) {
      const size_t colon = path.find(':', pos);
      const std::string dir = path.substr(pos, colon == std::string::npos ? std::string::npos : colon - pos);
      if (!dir.empty() && ::access((dir + "/meshrun").c_str(), X_OK) == 0) meshrun = dir + "/meshrun";
      if (colon == std::string::npos) break;
      pos = colon + 1;
    }
    if (meshrun.empty())
      return "--mesh-preflight: the meshrun CLI is not on $PATH; install it, or name it in plugstack.conf (meshrun=/usr/bin/meshrun)";
  }
  const std::vector<std::string> args = preflight_srun_args(st.opts, st.args, shape, plan, meshrun);
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  std::fflush(stdout);
  std::fflush(stderr);
  // srun may ignore SIGCHLD (then waitpid finds no child): wait with the default disposition, then restore it.
  struct sigaction dfl{}, old{};
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  ::sigaction(SIGCHLD, &dfl, &old);
  const pid_t pid = ::fork();
  if (pid == 0) {
    // A clean srun: no blocked or ignored signals inherited from this one, no stdin, and the marker that keeps its
    // own plugin from starting another preflight.
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGPIPE, SIGQUIT, SIGUSR1, SIGUSR2}) ::signal(sig, SIG_DFL);
    const int devnull = ::open("/dev/null", O_RDONLY);
    if (devnull >= 0) ::dup2(devnull, 0);
    ::setenv(kPreflightStep, "1", 1);
    ::unsetenv(kStepRefused);
    ::unsetenv(kStepDryRun);
    ::execvp(argv[0], argv.data());
    _exit(127);
  }
  std::string why;
  if (pid < 0) {
    why = std::string("--mesh-preflight: cannot start srun for the preflight step (") + std::strerror(errno) + ")";
  } else {
    const auto start = std::chrono::steady_clock::now();
    int status = 0;
    bool killed = false;
    for (;;) {
      const pid_t r = ::waitpid(pid, &status, WNOHANG);
      if (r == pid) break;
      if (r < 0 && errno != EINTR) {
        status = -1;
        break;
      }
      const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (!killed && waited > kPreflightLimitS) {
        ::kill(pid, SIGTERM);
        killed = true;
      } else if (waited > kPreflightLimitS + 10) {
        ::kill(pid, SIGKILL);
      }
      timespec ts{0, 50 * 1000 * 1000};
      nanosleep(&ts, nullptr);
    }
    if (killed) {
      why = "--mesh-preflight: the preflight step did not finish within " + std::to_string(kPreflightLimitS) +
            " s and was stopped; this step is not started";
    } else if (status == -1) {
      why = "--mesh-preflight: lost track of the preflight step (waitpid failed); this step is not started";
    } else if (!(WIFEXITED(status) && WEXITSTATUS(status) == 0)) {
      const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      why = "--mesh-preflight: the preflight step failed (exit " + std::to_string(code) +
            (code == 127 ? ": srun or meshrun could not be run" : "; its table above names the failing nodes") +
            "); this step is not started: exclude those nodes (--exclude=HOSTLIST) or drop --mesh-preflight";
    }
  }
  ::sigaction(SIGCHLD, &old, nullptr);
  return why;
}

}  // namespace

// srun, before Slurm creates the step. This is the last point where a refusal leaves nothing behind: inside an
// allocation, failing local_user_init (after the step exists) leaves a step Slurm keeps RUNNING with its CPUs
// until the time limit, and every later step waits ("Requested nodes are busy"). Slurm reports node and task
// counts only in local_user_init, so the step's shape is read here from srun's own arguments and, inside an
// allocation, the SLURM_* variables srun takes its defaults from.
int srun_init_post_opt(spank_t, PluginState& st) {
  if (!st.opts.active()) return 0;
  ::unsetenv(kStepRefused);  // never inherited: only this srun's own verdict counts
  ::unsetenv(kStepDryRun);
  StepShape shape = local_step_shape();
  bool known = false;
  // Where Slurm ignores the refusal (an `optional` plugin) the step still starts: the marker ends its tasks.
  auto refuse = [&] {
    ::setenv(kStepRefused, "1", 1);
    st.local_verdict = true;
    return -1;
  };
  if (std::string why = add_own_submission_shape(&shape, &known, nullptr, &st.opts); !why.empty()) {
    slurm_error("meshrun: %s", meshrun::cut_long_values(why).c_str());
    return refuse();
  }
  if (known && shape.gpus_per_node == 0) shape.gpus_per_node = gpus_per_node_from_env();
  if (known) {
    shape.hostlist = env_or_empty("SLURM_JOB_NODELIST");  // names the nodes only when the step spans the job
  }
  StepPlan plan = plan_step(st.opts, st.args, shape);
  if (!plan.problems.empty()) {
    log_error_lines(plan.error_text());
    return refuse();
  }
  // A heterogeneous step checked as a whole here: local_user_init sees one component at a time, whose counts
  // alone would not fit the layout.
  if (known) {
    const auto argv = read_own_cmdline();
    if (argv.size() > 1 && het_components({argv.begin() + 1, argv.end()}).size() > 1) st.local_verdict = true;
  }
  if (known && st.opts.dry_run && plan.layout) {
    std::fputs(render_dry_run(plan).c_str(), stdout);
    std::fflush(stdout);
    ::setenv(kStepDryRun, "1", 1);
    st.local_verdict = true;
    return -1;  // no step is created
  }
  // --mesh-preflight: the step's nodes are checked by a preflight step first (never here, never in slurmstepd);
  // the preflight step's own srun carries kPreflightStep and does not start another.
  if (st.opts.preflight && !st.opts.dry_run && std::getenv(kPreflightStep) == nullptr) {
    if (std::string why = run_preflight(st, shape, plan); !why.empty()) {
      slurm_error("meshrun: %s", meshrun::cut_long_values(why).c_str());
      return refuse();
    }
  }
  return 0;
}

// srun, after Slurm created the step (its shape is known now). Never fails: a failure here would leave the
// step behind (see above). Whatever init_post_opt could not check is reported here once, and the step's
// tasks end before their command runs (slurmstepd sees the marker in their environment).
int srun_local_user_init(spank_t sp, PluginState& st) {
  if (!st.opts.active() || st.local_verdict) return 0;
  uint32_t nnodes = 0, ntasks = 0;
  if (spank_get_item(sp, S_JOB_NNODES, &nnodes) != ESPANK_SUCCESS ||
      spank_get_item(sp, S_JOB_TOTAL_TASK_COUNT, &ntasks) != ESPANK_SUCCESS) {
    slurm_error("meshrun: srun did not report the step's node and task counts; run without --mesh-* options");
    ::setenv(kStepRefused, "1", 1);
    return 0;
  }
  StepShape shape = local_step_shape();
  shape.nodes = static_cast<int>(nnodes);
  shape.tasks = static_cast<int>(ntasks);
  shape.gpus_per_node = gpus_per_node_from_env();
  // A heterogeneous step: srun calls this once per component with that component's counts. The rank map spans
  // all of them, so wait for the last one and check the whole step once.
  const auto argv = read_own_cmdline();
  const size_t components = argv.size() > 1 ? het_components({argv.begin() + 1, argv.end()}).size() : 1;
  if (components > 1) {
    TaskShape c;
    c.nodes = shape.nodes;
    c.tasks = shape.tasks;
    c.tasks_per_node = shape.nodes > 0 && shape.tasks % shape.nodes == 0 ? shape.tasks / shape.nodes : -1;
    st.het_seen.push_back(c);
    if (st.het_seen.size() < components) return 0;
    std::string flags;
    auto add = [&](const std::optional<int>& v, const char* name) {
      if (v) flags += (flags.empty() ? "" : " ") + std::string(name) + "=" + std::to_string(*v);
    };
    add(st.opts.tp, "--mesh-tp");
    add(st.opts.cp, "--mesh-cp");
    add(st.opts.pp, "--mesh-pp");
    const int group = st.opts.tp.value_or(1) * st.opts.cp.value_or(1) * st.opts.pp.value_or(1);
    TaskShape total;
    if (std::string why = het_shape_problem(st.het_seen, group, flags, &total); !why.empty()) {
      slurm_error("meshrun: %s", meshrun::cut_long_values(why).c_str());
      ::setenv(kStepRefused, "1", 1);
      return 0;
    }
    shape.nodes = total.nodes;
    shape.tasks = total.tasks;
    shape.hostlist.clear();
  }
  if (components == 1) {
    shape.hostlist = env_or_empty("SLURM_STEP_NODELIST");
    for (const char* name : {"SLURM_JOB_NODELIST", "SLURM_NODELIST"})
      if (shape.hostlist.empty()) shape.hostlist = env_or_empty(name);
  }
  StepPlan plan = plan_step(st.opts, st.args, shape);
  if (!plan.problems.empty()) {
    log_error_lines(plan.error_text());
    ::setenv(kStepRefused, "1", 1);
    return 0;
  }
  if (st.opts.dry_run) {
    std::fputs(render_dry_run(plan).c_str(), stdout);
    std::fflush(stdout);
    ::setenv(kStepDryRun, "1", 1);
  }
  return 0;
}

}  // namespace meshrun::plugin
