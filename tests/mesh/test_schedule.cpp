// Pipeline schedules as data: every generated table is valid and complete, the simulator reproduces the
// textbook bubbles and memory, and the validator rejects broken tables with a message naming the action.
#include <algorithm>
#include <catch2/catch.hpp>
#include <map>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "meshrun/schedule.hpp"

using namespace meshrun;

namespace {

constexpr PipelineSchedule kAll[] = {PipelineSchedule::gpipe,       PipelineSchedule::one_f_one_b,
                                     PipelineSchedule::interleaved, PipelineSchedule::zero_bubble,
                                     PipelineSchedule::zbv,         PipelineSchedule::dualpipev};
bool v_shaped(PipelineSchedule k) { return chunk_placement(k) == ChunkPlacement::v; }

// Every spec of the range that the rule accepts: pp 1..8, m pp..4·pp, V in {1, 2, 4}.
std::vector<ScheduleSpec> valid_specs() {
  std::vector<ScheduleSpec> out;
  for (auto kind : kAll)
    for (int pp = 1; pp <= 8; ++pp)
      for (int m = pp; m <= 4 * pp; ++m)
        for (int v : {1, 2, 4}) {
          ScheduleSpec spec{kind, pp, v, m};
          if (check_schedule_spec(spec).empty()) out.push_back(spec);
        }
  return out;
}

std::string describe(const ScheduleSpec& s) {
  return std::string(pipeline_schedule_name(s.kind)) + " pp=" + std::to_string(s.pp) + " V=" +
         std::to_string(s.virtual_stages) + " m=" + std::to_string(s.microbatches);
}

bool has_problem(const std::vector<std::string>& problems, const std::string& text) {
  for (const auto& p : problems)
    if (p.find(text) != std::string::npos) return true;
  return false;
}

// Position of the first action equal to `a` on rank r.
size_t find_action(const ScheduleTable& t, int r, const Action& a) {
  auto& list = t.ranks[r];
  return size_t(std::find(list.begin(), list.end(), a) - list.begin());
}

// Per ordered pair of ranks (from, to): the tensors from's sends to `to` name, in from's order, and the
// tensors to's receives from `from` name, in to's order, as (gradient?, micro-batch, producing chunk).
using Message = std::tuple<bool, int, int>;
using PeerOrder = std::map<std::pair<int, int>, std::vector<Message>>;
std::pair<PeerOrder, PeerOrder> peer_order(const ScheduleTable& t) {
  PeerOrder sent, received;
  for (int r = 0; r < int(t.ranks.size()); ++r)
    for (const Action& a : t.ranks[r]) {
      const bool grad = a.kind == ActionKind::send_grad || a.kind == ActionKind::recv_grad;
      if (a.kind == ActionKind::send_act || a.kind == ActionKind::send_grad)
        sent[{r, a.peer}].emplace_back(grad, a.microbatch, a.chunk);
      if (a.kind == ActionKind::recv_act || a.kind == ActionKind::recv_grad)
        received[{a.peer, r}].emplace_back(grad, a.microbatch, a.chunk);
    }
  return {sent, received};
}

// Unit costs of the textbook formulas: F = B = W = 1 per chunk, so a fused BW costs 2; free transfers.
ScheduleCosts unit_costs() { return ScheduleCosts{}; }

}  // namespace

TEST_CASE("schedule names round-trip", "[schedule]") {
  for (auto kind : kAll) REQUIRE(parse_pipeline_schedule(pipeline_schedule_name(kind)) == kind);
  REQUIRE(pipeline_schedule_name(PipelineSchedule::one_f_one_b) == std::string("1f1b"));
  REQUIRE(pipeline_schedule_name(PipelineSchedule::zero_bubble) == std::string("zb"));
  REQUIRE_FALSE(parse_pipeline_schedule("1F1B"));
  REQUIRE(action_text({ActionKind::F, 3, 1, -1}) == "F(mb=3, chunk=1)");
  REQUIRE(action_text({ActionKind::send_act, 3, 1, 2}) == "send_act(mb=3, chunk=1 -> rank 2)");
  REQUIRE(action_text({ActionKind::recv_grad, 0, 2, 1}) == "recv_grad(mb=0, chunk=2 <- rank 1)");
}

