// meshrun-train: one process per rank (mpirun / srun --mpi=pmix). Layout and groups come from mesh/.
#include <mpi.h>
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>
#include <atomic>
#include <thread>

#include "meshrun/config.hpp"
#include "meshrun/device/backend.hpp"
#include "meshrun/json.hpp"
#include "meshrun/layout.hpp"
#include "meshrun/rank_map.hpp"
#include "meshrun/task_env.hpp"
#include "meshrun/train/checkpoint/checkpoint.hpp"
#include "meshrun/train/run/cli.hpp"
#include "meshrun/train/checkpoint/safetensors.hpp"
#include "meshrun/train/run/trainer.hpp"

extern char** environ;

namespace meshrun::train {

namespace {

const char* kUsage =
    "usage: meshrun-train TEMPLATE.toml [--set section.key=value ...] [--metrics FILE.jsonl]\n"
    "                     [--site FILE | --no-site] [--count-params]\n"
    "  --count-params: print the model's parameter count (from the parameter table; allocates nothing) and exit.\n"
    "  Trains the template's model with its [parallel] layout; the MPI world must equal tp·cp·pp·dp.\n"
    "  Configuration layers as everywhere in meshrun: defaults < site file < template < environment < --set.\n"
    "  checkpoint.load / checkpoint.save name safetensors files (Hugging Face Llama names).\n"
    "  checkpoint.dir: sharded checkpoints (every checkpoint.interval steps, at the end, and on checkpoint.signal);\n"
    "  with checkpoint.resume = true (default) a run continues from the latest one. After a signal-driven save\n"
    "  every rank exits with status 75 and DIR/status says \"saved STEP SIGNAL\".\n";

struct Args {
  std::string template_path, metrics, site;
  bool use_site = true, count_params = false;
  std::vector<std::string> sets;
};

// Thrown for input errors: one line, exit 2.
struct InputError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

Args parse_args(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string s = argv[i];
    auto next = [&](const char* flag) {
      if (i + 1 >= argc) throw InputError(std::string(flag) + " needs a value; see meshrun-train --help");
      return std::string(argv[++i]);
    };
    if (s == "--set") a.sets.push_back(next("--set"));
    else if (s.rfind("--set=", 0) == 0) a.sets.push_back(s.substr(6));
    else if (s == "--metrics") a.metrics = next("--metrics");
    else if (s.rfind("--metrics=", 0) == 0) a.metrics = s.substr(10);
    else if (s == "--site") a.site = next("--site");
    else if (s == "--no-site") a.use_site = false;
    else if (s == "--count-params") a.count_params = true;
    else if (!s.empty() && s[0] == '-') throw InputError("unknown option " + s + "; see meshrun-train --help");
    else if (a.template_path.empty()) a.template_path = s;
    else throw InputError("unexpected argument " + s + " (one template only); see meshrun-train --help");
  }
  if (a.template_path.empty()) throw InputError("no template given; usage: meshrun-train TEMPLATE.toml [--set k=v ...]");
  return a;
}

// All ranks agree on success; false everywhere if any rank failed.
bool all_ok(bool ok) {
  int v = ok ? 1 : 0, r = 0;
  MPI_Allreduce(&v, &r, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  return r == 1;
}

std::string mib(std::int64_t bytes) {
  char b[32];
  std::snprintf(b, sizeof b, "%.2f MiB", static_cast<double>(bytes) / (1024.0 * 1024.0));
  return b;
}

std::int64_t max_rss_bytes() {
  struct rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  return static_cast<std::int64_t>(u.ru_maxrss) * 1024;  // Linux reports KiB
}

// Builds data.path from data.text when the token file is missing (rank 0 writes, the rest wait).
void ensure_token_file(const JobConfig& cfg, int rank) {
  namespace fs = std::filesystem;
  std::string err;
  if (rank == 0 && !cfg.data.path.empty() && !cfg.data.text.empty() && !fs::exists(cfg.data.path)) {
    try {
      std::vector<std::string> inputs;
      std::stringstream ss(cfg.data.text);
      for (std::string part; std::getline(ss, part, ',');)
        if (!part.empty()) inputs.push_back(part);
      const fs::path parent = fs::path(cfg.data.path).parent_path();
      if (!parent.empty()) fs::create_directories(parent);
      const auto n = tokenize_bytes(inputs, cfg.data.path, cfg.data.token_dtype);
      std::printf("meshrun-train: tokenized %s into %s (%lld byte tokens)\n", cfg.data.text.c_str(),
                  cfg.data.path.c_str(), static_cast<long long>(n));
    } catch (const std::exception& e) {
      err = e.what();
    }
  }
  if (!all_ok(err.empty())) throw InputError(err.empty() ? "building the token file failed on rank 0" : err);
}

// Raises on every rank when any rank found a problem (so no rank goes on into a collective alone), with the
// first failing rank's message, which rank 0 prints.
void collective_check(const std::string& why, int rank, int world) {
  int mine = why.empty() ? world : rank, first = world;
  MPI_Allreduce(&mine, &first, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (first == world) return;
  int len = rank == first ? static_cast<int>(why.size()) : 0;
  MPI_Bcast(&len, 1, MPI_INT, first, MPI_COMM_WORLD);
  std::string msg = rank == first ? why : std::string(static_cast<size_t>(len), ' ');
  MPI_Bcast(msg.data(), len, MPI_CHAR, first, MPI_COMM_WORLD);
  throw InputError(msg);
}

// A launcher (the SPANK plugin or `meshrun exec`) that ran before us computed this task's coordinates from the
// mesh rank map. Ours must be the same map: a template or flag that differs between launcher and trainer
// would otherwise silently permute the groups. Absent variables (plain mpirun) are not an error.
void check_launcher_agrees(const std::map<std::string, std::string>& env, const Layout& layout, int rank) {
  auto get = [&](const std::string& name) -> const std::string* {
    auto it = env.find(name);
    return it == env.end() ? nullptr : &it->second;
  };
  if (const std::string* r = get("RANK"); r && get("MESHRUN_LAYOUT") && *r != std::to_string(rank))
    throw InputError("the launcher set RANK=" + *r + " but MPI made this process rank " + std::to_string(rank) +
                     "; launch one task per rank in block order (srun --distribution=block, or mpirun)");
  // The same variables compute_task_env() gave the launcher, computed here from the trainer's layout.
  for (const auto& [name, want] : layout_env(layout, rank)) {
    const std::string* got = get(name);
    if (got && *got != want)
      throw InputError("rank " + std::to_string(rank) + ": the launcher placed this task at " + name + "=" + *got +
                       " but the trainer's layout (" + layout.order.str() + ") gives " + want +
                       "; give the launcher and meshrun-train the same template and --mesh-*/--set overrides");
  }
}

// Signals asking for a checkpoint: the handler only records them; ranks agree at step boundaries.
volatile sig_atomic_t g_stop_bits = 0;  // 1: checkpoint.signal, 2: SIGTERM
int g_checkpoint_signal = SIGUSR1;
extern "C" void on_stop_signal(int sig) { g_stop_bits = g_stop_bits | (sig == g_checkpoint_signal ? 1 : 2); }

int signal_number(const std::string& name) {
  std::string s = name;
  for (auto& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  if (s.rfind("SIG", 0) == 0) s = s.substr(3);
  const std::pair<const char*, int> known[] = {{"USR1", SIGUSR1}, {"USR2", SIGUSR2}, {"TERM", SIGTERM},
                                               {"INT", SIGINT},   {"HUP", SIGHUP},   {"URG", SIGURG}};
  for (const auto& [n, v] : known)
    if (s == n) return v;
  throw InputError("checkpoint.signal = \"" + name + "\" is not a signal the trainer can catch; use USR1 (default), USR2 or TERM");
}

void install_stop_handlers(const std::string& signal) {
  g_checkpoint_signal = signal_number(signal);
  struct sigaction sa{};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  ::sigaction(g_checkpoint_signal, &sa, nullptr);
  ::sigaction(SIGTERM, &sa, nullptr);
}

const char* signal_text(int sig) {
  switch (sig) {
    case SIGUSR1: return "USR1";
    case SIGUSR2: return "USR2";
    case SIGTERM: return "TERM";
    case SIGINT: return "INT";
    case SIGHUP: return "HUP";
    case SIGURG: return "URG";
    default: return "?";
  }
}

// The stop bits of every rank, OR-ed (the tiny all-reduce each step boundary).
int agreed_stop_bits() {
  int mine = g_stop_bits, all = 0;
  MPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_BOR, MPI_COMM_WORLD);
  return all;
}

// Watchdogs (issue 16, fast named failure). A rank whose peers never reach MPI_Init (one exited before it or
// never started) would wait in MPI_Init's exchange until the time limit, and a rank whose peer stopped
// answering waits in a collective forever. A thread ends this process with one line naming the rank, the
// host and what it waited for; the launcher then ends the others (srun --kill-on-bad-exit, mpirun on a
// non-zero exit). MESHRUN_INIT_TIMEOUT_S (default 60) bounds MPI_Init; MESHRUN_STEP_TIMEOUT_S (default 60)
// is the least time without progress that counts as a hang: the limit is the larger of it, 10 × the slowest
// step and 3 × the slowest checkpoint save so far. 0 turns a watchdog off. Set-up (token file, checkpoint
// load) and checkpoint saves are file I/O of unknown length and are not bounded.
std::atomic<int> g_wd_phase{0};           // 0: in MPI_Init, 1: training steps, 2: done, 3: file I/O (unbounded)
std::atomic<double> g_wd_last{0};          // steady seconds of the last progress
std::atomic<double> g_wd_limit{60};        // seconds without progress that count as a hang
std::atomic<int> g_wd_rank{-1};

double steady_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
double env_seconds(const char* name, double fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::atof(v) : fallback;
}
std::string rank_from_env() {
  for (const char* n : {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "SLURM_PROCID", "RANK"})
    if (const char* v = std::getenv(n)) return v;
  return "?";
}
void progress() { g_wd_last = steady_s(); }

void start_watchdog() {
  const double init_limit = env_seconds("MESHRUN_INIT_TIMEOUT_S", 60), step_floor = env_seconds("MESHRUN_STEP_TIMEOUT_S", 60);
  g_wd_limit = step_floor;
  progress();
  std::thread([init_limit, step_floor] {
    char host[256] = "?";
    ::gethostname(host, sizeof host - 1);
    const double t0 = steady_s();
    while (g_wd_phase != 2) {
      ::usleep(100 * 1000);
      const double now = steady_s();
      const int rank = g_wd_rank;
      const std::string who = rank >= 0 ? std::to_string(rank) : rank_from_env();
      if (g_wd_phase == 0 && init_limit > 0 && now - t0 > init_limit) {
        std::fprintf(stderr, "meshrun-train: rank %s on %s: MPI_Init did not complete within %.0f s: another rank exited "
                     "before MPI_Init or never started (see its log); ending this rank\n", who.c_str(), host, init_limit);
        std::fflush(stderr);
        ::_exit(1);
      }
      if (g_wd_phase == 1 && step_floor > 0 && now - g_wd_last > g_wd_limit) {
        std::fprintf(stderr, "meshrun-train: rank %s on %s: no progress for %.0f s (limit %.0f s): a peer rank died or stopped "
                     "answering inside a collective; ending this rank\n", who.c_str(), host, now - g_wd_last.load(), g_wd_limit.load());
        std::fflush(stderr);
        ::_exit(1);
      }
    }
  }).detach();
}
// After a step or a save that took `seconds`: progress, and the hang limit grows with the slowest one.
void progress_after(double seconds, double factor) {
  progress();
  const double want = seconds * factor;
  if (want > g_wd_limit) g_wd_limit = want;
}

// Keeps the metrics lines of steps <= `step` (a resumed run rewrites the steps after its checkpoint).
void truncate_metrics(const std::string& path, int step) {
  std::ifstream is(path);
  if (!is) return;
  std::string kept, line;
  while (std::getline(is, line)) {
    const auto at = line.find("\"step\":");
    if (at == std::string::npos) continue;
    if (std::atoi(line.c_str() + at + 7) <= step) kept += line + "\n";
  }
  is.close();
  std::ofstream os(path, std::ios::trunc);
  os << kept;
}

template <class T>
int train(const JobConfig& cfg, const Layout& layout, const Args& args, int rank) {
  const RankGrid grid(layout);
  Groups groups = make_mpi_groups(MPI_COMM_WORLD, grid);
  ensure_token_file(cfg, rank);
  std::unique_ptr<TokenFile> file;
  std::string err;
  try {
    file = std::make_unique<TokenFile>(cfg.data.path, cfg.data.token_dtype, cfg.model.vocab, cfg.training.seq_len,
                                       cfg.training.global_batch_size);
  } catch (const DataError& e) {
    err = e.what();
  }
  if (!all_ok(err.empty())) throw InputError(err.empty() ? "the token file failed to load on another rank" : err);
  const BatchSchedule schedule(*file, cfg.training.seq_len, cfg.training.global_batch_size, cfg.data.shuffle,
                               cfg.training.seed);

  Trainer<T> trainer(cfg, grid, rank, groups);
  const CheckpointSpec& ck = cfg.checkpoint;
  const int world = layout.world();
  if (!ck.dir.empty()) {
    install_stop_handlers(ck.signal);  // before anything slow: a signal from now on asks for a save
    if (rank == 0) {
      std::error_code ec;
      std::filesystem::create_directories(ck.dir, ec);
      if (ec || ::access(ck.dir.c_str(), W_OK) != 0)
        err = "checkpoint.dir = " + ck.dir + " cannot be created or is not writable; create it or change checkpoint.dir";
    }
    collective_check(err, rank, world);
  }
  // Resume wins over checkpoint.load (which only seeds a fresh start).
  std::string resume_from;
  if (!ck.dir.empty() && ck.resume) {
    try {
      resume_from = latest_checkpoint(ck.dir);
    } catch (const CheckpointError& e) {
      err = e.what();
    }
    collective_check(err, rank, world);
  }
  int start = 0;
  if (!resume_from.empty()) {
    const auto t0 = std::chrono::steady_clock::now();
    try {
      start = load_checkpoint(trainer, resume_from, file->tokens());
    } catch (const CheckpointError& e) {
      err = e.what();
    }
    collective_check(err, rank, world);
    double load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    MPI_Allreduce(MPI_IN_PLACE, &load_s, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    if (rank == 0) {
      const CheckpointInfo info = read_checkpoint_info(resume_from);
      std::printf("meshrun-train: resuming from %s: step %d, %lld samples consumed, saved under %s; loaded in %.3f s%s\n",
                  resume_from.c_str(), start, static_cast<long long>(info.consumed_samples), info.layout_text.c_str(), load_s,
                  ck.load.empty() ? "" : ("; checkpoint.load = " + ck.load + " not used (the checkpoint wins)").c_str());
    }
  } else if (ck.load.empty()) {
    trainer.init_params();
    if (rank == 0 && !ck.dir.empty())
      std::printf("meshrun-train: starting at step 0 from initialization (training.seed = %llu)%s\n",
                  static_cast<unsigned long long>(cfg.training.seed),
                  ck.resume ? "; no checkpoint in checkpoint.dir" : "; checkpoint.resume = false");
  } else {
    try {
      trainer.load(ck.load);
    } catch (const SafetensorsError& e) {
      err = e.what();
    }
    if (!all_ok(err.empty())) throw InputError(err.empty() ? "loading the checkpoint failed on another rank" : err);
    if (rank == 0)
      std::printf("meshrun-train: starting at step 0 from the weights in %s (checkpoint.load)%s\n", ck.load.c_str(),
                  ck.dir.empty() ? "" : ck.resume ? "; no checkpoint in checkpoint.dir" : "; checkpoint.resume = false");
  }
  if (!ck.dir.empty() && rank == 0) std::remove(status_file_path(ck.dir).c_str());  // it speaks of this run only

  // Fail now, not after training, if the final weights cannot be written.
  if (rank == 0 && !cfg.checkpoint.save.empty()) {
    const std::filesystem::path parent = std::filesystem::absolute(cfg.checkpoint.save).parent_path();
    if (::access(parent.c_str(), W_OK) != 0)
      err = "checkpoint.save = " + cfg.checkpoint.save + ": directory " + parent.string() +
            " does not exist or is not writable; create it or change checkpoint.save";
  }
  if (!all_ok(err.empty())) throw InputError(err.empty() ? "checkpoint.save is not writable" : err);

  std::FILE* metrics = nullptr;
  if (rank == 0 && !args.metrics.empty()) {
    if (start > 0) truncate_metrics(args.metrics, start);
    metrics = std::fopen(args.metrics.c_str(), start > 0 ? "a" : "w");
    if (!metrics) err = "cannot write metrics file " + args.metrics + "; check the directory";
  }
  if (!all_ok(err.empty())) throw InputError(err.empty() ? "metrics file" : err);

  if (rank == 0) {
    std::printf("meshrun-train: %s, %lld parameters, %s; layout tp=%d pp=%d dp=%d zero=%d sp=%s on %d ranks (%s)\n",
                cfg.model.name.c_str(), static_cast<long long>(trainer.table().global_size()), cfg.training.dtype.c_str(),
                layout.tp, layout.pp, layout.dp, layout.zero_stage, layout.sequence_parallel ? "on" : "off",
                static_cast<int>(layout.world()), layout.order.str().c_str());
    if (layout.pp > 1)
      std::printf("meshrun-train: pipeline %s, %d stages × %d virtual, %lld micro-batches per step\n",
                  pipeline_schedule_name(trainer.schedule().spec.kind), layout.pp, layout.virtual_stages,
                  static_cast<long long>(trainer.geometry().microbatches));
    std::fflush(stdout);
  }
  int last_saved = start > 0 ? start : -1;  // the step whose checkpoint is committed
  double last_save_s = -1, last_step_s = 0;
  // A collective save of `step`; the log line is printed only after the commit (latest renamed).
  auto checkpoint = [&](int step, std::string* why) -> bool {
    struct Unbounded {  // the watchdog does not bound file I/O
      Unbounded() { g_wd_phase = 3; }
      ~Unbounded() { progress(); g_wd_phase = 1; }
    } unbounded;
    try {
      const SaveResult r = save_checkpoint(trainer, ck.dir, step, ck.keep, file->tokens());
      last_saved = step;
      last_save_s = r.seconds;
      progress_after(r.seconds, 3);
      if (rank == 0) {
        std::string removed;
        for (const auto& p : r.removed) removed += (removed.empty() ? "; removed " : ", ") + std::filesystem::path(p).filename().string();
        std::printf("meshrun-train: checkpoint committed: %s (%d shards, %s, %.3f s); latest = step-%d%s\n", r.path.c_str(),
                    r.files, mib(r.bytes_total).c_str(), r.seconds, step, removed.c_str());
        if (r.seconds > ck.signal_lead_s)
          std::printf("meshrun-train: warning: this save took %.1f s, longer than checkpoint.signal_lead_s = %d s; a save "
                      "asked for by the signal may not finish before the time limit: raise checkpoint.signal_lead_s\n",
                      r.seconds, ck.signal_lead_s);
        std::fflush(stdout);
      }
      return true;
    } catch (const CheckpointError& e) {
      *why = e.what();
      return false;
    }
  };
  // Budget for a best-effort save on SIGTERM: Slurm sends SIGKILL KillWait (default 30 s) after it.
  constexpr double kTermBudgetS = 20.0;
  progress();
  g_wd_phase = 1;  // from here on, steps are bounded
  for (int s = start; s < cfg.training.steps; ++s) {
    const StepStats st = trainer.step(s, schedule);
    last_step_s = st.ms / 1000.0;
    progress_after(last_step_s, 10);
    if (rank == 0) {
      std::printf("step %5d/%d | loss %.4f | grad_norm %.4f | lr %.3e | %.0f tok/s | %.1f ms/step", st.step,
                  cfg.training.steps, st.loss, st.grad_norm, st.lr, st.tokens_per_s, st.ms);
      if (cfg.model.experts > 0)
        std::printf(" | aux %.5f | expert tokens max %.0f mean %.1f | a2a %s", st.aux_loss, st.expert_tokens_max,
                    st.expert_tokens_mean, mib(st.a2a_bytes).c_str());
      std::printf("\n");
      if (cfg.model.experts > 0 && (s == start || st.step == cfg.training.steps)) {  // per-expert load
        std::string load;
        for (std::size_t i = 0; i < st.expert_tokens.size(); ++i)
          load += (i % cfg.model.experts ? " " : i ? " | " : "") + std::to_string(std::llround(st.expert_tokens[i]));
        std::printf("meshrun-train: step %d assignments per expert (layers 0..%d): %s\n", st.step,
                    cfg.model.layers - 1, load.c_str());
      }
      if (s == start) {  // after one step the transient peak includes gathered units (ZeRO-3) and scratch
        const MemoryReport m = trainer.memory();
        std::printf("meshrun-train: memory per rank (ZeRO-%d): params %s, grads %s, optimizer %s, transient peak %s, "
                    "total %s; activations %s; process max RSS %s\n",
                    layout.zero_stage, mib(m.params).c_str(), mib(m.grads).c_str(), mib(m.optimizer).c_str(),
                    mib(m.transient_peak).c_str(), mib(m.total()).c_str(),
                    mib(trainer.activation_bytes()).c_str(), mib(max_rss_bytes()).c_str());
      }
      std::fflush(stdout);
      if (metrics) {
        std::string line;
        JsonWriter w(line);
        w.begin_object()
            .field("step", st.step)
            .field("loss", st.loss)
            .field("grad_norm", st.grad_norm)
            .field("lr", st.lr)
            .field("tokens_per_s", st.tokens_per_s)
            .field("ms_per_step", st.ms)
            .field("memory_bytes", trainer.memory().total())
            .field("pipeline_wait_ms", st.pipeline.wait_s * 1000.0)
            .field("pipeline_compute_ms", st.pipeline.compute_s() * 1000.0)
            .field("comm_exposed_ms", st.comm_exposed_ms);
        if (cfg.model.experts > 0)
          w.field("aux_loss", st.aux_loss)
              .field("expert_tokens_max", st.expert_tokens_max)
              .field("expert_tokens_mean", st.expert_tokens_mean)
              .field("a2a_bytes", st.a2a_bytes);
        w.end_object();
        std::fprintf(metrics, "%s\n", line.c_str());
        std::fflush(metrics);
      }
    }
    if (ck.dir.empty()) continue;
    const int stop = agreed_stop_bits();  // every rank, every step: the same decision
    std::string why;
    if (stop != 0) {
      if (metrics) {
        std::fclose(metrics);
        metrics = nullptr;
      }
      const bool requested = stop & 1;
      const char* sig = requested ? signal_text(g_checkpoint_signal) : "TERM";
      if (rank == 0) {
        std::printf("meshrun-train: SIG%s received; stopping after step %d\n", sig, s + 1);
        std::fflush(stdout);
      }
      bool saved = last_saved == s + 1;
      if (!saved && !requested && last_save_s >= 0 && last_save_s + last_step_s > kTermBudgetS) {
        char b[200];
        std::snprintf(b, sizeof b, "the last save took %.1f s, more than the %.0f s a SIGTERM leaves before SIGKILL",
                      last_save_s, kTermBudgetS);
        why = b;
      } else if (!saved) {
        saved = checkpoint(s + 1, &why);
      }
      if (rank == 0) {
        if (saved) {
          write_status_file(ck.dir, "saved " + std::to_string(s + 1) + " " + sig);
          std::printf("meshrun-train: stopped after step %d on SIG%s; checkpoint step-%d is committed; %s says so; every "
                      "rank exits %d\n", s + 1, sig, s + 1, status_file_path(ck.dir).c_str(), kPreemptedExitCode);
        } else {
          write_status_file(ck.dir, "not-saved " + std::to_string(s + 1) + " " + sig + " " + why);
          std::printf("meshrun-train: stopped after step %d on SIG%s without saving: %s; latest checkpoint: %s\n", s + 1,
                      sig, why.c_str(), last_saved > 0 ? ("step-" + std::to_string(last_saved)).c_str() : "none");
        }
        std::fflush(stdout);
      }
      MPI_Barrier(MPI_COMM_WORLD);  // no rank exits before the status file exists
      return saved ? kPreemptedExitCode : 1;
    }
    if (ck.interval > 0 && (s + 1) % ck.interval == 0 && s + 1 < cfg.training.steps && !checkpoint(s + 1, &why))
      throw InputError(why);
  }
  if (metrics) std::fclose(metrics);
  if (!ck.dir.empty()) {
    std::string why;
    if (last_saved != cfg.training.steps && !checkpoint(cfg.training.steps, &why)) throw InputError(why);
    if (rank == 0) write_status_file(ck.dir, "finished " + std::to_string(cfg.training.steps));
  }
  g_wd_phase = 3;  // the gathered final weights: file I/O
  if (!cfg.checkpoint.save.empty()) {
    trainer.save(cfg.checkpoint.save);
    if (rank == 0) std::printf("meshrun-train: saved %s\n", cfg.checkpoint.save.c_str());
  }
  return 0;
}

// training.device = "cuda": the CUDA backend (gpu/) trains the single-device model of meshrun-gpu-check;
// this MPI trainer's layers do not call it yet. Refused with the first reason that applies here.
std::string cuda_refusal(const TrainingSpec& t) {
  std::string why;
  if (device::cuda_device_count(&why) == 0) return "training.device = \"cuda\": " + why;
  try {
    (void)device::Precision::cuda(t.param_dtype, t.grad_dtype, t.optim_dtype);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "training.device = \"cuda\": meshrun-train runs its layers on the CPU only so far (the CUDA backend is "
         "checked by bench/gpu/check.sh, docs/gpu.md); use training.device = \"cpu\"";
}

int run(int argc, char** argv, int rank, int world) {
  for (int i = 1; i < argc; ++i)
    if (!std::strcmp(argv[i], "-h") || !std::strcmp(argv[i], "--help")) {
      if (rank == 0) std::fputs(kUsage, stdout);
      return 0;
    }
  const Args args = parse_args(argc, argv);
  ConfigRequest req;
  req.template_path = args.template_path;
  req.site_path = args.site;
  req.use_site = args.use_site;
  const auto env = environment_map(environ);
  req.environment = &env;
  req.sets = args.sets;
  const Config config = build_config(req);
  const JobConfig& cfg = config.job;
  if (args.count_params) {  // the global table (tp = 1): metadata only, no buffers, any world size
    try {
      if (rank == 0) std::printf("%lld\n", static_cast<long long>(build_param_table(cfg.model, 1, 0).global_size()));
    } catch (const std::invalid_argument& e) {
      throw InputError(e.what());
    }
    return 0;
  }

  std::vector<Problem> problems;
  const std::optional<Layout> layout = resolve_layout(cfg.parallel, world, &problems);
  if (!layout || !problems.empty())
    throw InputError(problems.empty() ? "parallel: cannot resolve the layout" : problems.front().message);
  if (layout->world() != world)
    throw InputError("the layout tp·cp·pp·dp = " + std::to_string(layout->tp) + "·" + std::to_string(layout->cp) + "·" +
                     std::to_string(layout->pp) + "·" + std::to_string(layout->dp) + " needs " +
                     std::to_string(layout->world()) + " ranks but MPI started " + std::to_string(world) +
                     "; run mpirun -np " + std::to_string(layout->world()) + " or set parallel.dp = \"auto\"");
  {
    std::string why;
    try {
      check_launcher_agrees(env, *layout, rank);
    } catch (const InputError& e) {
      why = e.what();
    }
    collective_check(why, rank, world);
  }
  // On CPU the "cluster" is whatever MPI gives: one shared-memory node holding every rank.
  ClusterSpec spec;
  spec.nodes = 1;
  spec.gpus_per_node = world;
  spec.nvlink_domain_gpus = world;
  spec.node_type = "generic";
  const Cluster cluster = resolve_cluster(spec, &problems);
  problems = validate(cfg, *layout, cluster);
  if (!problems.empty()) throw InputError(problems.front().message);
  if (const std::string why = check_train_setup(cfg, *layout); !why.empty()) throw InputError(why);
  if (cfg.training.device == "cuda") throw InputError(cuda_refusal(cfg.training));
  try {
    (void)build_param_table(cfg.model, layout->tp, 0);
  } catch (const std::invalid_argument& e) {
    throw InputError(e.what());
  }
  return cfg.training.dtype == "fp64" ? train<double>(cfg, *layout, args, rank)
                                      : train<float>(cfg, *layout, args, rank);
}

}  // namespace

int train_main(int argc, char** argv) {
  start_watchdog();
  MPI_Init(&argc, &argv);
  int rank = 0, world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  g_wd_rank = rank;
  progress();
  g_wd_phase = 3;  // set-up: configuration, token file, checkpoint load
  int code = 0;
  try {
    code = run(argc, argv, rank, world);
  } catch (const ConfigError& e) {
    if (rank == 0) std::fprintf(stderr, "meshrun-train: %s\n", e.what());
    code = 2;
  } catch (const InputError& e) {
    if (rank == 0) std::fprintf(stderr, "meshrun-train: %s\n", e.what());
    code = 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "meshrun-train: rank %d: %s\n", rank, e.what());
    MPI_Abort(MPI_COMM_WORLD, 1);
    return 1;
  }
  g_wd_phase = 2;
  MPI_Finalize();
  return code;
}

}  // namespace meshrun::train
