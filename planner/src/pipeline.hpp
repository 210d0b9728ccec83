// The pipeline part of the cost model: mesh's schedule generator and simulator, cached. Internal to the
// planner (docs/planner.md, "Pipeline bubble").
#pragma once
#include <map>
#include <set>
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

// Simulations cached by (schedule, pp, V, m) and costs relative to one layer's f + b + w, rounded to
// 1/kCostSteps of it (the simulation runs on the rounded costs and is scaled back, so a cached result is
// exact for its key). Only the last table simulated is kept (the search simulates one spec with several
// costs in a row; a table of 65,536 slots is megabytes), each spec's table validated once.
//
// Live slots need no table: they follow from each rank's order alone (a rank runs one action at a time,
// the simulator counts a slot from its F until its W or BW), and each generator's order gives them in
// closed form (peak_live). tests/planner/test_pipeline.cpp compares it with the simulated tables.
// Bubbles are always simulated on the table of m itself. Not thread-safe: one per CostModel. The table of
// m is as large as the step (m × pp·V slots): the planner's callers simulate only pp > 1 within
// kMaxScheduleSlots slots (schedule_within_bound(), cost.hpp), the bound of `meshrun plan --schedule`.
class PipelineSims {
 public:
  static constexpr double kCostSteps = 256;
  explicit PipelineSims(int layers) : layers_(layers) {}
  // Peak live activation slots of pipeline rank `rank` (0 ≤ rank < pp) for a spec mesh's rule accepts.
  static int peak_live(PipelineSchedule kind, int pp, int v, int m, int rank);
  std::vector<int> peak_live(PipelineSchedule kind, int pp, int v, int m) const;
  PipelineRun run(PipelineSchedule kind, int pp, int v, int m, const PipelineCosts& costs);
  // A lower bound of run(...).min_idle without simulating, on the same rounded costs: rank r cannot start
  // before micro-batch 0 has passed chunks 0..r−1 and, with fused backwards, cannot finish before its last
  // backward has gone back through them, so the makespan is at least r's compute plus those two chains.
  double idle_lower_bound(PipelineSchedule kind, int pp, int v, int m, const PipelineCosts& costs);
  // The live slots of the simulated table, cached (the reference the tests and the exhaustive search
  // compare peak_live with).
  const std::vector<int>& peak_live_simulated(PipelineSchedule kind, int pp, int v, int m);
  // Per rank, the backward buffers of a split schedule (one per B whose W has not run yet, each chunk
  // keeping its most), read off the generated table and cached: meshrun-train's Stage allocates them so.
  const std::vector<int>& backward_buffers(PipelineSchedule kind, int pp, int v, int m);
  // Per rank, the activation slots meshrun-train's stages allocate for the table (trainer/src/parallel/stage.cpp):
  // each chunk its own pool, a slot taken at the micro-batch's first use on the chunk (its receive or F), given
  // back once its W (or BW) has run and its input gradient has gone to the previous chunk (not on chunk 0),
  // and reused only from where its sends are known received (sends_known_received). Summed over a rank's
  // chunks, this can exceed the simultaneous peak (peak_live); the V schedules' memory uses it.
  const std::vector<int>& activation_slots(PipelineSchedule kind, int pp, int v, int m);
  // Whether the schedule's table has W apart from B (zb, zbv, dualpipev), so b and w cost apart.
  static bool splits_backward(PipelineSchedule kind);
  int simulations() const { return simulations_; }
  int tables() const { return tables_; }

 private:
  // Costs in steps of 1/kCostSteps of one layer's f + b + w, as the cache key holds them.
  struct Relative {
    long long f, b, w, head_f, head_b, head_w, transfer;
  };
  Relative relative(PipelineSchedule kind, const PipelineCosts& c) const;
  PipelineRun simulate(PipelineSchedule kind, int pp, int v, int m, const Relative& r);  // relative units
  const std::vector<int>& layers_of(int chunks);  // mesh's chunk_layers, cached

  int layers_;
  int simulations_ = 0, tables_ = 0;
  // The last table simulated: the search asks for one (schedule, pp, V, m) with several costs in a row.
  std::tuple<int, int, int, int> table_key_{-1, 0, 0, 0};
  ScheduleTable table_;
  std::set<std::tuple<int, int, int, int>> validated_;  // specs whose table passed validate_schedule
  std::map<std::vector<long long>, PipelineRun> runs_;  // relative to one layer's f + b + w
  std::map<int, std::vector<int>> chunk_layers_;
  std::map<std::tuple<int, int, int, int>, std::vector<int>> simulated_live_, backward_buffers_, activation_slots_;
};

}  // namespace meshrun::planner::detail