TEST_CASE("the spec rule: virtual stages go with interleaved only", "[schedule]") {
  using PS = PipelineSchedule;
  REQUIRE(check_schedule_spec({PS::one_f_one_b, 4, 1, 8}).empty());
  REQUIRE(check_schedule_spec({PS::interleaved, 4, 2, 8}).empty());
  REQUIRE(check_schedule_spec({PS::gpipe, 1, 1, 1}).empty());
  auto fails = [](ScheduleSpec spec, const std::string& text) {
    std::string why = check_schedule_spec(spec);
    INFO(why);
    REQUIRE(why.find(text) != std::string::npos);
    REQUIRE(why.find("; ") != std::string::npos);  // problem; fix
    REQUIRE(why.find('\n') == std::string::npos);
    REQUIRE_THROWS_AS(generate_schedule(spec), std::invalid_argument);
  };
  fails({PS::one_f_one_b, 4, 2, 8}, "virtual_stages=2 needs pipeline_schedule = \"interleaved\"");
  fails({PS::zero_bubble, 4, 2, 8}, "set parallel.pipeline_schedule = \"interleaved\" or virtual_stages = 1");
  fails({PS::gpipe, 4, 4, 8}, "\"gpipe\" runs one chunk per pipeline rank");
  fails({PS::interleaved, 4, 1, 8}, "needs parallel.virtual_stages ≥ 2");
  fails({PS::interleaved, 1, 2, 8}, "needs a pipeline (pp > 1)");
  fails({PS::interleaved, 4, 2, 6}, "micro-batches per step (6) to be a multiple of pp=4");
  fails({PS::one_f_one_b, 4, 1, 3}, "only 3 micro-batches per step for pp=4");
  fails({PS::zero_bubble, 2, 1, 0}, "at least one micro-batch");
  // V schedules: two chunks per rank always (resolve_layout turns virtual_stages = 1 into 2), a pipeline,
  // and DualPipeV's 2·pp micro-batches.
  REQUIRE(check_schedule_spec({PS::zbv, 4, 2, 4}).empty());
  REQUIRE(check_schedule_spec({PS::dualpipev, 4, 2, 8}).empty());
  REQUIRE(scheduled_virtual_stages(PS::zbv, 1) == 2);
  REQUIRE(scheduled_virtual_stages(PS::dualpipev, 2) == 2);
  REQUIRE(scheduled_virtual_stages(PS::dualpipev, 3) == 3);  // refused below, not silently changed
  REQUIRE(scheduled_virtual_stages(PS::interleaved, 1) == 1);
  REQUIRE(min_microbatches(PS::dualpipev, 4) == 8);
  REQUIRE(min_microbatches(PS::zbv, 4) == 4);
  REQUIRE(min_microbatches(PS::dualpipev, 1) == 1);
  fails({PS::zbv, 4, 3, 8}, "runs exactly two chunks per pipeline rank in a V; set parallel.virtual_stages = 1 or 2");
  fails({PS::dualpipev, 4, 1, 8}, "virtual_stages=1 does not go with pipeline_schedule = \"dualpipev\"");
  fails({PS::zbv, 1, 2, 4}, "\"zbv\" needs a pipeline (pp > 1)");
  fails({PS::dualpipev, 4, 2, 7}, "only 7 micro-batches per step for pipeline_schedule = \"dualpipev\" at pp=4, "
                                  "which needs at least 2·pp = 8");
  fails({PS::dualpipev, 4, 2, 2}, "needs at least 2·pp = 8");
  fails({PS::zbv, 4, 2, 3}, "only 3 micro-batches per step for pp=4");
}

