// The planner's pipeline simulations (planner/src/pipeline.hpp): the cache is exact for its key, and the
// closed-form live slots give what the simulated table gives.
#include <catch2/catch.hpp>

#include "pipeline.hpp"

using meshrun::PipelineSchedule;
using meshrun::planner::detail::PipelineCosts;
using meshrun::planner::detail::PipelineRun;
using meshrun::planner::detail::PipelineSims;


TEST_CASE("live slots in closed form equal the simulated tables", "[planner][pipeline]") {
  // Every spec mesh's rule accepts up to pp = 8, V = 4 and m = 6·pp (past warm-up and cool-down of every
  // rank), and pp = 1 for the schedules that allow it.
  int checked = 0;
  for (auto kind : {PipelineSchedule::gpipe, PipelineSchedule::one_f_one_b, PipelineSchedule::zero_bubble,
                    PipelineSchedule::interleaved, PipelineSchedule::zbv, PipelineSchedule::dualpipev})
    for (int pp = 1; pp <= 8; ++pp)
      for (int v = 1; v <= 4; ++v)
        for (int m = 1; m <= 6 * pp; ++m) {
          if (!meshrun::check_schedule_spec({kind, pp, v, m}).empty()) continue;
          INFO(meshrun::pipeline_schedule_name(kind) << " pp=" << pp << " V=" << v << " m=" << m);
          PipelineSims sims(pp * v);
          REQUIRE(sims.peak_live(kind, pp, v, m) == sims.peak_live_simulated(kind, pp, v, m));
          ++checked;
        }
  // pp = 1: m 1..6; pp ≥ 2: m pp..6·pp; interleaved: m a multiple of pp; zbv (V = 2, pp ≥ 2): m pp..6·pp;
  // dualpipev: m 2pp..6pp.
  REQUIRE(checked == 3 * (6 + 182) + 7 * 3 * 6 + 182 + 147);
  // Long steps the search meets (m up to kMaxScheduleSlots / (pp·V)): GPipe grows with m, the others not.
  PipelineSims sims(256);
  REQUIRE(sims.peak_live(PipelineSchedule::gpipe, 4, 1, 4096) == sims.peak_live_simulated(PipelineSchedule::gpipe, 4, 1, 4096));
  REQUIRE(sims.peak_live(PipelineSchedule::interleaved, 16, 8, 512) ==
          sims.peak_live_simulated(PipelineSchedule::interleaved, 16, 8, 512));
  REQUIRE(sims.peak_live(PipelineSchedule::zero_bubble, 64, 1, 1024) ==
          sims.peak_live_simulated(PipelineSchedule::zero_bubble, 64, 1, 1024));
  REQUIRE(sims.peak_live(PipelineSchedule::zbv, 64, 2, 512) == sims.peak_live_simulated(PipelineSchedule::zbv, 64, 2, 512));
  REQUIRE(sims.peak_live(PipelineSchedule::dualpipev, 32, 2, 1024) ==
          sims.peak_live_simulated(PipelineSchedule::dualpipev, 32, 2, 1024));
  REQUIRE(sims.tables() == 0);  // none of this simulated a bubble
}

TEST_CASE("simulations are cached by relative costs", "[planner][pipeline]") {
  PipelineSims sims(16);
  PipelineCosts c{1, 1.2, 0.8, 2, 2, 1, 0.1};
  PipelineRun a = sims.run(PipelineSchedule::one_f_one_b, 4, 1, 8, c);
  REQUIRE(sims.simulations() == 1);
  // Twice every cost: the same relative costs, so no new simulation and twice the times.
  PipelineCosts twice{2, 2.4, 1.6, 4, 4, 2, 0.2};
  PipelineRun b = sims.run(PipelineSchedule::one_f_one_b, 4, 1, 8, twice);
  REQUIRE(sims.simulations() == 1);
  REQUIRE(b.makespan == Approx(2 * a.makespan));
  REQUIRE(b.min_idle == Approx(2 * a.min_idle));
  // A fused schedule sees only b + w: moving weight between B and W is the same key.
  PipelineCosts moved{1, 1.5, 0.5, 2, 2.5, 0.5, 0.1};
  sims.run(PipelineSchedule::one_f_one_b, 4, 1, 8, moved);
  REQUIRE(sims.simulations() == 1);
  // zb runs B and W apart, so the split matters.
  sims.run(PipelineSchedule::zero_bubble, 4, 1, 8, c);
  sims.run(PipelineSchedule::zero_bubble, 4, 1, 8, moved);
  REQUIRE(sims.simulations() == 3);
  // With free transfers and equal stages, 1F1B's bubble is the textbook (p−1)(f+b+w) per rank: 8 layers on
  // 4 ranks, 2 per stage, f + b + w = 3 per layer.
  PipelineSims even(8);
  PipelineRun r = even.run(PipelineSchedule::one_f_one_b, 4, 1, 8, {1, 1, 1, 0, 0, 0, 0});
  REQUIRE(r.min_idle == Approx(3 * 2 * 3.0));
  REQUIRE(r.makespan == Approx((8 + 3) * 2 * 3.0));
  // Live slots: 1F1B p − r.
  REQUIRE(even.peak_live(PipelineSchedule::one_f_one_b, 4, 1, 8) == std::vector<int>{4, 3, 2, 1});
  REQUIRE(even.tables() == 1);
  REQUIRE_THROWS_AS(even.run(PipelineSchedule::one_f_one_b, 4, 2, 8, {1, 1, 1, 0, 0, 0, 0}), std::invalid_argument);
}

