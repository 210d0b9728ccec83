// `meshrun plot --timeline DIR/trace.json`: the measured pipeline timeline of one traced step (meshrun-train
// --trace, docs/trainer.md "Timelines") next to the schedule simulator's plan for the same layout, with the
// bubble fraction of each. The layout comes from the trace's otherData (schedule, pp, virtual_stages,
// microbatches, the ranks' coordinates); the plan is what `meshrun plan --schedule` simulates (unit costs).
// Like the metrics plot, the SVG is a function of the input alone.
#pragma once
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "meshrun/schedule.hpp"

namespace meshrun::timeline {

// Bad input: one line naming the file and the problem.
struct TimelineError : std::runtime_error {
  explicit TimelineError(const std::string& message);
};

inline constexpr size_t kMaxTraceBytes = size_t(256) << 20;  // a larger file is refused before it is read

struct TraceRank {
  int rank = 0, pp = 0, dp = 0, tp = 0, cp = 0;
  std::string node;
};

// An "X" event of the tracks the picture reads: step phases (tid 1), compute (2), waits (4).
struct TraceEvent {
  std::string name;
  int pid = 0, tid = 0;
  double ts = 0, dur = 0;  // µs
  int step = -1, microbatch = -1, chunk = -1;
};

struct Trace {
  std::string path, model;
  ScheduleSpec spec;  // schedule, pp, virtual_stages, microbatches
  int tp = 1, cp = 1, dp = 1, ep = 1, world = 1;
  std::vector<int> steps;  // traced, 1-based
  double clock_error_bound_us = 0;
  std::vector<TraceRank> ranks;  // merged ranks
  std::vector<TraceEvent> events;
};

// Parses a merged (or per-rank) trace file's text. Throws TimelineError "NAME: problem" when it is not JSON,
// not a meshrun-train trace (no otherData.meshrun_trace), its layout is missing or not a schedule meshrun
// generates, or an event of the read tracks lacks a field or has one of the wrong type.
Trace parse_trace(const std::string& text, const std::string& path);
// Reads FILE, or DIR/trace.json when given a directory (at most kMaxTraceBytes).
Trace read_trace(const std::string& path);

struct Box {
  Action action;          // kind, microbatch, chunk
  double start = 0, end = 0;  // µs from the step's pipeline start (measured) or time units (simulated)
};

struct Row {
  int rank = -1;          // world rank (measured), or -1
  int stage = 0;          // pipeline rank
  std::string node;
  double busy = 0;        // compute time in the span
  double phase_start = 0, phase_end = 0;  // measured: this rank's own pipeline phase, from the span's start
  std::vector<Box> boxes;
  std::vector<std::pair<double, double>> waits;  // blocked in communication (measured only)
};

struct Comparison {
  int step = 0;
  std::vector<Row> measured;   // one per pipeline rank of dp 0 (tp 0, cp 0), pipeline rank order
  double span_us = 0;          // first pipeline start to last pipeline end of those ranks
  double start_skew_us = 0;    // last pipeline start − first (the ranks are not barrier-synchronized)
  double measured_bubble = 0;  // Σ (span − busy_r) ÷ (pp × span)
  std::vector<Row> simulated;  // the unit-cost plan, in time units
  double makespan = 0;
  double simulated_bubble = 0;            // meshrun plan --schedule's figure
  double simulated_measured_costs = 0;    // the same table with this step's mean per-chunk F, B, W
};

// The comparison of traced step `step` (default: the last traced). Throws TimelineError when the step was not
// traced, a rank of the pipeline is missing or ran other actions than the schedule's table.
Comparison compare(const Trace& trace, std::optional<int> step);

// The SVG document of the comparison; `title` replaces the default one when not empty.
std::string render_timeline_svg(const Trace& trace, const Comparison& c, const std::string& title = "");

// What `meshrun plot --timeline` prints: the step and layout, then the measured and the simulated bubble.
std::string summary_text(const Trace& trace, const Comparison& c);

}  // namespace meshrun::timeline