TEST_CASE("V placement: rank r holds chunks r and 2pp-1-r, the embedding and the head on rank 0", "[schedule]") {
  for (int pp = 2; pp <= 8; ++pp)
    for (int c = 0; c < 2 * pp; ++c) {
      INFO("pp=" << pp << " chunk " << c);
      REQUIRE(chunk_rank(c, pp, ChunkPlacement::v) == (c < pp ? c : 2 * pp - 1 - c));
      REQUIRE(chunk_rank(c, pp, ChunkPlacement::looped) == c % pp);
      REQUIRE(chunk_virtual_stage(c, pp) == c / pp);
    }
  REQUIRE(chunk_placement(PipelineSchedule::zbv) == ChunkPlacement::v);
  REQUIRE(chunk_placement(PipelineSchedule::dualpipev) == ChunkPlacement::v);
  for (auto k : {PipelineSchedule::gpipe, PipelineSchedule::one_f_one_b, PipelineSchedule::interleaved,
                 PipelineSchedule::zero_bubble})
    REQUIRE(chunk_placement(k) == ChunkPlacement::looped);
  // The turn of the V (chunks pp−1 and pp on rank pp−1) hands over in memory: no transfer names it.
  for (auto k : {PipelineSchedule::zbv, PipelineSchedule::dualpipev}) {
    const int pp = 4;
    ScheduleTable t = generate_schedule({k, pp, 2, 8});
    for (int r = 0; r < pp; ++r)
      for (const Action& a : t.ranks[r]) {
        if (a.kind == ActionKind::send_act || a.kind == ActionKind::recv_act) REQUIRE(a.chunk != pp - 1);
        if (a.kind == ActionKind::send_grad || a.kind == ActionKind::recv_grad) REQUIRE(a.chunk != pp);
        if (a.kind == ActionKind::F) REQUIRE(r == (a.chunk < pp ? a.chunk : 2 * pp - 1 - a.chunk));
      }
  }
}

TEST_CASE("ZBV and DualPipeV idle half of ZB-H1 (Qi et al. 2024; DeepSeek-V3)", "[schedule]") {
  // Per chunk F = B = W = 1, fused BW = 2, transfers free. A V chunk is half a stage, so ZB-H1's stage of
  // F = B = W = 2 is the comparison: ZB-H1 idles (p−1)(F+B−W) = 2(p−1) per rank; ZBV and DualPipeV idle
  // only the ramp of p−1 chunk forwards, half of it. Memory: ZBV holds 2p chunk slots on every rank
  // (1F1B's p stages, the paper's claim); DualPipeV one more (DeepSeek's PP+1 stage activations, halved).
  for (int p = 2; p <= 8; ++p)
    for (int m = 2 * p; m <= 4 * p; ++m) {
      INFO("pp=" << p << " m=" << m);
      ScheduleCosts stage;
      stage.f = stage.b = stage.w = {2.0};
      Timeline zb = simulate_schedule(generate_schedule({PipelineSchedule::zero_bubble, p, 1, m}), stage);
      Timeline zbv = simulate_schedule(generate_schedule({PipelineSchedule::zbv, p, 2, m}), unit_costs());
      Timeline dpv = simulate_schedule(generate_schedule({PipelineSchedule::dualpipev, p, 2, m}), unit_costs());
      for (int r = 0; r < p; ++r) {
        REQUIRE(zb.idle[r] == Approx(2.0 * (p - 1)));
        REQUIRE(zbv.idle[r] == Approx(p - 1.0));
        REQUIRE(dpv.idle[r] == Approx(p - 1.0));
        REQUIRE(zbv.peak_live_per_rank[r] == 2 * p);
        REQUIRE(dpv.peak_live_per_rank[r] == 2 * p + 1);
      }
      REQUIRE(zbv.makespan == Approx(6.0 * m + p - 1));
      REQUIRE(dpv.makespan == Approx(6.0 * m + p - 1));
    }
  // Below 2p − 1 micro-batches ZBV still runs (PyTorch drops the padded ones) with a longer ramp.
  Timeline short_step = simulate_schedule(generate_schedule({PipelineSchedule::zbv, 4, 2, 4}), unit_costs());
  REQUIRE(short_step.makespan > 6.0 * 4 + 3);
}

