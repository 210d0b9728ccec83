// Pipeline bubble and live activations from mesh's generator and simulator, cached (pipeline.hpp).
#include "pipeline.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "meshrun/layout.hpp"

namespace meshrun::planner::detail {

int PipelineSims::peak_live(PipelineSchedule kind, int pp, int v, int m, int rank) {
  // A slot opens at F and closes at W or BW, and a rank runs its list in order, so its peak is the largest
  // count of Fs not yet closed along its list. Each generator's order (mesh/src/schedule.cpp) in turn:
  switch (kind) {
    case PipelineSchedule::gpipe: return m;  // every F before the first BW
    case PipelineSchedule::one_f_one_b: {
      // warm-up min(pp − r − 1, m) Fs, then (F, BW) pairs: one more F opens before the first BW closes.
      const int warmup = std::min(pp - rank - 1, m);
      return warmup < m ? warmup + 1 : m;
    }
    case PipelineSchedule::interleaved: {
      // the same with m·V chunk-micro-batches and Megatron's warm-up 2·(pp − r − 1) + (V − 1)·pp.
      const int64_t total = int64_t(m) * v, warmup = std::min<int64_t>(total, 2 * (pp - rank - 1) + int64_t(v - 1) * pp);
      return int(warmup < total ? warmup + 1 : total);
    }
    case PipelineSchedule::zero_bubble:
      // pp − r − 1 Fs, r (F, B) pairs and the first triple's F all come before the first W: min(pp, m) open;
      // then each (F, B, W) opens one and closes one, and the cool-down only closes.
      return std::min(pp, m);
    case PipelineSchedule::zbv:
      // 2(pp − r) − 1 + 2r forwards and the first (F, B, W) triple's F come before the first W: 2pp open,
      // and every later F follows a W. Below 2pp − 1 micro-batches the dropped ones leave m + r + 1 open
      // (tests/planner/test_pipeline.cpp checks both against the tables).
      return std::min(2 * pp, m + rank + 1);
    case PipelineSchedule::dualpipev:
      // steps 1–2 open 2pp, step 3's (B, W, F) closes one and opens one, and step 4 (m ≥ 2pp gives it at
      // least one round) opens its F c0 before its BW c1 closes: 2pp + 1 on every rank.
      return 2 * pp + 1;
  }
  throw std::invalid_argument("pipeline: unknown schedule");
}

std::vector<int> PipelineSims::peak_live(PipelineSchedule kind, int pp, int v, int m) const {
  std::vector<int> out(pp);
  for (int r = 0; r < pp; ++r) out[r] = peak_live(kind, pp, v, m, r);
  return out;
}

const std::vector<int>& PipelineSims::peak_live_simulated(PipelineSchedule kind, int pp, int v, int m) {
  auto& out = simulated_live_[{int(kind), pp, v, m}];
  if (out.empty()) out = simulate_schedule(generate_schedule({kind, pp, v, m}), ScheduleCosts{}).peak_live_per_rank;
  return out;
}

PipelineSims::Relative PipelineSims::relative(PipelineSchedule kind, const PipelineCosts& c) const {
  const double unit = c.f + c.b + c.w;
  if (!(unit > 0)) throw std::invalid_argument("pipeline: a layer must cost time");
  auto q = [&](double x) { return std::llround(x / unit * kCostSteps); };
  // Fused schedules see only b + w, so their key ignores the split (more hits).
  if (!splits_backward(kind))
    return {q(c.f), q(c.b + c.w), 0, q(c.head_f), q(c.head_b + c.head_w), 0, q(c.transfer)};
  return {q(c.f), q(c.b), q(c.w), q(c.head_f), q(c.head_b), q(c.head_w), q(c.transfer)};
}

PipelineRun PipelineSims::simulate(PipelineSchedule kind, int pp, int v, int m, const Relative& r) {
  std::vector<long long> key = {int(kind), pp, v, m, r.f, r.b, r.w, r.head_f, r.head_b, r.head_w, r.transfer};
  auto it = runs_.find(key);
  if (it != runs_.end()) return it->second;
  const std::tuple<int, int, int, int> table_key{int(kind), pp, v, m};
  if (table_key != table_key_) {
    table_key_ = {-1, 0, 0, 0};
    table_ = generate_schedule({kind, pp, v, m});  // throws on a spec the mesh rule refuses
    ++tables_;
    if (validated_.insert(table_key).second)  // each spec once; a regenerated table is the same table
      if (auto problems = validate_schedule(table_); !problems.empty())
        throw std::invalid_argument("pipeline: mesh's generator wrote an invalid table: " + problems.front());
    table_key_ = table_key;
  }
  const std::vector<int>& chunk_layers = layers_of(pp * v);
  const int chunks = pp * v;
  auto rel = [](long long steps) { return double(steps) / kCostSteps; };
  ScheduleCosts sc;
  sc.f.resize(chunks), sc.b.resize(chunks), sc.w.resize(chunks);
  for (int ch = 0; ch < chunks; ++ch) {
    const bool head = ch == chunks - 1;
    sc.f[ch] = chunk_layers[ch] * rel(r.f) + (head ? rel(r.head_f) : 0);
    sc.b[ch] = chunk_layers[ch] * rel(r.b) + (head ? rel(r.head_b) : 0);
    sc.w[ch] = chunk_layers[ch] * rel(r.w) + (head ? rel(r.head_w) : 0);
  }
  sc.transfer = rel(r.transfer);
  const ScheduleMakespan tl = simulate_validated_makespan(table_, sc);  // validated above
  ++simulations_;
  double min_idle = tl.idle.empty() ? 0 : tl.idle[0];
  for (double idle : tl.idle) min_idle = std::min(min_idle, idle);
  return runs_.emplace(std::move(key), PipelineRun{tl.makespan, min_idle}).first->second;
}

bool PipelineSims::splits_backward(PipelineSchedule kind) {
  return kind == PipelineSchedule::zero_bubble || kind == PipelineSchedule::zbv || kind == PipelineSchedule::dualpipev;
}

const std::vector<int>& PipelineSims::backward_buffers(PipelineSchedule kind, int pp, int v, int m) {
  auto& out = backward_buffers_[{int(kind), pp, v, m}];
  if (!out.empty()) return out;
  // Walk each rank's list: a split B takes a buffer of its chunk until the chunk's W of that micro-batch
  // (Stage::backward_input), which the chunk keeps for reuse; a chunk owns the most it ever held at once.
  const ScheduleTable t = generate_schedule({kind, pp, v, m});
  out.assign(pp, 0);
  std::vector<int> held(t.chunks(), 0), most(t.chunks(), 0);
  for (int r = 0; r < pp; ++r)
    for (const Action& a : t.ranks[r]) {
      if (a.kind == ActionKind::B) most[a.chunk] = std::max(most[a.chunk], ++held[a.chunk]);
      if (a.kind == ActionKind::W) --held[a.chunk];
    }
  for (int c = 0; c < t.chunks(); ++c) out[t.spec.rank_of(c)] += most[c];
  return out;
}

const std::vector<int>& PipelineSims::activation_slots(PipelineSchedule kind, int pp, int v, int m) {
  auto& out = activation_slots_[{int(kind), pp, v, m}];
  if (!out.empty()) return out;
  const ScheduleTable t = generate_schedule({kind, pp, v, m});
  const std::vector<std::vector<int>> known = sends_known_received(t);
  const int chunks = t.chunks(), last = chunks - 1;
  out.assign(pp, 0);
  for (int r = 0; r < pp; ++r) {
    struct Slot {
      int mb = -1, reusable_from = 0;
      bool weights = false, handed = false;
    };
    std::vector<std::vector<Slot>> pool(chunks);
    auto find = [&](int c, int mb) -> Slot* {
      for (Slot& s : pool[c])
        if (s.mb == mb) return &s;
      return nullptr;
    };
    auto take = [&](int c, int mb, int i) -> Slot& {
      if (Slot* s = find(c, mb)) return *s;
      for (Slot& s : pool[c])
        if (s.mb < 0 && s.reusable_from <= i) return s = Slot{mb, s.reusable_from};
      pool[c].push_back(Slot{mb, 0});
      return pool[c].back();
    };
    auto release = [&](int c, Slot& s) {
      if (s.weights && (c == 0 || s.handed)) s.mb = -1, s.weights = s.handed = false;
    };
    const auto& list = t.ranks[r];
    for (int i = 0; i < int(list.size()); ++i) {
      const Action& a = list[i];
      switch (a.kind) {
        case ActionKind::recv_act: take(a.chunk + 1, a.microbatch, i); break;
        case ActionKind::recv_grad: break;  // into the consumer's live slot
        case ActionKind::F: take(a.chunk, a.microbatch, i); break;
        case ActionKind::B:
        case ActionKind::BW: {
          if (a.chunk < last && t.spec.rank_of(a.chunk + 1) == r)  // the V's turn: the gradient handed over here
            if (Slot* s = find(a.chunk + 1, a.microbatch)) s->handed = true, release(a.chunk + 1, *s);
          Slot& s = *find(a.chunk, a.microbatch);
          if (a.kind == ActionKind::BW) s.weights = true, release(a.chunk, s);
          break;
        }
        case ActionKind::W: {
          Slot& s = *find(a.chunk, a.microbatch);
          s.weights = true, release(a.chunk, s);
          break;
        }
        case ActionKind::send_act:
        case ActionKind::send_grad: {
          Slot& s = *find(a.chunk, a.microbatch);
          s.reusable_from = std::max(s.reusable_from, known[r][i]);
          if (a.kind == ActionKind::send_grad) s.handed = true, release(a.chunk, s);
          break;
        }
      }
    }
    for (int c = 0; c < chunks; ++c)
      if (t.spec.rank_of(c) == r) out[r] += int(pool[c].size());
  }
  return out;
}

const std::vector<int>& PipelineSims::layers_of(int chunks) {
  auto& out = chunk_layers_[chunks];
  if (out.empty()) {
    auto layers = chunk_layers(layers_, chunks);
    if (!layers) throw std::invalid_argument("pipeline: " + std::to_string(layers_) + " layers do not split over " +
                                             std::to_string(chunks) + " chunks");
    out = *layers;
  }
  return out;
}

double PipelineSims::idle_lower_bound(PipelineSchedule kind, int pp, int v, int m, const PipelineCosts& costs) {
  const Relative q = relative(kind, costs);
  const std::vector<int>& layers = layers_of(pp * v);
  const int chunks = pp * v;
  auto rel = [](long long steps) { return double(steps) / kCostSteps; };
  auto cost = [&](int c, long long per_layer, long long head) {
    return layers[c] * rel(per_layer) + (c == chunks - 1 ? rel(head) : 0);
  };
  const bool fused = !splits_backward(kind);
  std::vector<double> busy(pp, 0.0);
  for (int c = 0; c < chunks; ++c)
    busy[chunk_rank(c, pp, chunk_placement(kind))] += m * (cost(c, q.f, q.head_f) + cost(c, q.b, q.head_b) + cost(c, q.w, q.head_w));
  double busiest = 0, bound = 0, before = 0;  // before: the chains through chunks 0..r−1
  for (int r = 0; r < pp; ++r) {
    busiest = std::max(busiest, busy[r]);
    bound = std::max(bound, busy[r] + before);
    before += cost(r, q.f, q.head_f) + rel(q.transfer);
    if (fused) before += cost(r, q.b, q.head_b) + cost(r, q.w, q.head_w) + rel(q.transfer);
  }
  // The simulation adds the same numbers in another order: give up a hair so the bound stays below it.
  return std::max(0.0, (bound - busiest) * (1 - 1e-9)) * (costs.f + costs.b + costs.w);
}

PipelineRun PipelineSims::run(PipelineSchedule kind, int pp, int v, int m, const PipelineCosts& costs) {
  const double unit = costs.f + costs.b + costs.w;
  PipelineRun r = simulate(kind, pp, v, m, relative(kind, costs));
  r.makespan *= unit;
  r.min_idle *= unit;
  return r;
}

}  // namespace meshrun::planner::detail
