#include "trace_run.hpp"

#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "agree.hpp"
#include "meshrun/json.hpp"
#include "meshrun/version.hpp"
#include "watchdog.hpp"

namespace meshrun::train::cli {

namespace {

constexpr int kSyncRounds = 10;
constexpr int kNodeChars = 256;
constexpr int kTagSize = 1, kTagText = 2;

// Slurm's node name (the local cluster's nodes share one host name), else the host name.
std::string node_name() {
  if (const char* n = std::getenv("SLURMD_NODENAME"); n && *n) return std::string(n).substr(0, kNodeChars - 1);
  char host[kNodeChars] = {};
  if (::gethostname(host, sizeof host - 1) != 0) return "?";
  return host;
}

std::string rank_file(const std::string& dir, int rank) {
  return (std::filesystem::path(dir) / ("trace-rank" + std::to_string(rank) + ".json")).string();
}

// "" or the one-line reason.
std::string write_file(const std::string& path, const std::string& head, const std::vector<const std::string*>& parts,
                       const std::string& tail) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) return "cannot write " + path + " (" + std::strerror(errno) + ")";
  bool ok = std::fwrite(head.data(), 1, head.size(), f) == head.size();
  bool first = true;
  for (const std::string* p : parts) {
    if (p->empty()) continue;
    if (!first) ok = ok && std::fwrite(",\n", 1, 2, f) == 2;
    ok = ok && std::fwrite(p->data(), 1, p->size(), f) == p->size();
    first = false;
  }
  ok = ok && std::fwrite(tail.data(), 1, tail.size(), f) == tail.size();
  if (std::fclose(f) != 0) ok = false;
  return ok ? "" : "writing " + path + " failed (" + std::strerror(errno) + ")";
}

std::string metadata(const char* name, int pid, int tid, const std::string& arg_key, const std::string& arg_json) {
  return "{\"name\":\"" + std::string(name) + "\",\"ph\":\"M\",\"pid\":" + std::to_string(pid) + ",\"tid\":" +
         std::to_string(tid) + ",\"args\":{\"" + arg_key + "\":" + arg_json + "}}";
}

}  // namespace

int parse_trace_steps(const std::string& text) {
  char* end = nullptr;
  errno = 0;
  const long v = std::strtol(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || errno != 0 || v < 1 || v > kMaxTraceSteps)
    throw InputError("--trace-steps " + text + ": give a whole number of steps from 1 to " +
                     std::to_string(kMaxTraceSteps) + " (a trace stays small; the steps counted from the run's first)");
  return static_cast<int>(v);
}