TEST_CASE("every generated table is valid, complete and ordered", "[schedule]") {
  auto specs = valid_specs();
  std::map<PipelineSchedule, int> covered;
  for (const auto& spec : specs) {
    INFO(describe(spec));
    ScheduleTable t = generate_schedule(spec);
    REQUIRE(int(t.ranks.size()) == spec.pp);
    auto problems = validate_schedule(t);
    INFO((problems.empty() ? "" : problems.front()));
    REQUIRE(problems.empty());
    ++covered[spec.kind];

    const int chunks = t.chunks(), m = spec.microbatches;
    std::vector<int> f(m * chunks, 0), b(m * chunks, 0), w(m * chunks, 0);
    for (int r = 0; r < spec.pp; ++r) {
      const auto& list = t.ranks[r];
      std::vector<int> last_b(chunks, -1), last_w(chunks, -1);
      for (size_t i = 0; i < list.size(); ++i) {
        const Action& a = list[i];
        const int at = a.microbatch * chunks + a.chunk;
        bool input_grad = a.kind == ActionKind::B || a.kind == ActionKind::BW;
        bool weight_grad = a.kind == ActionKind::W || a.kind == ActionKind::BW;
        if (a.kind == ActionKind::F) ++f[at];
        if (input_grad) {
          ++b[at];
          REQUIRE(a.microbatch > last_b[a.chunk]);  // B (or BW) ascending per chunk
          last_b[a.chunk] = a.microbatch;
        }
        if (weight_grad) {
          ++w[at];
          REQUIRE(a.microbatch > last_w[a.chunk]);  // W (or BW) ascending per chunk: the trainer's sum order
          last_w[a.chunk] = a.microbatch;
        }
        // Receives sit right before their consumer, sends right after their producer.
        if (a.kind == ActionKind::recv_act) {
          REQUIRE(i + 1 < list.size());
          REQUIRE(list[i + 1] == Action{ActionKind::F, a.microbatch, a.chunk + 1, -1});
        }
        if (a.kind == ActionKind::recv_grad) {
          REQUIRE(i + 1 < list.size());
          REQUIRE((list[i + 1].kind == ActionKind::B || list[i + 1].kind == ActionKind::BW));
          REQUIRE(list[i + 1].microbatch == a.microbatch);
          REQUIRE(list[i + 1].chunk == a.chunk - 1);
        }
        // (In a V a send may wait behind sends its receiver takes first: after its producer, not right after.)
        if (v_shaped(spec.kind)) continue;
        if (a.kind == ActionKind::send_act) REQUIRE((i > 0 && list[i - 1] == Action{ActionKind::F, a.microbatch, a.chunk, -1}));
        if (a.kind == ActionKind::send_grad) {
          REQUIRE(i > 0);
          REQUIRE((list[i - 1].kind == ActionKind::B || list[i - 1].kind == ActionKind::BW));
          REQUIRE(list[i - 1].microbatch == a.microbatch);
          REQUIRE(list[i - 1].chunk == a.chunk);
        }
      }
    }
    for (int i = 0; i < m * chunks; ++i) {
      REQUIRE(f[i] == 1);
      REQUIRE(b[i] == 1);  // BW counts as both B and W
      REQUIRE(w[i] == 1);
    }
    // Fused backward for gpipe, 1f1b and interleaved; split B/W for zb.
    bool split = std::any_of(t.ranks.begin(), t.ranks.end(), [](auto& l) {
      return std::any_of(l.begin(), l.end(), [](auto& a) { return a.kind == ActionKind::W; });
    });
    REQUIRE(split == (spec.kind == PipelineSchedule::zero_bubble || v_shaped(spec.kind)));
  }
  // The range is not vacuous: 8 pp values × (3·pp+1) m values for each V = 1 schedule, and V ∈ {2, 4} with
  // m ∈ {pp, 2pp, 3pp, 4pp} for interleaved on pp = 2..8.
  REQUIRE(covered[PipelineSchedule::gpipe] == 116);
  REQUIRE(covered[PipelineSchedule::one_f_one_b] == 116);
  REQUIRE(covered[PipelineSchedule::zero_bubble] == 116);
  REQUIRE(covered[PipelineSchedule::interleaved] == 7 * 4 * 2);
  // zbv on pp = 2..8 with V = 2 and every m from pp to 4pp; dualpipev from 2pp to 4pp.
  REQUIRE(covered[PipelineSchedule::zbv] == 112);
  REQUIRE(covered[PipelineSchedule::dualpipev] == 77);
}

