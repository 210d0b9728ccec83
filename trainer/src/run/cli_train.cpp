// meshrun-train: one process per rank (mpirun / srun --mpi=pmix). Layout and groups come from mesh/.
#include <mpi.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "agree.hpp"
#include "meshrun/config.hpp"
#include "meshrun/device/backend.hpp"
#include "meshrun/layout.hpp"
#include "meshrun/rank_map.hpp"
#include "meshrun/resolve.hpp"
#include "meshrun/task_env.hpp"
#include "meshrun/train/checkpoint/checkpoint.hpp"
#include "meshrun/train/run/cli.hpp"
#include "meshrun/train/checkpoint/safetensors.hpp"
#include "meshrun/train/data/samples.hpp"
#include "meshrun/train/data/tokenize.hpp"
#include "meshrun/train/run/trainer.hpp"
#include "heartbeat.hpp"
#include "meshrun/comm/wait_state.hpp"
#include "../checkpoint/file_io.hpp"
#include "metrics.hpp"
#include "peak_probe.hpp"
#include "signals.hpp"
#include "step_log.hpp"
#include "kernel_times.hpp"
#include "stragglers.hpp"
#include "trace_run.hpp"
#include "watchdog.hpp"
#include "meshrun/comm/mpi.hpp"
#ifdef MESHRUN_HAVE_CUDA
#include "meshrun/comm/nccl_groups.hpp"
#endif
#include "meshrun/version.hpp"

using meshrun::comm::make_mpi_groups;

extern char** environ;