RunTracer::RunTracer(const TraceSetup& setup, const RankGrid& grid, int rank)
    : setup_(setup),
      grid_(grid),
      rank_(rank),
      world_(grid.world()),
      coord_(grid.coords(rank)),
      node_(node_name()),
      recorder_(grid.group_of(rank, GroupKind::pp), kMaxTraceEvents) {
  // DIR on every rank (it may be node-local): created, and writable.
  std::string err;
  std::error_code ec;
  std::filesystem::create_directories(setup_.dir, ec);
  if (ec || ::access(setup_.dir.c_str(), W_OK) != 0)
    err = "--trace " + setup_.dir + ": cannot create or write the directory" + (ec ? " (" + ec.message() + ")" : "") +
          " on rank " + std::to_string(rank_) + " (node " + node_ + "); give a writable directory";
  collective_check(err, rank_, world_);

  // Clock alignment: the exit of the best of kSyncRounds barriers.
  MPI_Barrier(MPI_COMM_WORLD);
  double exits[kSyncRounds], spans[kSyncRounds], worst[kSyncRounds];
  for (int k = 0; k < kSyncRounds; ++k) {
    const double t_in = trace::now();
    MPI_Barrier(MPI_COMM_WORLD);
    exits[k] = trace::now();
    spans[k] = exits[k] - t_in;
  }
  MPI_Allreduce(spans, worst, kSyncRounds, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  const int best = static_cast<int>(std::min_element(worst, worst + kSyncRounds) - worst);
  origin_s_ = exits[best];
  error_bound_us_ = worst[best] * 1e6;
  if (rank_ == 0) {
    const int first = setup_.first_step + 1, last = std::min(setup_.first_step + setup_.steps, setup_.end_step);
    if (last >= first)
      std::printf("meshrun-train: trace: steps %d-%d into %s (a file per rank, merged into trace.json); clocks aligned "
                  "within %.1f us\n", first, last, setup_.dir.c_str(), error_bound_us_);
    else
      std::printf("meshrun-train: trace: no step to trace (the run ends at step %d); %s gets empty files\n",
                  setup_.end_step, setup_.dir.c_str());
    std::fflush(stdout);
  }
}

RunTracer::~RunTracer() {
  if (recorder_.recording()) recorder_.end_step();
}

void RunTracer::before_step(int s) {
  if (!finished_ && s >= setup_.first_step + setup_.steps) finish();  // the window is over: write it
  if (finished_ || s < setup_.first_step || s >= setup_.first_step + setup_.steps) return;
  if (first_traced_ < 0) first_traced_ = s + 1;
  last_traced_ = s + 1;
  recorder_.begin_step(s + 1);
  step_t0_ = trace::now();
}

void RunTracer::after_step(int /*s*/) {
  if (!recorder_.recording()) return;
  recorder_.phase("step", step_t0_, trace::now());
  recorder_.end_step();
}

std::string RunTracer::metadata_events() const {
  std::string name = "rank " + std::to_string(rank_) + " (pp " + std::to_string(coord_.pp) + ", dp " +
                     std::to_string(coord_.dp) + ", tp " + std::to_string(coord_.tp) + ", cp " +
                     std::to_string(coord_.cp) + ") node " + node_;
  std::string s = metadata("process_name", rank_, 0, "name", trace::json_string(name));
  s += ",\n" + metadata("process_sort_index", rank_, 0, "sort_index", std::to_string(rank_));
  for (int tid : {trace::kStepTrack, trace::kComputeTrack, trace::kP2pTrack, trace::kWaitTrack}) {
    s += ",\n" + metadata("thread_name", rank_, tid, "name", trace::json_string(trace::track_name(tid)));
    s += ",\n" + metadata("thread_sort_index", rank_, tid, "sort_index", std::to_string(tid));
  }
  return s;
}

std::string RunTracer::other_data(const std::vector<int>& ranks, const std::vector<std::string>& nodes,
                                  const std::vector<long long>& events, const std::vector<long long>& dropped,
                                  const char* merged) const {
  const Layout& l = grid_.layout();
  std::string out;
  JsonWriter j(out);
  j.begin_object();
  j.field("producer", std::string("meshrun-train ") + kVersion);
  j.field("meshrun_trace", 1);  // this object's version: fields are added, never re-purposed
  j.field("model", setup_.model);
  j.field("schedule", pipeline_schedule_name(setup_.schedule.kind));
  j.field("pp", setup_.schedule.pp);
  j.field("virtual_stages", setup_.schedule.virtual_stages);
  j.field("microbatches", setup_.schedule.microbatches);
  j.field("tp", l.tp).field("cp", l.cp).field("dp", l.dp).field("ep", l.ep).field("world", world_);
  j.field("order", l.order.str());
  j.key("steps").begin_array();
  for (int s = first_traced_; s >= 1 && s <= last_traced_; ++s) j.value(s);
  j.end_array();
  j.field("time_unit", "us from the clock origin (the aligned exit of a start-up MPI_Barrier)");
  j.field("clock_alignment", "best of 10 timed MPI_Barriers; the ranks' origins differ by at most clock_error_bound_us");
  j.field("clock_error_bound_us", error_bound_us_);
  j.field("ranks_merged", merged);
  j.key("ranks").begin_array();
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    const Coord c = grid_.coords(ranks[i]);
    j.begin_object();
    j.field("rank", ranks[i]).field("pp", c.pp).field("dp", c.dp).field("tp", c.tp).field("cp", c.cp).field("ep", c.ep);
    j.field("node", nodes[i]);
    j.field("events", static_cast<int64_t>(events[i])).field("dropped_events", static_cast<int64_t>(dropped[i]));
    j.end_object();
  }
  j.end_array();
  j.end_object();
  return out;
}