TEST_CASE("every generated table pairs sends and receives per peer in order", "[schedule]") {
  // Transfers carry no tag: rank a's k-th send to b meets b's k-th receive from a. Checked here apart from
  // the validator, on the same grid (pp 1..8, V in {1, 2, 4}, m pp..4·pp) and a few long steps.
  auto specs = valid_specs();
  for (auto kind : kAll)
    for (int pp : {2, 3, 4, 8})
      for (int v : {1, 2, 4}) {
        ScheduleSpec spec{kind, pp, v, 16 * pp};
        if (check_schedule_spec(spec).empty()) specs.push_back(spec);
      }
  int pairs_with_both_kinds = 0;
  for (const auto& spec : specs) {
    INFO(describe(spec));
    ScheduleTable t = generate_schedule(spec);
    auto problems = validate_schedule(t);
    INFO((problems.empty() ? "" : problems.front()));
    REQUIRE(problems.empty());
    auto [sent, received] = peer_order(t);
    REQUIRE(sent.size() == received.size());
    for (const auto& [ranks, messages] : sent) {
      INFO("rank " << ranks.first << " -> rank " << ranks.second);
      REQUIRE(received.count(ranks) == 1);
      REQUIRE(messages == received.at(ranks));
      const bool acts = std::any_of(messages.begin(), messages.end(), [](auto& x) { return !std::get<0>(x); });
      const bool grads = std::any_of(messages.begin(), messages.end(), [](auto& x) { return std::get<0>(x); });
      pairs_with_both_kinds += acts && grads;
    }
  }
  // Not vacuous: interleaved pp = 2 sends activations and gradients over one pair (both ways).
  REQUIRE(pairs_with_both_kinds > 0);
}

TEST_CASE("unit-cost bubbles equal the textbook values", "[schedule]") {
  // Cost model: F = B = W = 1 per chunk (a fused BW costs 2), transfers free. GPipe and 1F1B then idle
  // (p−1)·(F+BW) = 3(p−1) per rank over a makespan of 3(m+p−1): bubble (p−1)/(m+p−1). Interleaved with the
  // same per-chunk costs: (p−1)·3 idle over 3(V·m+p−1).
  for (const auto& spec : valid_specs()) {
    if (spec.kind == PipelineSchedule::zero_bubble || v_shaped(spec.kind)) continue;  // split B/W: tested below
    INFO(describe(spec));
    const int p = spec.pp, m = spec.microbatches, v = spec.virtual_stages;
    Timeline tl = simulate_schedule(generate_schedule(spec), unit_costs());
    REQUIRE(tl.makespan == Approx(3.0 * (v * m + p - 1)));
    for (double idle : tl.idle) REQUIRE(idle == Approx(3.0 * (p - 1)).margin(1e-9));
    REQUIRE(tl.bubble_fraction == Approx(double(p - 1) / (v * m + p - 1)).margin(1e-12));
  }
}

