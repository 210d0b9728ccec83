// The pipeline part of the cost model: mesh's schedule generator and simulator, cached. Internal to the
// planner (docs/planner.md, "Pipeline bubble").
#pragma once
#include <map>
#include <memory>
#include <tuple>
#include <vector>

#include "meshrun/schedule.hpp"

namespace meshrun::planner::detail {

// One micro-batch's costs in seconds: per layer and for the output head (on the last chunk). `w` is the
// weight-gradient part of the backward (what zb defers), `b` the rest, communication and recomputation
// included; fused schedules run b + w as one BW.
struct PipelineCosts {
  double f = 0, b = 0, w = 0;
  double head_f = 0, head_b = 0, head_w = 0;
  double transfer = 0;  // one point-to-point hop between pipeline ranks
};

struct PipelineRun {
  double makespan = 0;  // seconds from the first forward to the last backward
  double min_idle = 0;  // idle time of the busiest rank: makespan − its compute, i.e. the step's bubble
};

// Tables by (schedule, pp, V, m); simulations by table and costs relative to one layer's f + b + w,
// rounded to 1/kCostSteps of it (the simulation runs on the rounded costs and is scaled back, so a
// cached result is exact for its key).
//
// Live slots of long steps: they depend on each rank's order alone, and the generators' orders repeat
// every micro-batch with one chunk per rank and every pp micro-batches when interleaved, so past warm-up
// one more period adds the same slots (none, or m's growth for GPipe). For m beyond three periods past
// 2·pp (3·pp interleaved) micro-batches, the peaks of those three table sizes are taken and, when their
// two differences agree, extended linearly to m (else the table of m is built, counted by not_periodic).
// Bubbles are always simulated on the table of m itself. tests/planner/test_pipeline.cpp compares the
// extension with full tables. Not thread-safe: one per CostModel. The table of m is as large as the step
// (m × pp·V slots): the planner's callers ask only for pp = 1 or at most kMaxScheduleSlots slots
// (schedule_within_bound(), cost.hpp), the bound of `meshrun plan --schedule`.
class PipelineSims {
 public:
  static constexpr double kCostSteps = 256;
  explicit PipelineSims(int layers) : layers_(layers) {}
  // Live activation slots per rank: they follow from each rank's order alone (a rank runs one action at a
  // time), so the unit-cost simulation of the table gives them for every cost.
  const std::vector<int>& peak_live(PipelineSchedule kind, int pp, int v, int m);
  PipelineRun run(PipelineSchedule kind, int pp, int v, int m, const PipelineCosts& costs);
  // A lower bound of run(...).min_idle without simulating, on the same rounded costs: rank r cannot start
  // before micro-batch 0 has passed chunks 0..r−1 and, with fused backwards, cannot finish before its last
  // backward has gone back through them, so the makespan is at least r's compute plus those two chains.
  double idle_lower_bound(PipelineSchedule kind, int pp, int v, int m, const PipelineCosts& costs);
  // peak_live without the periodic extension (the reference the tests compare it with).
  std::vector<int> peak_live_exact(PipelineSchedule kind, int pp, int v, int m) { return table(kind, pp, v, m).peak_live; }
  int simulations() const { return simulations_; }
  int tables() const { return int(tables_.size()); }
  int not_periodic() const { return not_periodic_; }  // extensions refused by the check (tables built in full)

 private:
  struct Table {
    ScheduleTable table;
    std::vector<int> chunk_layers;
    std::vector<int> peak_live;
  };
  Table& table(PipelineSchedule kind, int pp, int v, int m);
  // Costs in steps of 1/kCostSteps of one layer's f + b + w, as the cache key holds them.
  struct Relative {
    long long f, b, w, head_f, head_b, head_w, transfer;
  };
  Relative relative(PipelineSchedule kind, const PipelineCosts& c) const;
  PipelineRun simulate(PipelineSchedule kind, int pp, int v, int m, const Relative& r);  // relative units
  const std::vector<int>& layers_of(int chunks);  // mesh's chunk_layers, cached
  // The three sample sizes for m's live slots (empty when m is too short to extend).
  static std::vector<int> samples(int pp, int v, int m);

  int layers_;
  int simulations_ = 0, not_periodic_ = 0;
  std::map<std::tuple<int, int, int, int>, std::unique_ptr<Table>> tables_;
  std::map<std::vector<long long>, PipelineRun> runs_;  // relative to one layer's f + b + w
  std::map<std::tuple<int, int, int, int>, std::vector<int>> peaks_;  // peak_live's answers
  std::map<int, std::vector<int>> chunk_layers_;
};

}  // namespace meshrun::planner::detail