namespace meshrun::train {

using namespace cli;

namespace {

const char* kUsage =
    "usage: meshrun-train TEMPLATE.toml [--set section.key=value ...] [--metrics FILE.jsonl | --no-metrics]\n"
    "                     [--site FILE | --no-site] [--trace DIR [--trace-steps N]] [--count-params]\n"
    "  --metrics: one JSON record per step (docs/trainer.md, Metrics); default job.output_dir/metrics.jsonl,\n"
    "  else checkpoint.dir/metrics.jsonl, else none; a resumed run appends.\n"
    "  --trace DIR: the run's first N steps (--trace-steps, default 2, at most 50) as a timeline: every rank writes\n"
    "  DIR/trace-rank<R>.json (Chrome trace-event format: F/B/W per micro-batch and chunk, sends and receives,\n"
    "  communication waits, the optimizer), rank 0 merges them into DIR/trace.json (Perfetto, chrome://tracing;\n"
    "  meshrun plot --timeline DIR/trace.json -o OUT.svg draws it against the schedule simulator's plan).\n"
    "  --count-params: print the model's parameter count (from the parameter table; allocates nothing) and exit.\n"
    "  Trains the template's model with its [parallel] layout; the MPI world must equal tp·cp·pp·dp.\n"
    "  Configuration layers as everywhere in meshrun: defaults < site file < template < environment < --set.\n"
    "  checkpoint.load / checkpoint.save name safetensors files (Hugging Face Llama names); checkpoint.load may\n"
    "  also name a Hugging Face model directory (config.json checked against [model]; meshrun-ckpt export writes one).\n"
    "  checkpoint.finetune = DIR: a new run (step 0, fresh optimizer and data position) from the weights of a\n"
    "  meshrun checkpoint (a checkpoint.dir's latest, or one step-N), resharded onto this run's layout.\n"
    "  checkpoint.dir: sharded checkpoints (every checkpoint.interval steps, at the end, and on checkpoint.signal);\n"
    "  with checkpoint.resume = true (default) a run continues from the latest one. After a signal-driven save\n"
    "  every rank exits with status 75 and DIR/status says \"saved STEP SIGNAL\".\n";

struct Args {
  std::string template_path, metrics, site, trace_dir;
  int trace_steps = 2;  // --trace-steps: steps traced from the run's first
  bool use_site = true, count_params = false, no_metrics = false, trace_steps_given = false;
  std::vector<std::string> sets;
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
    else if (s == "--no-metrics") a.no_metrics = true;
    else if (s.rfind("--metrics=", 0) == 0) a.metrics = s.substr(10);
    else if (s == "--site") a.site = next("--site");
    else if (s == "--no-site") a.use_site = false;
    else if (s == "--count-params") a.count_params = true;
    else if (s == "--trace") a.trace_dir = next("--trace");
    else if (s.rfind("--trace=", 0) == 0) a.trace_dir = s.substr(8);
    else if (s == "--trace-steps") a.trace_steps = parse_trace_steps(next("--trace-steps")), a.trace_steps_given = true;
    else if (s.rfind("--trace-steps=", 0) == 0) a.trace_steps = parse_trace_steps(s.substr(14)), a.trace_steps_given = true;
    else if (!s.empty() && s[0] == '-') throw InputError("unknown option " + s + "; see meshrun-train --help");
    else if (a.template_path.empty()) a.template_path = s;
    else throw InputError("unexpected argument " + s + " (one template only); see meshrun-train --help");
  }
  if (a.template_path.empty()) throw InputError("no template given; usage: meshrun-train TEMPLATE.toml [--set k=v ...]");
  if (a.trace_steps_given && a.trace_dir.empty()) throw InputError("--trace-steps needs --trace DIR (where the trace goes)");
  return a;
}

// data.text is tokenized only when no data.path is given (data.path is input only: never written, so a
// mistyped path is refused, not filled from data.text).
bool tokenizes_text(const JobConfig& cfg) { return cfg.data.path.empty() && !cfg.data.text.empty(); }

// The token file: data.path as given, or the file data.text is tokenized into: data.text_cache, else a cache
// file, so that a template need not name a path relative to wherever it is run from: $MESHRUN_CACHE_DIR, else
// $XDG_CACHE_HOME/meshrun, else ~/.cache/meshrun, as text-<hash>.<dtype>.bin, the hash over the text files'
// absolute paths, sizes and modification times (a changed corpus gets a new file). Rank 0 decides and tells
// every rank.
std::string token_file_path(const JobConfig& cfg, int rank) {
  namespace fs = std::filesystem;
  if (!tokenizes_text(cfg)) return cfg.data.path;
  if (!cfg.data.text_cache.empty()) return cfg.data.text_cache;
  std::string path, err;
  if (rank == 0) {
    try {
      std::vector<std::string> inputs;
      std::stringstream ss(cfg.data.text);
      for (std::string part; std::getline(ss, part, ',');)
        if (!part.empty()) inputs.push_back(part);
      std::string key = "byte-level 1|" + cfg.data.token_dtype;
      auto add_file = [&](const std::string& f) {
        std::error_code ec;
        const auto size = fs::file_size(f, ec);
        const auto mtime = fs::last_write_time(f, ec).time_since_epoch().count();
        key += "|" + fs::absolute(f).string() + "|" + std::to_string(size) + "|" + std::to_string(mtime);
      };
      if (!cfg.data.tokenizer.empty()) {  // another tokenizer (or a changed one) gets another file
        key = "tokenizer 1|" + cfg.data.token_dtype;
        try {
          for (const std::string& f : tokenizer_files(cfg.data.tokenizer).paths()) add_file(f);
        } catch (const TokenizerError& e) {
          throw DataError("data.tokenizer: " + e.msg);
        }
      }
      for (const std::string& f : text_files(inputs)) add_file(f);
      const char* dir = std::getenv("MESHRUN_CACHE_DIR");
      const char* xdg = std::getenv("XDG_CACHE_HOME");
      const char* home = std::getenv("HOME");
      const fs::path cache = dir && *dir ? fs::path(dir)
                             : xdg && *xdg ? fs::path(xdg) / "meshrun"
                             : fs::path(home && *home ? home : "/tmp") / ".cache" / "meshrun";
      char name[64];
      std::snprintf(name, sizeof name, "text-%016llx.%s.bin",
                    static_cast<unsigned long long>(ckpt::hash_bytes_xxh3(key.data(), key.size())),
                    cfg.data.token_dtype.c_str());
      path = (cache / name).string();
    } catch (const std::exception& e) {
      err = e.what();
    }
  }
  if (!all_ok(err.empty())) throw InputError(err.empty() ? "finding the token file failed on rank 0" : err);
  unsigned long n = path.size();
  MPI_Bcast(&n, 1, MPI_UNSIGNED_LONG, 0, MPI_COMM_WORLD);
  path.resize(n);
  MPI_Bcast(path.data(), static_cast<int>(n), MPI_CHAR, 0, MPI_COMM_WORLD);
  return path;
}

void ensure_token_file(const JobConfig& cfg, const std::string& path, int rank) {
  namespace fs = std::filesystem;
  std::string err;
  // With data.tokenizer the cache is a Megatron dataset: .bin is renamed into place before .idx, so the .idx
  // says it is complete.
  const bool with_tokenizer = !cfg.data.tokenizer.empty();
  const std::string done = with_tokenizer ? path.substr(0, path.size() - 4) + ".idx" : path;
  if (rank == 0 && !path.empty() && tokenizes_text(cfg) && !fs::exists(done)) {
    try {
      std::vector<std::string> inputs;
      std::stringstream ss(cfg.data.text);
      for (std::string part; std::getline(ss, part, ',');)
        if (!part.empty()) inputs.push_back(part);
      const fs::path parent = fs::path(path).parent_path();
      if (!parent.empty()) fs::create_directories(parent);
      if (with_tokenizer) {
        std::unique_ptr<Tokenizer> tok;
        try {
          tok = load_tokenizer(cfg.data.tokenizer);
        } catch (const TokenizerError& e) {
          throw DataError("data.tokenizer: " + e.msg);
        }
        if (static_cast<std::int64_t>(tok->vocab_size()) > cfg.model.vocab)
          throw DataError("data.tokenizer " + cfg.data.tokenizer + " has " + std::to_string(tok->vocab_size()) +
                          " ids but model.vocab = " + std::to_string(cfg.model.vocab) + "; raise model.vocab to at least " +
                          std::to_string(tok->vocab_size()));
        const TokenizeCounts n = tokenize_documents(*tok, inputs, path, cfg.data.token_dtype, false, "");
        std::printf("meshrun-train: tokenized %s with %s into %s (%lld tokens, %lld documents, EOS after each)\n",
                    cfg.data.text.c_str(), cfg.data.tokenizer.c_str(), path.c_str(), static_cast<long long>(n.tokens),
                    static_cast<long long>(n.documents));
      } else {
        const auto n = tokenize_bytes(inputs, path, cfg.data.token_dtype);
        std::printf("meshrun-train: tokenized %s into %s (%lld byte tokens)\n", cfg.data.text.c_str(), path.c_str(),
                    static_cast<long long>(n));
      }
    } catch (const std::exception& e) {
      err = e.what();
    }
  }
  if (!all_ok(err.empty())) throw InputError(err.empty() ? "building the token file failed on rank 0" : err);
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

// ---- meshrun-train's run, step by step (every rank makes the same collective calls in the same order) ----

// Validation samples to open: data.valid's, or data.split's second part when the run evaluates (the rules refuse
// eval_interval > 0 without either, and data.valid with eval_interval = 0).
bool has_validation_data(const JobConfig& cfg) {
  return !cfg.data.valid.empty() || (!cfg.data.split.empty() && cfg.training.eval_interval > 0);
}

// The training samples (data.path, built from data.text first when asked, or data.blend) and, with data.valid,
// the validation samples, opened on every rank.
// `line` receives rank 0's line naming the data read (its file, tokens and dtype), printed with the run's banner.
std::unique_ptr<SampleSource> open_sample_source(const JobConfig& cfg, int rank, bool validation, std::string* line) {
  std::string path;
  const bool split = !cfg.data.split.empty();  // validation reads the training datasets' second part
  if ((!validation || split) && cfg.data.blend.empty()) {
    path = token_file_path(cfg, rank);
    if (!validation) ensure_token_file(cfg, path, rank);
  }
  std::unique_ptr<SampleSource> source;
  std::string err, part;
  try {
    const SampleSpec spec = validation ? validation_samples(cfg, path) : training_samples(cfg, path);
    source = open_samples(spec);
    part = split_description(spec, *source);  // with data.split it names the tokens read
  } catch (const DataError& e) {
    err = e.what();
  }
  if (!all_ok(err.empty())) throw InputError(err.empty() ? "the data failed to load on another rank" : err);
  if (rank == 0 && line) {  // the first lines name the data read: its file, its size and its dtype
    const std::vector<BlendEntry>& entries = validation && !split ? cfg.data.valid : cfg.data.blend;
    const std::string what = validation ? "validation data" : "data";
    const std::string tokens = part.empty() ? ", " + std::to_string(source->identity().tokens) + " tokens" : "";
    if (entries.size() > 1 || ((!validation || split) && !cfg.data.blend.empty())) {
      *line = "meshrun-train: " + what + ": a blend of " + std::to_string(entries.size()) + " datasets (" +
              (validation && !split ? "data.valid" : "data.blend") + ")" + tokens;
    } else {
      const std::string file = entries.empty() ? path : entries.front().path;
      *line = "meshrun-train: " + what + ": " + file + tokens + ", " +
              (is_indexed_dataset(file) ? "a Megatron indexed dataset (dtype from its .idx)"
                                        : cfg.data.token_dtype + " (raw token file, data.token_dtype)");
    }
    if (!part.empty()) *line += "; " + part;
  }
  return source;
}

// checkpoint.dir: stop signals are caught, and rank 0 makes sure the directory can be written.
void prepare_checkpoint_dir(const CheckpointSpec& ck, int rank, int world) {
  if (ck.dir.empty()) return;
  install_stop_handlers(ck.signal);  // before anything slow: a signal from now on asks for a save
  std::string err;
  if (rank == 0) {
    std::error_code ec;
    std::filesystem::create_directories(ck.dir, ec);
    if (ec || ::access(ck.dir.c_str(), W_OK) != 0)
      err = "checkpoint.dir = " + ck.dir + " cannot be created or is not writable; create it or change checkpoint.dir";
    else
      err = lock_checkpoint_dir(ck.dir);  // held until exit: this run is the directory's only writer
  }
  collective_check(err, rank, world);
}

// The committed checkpoint to resume from ("" to start fresh). Resume wins over checkpoint.load (which only
// seeds a fresh start).
std::string checkpoint_to_resume(const CheckpointSpec& ck, int rank, int world) {
  std::string resume_from, err;
  if (!ck.dir.empty() && ck.resume) {
    try {
      resume_from = latest_checkpoint(ck.dir);
    } catch (const CheckpointError& e) {
      err = e.what();
    }
    collective_check(err, rank, world);
  }
  return resume_from;
}

// Loads checkpoint `path` on every rank; returns its step.
template <class T>
int resume(Trainer<T>& trainer, const std::string& path, const CheckpointSpec& ck, const DataIdentity& data, int rank,
           int world) {
  int start = 0;
  std::string err;
  const auto t0 = std::chrono::steady_clock::now();
  try {
    start = load_checkpoint(trainer, path, data);
  } catch (const CheckpointError& e) {
    err = e.what();
  }
  collective_check(err, rank, world);
  // training.steps may grow (an extended run); a run cannot end before the step it resumes at.
  if (start > trainer.config().training.steps)
    throw InputError(path + ": the checkpoint is at step " + std::to_string(start) + " but training.steps = " +
                     std::to_string(trainer.config().training.steps) + "; set training.steps >= " + std::to_string(start) +
                     " or use another checkpoint.dir");
  double load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  MPI_Allreduce(MPI_IN_PLACE, &load_s, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  if (rank == 0) {
    const CheckpointInfo info = read_checkpoint_info(path);
    std::printf("meshrun-train: resuming from %s: step %d, %lld samples consumed, saved under %s; loaded in %.3f s%s\n",
                path.c_str(), start, static_cast<long long>(info.consumed_samples), info.layout_text.c_str(), load_s,
                ck.load.empty() && ck.finetune.empty()
                    ? ""
                    : ("; " + std::string(ck.load.empty() ? "checkpoint.finetune = " + ck.finetune : "checkpoint.load = " + ck.load) +
                       " not used (the checkpoint wins)")
                          .c_str());
  }
  return start;
}

// checkpoint.load names weights (a .safetensors file or a Hugging Face model directory); a meshrun checkpoint
// directory (checkpoint.dir's `latest` and step-N/, or one step-N/ with its manifest.json) is resumed through
// checkpoint.dir instead, or exported first: the message says which ("" when `path` is not one).
std::string meshrun_checkpoint_load_problem(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(path, ec) || is_hf_model_dir(path)) return "";
  const fs::path p(path);
  std::string dir;  // the checkpoint.dir it belongs to
  if (fs::exists(p / "latest", ec)) dir = path;
  else if (fs::exists(p / "manifest.json", ec)) dir = p.lexically_normal().parent_path().string();
  else
    for (const auto& e : fs::directory_iterator(p, ec))
      if (e.path().filename().string().rfind("step-", 0) == 0 && fs::exists(e.path() / "manifest.json", ec)) {
        dir = path;
        break;
      }
  if (dir.empty()) return "";
  return "checkpoint.load = " + path + " is a meshrun checkpoint directory, not weights to load: to resume it set "
         "checkpoint.dir = " + (dir.empty() ? std::string(".") : dir) + " (checkpoint.resume = true, the default) and "
         "remove checkpoint.load; to start a new run from its weights, set checkpoint.finetune = " + path +
         " instead of checkpoint.load (or export them, meshrun-ckpt export " + path + " OUTDIR, and load OUTDIR)";
}

// Step 0 from the parameters of checkpoint.finetune's checkpoint (moments zero, as initialized).
template <class T>
void start_finetune(Trainer<T>& trainer, const CheckpointSpec& ck, int rank, int world) {
  std::string path, err;
  int saved_at = 0;
  const auto t0 = std::chrono::steady_clock::now();
  try {
    path = finetune_checkpoint(ck.finetune);
    saved_at = load_checkpoint_weights(trainer, path);
  } catch (const CheckpointError& e) {
    err = e.what();
  }
  collective_check(err, rank, world);
  double load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  MPI_Allreduce(MPI_IN_PLACE, &load_s, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  if (rank == 0)
    std::printf("meshrun-train: starting at step 0 from the weights of %s (checkpoint.finetune: saved at step %d under "
                "%s; its optimizer state, step and data position not used); loaded in %.3f s%s\n",
                path.c_str(), saved_at, read_checkpoint_info(path).layout_text.c_str(), load_s,
                ck.dir.empty() ? "" : ck.resume ? "; no checkpoint in checkpoint.dir" : "; checkpoint.resume = false");
}

// Step 0: the parameters from initialization, or from the weights of checkpoint.load or checkpoint.finetune.
template <class T>
void start_fresh(Trainer<T>& trainer, const JobConfig& cfg, int rank, int world) {
  const CheckpointSpec& ck = cfg.checkpoint;
  if (!ck.finetune.empty()) return start_finetune(trainer, ck, rank, world);
  if (ck.load.empty()) {
    trainer.init_params();
    if (rank == 0 && !ck.dir.empty())
      std::printf("meshrun-train: starting at step 0 from initialization (training.seed = %llu)%s\n",
                  static_cast<unsigned long long>(cfg.training.seed),
                  ck.resume ? "; no checkpoint in checkpoint.dir" : "; checkpoint.resume = false");
    return;
  }
  std::string err = meshrun_checkpoint_load_problem(ck.load);
  if (err.empty()) {
    try {
      trainer.load(ck.load);
    } catch (const SafetensorsError& e) {
      err = e.what();
    }
  }
  if (!all_ok(err.empty())) throw InputError(err.empty() ? "loading the checkpoint failed on another rank" : err);
  if (rank == 0)
    std::printf("meshrun-train: starting at step 0 from the weights in %s (checkpoint.load)%s\n", ck.load.c_str(),
                ck.dir.empty() ? "" : ck.resume ? "; no checkpoint in checkpoint.dir" : "; checkpoint.resume = false");
}

// Fail now, not after training, if the final weights cannot be written.
void check_save_writable(const CheckpointSpec& ck, int rank) {
  std::string err;
  if (rank == 0 && !ck.save.empty()) {
    const std::filesystem::path parent = std::filesystem::absolute(ck.save).parent_path();
    if (::access(parent.c_str(), W_OK) != 0)
      err = "checkpoint.save = " + ck.save + ": directory " + parent.string() +
            " does not exist or is not writable; create it or change checkpoint.save";
  }
  if (!all_ok(err.empty())) throw InputError(err.empty() ? "checkpoint.save is not writable" : err);
}

// The metrics file (metrics_target): rank 0 opens it; every rank learns whether it could.
MetricsFile open_metrics(const std::string& path, int start, int rank) {
  MetricsFile metrics;
  std::string err;
  if (rank == 0 && !path.empty()) err = metrics.open(path, start);
  if (!all_ok(err.empty())) throw InputError(err.empty() ? "metrics file" : err);
  return metrics;
}

// The run's checkpoint.dir saves, and what a signal-driven stop needs to know of them. With checkpoint.async
// a periodic save only starts (the host copy) and commits at a later step boundary once every rank's write
// has ended; a save still in flight is waited for before the next save, a signal's save and the final save.
template <class T>
struct RunCheckpoints {
  Trainer<T>& trainer;
  const CheckpointSpec& ck;
  DataIdentity data;
  int rank;
  SaveHistory history;
  CheckpointSaver<T> saver{trainer, ck.dir, ck.keep, data, ck.async};
  int failures = 0;  // consecutive failed saves

  // Commits the save in flight (collective); the log line is printed only after the commit (latest renamed).
  bool commit(std::string* why) {
    const UnboundedIo unbounded;  // the watchdog does not bound file I/O
    const int step = saver.step_in_flight();
    try {
      const SaveResult r = saver.finish();
      history.last_saved = step;
      history.last_save_s = r.work_seconds;  // a SIGTERM's save is synchronous: its cost, not async's overlap
      failures = 0;
      progress_after(r.seconds, 3);
      if (rank == 0) print_checkpoint_committed(r, step, ck.signal_lead_s);
      return true;
    } catch (const CheckpointError& e) {
      *why = e.what();
      ++failures;
      return false;
    }
  }

  bool begin(int step, std::string* why) {
    const UnboundedIo unbounded;
    try {
      saver.start(step);
      return true;
    } catch (const CheckpointError& e) {
      *why = e.what();
      ++failures;
      return false;
    }
  }

  // A save still in flight is committed (or its failure handled) before anything else is saved.
  void settle() {
    std::string why;
    if (saver.in_flight() && !commit(&why)) after_failure(why);
  }

  // A collective save of `step`, waited for (a signal's stop, the end of the run); false with *why on failure.
  bool save(int step, std::string* why) {
    settle();
    return begin(step, why) && commit(why);
  }

  // After each step: an asynchronous save whose writes all ended is committed.
  void poll() {
    std::string why;
    if (saver.in_flight() && saver.ready() && !commit(&why)) after_failure(why);
  }

  std::string latest_text() const {
    return history.last_saved > 0 ? "step-" + std::to_string(history.last_saved) : std::string("none");
  }

  // A failed periodic save (its files already removed by the save) is one line, and the run goes on from the
  // previous checkpoint unless checkpoint.on_error = "stop" or checkpoint.max_failures saves in a row failed.
  void after_failure(const std::string& why) {
    const bool stop = ck.on_error == "stop" || failures >= ck.max_failures;
    if (stop)
      throw RunFailure(why + "; latest checkpoint: " + latest_text() + "; stopping (checkpoint.on_error = \"" + ck.on_error +
                       "\", " + std::to_string(failures) + " of checkpoint.max_failures = " + std::to_string(ck.max_failures) +
                       " failures in a row)");
    if (rank == 0) {
      std::printf("meshrun-train: %s; training continues, latest checkpoint: %s (%d of checkpoint.max_failures = %d failures "
                  "in a row)\n", why.c_str(), latest_text().c_str(), failures, ck.max_failures);
      std::fflush(stdout);
    }
  }

  // checkpoint.interval's save of `step`: started (async) or done.
  void periodic(int step) {
    std::string why;
    if (ck.async) {
      settle();
      if (!begin(step, &why)) after_failure(why);
    } else if (!save(step, &why)) {
      after_failure(why);
    }
  }
};

// Rank 0's output of a step: its line (memory after the first step) and metrics record.
template <class T>
void report_step(const Trainer<T>& trainer, const StepStats& st, const JobConfig& cfg, const Layout& layout, bool first,
                 const Progress& progress, const Utilization& util, MetricsFile& metrics) {
  print_step(st, cfg, first, progress, util);
  if (first) print_memory(trainer.memory(), layout.zero_stage, trainer.activation_bytes());
  std::fflush(stdout);
  if (metrics) metrics.write_step(st, trainer.memory().total(), cfg.model.experts > 0, util, progress.elapsed_s);
}

// After the last step: the final checkpoint and the status file, then checkpoint.save's gathered weights.
template <class T>
void finish_run(Trainer<T>& trainer, const JobConfig& cfg, RunCheckpoints<T>& checkpoints, int rank) {
  const CheckpointSpec& ck = cfg.checkpoint;
  if (!ck.dir.empty()) {
    std::string why;
    if (checkpoints.history.last_saved != cfg.training.steps && !checkpoints.save(cfg.training.steps, &why))
      throw RunFailure(why + "; the final checkpoint is not saved; latest checkpoint: " + checkpoints.latest_text());
    if (rank == 0) write_status_file(ck.dir, "finished " + std::to_string(cfg.training.steps));
  }
  set_watchdog_phase(WatchdogPhase::file_io);  // the gathered final weights: file I/O
  if (!ck.save.empty()) {
    trainer.save(ck.save);
    if (rank == 0) std::printf("meshrun-train: saved %s\n", ck.save.c_str());
  }
}

// The device is MESHRUN_CUDA_DEVICE, else the node-local rank (as torchrun's LOCAL_RANK); one device per rank.
// Returns the run header's line.
std::string open_nccl(const JobConfig& cfg, const RankGrid& grid, int rank, std::unique_ptr<device::Backend>& backend,
                      Groups& groups) {
#ifdef MESHRUN_HAVE_CUDA
  MPI_Comm node = MPI_COMM_NULL;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node);
  int local = 0;
  MPI_Comm_rank(node, &local);
  MPI_Comm_free(&node);
  std::string why;
  int index = 0;
  try {
    std::string none;
    index = device::task_cuda_device(device::cuda_device_count(&none), local);
    backend = make_backend(cfg.training, cfg.training.dtype, index);
  } catch (const std::invalid_argument& e) {
    why = e.what();
  }
  collective_check(why, rank, static_cast<int>(grid.world()));
  try {
    groups = comm::make_nccl_groups(MPI_COMM_WORLD, grid, *backend, index);
  } catch (const std::invalid_argument& e) {   // every rank: two ranks on one device
    throw InputError(e.what());
  }
  return "meshrun-train: comm NCCL " + comm::nccl_version() + " for device tensors, one communicator per group; " +
         (std::getenv("MESHRUN_CUDA_DEVICE") ? "device MESHRUN_CUDA_DEVICE" : "device = node-local rank") +
         "; MPI for host values (counts, sums of metrics, checkpoint metadata)";
#else
  (void)cfg, (void)grid, (void)rank, (void)backend, (void)groups;
  throw InputError("training.device = \"cuda\" at world > 1: this meshrun-train was built without CUDA and NCCL");
#endif
}

template <class T>
int train(const JobConfig& cfg, const Layout& layout, const Args& args, int rank) {
  const RankGrid grid(layout);
  Groups groups = make_mpi_groups(MPI_COMM_WORLD, grid);
  const std::vector<RankPlace> places = gather_places(MPI_COMM_WORLD, grid);
  Heartbeat heartbeat(MPI_COMM_WORLD, places, heartbeat_timeout_from_env());
  std::string data_line, valid_line;
  const std::unique_ptr<SampleSource> samples = open_sample_source(cfg, rank, false, &data_line);
  const std::unique_ptr<SampleSource> valid =
      has_validation_data(cfg) ? open_sample_source(cfg, rank, true, &valid_line) : nullptr;
  // CUDA at world > 1: the backend on this rank's device and NCCL groups over it (docs/gpu.md, "NCCL").
  std::unique_ptr<device::Backend> device_backend;
  Groups device_groups;
  std::string nccl_line;
  if (cfg.training.device == "cuda" && layout.world() > 1) nccl_line = open_nccl(cfg, grid, rank, device_backend, device_groups);
#ifdef MESHRUN_HAVE_CUDA
  // NCCL reports a lost peer or link only through ncclCommGetAsyncError: the heartbeat thread polls it, aborts the
  // communicators (so that the blocked call returns, as NCCL's docs ask) and ends the rank with one line.
  if (!nccl_line.empty()) heartbeat.watch(comm::nccl_async_error, comm::abort_nccl_communicators);
#endif
  const Groups& trainer_groups = device_backend ? device_groups : groups;
  Trainer<T> trainer(cfg, grid, rank, trainer_groups, {}, std::move(device_backend));
  const CheckpointSpec& ck = cfg.checkpoint;
  const int world = layout.world();
  prepare_checkpoint_dir(ck, rank, world);
  const std::string resume_from = checkpoint_to_resume(ck, rank, world);
  int start = 0;
  if (!resume_from.empty())
    start = resume(trainer, resume_from, ck, samples->identity(), rank, world);
  else
    start_fresh(trainer, cfg, rank, world);
  if (!ck.dir.empty() && rank == 0) std::remove(status_file_path(ck.dir).c_str());  // it speaks of this run only
  check_save_writable(ck, rank);
  const MetricsTarget metrics_to = metrics_target(args.metrics, args.no_metrics, cfg);
  MetricsFile metrics = open_metrics(metrics_to.path, start, rank);
  // On GPUs the data sheet's peak; the CPU's is measured (a GPU run against a CPU matmul would be meaningless).
  const PeakFlops peak = cfg.training.device == "cuda" ? catalogue_gpu_peak(MPI_COMM_WORLD)
                                                       : measure_cpu_peak(MPI_COMM_WORLD, cfg.training.dtype);
  const int cpus = node_cpus(MPI_COMM_WORLD, places);  // collective
  const Utilization util = utilization(cfg, peak.flops_per_s, peak.source);
  if (rank == 0) {
    const PipelineSchedule kind = trainer.schedule().spec.kind;
    print_run_banner(cfg, layout, trainer.table().global_size(), kind, trainer.geometry().microbatches);
    if (cfg.training.device == "cuda") std::printf("meshrun-train: device %s\n", trainer.backend().name().c_str());
    if (!nccl_line.empty()) std::printf("%s\n", nccl_line.c_str());
    for (const std::string* l : {&data_line, &valid_line})
      if (!l->empty()) std::printf("%s\n", l->c_str());
    print_utilization(util, metrics_to.path, metrics_to.why);
    std::printf("meshrun-train: %s\n", heartbeat.status().c_str());
    std::fflush(stdout);
    if (metrics) {
      RunFacts facts;
      facts.start_step = start;
      facts.params = trainer.table().global_size();
      facts.schedule = pipeline_schedule_name(kind);
      facts.microbatches = trainer.geometry().microbatches;
      facts.world = static_cast<int>(layout.world());
      facts.backend = trainer.backend().name();
      std::vector<std::string> nodes;
      for (const RankPlace& p : places)
        if (std::find(nodes.begin(), nodes.end(), p.node) == nodes.end()) nodes.push_back(p.node);
      facts.nodes = static_cast<int>(nodes.size());
      facts.ranks_per_node = static_cast<int>(
          std::count_if(places.begin(), places.end(), [&](const RankPlace& p) { return p.node == places[0].node; }));
      facts.node_cpus = cpus;
      metrics.write_run(cfg, layout, facts, util);
    }
  }

  RunCheckpoints<T> checkpoints{trainer, ck, samples->identity(), rank, SaveHistory{start > 0 ? start : -1}};
  if (!ck.dir.empty()) {
    const auto t0 = std::chrono::steady_clock::now();
    const std::size_t bytes = checkpoints.saver.reserve();
    if (rank == 0)
      std::printf("meshrun-train: checkpoint staging buffer: %.1f MiB on rank 0, allocated and touched in %.3f s (saves copy "
                  "the state there, then write it, with O_DIRECT where the file system allows)\n", static_cast<double>(bytes) / 1048576.0,
                  std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  const std::unique_ptr<RunTracer> tracer =  // --trace: collective (directory check, clock alignment)
      make_run_tracer(args.trace_dir, args.trace_steps, start, cfg, trainer.schedule().spec, grid, rank);
  progress();
  set_watchdog_phase(WatchdogPhase::steps);  // from here on, steps are bounded
  const auto loop_t0 = std::chrono::steady_clock::now();
  const auto since_loop = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - loop_t0).count(); };
  Progress run_progress;
  double last_loss = 0;
  StragglerWatch stragglers(MPI_COMM_WORLD, cfg.training.straggler_interval, cfg.training.straggler_margin);
  KernelTimesPerStep kernel_times(trainer.backend(), MPI_COMM_WORLD, !metrics_to.path.empty());
  for (int s = start; s < cfg.training.steps; ++s) {
    heartbeat.set_step(s + 1);
    if (tracer) tracer->before_step(s);  // the step after the traced ones writes the trace (collective)
    const double waited_before = comm::total_wait_seconds();
    StepStats st = trainer.step(s, *samples);
    const double waited = comm::total_wait_seconds() - waited_before;
    st.kernel_ms = kernel_times.after_step();  // collective when metrics are written
    // training.eval_interval: the validation loss after every interval's step and after the last one.
    if (valid && cfg.training.eval_interval > 0 && ((s + 1) % cfg.training.eval_interval == 0 || s + 1 == cfg.training.steps)) {
      st.eval_loss = trainer.evaluate(*valid, cfg.training.eval_batches);
      kernel_times.skip_since_last();
    }
    if (tracer) tracer->after_step(s);
    StragglerReport late;
    if (stragglers.after_step(s + 1, st.ms / 1000.0, waited, &late))
      for (const Straggler& slow : late.slow) {
        std::printf("%s\n", straggler_line(late, slow, places, cfg.training.straggler_margin).c_str());
        if (metrics) metrics.write_straggler(late, slow, places[static_cast<std::size_t>(slow.rank)]);
      }
    checkpoints.history.last_step_s = st.ms / 1000.0;
    progress_after(checkpoints.history.last_step_s, 10);
    run_progress = {since_loop(), s + 1 - start, cfg.training.steps - (s + 1)};
    last_loss = st.loss;
    if (rank == 0) report_step(trainer, st, cfg, layout, s == start, run_progress, util, metrics);
    if (ck.dir.empty()) continue;
    if (const int stop = agreed_stop_bits(); stop != 0) {  // every rank, every step: the same decision
      metrics.close();
      if (tracer) tracer->finish();
      return stop_after_step(stop, s + 1, ck.dir, rank, checkpoints.history,
                             [&](int step, std::string* why) { return checkpoints.save(step, why); });
    }
    checkpoints.poll();
    // checkpoint.interval; the last step's save is finish_run's
    if (ck.interval > 0 && (s + 1) % ck.interval == 0 && s + 1 < cfg.training.steps) checkpoints.periodic(s + 1);
  }
  metrics.close();
  if (tracer) tracer->finish();  // unless written already (a run shorter than its traced window)
  finish_run(trainer, cfg, checkpoints, rank);
  if (rank == 0 && run_progress.steps_done > 0) {
    run_progress.elapsed_s = since_loop();  // the final save included
    print_run_summary(cfg, start, run_progress, util, last_loss, ck.dir.empty() ? "" : checkpoints.latest_text());
  }
  return 0;
}

// training.device = "cuda" runs on the CUDA backend, one device per rank, NCCL between ranks (the ON build on GPUs,
// the EMULATED build on the host's CPU with the fake NCCL, docs/gpu.md); refused in one line where it cannot: no
// backend or device here, or a dtype the backend does not keep.
std::string cuda_refusal(const TrainingSpec& t) {
  std::string why;
  if (device::cuda_device_count(&why) == 0) return "training.device = \"cuda\": " + why;
  try {
    (void)device::Precision::for_run(t.device, t.dtype, t.param_dtype, t.grad_dtype, t.optim_dtype);
    (void)device::task_cuda_device(device::cuda_device_count(nullptr));
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

// Keys that apply only to the other device, set to a value other than their default: one warning line each
// (they are accepted, so one template serves both devices, but must not look honoured).
std::vector<std::string> other_device_keys(const TrainingSpec& t) {
  const TrainingSpec d;
  std::vector<std::string> out;
  auto q = [](const std::string& v) { return "\"" + v + "\""; };
  if (t.device == "cpu") {
    const struct {
      const char* key;
      const std::string &value, &fallback;
    } keys[] = {{"param_dtype", t.param_dtype, d.param_dtype},
                {"grad_dtype", t.grad_dtype, d.grad_dtype},
                {"optim_dtype", t.optim_dtype, d.optim_dtype}};
    for (const auto& k : keys)
      if (k.value != k.fallback)
        out.push_back(std::string("training.") + k.key + " = " + q(k.value) +
                      " applies to training.device = \"cuda\" (the types the CUDA backend stores); on the CPU every "
                      "tensor is training.dtype = " + q(t.dtype) + ", so this run does not use it");
  } else if (t.dtype != d.dtype) {
    out.push_back("training.dtype = " + q(t.dtype) + " applies to training.device = \"cpu\"; on CUDA the stored types "
                  "are training.param_dtype, grad_dtype, optim_dtype (" + t.param_dtype + ", " + t.grad_dtype + ", " +
                  t.optim_dtype + "), so this run does not use it");
  }
  return out;
}

int run(int argc, char** argv, int rank, int world) {
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "-h") || !std::strcmp(argv[i], "--help")) {
      if (rank == 0) std::fputs(kUsage, stdout);
      return 0;
    }
    if (!std::strcmp(argv[i], "--version")) {
      if (rank == 0) std::printf("meshrun-train %s\n", kVersion);
      return 0;
    }
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
  {
    const Origin o = config.origin_of("job.trainer");  // a file's line:column; a --set names itself
    const bool located = o.kind == SourceKind::template_file || o.kind == SourceKind::site;
    if (const std::string why = meshrun_train_refusal(cfg, located ? o.where : ""); !why.empty()) throw InputError(why);
  }
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
  {
    // mesh's one resolve, with the allocation MPI gives: on CPU one shared-memory node holding every rank. The
    // dry run, the launcher and the plugin hold a template's job to the same rules (RuleSet::trainer).
    Config here = config;
    here.job.cluster = single_node_spec(world);
    const Resolution res = resolve_job(here, {RuleSet::trainer, world, nullptr, /*warnings=*/false});
    if (!res.ok()) throw InputError(res.problems.front().message);
  }
  {
    // The data's input files, before anything is written: one line per missing file (data_input_problems, as
    // `meshrun plan`, `run` and `sbatch` check them). Every rank looks; all end together.
    const auto where = [&config](const std::string& key) {
      const Origin o = config.origin_of(key);
      return o.kind == SourceKind::template_file || o.kind == SourceKind::site ? o.where : std::string();
    };
    const auto missing = input_file_problems(cfg, where);
    if (!all_ok(missing.empty()))
      throw ConfigError(missing.empty() ? std::vector<std::string>{"an input file (data, checkpoint.finetune) is missing "
                                                                   "on another rank; put it where every rank reads it"}
                                        : missing);
  }
  if (cfg.training.device == "cuda")
    if (const std::string why = cuda_refusal(cfg.training); !why.empty()) throw InputError(why);
  if (rank == 0)
    for (const std::string& line : other_device_keys(cfg.training)) std::printf("meshrun-train: warning: %s\n", line.c_str());
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
  set_watchdog_rank(rank);
  progress();
  set_watchdog_phase(WatchdogPhase::file_io);  // set-up: configuration, token file, checkpoint load
  int code = 0;
  try {
    code = run(argc, argv, rank, world);
  } catch (const ConfigError& e) {
    if (rank == 0) std::fputs(message_lines("meshrun-train: ", e.what()).c_str(), stderr);
    code = 2;
  } catch (const InputError& e) {
    // Input errors echo file names, tensor names and values: escaped so each stays one printable line.
    if (rank == 0) std::fprintf(stderr, "meshrun-train: %s\n", cut_long_values(e.what()).c_str());
    code = 2;
  } catch (const RunFailure& e) {  // every rank agreed (a failed save): one line, exit 1, no abort
    if (rank == 0) std::fprintf(stderr, "meshrun-train: %s\n", cut_long_values(e.what()).c_str());
    code = 1;
  } catch (const std::bad_alloc&) {
    // A size from the input (model, batch, a file's header) outgrew memory: one line and exit 2, not an abort.
    std::fprintf(stderr, "meshrun-train: rank %d: out of memory (std::bad_alloc); the model, batch or a file it reads "
                         "asks for more than this node can hold: lower model/training sizes or raise parallel.tp/pp/"
                         "zero_stage, or run on nodes with more memory\n", rank);
    MPI_Abort(MPI_COMM_WORLD, 2);
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "meshrun-train: rank %d: %s\n", rank, cut_long_values(e.what()).c_str());
    MPI_Abort(MPI_COMM_WORLD, 1);
    return 1;
  }
  set_watchdog_phase(WatchdogPhase::done);
  MPI_Finalize();
  return code;
}

}  // namespace meshrun::train