TEST_CASE("peak live micro-batches: GPipe m, 1F1B p on stage 0", "[schedule]") {
  for (int p = 1; p <= 8; ++p)
    for (int m = p; m <= 4 * p; ++m) {
      INFO("pp=" << p << " m=" << m);
      Timeline g = simulate_schedule(generate_schedule({PipelineSchedule::gpipe, p, 1, m}), unit_costs());
      REQUIRE(g.peak_live_microbatches == m);
      for (int r = 0; r < p; ++r) REQUIRE(g.peak_live_per_rank[r] == m);
      Timeline o = simulate_schedule(generate_schedule({PipelineSchedule::one_f_one_b, p, 1, m}), unit_costs());
      REQUIRE(o.peak_live_microbatches == p);
      for (int r = 0; r < p; ++r) REQUIRE(o.peak_live_per_rank[r] == p - r);
      // ZB-H1: no rank holds more than 1F1B's peak p (later stages defer W and so hold more than their
      // 1F1B share p − r, as in Qi et al.), and each rank idles (p−1)(F+B−W) = p − 1.
      Timeline z = simulate_schedule(generate_schedule({PipelineSchedule::zero_bubble, p, 1, m}), unit_costs());
      REQUIRE(z.peak_live_microbatches == p);
      for (int r = 0; r < p; ++r) REQUIRE(z.peak_live_per_rank[r] <= o.peak_live_microbatches);
      REQUIRE(z.makespan == Approx(3.0 * m + p - 1));
      for (double idle : z.idle) REQUIRE(idle == Approx(p - 1.0).margin(1e-9));
    }
}

TEST_CASE("ZB-H1 idles a third of 1F1B at 1F1B's memory (Qi et al. 2023)", "[schedule]") {
  // Cost model: F = B = W = 1, fused BW = 2, transfers free; p = 4, m = 8. Qi et al.: each rank idles
  // (p−1)(F+B+W) = 9 in 1F1B and (p−1)(F+B−W) = 3 in ZB-H1.
  const int p = 4, m = 8;
  Timeline one = simulate_schedule(generate_schedule({PipelineSchedule::one_f_one_b, p, 1, m}), unit_costs());
  Timeline zb = simulate_schedule(generate_schedule({PipelineSchedule::zero_bubble, p, 1, m}), unit_costs());
  double idle_1f1b = 0, idle_zb = 0;
  for (int r = 0; r < p; ++r) idle_1f1b += one.idle[r], idle_zb += zb.idle[r];
  REQUIRE(idle_1f1b == Approx(4 * 9));
  REQUIRE(idle_zb <= idle_1f1b / 3 + 1e-9);
  for (int r = 0; r < p; ++r) REQUIRE(zb.idle[r] == Approx(3));
  REQUIRE(zb.peak_live_microbatches <= p);
  REQUIRE(zb.peak_live_microbatches <= one.peak_live_microbatches);
}

TEST_CASE("the simulator charges transfers on the critical path", "[schedule]") {
  // pp = 2, m = 2, GPipe, F = 1, BW = 2, transfer t: rank 1 runs F0 from 1 + t and its two BW end at 7 + t;
  // rank 0 gets the first gradient at 5 + 2t and ends its two BW at 9 + 2t (9 with free transfers).
  ScheduleCosts c;
  c.transfer = 0.5;
  Timeline tl = simulate_schedule(generate_schedule({PipelineSchedule::gpipe, 2, 1, 2}), c);
  REQUIRE(tl.makespan == Approx(10.0));
  REQUIRE(tl.idle[0] == Approx(10.0 - 6.0));
  REQUIRE(tl.idle[1] == Approx(10.0 - 6.0));
  REQUIRE(tl.bubble_fraction == Approx((4.0 + 4.0) / (2 * 10.0)));
  // Per-chunk costs: a slow last stage stretches the step.
  ScheduleCosts slow;
  slow.f = {1.0, 2.0};
  Timeline s = simulate_schedule(generate_schedule({PipelineSchedule::one_f_one_b, 2, 1, 2}), slow);
  REQUIRE(s.makespan > 3.0 * 3);
  ScheduleCosts wrong;
  wrong.f = {1.0, 1.0, 1.0};
  REQUIRE_THROWS_AS(simulate_schedule(generate_schedule({PipelineSchedule::one_f_one_b, 2, 1, 2}), wrong),
                    std::invalid_argument);
}

