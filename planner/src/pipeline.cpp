// Pipeline bubble and live activations from mesh's generator and simulator, cached (pipeline.hpp).
#include "pipeline.hpp"

#include <cmath>
#include <stdexcept>

#include "meshrun/layout.hpp"

namespace meshrun::planner::detail {

PipelineSims::Table& PipelineSims::table(PipelineSchedule kind, int pp, int v, int m) {
  auto& slot = tables_[{int(kind), pp, v, m}];
  if (!slot) {
    auto t = std::make_unique<Table>();
    t->table = generate_schedule({kind, pp, v, m});  // throws on a spec the mesh rule refuses
    t->chunk_layers = layers_of(pp * v);
    t->peak_live = simulate_schedule(t->table, ScheduleCosts{}).peak_live_per_rank;  // validates it, once
    slot = std::move(t);
  }
  return *slot;
}

std::vector<int> PipelineSims::samples(int pp, int v, int m) {
  // The generators' orders repeat every micro-batch with one chunk per rank and every group of pp
  // micro-batches when interleaved; the samples lie past warm-up and before cool-down.
  const int period = v == 1 ? 1 : pp, first = v == 1 ? 2 * pp : 3 * pp;
  if (m <= first + 2 * period) return {};
  return {first, first + period, first + 2 * period};  // m − first is whole periods (interleaved: m % pp = 0)
}

const std::vector<int>& PipelineSims::peak_live(PipelineSchedule kind, int pp, int v, int m) {
  auto& out = peaks_[{int(kind), pp, v, m}];
  if (!out.empty()) return out;
  const std::vector<int> at = samples(pp, v, m);
  if (at.empty()) return out = peak_live_exact(kind, pp, v, m);
  const std::vector<int> a = peak_live_exact(kind, pp, v, at[0]), b = peak_live_exact(kind, pp, v, at[1]),
                         c = peak_live_exact(kind, pp, v, at[2]);
  out.resize(a.size());
  for (size_t r = 0; r < a.size(); ++r) {
    if (c[r] - b[r] != b[r] - a[r]) return ++not_periodic_, out = peak_live_exact(kind, pp, v, m);
    out[r] = c[r] + (c[r] - b[r]) * ((m - at[2]) / (at[2] - at[1]));
  }
  return out;
}

PipelineSims::Relative PipelineSims::relative(PipelineSchedule kind, const PipelineCosts& c) const {
  const double unit = c.f + c.b + c.w;
  if (!(unit > 0)) throw std::invalid_argument("pipeline: a layer must cost time");
  auto q = [&](double x) { return std::llround(x / unit * kCostSteps); };
  // Fused schedules see only b + w, so their key ignores the split (more hits).
  if (kind != PipelineSchedule::zero_bubble)
    return {q(c.f), q(c.b + c.w), 0, q(c.head_f), q(c.head_b + c.head_w), 0, q(c.transfer)};
  return {q(c.f), q(c.b), q(c.w), q(c.head_f), q(c.head_b), q(c.head_w), q(c.transfer)};
}

PipelineRun PipelineSims::simulate(PipelineSchedule kind, int pp, int v, int m, const Relative& r) {
  std::vector<long long> key = {int(kind), pp, v, m, r.f, r.b, r.w, r.head_f, r.head_b, r.head_w, r.transfer};
  auto it = runs_.find(key);
  if (it != runs_.end()) return it->second;
  Table& t = table(kind, pp, v, m);
  const int chunks = pp * v;
  auto rel = [](long long steps) { return double(steps) / kCostSteps; };
  ScheduleCosts sc;
  sc.f.resize(chunks), sc.b.resize(chunks), sc.w.resize(chunks);
  for (int ch = 0; ch < chunks; ++ch) {
    const bool head = ch == chunks - 1;
    sc.f[ch] = t.chunk_layers[ch] * rel(r.f) + (head ? rel(r.head_f) : 0);
    sc.b[ch] = t.chunk_layers[ch] * rel(r.b) + (head ? rel(r.head_b) : 0);
    sc.w[ch] = t.chunk_layers[ch] * rel(r.w) + (head ? rel(r.head_w) : 0);
  }
  sc.transfer = rel(r.transfer);
  Timeline tl = simulate_validated_schedule(t.table, sc);  // table() validated it
  ++simulations_;
  double min_idle = tl.idle.empty() ? 0 : tl.idle[0];
  for (double idle : tl.idle) min_idle = std::min(min_idle, idle);
  return runs_.emplace(std::move(key), PipelineRun{tl.makespan, min_idle}).first->second;
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
  const bool fused = kind != PipelineSchedule::zero_bubble;
  std::vector<double> busy(pp, 0.0);
  for (int c = 0; c < chunks; ++c)
    busy[chunk_rank(c, pp)] += m * (cost(c, q.f, q.head_f) + cost(c, q.b, q.head_b) + cost(c, q.w, q.head_w));
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