void RunTracer::finish() {
  if (finished_) return;
  finished_ = true;
  if (recorder_.recording()) recorder_.end_step();
  const UnboundedIo unbounded;  // file I/O of unknown length: not a hang
  // This rank's events, then its own file (a trace of its own, with its process metadata).
  std::string text = metadata_events();
  for (const trace::Event& e : recorder_.events()) {
    text += ",\n";
    text += trace::event_json(e, rank_, origin_s_, setup_.schedule);
  }
  const long long n_events = static_cast<long long>(recorder_.events().size());
  const long long n_dropped = static_cast<long long>(recorder_.dropped());
  const std::string tail = "\n]}\n";
  auto head = [&](const std::string& other) {
    return "{\"displayTimeUnit\":\"ms\",\"otherData\":" + other + ",\n\"traceEvents\":[\n";
  };
  const std::string own_path = rank_file(setup_.dir, rank_);
  std::string err = write_file(own_path, head(other_data({rank_}, {node_}, {n_events}, {n_dropped}, "this rank")), {&text}, tail);
  if (!err.empty()) {
    std::fprintf(stderr, "meshrun-train: rank %d: trace: %s; training goes on\n", rank_, err.c_str());
    std::fflush(stderr);
  }

  // The merge: every rank (or, above kMergeEveryRankUpTo ranks, those of dp 0) sends its text to rank 0,
  // one after the other, so rank 0 holds one rank's events at a time besides its own.
  MPI_Barrier(MPI_COMM_WORLD);  // every rank's file is written
  char node_buf[kNodeChars] = {};
  std::snprintf(node_buf, sizeof node_buf, "%s", node_.c_str());
  std::vector<char> nodes_all(rank_ == 0 ? static_cast<std::size_t>(world_) * kNodeChars : 1);
  MPI_Gather(node_buf, kNodeChars, MPI_CHAR, nodes_all.data(), kNodeChars, MPI_CHAR, 0, MPI_COMM_WORLD);
  long long counts[2] = {n_events, n_dropped};
  std::vector<long long> counts_all(rank_ == 0 ? static_cast<std::size_t>(world_) * 2 : 1);
  MPI_Gather(counts, 2, MPI_LONG_LONG, counts_all.data(), 2, MPI_LONG_LONG, 0, MPI_COMM_WORLD);
  auto merged = [&](int r) { return world_ <= kMergeEveryRankUpTo || grid_.coords(r).dp == 0; };
  if (rank_ != 0) {
    if (merged(rank_)) {
      const long long size = static_cast<long long>(text.size());
      MPI_Send(&size, 1, MPI_LONG_LONG, 0, kTagSize, MPI_COMM_WORLD);
      MPI_Send(text.data(), static_cast<int>(text.size()), MPI_CHAR, 0, kTagText, MPI_COMM_WORLD);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    return;
  }
  std::vector<int> ranks;
  std::vector<std::string> nodes;
  std::vector<long long> events, dropped;
  long long total = 0;
  for (int r = 0; r < world_; ++r) {
    if (!merged(r)) continue;
    ranks.push_back(r);
    nodes.emplace_back(&nodes_all[static_cast<std::size_t>(r) * kNodeChars]);
    events.push_back(counts_all[2 * static_cast<std::size_t>(r)]);
    dropped.push_back(counts_all[2 * static_cast<std::size_t>(r) + 1]);
    total += events.back();
  }
  const std::string path = (std::filesystem::path(setup_.dir) / "trace.json").string();
  std::FILE* f = std::fopen(path.c_str(), "wb");
  err = f ? "" : "cannot write " + path + " (" + std::strerror(errno) + ")";
  auto put = [&](const std::string& s) {
    if (f && std::fwrite(s.data(), 1, s.size(), f) != s.size() && err.empty())
      err = "writing " + path + " failed (" + std::strerror(errno) + ")";
  };
  put(head(other_data(ranks, nodes, events, dropped, world_ <= kMergeEveryRankUpTo ? "all" : "dp 0 (world > 512)")));
  put(text);  // rank 0 is always merged (dp 0)
  std::string other;
  for (int r : ranks) {
    if (r == 0) continue;
    long long size = 0;
    MPI_Recv(&size, 1, MPI_LONG_LONG, r, kTagSize, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    other.resize(static_cast<std::size_t>(size));
    MPI_Recv(other.data(), static_cast<int>(size), MPI_CHAR, r, kTagText, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    put(",\n");
    put(other);
  }
  put(tail);
  if (f && std::fclose(f) != 0 && err.empty()) err = "writing " + path + " failed (" + std::strerror(errno) + ")";
  if (!err.empty()) {
    std::fprintf(stderr, "meshrun-train: trace: %s; training goes on\n", err.c_str());
  } else if (first_traced_ < 0) {
    std::printf("meshrun-train: trace: %s: no step was traced\n", path.c_str());
  } else {
    long long lost = 0;
    for (long long d : dropped) lost += d;
    std::printf("meshrun-train: trace: %s: steps %d-%d, %zu ranks, %lld events%s; clocks aligned within %.1f us; "
                "draw it: meshrun plot --timeline %s -o timeline.svg\n",
                path.c_str(), first_traced_, last_traced_, ranks.size(), total,
                lost ? (", " + std::to_string(lost) + " dropped over the per-rank limit").c_str() : "", error_bound_us_,
                path.c_str());
  }
  std::fflush(stdout);
  std::fflush(stderr);
  MPI_Barrier(MPI_COMM_WORLD);
}

std::unique_ptr<RunTracer> make_run_tracer(const std::string& dir, int steps, int first_step, const JobConfig& cfg,
                                           const ScheduleSpec& schedule, const RankGrid& grid, int rank) {
  if (dir.empty()) return nullptr;
  TraceSetup setup;
  setup.dir = dir;
  setup.steps = steps;
  setup.first_step = first_step;
  setup.end_step = cfg.training.steps;
  setup.model = cfg.model.name;
  setup.schedule = schedule;
  return std::make_unique<RunTracer>(setup, grid, rank);
}

}  // namespace meshrun::train::cli