TEST_CASE("the validator rejects broken tables naming the action", "[schedule]") {
  ScheduleTable zb = generate_schedule({PipelineSchedule::zero_bubble, 4, 1, 8});
  ScheduleTable one = generate_schedule({PipelineSchedule::one_f_one_b, 2, 1, 2});
  auto erase = [](ScheduleTable& t, int r, const Action& a) {
    auto& l = t.ranks[r];
    auto it = std::find(l.begin(), l.end(), a);
    REQUIRE(it != l.end());
    l.erase(it);
  };

  SECTION("a transfer across the turn of a V") {
    ScheduleTable v = generate_schedule({PipelineSchedule::zbv, 2, 2, 4});
    v.ranks[1].push_back({ActionKind::send_act, 0, 1, 1});
    REQUIRE(has_problem(validate_schedule(v), "rank 1: send_act(mb=0, chunk=1 -> rank 1) is a transfer between "
                                              "chunks 1 and 2, which both live on rank 1 and hand over in memory"));
  }
  SECTION("a V table's action on a looped schedule's rank") {
    ScheduleTable v = generate_schedule({PipelineSchedule::dualpipev, 2, 2, 4});
    erase(v, 0, {ActionKind::F, 0, 3, -1});
    v.ranks[1].push_back({ActionKind::F, 0, 3, -1});  // chunk 3 = 2pp−1 lives on rank 0 in a V, not 3 mod 2
    REQUIRE(has_problem(validate_schedule(v), "rank 1: F(mb=0, chunk=3) is on the wrong rank: chunk 3 lives on rank 0"));
  }
  SECTION("a missing W") {
    erase(zb, 2, {ActionKind::W, 5, 2, -1});
    auto p = validate_schedule(zb);
    REQUIRE(has_problem(p, "rank 2: W(mb=5, chunk=2) is missing"));
    REQUIRE_THROWS_AS(simulate_schedule(zb, unit_costs()), std::invalid_argument);
  }
  SECTION("a send without its receive") {
    erase(zb, 2, {ActionKind::recv_act, 3, 1, 1});
    auto p = validate_schedule(zb);
    REQUIRE(has_problem(p, "rank 1: send_act(mb=3, chunk=1 -> rank 2) has no matching recv_act on rank 2"));
    REQUIRE(has_problem(p, "rank 2: F(mb=3, chunk=2) runs before recv_act(mb=3, chunk=1 <- rank 1)"));
  }
  SECTION("a receive without its send") {
    erase(one, 1, {ActionKind::send_grad, 1, 1, 0});
    REQUIRE(has_problem(validate_schedule(one), "rank 0: recv_grad(mb=1, chunk=1 <- rank 1) has no matching send_grad on rank 1"));
  }
  SECTION("a receive moved ahead of what its sender waits for deadlocks") {
    // Rank 0 waits for micro-batch 0's gradient before sending micro-batch 0's activation.
    Action recv{ActionKind::recv_grad, 0, 1, 1};
    erase(one, 0, recv);
    one.ranks[0].insert(one.ranks[0].begin(), recv);
    auto p = validate_schedule(one);
    INFO((p.empty() ? "" : p.front()));
    REQUIRE(has_problem(p, "rank 0: recv_grad(mb=0, chunk=1 <- rank 1) (action 0) deadlocks"));
    REQUIRE(has_problem(p, "rank 1: recv_act(mb=0, chunk=0 <- rank 0) (action 0) deadlocks"));
  }
  SECTION("two sends to one peer swapped") {
    // 1F1B, pp = 4, m = 8, rank 1: delaying send_act of micro-batch 2 to just before that of micro-batch 3
    // keeps the table valid (a send may be posted late); swapping the two then breaks only the per-peer
    // order, which no other check sees (each receive's tensor is still sent, after its producer).
    ScheduleTable t = generate_schedule({PipelineSchedule::one_f_one_b, 4, 1, 8});
    const Action s2{ActionKind::send_act, 2, 1, 2}, s3{ActionKind::send_act, 3, 1, 2};
    erase(t, 1, s2);
    auto& l = t.ranks[1];
    l.insert(l.begin() + find_action(t, 1, s3), s2);
    INFO((validate_schedule(t).empty() ? "" : validate_schedule(t).front()));
    REQUIRE(validate_schedule(t).empty());
    const size_t i2 = find_action(t, 1, s2), i3 = find_action(t, 1, s3);
    REQUIRE(i3 == i2 + 1);
    std::swap(l[i2], l[i3]);
    auto p = validate_schedule(t);
    const size_t recv2 = find_action(t, 2, {ActionKind::recv_act, 2, 1, 1});
    REQUIRE(p.size() == 1);
    REQUIRE(p[0] == "rank 1: send_act(mb=3, chunk=1 -> rank 2) (action " + std::to_string(i2) +
                        ") is message 2 to rank 2, but rank 2's message 2 from rank 1 is recv_act(mb=2, chunk=1 "
                        "<- rank 1) (action " + std::to_string(recv2) + "); transfers pair per peer in posting "
                        "order (no tags), so post rank 1's sends to rank 2 in the order rank 2 receives them");
    REQUIRE_THROWS_AS(simulate_schedule(t, unit_costs()), std::invalid_argument);
    auto [sent, received] = peer_order(t);  // the positive test's own comparison sees it too
    REQUIRE(sent.at({1, 2}) != received.at({1, 2}));
  }
  SECTION("an activation and a gradient on one pair received out of order") {
    // Interleaved pp = 2: rank 1 sends rank 0 activations and gradients. Rank 0 waiting for a gradient
    // before an activation sent earlier would, untagged, read the activation as the gradient (same size).
    ScheduleTable t = generate_schedule({PipelineSchedule::interleaved, 2, 2, 2});
    const Action grad{ActionKind::recv_grad, 0, 3, 1}, act{ActionKind::recv_act, 1, 1, 1};
    erase(t, 0, grad);
    auto& l = t.ranks[0];
    l.insert(l.begin() + find_action(t, 0, act), grad);
    auto p = validate_schedule(t);
    REQUIRE(p.size() == 1);
    REQUIRE(p[0] == "rank 1: send_act(mb=1, chunk=1 -> rank 0) (action " +
                        std::to_string(find_action(t, 1, {ActionKind::send_act, 1, 1, 0})) +
                        ") is message 1 to rank 0, but rank 0's message 1 from rank 1 is recv_grad(mb=0, chunk=3 "
                        "<- rank 1) (action " + std::to_string(find_action(t, 0, grad)) + "); transfers pair per "
                        "peer in posting order (no tags), so post rank 1's sends to rank 0 in the order rank 0 "
                        "receives them");
  }
  SECTION("a wrong peer") {
    auto& l = zb.ranks[1];
    auto it = std::find(l.begin(), l.end(), Action{ActionKind::send_act, 2, 1, 2});
    REQUIRE(it != l.end());
    it->peer = 3;
    REQUIRE(has_problem(validate_schedule(zb), "rank 1: send_act(mb=2, chunk=1 -> rank 3) names the wrong peer"));
  }
  SECTION("a W before its B") {
    auto& l = zb.ranks[3];
    size_t b = find_action(zb, 3, {ActionKind::B, 0, 3, -1}), w = find_action(zb, 3, {ActionKind::W, 0, 3, -1});
    REQUIRE(b < w);
    std::swap(l[b], l[w]);
    REQUIRE(has_problem(validate_schedule(zb), "rank 3: W(mb=0, chunk=3) runs before B(mb=0, chunk=3)"));
  }
  SECTION("an action on the wrong rank") {
    zb.ranks[0].push_back({ActionKind::F, 0, 1, -1});
    REQUIRE(has_problem(validate_schedule(zb), "rank 0: F(mb=0, chunk=1) is on the wrong rank"));
  }
  SECTION("a duplicated F and a fused BW beside its B") {
    one.ranks[1].push_back({ActionKind::F, 0, 1, -1});
    one.ranks[1].push_back({ActionKind::B, 0, 1, -1});
    auto p = validate_schedule(one);
    REQUIRE(has_problem(p, "rank 1: F(mb=0, chunk=1) runs 2 times"));
    REQUIRE(has_problem(p, "rank 1: BW(mb=0, chunk=1) is fused but B or W"));
  }
}
