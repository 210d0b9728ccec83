// meshrun-train --trace DIR [--trace-steps N] (docs/trainer.md, "Timelines"): the first N steps of the run are
// recorded (trace.hpp's Recorder), then every rank writes DIR/trace-rank<R>.json and rank 0 DIR/trace.json, the
// merge with one process track per rank, both in Chrome's trace-event format (JSON Object Format: "X" complete
// events in µs, "M" metadata naming each rank's process and tracks; Perfetto and chrome://tracing open them).
// The merged file's otherData holds what `meshrun plot --timeline` needs to simulate the same schedule.
//
// Clocks: each rank's events are in its own steady clock. At construction the ranks run 10 timed
// MPI_Barriers; every rank takes the exit of the round whose slowest rank was fastest as its origin. No rank
// leaves a barrier before the last one entered it, so the origins differ by at most that round's longest
// barrier (recorded as clock_error_bound_us); drift between nodes' clocks after that is not corrected.
#pragma once
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "meshrun/job.hpp"
#include "meshrun/layout.hpp"
#include "meshrun/rank_map.hpp"
#include "meshrun/schedule.hpp"
#include "meshrun/train/run/trace.hpp"

namespace meshrun::train::cli {

inline constexpr int kMaxTraceSteps = 50;                     // --trace-steps at most
inline constexpr std::size_t kMaxTraceEvents = 200000;        // per rank; later events are counted, not kept
inline constexpr int kMergeEveryRankUpTo = 512;               // larger worlds merge the ranks of dp 0 only

// --trace-steps N: an integer in [1, kMaxTraceSteps], else InputError naming the flag.
int parse_trace_steps(const std::string& text);

struct TraceSetup {
  std::string dir;
  int steps = 2;       // how many steps, from the run's first
  int first_step = 0;  // 0-based index of the run's first step
  int end_step = 0;    // training.steps: no step at or after it runs
  std::string model;
  ScheduleSpec schedule;
};

class RunTracer {
 public:
  // Collective. Every rank creates DIR and checks that it can write there (a problem on any rank: one line,
  // exit 2, before any step), then the clocks are aligned.
  RunTracer(const TraceSetup& setup, const RankGrid& grid, int rank);
  ~RunTracer();
  RunTracer(const RunTracer&) = delete;
  RunTracer& operator=(const RunTracer&) = delete;

  // Around each step (0-based s): a step inside the traced window is recorded; the step after the window
  // first writes the trace (finish(); the caller finishes a run that ends earlier), so the last traced
  // step's line is printed before the trace's.
  void before_step(int s);
  void after_step(int s);
  // Collective and idempotent: writes this rank's file, gathers the ranks' events to rank 0, which writes
  // DIR/trace.json and prints one line. A file that cannot be written is one line from that rank; training
  // goes on.
  void finish();

 private:
  // `merged`: which ranks the file holds ("all", "dp 0 (world > 512)", "this rank").
  std::string other_data(const std::vector<int>& ranks, const std::vector<std::string>& nodes,
                         const std::vector<long long>& events, const std::vector<long long>& dropped,
                         const char* merged) const;
  std::string metadata_events() const;

  TraceSetup setup_;
  const RankGrid& grid_;
  int rank_, world_;
  Coord coord_;
  std::string node_;
  trace::Recorder recorder_;
  double origin_s_ = 0, error_bound_us_ = 0;
  double step_t0_ = 0;
  int first_traced_ = -1, last_traced_ = -1;  // 1-based steps actually recorded
  bool finished_ = false;
};

// The tracer of --trace DIR, or null without it.
std::unique_ptr<RunTracer> make_run_tracer(const std::string& dir, int steps, int first_step, const JobConfig& cfg,
                                           const ScheduleSpec& schedule, const RankGrid& grid, int rank);

}  // namespace meshrun::train::cli