TEST_CASE("the idle lower bound never exceeds the simulated idle", "[planner][pipeline]") {
  // The search skips simulations whose bound already loses, so a bound above the simulation would drop a
  // setting wrongly. Cost sets: uniform, a heavy output head, costly hops, B and W unequal.
  const std::vector<PipelineCosts> costs = {
      {1, 1, 1, 0, 0, 0, 0}, {1, 1.2, 0.8, 2.5, 3, 2, 0.1}, {1, 1.5, 0.5, 0.3, 0.3, 0.3, 0.6}, {0.7, 2.1, 0.9, 1, 1, 1, 0.05}};
  int checked = 0;
  for (auto kind : {PipelineSchedule::gpipe, PipelineSchedule::one_f_one_b, PipelineSchedule::zero_bubble,
                    PipelineSchedule::interleaved, PipelineSchedule::zbv, PipelineSchedule::dualpipev})
    for (int pp : {2, 3, 4, 8})
      for (int v : kind == PipelineSchedule::interleaved                          ? std::vector<int>{2, 4}
                   : meshrun::chunk_placement(kind) == meshrun::ChunkPlacement::v ? std::vector<int>{2}
                                                                                  : std::vector<int>{1})
        for (int m = meshrun::min_microbatches(kind, pp); m <= 4 * pp; m += (kind == PipelineSchedule::interleaved ? pp : 1)) {
          PipelineSims sims(2 * pp * v - 2);  // two layers per chunk, one on the first and the last
          for (const PipelineCosts& c : costs) {
            INFO(meshrun::pipeline_schedule_name(kind) << " pp=" << pp << " V=" << v << " m=" << m);
            const double bound = sims.idle_lower_bound(kind, pp, v, m, c), idle = sims.run(kind, pp, v, m, c).min_idle;
            REQUIRE(bound >= 0);
            REQUIRE(bound <= idle);
            ++checked;
          }
        }
  REQUIRE(checked > 300);
  // Tight where the textbook holds: 1F1B with equal stages and free transfers idles (p−1)(f+b+w) per rank.
  PipelineSims even(8);
  REQUIRE(even.idle_lower_bound(PipelineSchedule::one_f_one_b, 4, 1, 8, {1, 1, 1, 0, 0, 0, 0}) ==
          Approx(3 * 2 * 3.0).epsilon(1e-6));
}

TEST_CASE("the planner's makespan-only simulation equals the full timeline's", "[planner][pipeline]") {
  // simulate_validated_makespan (what PipelineSims runs) shares simulate_validated_schedule's event loop and
  // drops only the per-action record: same makespan and idle per rank, bit for bit, with per-chunk costs.
  int checked = 0;
  for (auto kind : {PipelineSchedule::gpipe, PipelineSchedule::one_f_one_b, PipelineSchedule::zero_bubble,
                    PipelineSchedule::interleaved, PipelineSchedule::zbv, PipelineSchedule::dualpipev})
    for (int pp : {1, 2, 3, 5, 8})
      for (int v : {1, 2, 3})
        for (int m : {pp, 2 * pp + 1, 4 * pp}) {
          const meshrun::ScheduleSpec spec{kind, pp, v, m};
          if (!meshrun::check_schedule_spec(spec).empty()) continue;
          INFO(meshrun::pipeline_schedule_name(kind) << " pp=" << pp << " V=" << v << " m=" << m);
          const meshrun::ScheduleTable table = meshrun::generate_schedule(spec);
          meshrun::ScheduleCosts costs;
          costs.f.clear(), costs.b.clear(), costs.w.clear();
          for (int c = 0; c < pp * v; ++c) {
            costs.f.push_back(1.0 + 0.37 * (c % 3));
            costs.b.push_back(1.5 + 0.21 * (c % 5));
            costs.w.push_back(0.4 + 0.13 * (c % 2));
          }
          costs.transfer = 0.07;
          const meshrun::Timeline full = meshrun::simulate_schedule(table, costs);
          const meshrun::ScheduleMakespan fast = meshrun::simulate_validated_makespan(table, costs);
          REQUIRE(fast.makespan == full.makespan);
          REQUIRE(fast.idle == full.idle);
          ++checked;
        }
  REQUIRE(checked == 61 + 12 + 8);  // zbv: 4 pp × 3 m; dualpipev: m ≥ 2pp leaves 2 of the 3
}

TEST_CASE("backward buffers: one per B waiting for its W, the most each chunk held", "[planner][pipeline]") {
  PipelineSims sims(16);
  // ZB-H1 defers r + 1 on rank r (the planner's closed form for zb); 1F1B's fused BW takes none.
  for (int pp : {2, 4, 8}) {
    INFO("pp=" << pp);
    const auto& zb = sims.backward_buffers(PipelineSchedule::zero_bubble, pp, 1, 4 * pp);
    for (int r = 0; r < pp; ++r) REQUIRE(zb[r] == r + 1);
    for (int b : sims.backward_buffers(PipelineSchedule::one_f_one_b, pp, 1, 4 * pp)) REQUIRE(b == 0);
    // ZBV: chunk c0 defers r + 1 in the cool-down, c1 r (at least the one its immediate W frees).
    const auto& zbv = sims.backward_buffers(PipelineSchedule::zbv, pp, 2, 4 * pp);
    for (int r = 0; r < pp; ++r) REQUIRE(zbv[r] == r + 1 + std::max(r, 1));
    // DualPipeV splits only its ramps' backwards: some rank holds buffers, none more than ZBV's.
    const auto& dpv = sims.backward_buffers(PipelineSchedule::dualpipev, pp, 2, 4 * pp);
    int total = 0;
    for (int r = 0; r < pp; ++r) total += dpv[r];
    REQUIRE(total > 0);
  }
}
