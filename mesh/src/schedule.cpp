// Pipeline schedules as data: names, the spec rule, one generator per schedule, the validator and the
// event simulator (semantics in schedule.hpp).
#include "meshrun/schedule.hpp"

#include <algorithm>
#include <stdexcept>
#include <utility>

#include "meshrun/limits.hpp"

namespace meshrun {

ScheduleSize schedule_size(int64_t global_batch, int64_t micro_batch_size, int64_t dp, int64_t pp,
                           int64_t virtual_stages) {
  ScheduleSize z;
  const int64_t per_micro = limits::product({dp, micro_batch_size});
  z.microbatches = per_micro > 0 ? global_batch / per_micro : 0;
  z.chunks = limits::product({pp, virtual_stages});
  z.slots = limits::product({z.microbatches, z.chunks});
  return z;
}

std::string schedule_size_problem(int64_t global_batch, int64_t micro_batch_size, int64_t dp, int64_t pp,
                                  int64_t virtual_stages, std::string_view who) {
  const ScheduleSize z = schedule_size(global_batch, micro_batch_size, dp, pp, virtual_stages);
  if (z.fits()) return "";
  return "training.global_batch_size = " + std::to_string(global_batch) + " gives " + std::to_string(z.microbatches) +
         " micro-batches per step (÷ dp " + std::to_string(dp) + " × training.micro_batch_size " +
         std::to_string(micro_batch_size) + ") over " + std::to_string(z.chunks) + " pipeline chunk" +
         (z.chunks == 1 ? "" : "s") + ", " + std::to_string(z.slots) + " schedule slots; " + std::string(who) +
         " at most " + std::to_string(kMaxScheduleSlots) +
         ": lower training.global_batch_size or raise training.micro_batch_size";
}
namespace {

std::string s(int64_t v) { return std::to_string(v); }

bool is_compute(ActionKind k) {
  return k == ActionKind::F || k == ActionKind::B || k == ActionKind::W || k == ActionKind::BW;
}
bool is_send(ActionKind k) { return k == ActionKind::send_act || k == ActionKind::send_grad; }
bool is_recv(ActionKind k) { return k == ActionKind::recv_act || k == ActionKind::recv_grad; }
bool is_input_backward(ActionKind k) { return k == ActionKind::B || k == ActionKind::BW; }
bool frees_slot(ActionKind k) { return k == ActionKind::W || k == ActionKind::BW; }

// Index of a (micro-batch, chunk) pair in flat per-step arrays.
struct Grid {
  int m, chunks;
  int at(int mb, int chunk) const { return mb * chunks + chunk; }
  int size() const { return m * chunks; }
};

// Message key: a send and its receive share it ((activation or gradient, micro-batch, producing chunk)).
// Only the validator and the simulator use it; the runtime's transfers carry no tag.
int message_key(const Grid& g, const Action& a) {
  bool grad = a.kind == ActionKind::send_grad || a.kind == ActionKind::recv_grad;
  return (grad ? g.size() : 0) + g.at(a.microbatch, a.chunk);
}

Action compute(ActionKind k, int mb, int chunk) { return Action{k, mb, chunk, -1}; }

// Lowering: every rank's compute order, with each receive placed right before the action that consumes it
// and each send right after the action that produces it. Chunk 0's F reads data and the last chunk's B
// starts from the loss, so nothing crosses those ends; nor is anything sent between two chunks of one rank
// (a V's turn), which hand over in memory. Then per ordered pair of ranks the sends are put in the order
// the receiver takes them (transfers pair by that order alone): a send whose message the receiver wants
// later waits behind the ones it wants first. Delaying a non-blocking send past the sends its receiver
// needs earlier cannot block anyone, so a deadlock-free order stays deadlock-free.
ScheduleTable lower(const ScheduleSpec& spec, const std::vector<std::vector<Action>>& compute_order) {
  ScheduleTable t{spec, {}};
  const int last = t.chunks() - 1, pp = spec.pp;
  auto rank_of = [&spec](int c) { return spec.rank_of(c); };
  t.ranks.resize(pp);
  for (int r = 0; r < pp; ++r) {
    auto& out = t.ranks[r];
    out.reserve(3 * compute_order[r].size());  // each compute action with at most one receive and one send
    for (const Action& a : compute_order[r]) {
      const int mb = a.microbatch, c = a.chunk;
      const bool from_prev = c > 0 && rank_of(c - 1) != r, to_next = c < last && rank_of(c + 1) != r;
      if (a.kind == ActionKind::F && from_prev) out.push_back({ActionKind::recv_act, mb, c - 1, rank_of(c - 1)});
      if (is_input_backward(a.kind) && to_next) out.push_back({ActionKind::recv_grad, mb, c + 1, rank_of(c + 1)});
      out.push_back(a);
      if (a.kind == ActionKind::F && to_next) out.push_back({ActionKind::send_act, mb, c, rank_of(c + 1)});
      if (is_input_backward(a.kind) && from_prev) out.push_back({ActionKind::send_grad, mb, c, rank_of(c - 1)});
    }
  }
  // Per (receiver, sender): the receiver's receives in order, as messages (kind family, mb, chunk).
  const Grid g{spec.microbatches, t.chunks()};
  std::vector<std::vector<std::vector<int>>> wanted(pp, std::vector<std::vector<int>>(pp));
  for (int r = 0; r < pp; ++r)
    for (const Action& a : t.ranks[r])
      if (is_recv(a.kind)) wanted[a.peer][r].push_back(message_key(g, a));
  for (int r = 0; r < pp; ++r) {
    std::vector<Action> out;
    out.reserve(t.ranks[r].size());
    std::vector<size_t> next(pp, 0);                                // per receiver: its next wanted message
    std::vector<std::vector<std::pair<int, Action>>> ready(pp);     // produced, not yet posted
    for (const Action& a : t.ranks[r]) {
      if (!is_send(a.kind)) {
        out.push_back(a);
        continue;
      }
      auto& queue = ready[a.peer];
      queue.push_back({message_key(g, a), a});
      const auto& want = wanted[r][a.peer];
      for (bool posted = true; posted && next[a.peer] < want.size();) {
        posted = false;
        for (size_t i = 0; i < queue.size(); ++i)
          if (queue[i].first == want[next[a.peer]]) {
            out.push_back(queue[i].second);
            queue.erase(queue.begin() + long(i));
            ++next[a.peer], posted = true;
            break;
          }
      }
    }
    for (auto& queue : ready)  // a send nobody receives: left at the end for the validator to name
      for (auto& [key, a] : queue) out.push_back(a);
    t.ranks[r] = std::move(out);
  }
  return t;
}

// GPipe: all forwards, then all fused backwards, both in micro-batch order.
std::vector<std::vector<Action>> gpipe_order(const ScheduleSpec& spec) {
  std::vector<std::vector<Action>> order(spec.pp);
  for (int r = 0; r < spec.pp; ++r) {
    order[r].reserve(2 * size_t(spec.microbatches));
    for (int mb = 0; mb < spec.microbatches; ++mb) order[r].push_back(compute(ActionKind::F, mb, r));
    for (int mb = 0; mb < spec.microbatches; ++mb) order[r].push_back(compute(ActionKind::BW, mb, r));
  }
  return order;
}

// 1F1B (Megatron's forward_backward_pipelining_without_interleaving): rank i runs min(pp−i−1, m) warm-up
// forwards, then (F, BW) pairs, then the cool-down backwards.
std::vector<std::vector<Action>> one_f_one_b_order(const ScheduleSpec& spec) {
  const int pp = spec.pp, m = spec.microbatches;
  std::vector<std::vector<Action>> order(pp);
  for (int r = 0; r < pp; ++r) {
    order[r].reserve(2 * size_t(m));
    const int warmup = std::min(pp - r - 1, m);
    for (int mb = 0; mb < warmup; ++mb) order[r].push_back(compute(ActionKind::F, mb, r));
    for (int k = 0; k < m - warmup; ++k) {
      order[r].push_back(compute(ActionKind::F, warmup + k, r));
      order[r].push_back(compute(ActionKind::BW, k, r));
    }
    for (int mb = m - warmup; mb < m; ++mb) order[r].push_back(compute(ActionKind::BW, mb, r));
  }
  return order;
}

// Interleaved 1F1B, Megatron-LM's forward_backward_pipelining_with_interleaving (megatron/core/
// pipeline_parallel/schedules.py) with microbatch_group_size_per_vp_stage = pp: virtual micro-batch k runs
// micro-batch (k / (pp·V))·pp + k mod pp on virtual stage (k mod (pp·V)) / pp (counted from the last stage
// for backwards). Rank i's warm-up is 2·(pp−i−1) + (V−1)·pp forwards, all of them if that is more (current
// Megatron; older versions ran all forwards first whenever m = pp).
std::vector<std::vector<Action>> interleaved_order(const ScheduleSpec& spec) {
  const int pp = spec.pp, v = spec.virtual_stages, m = spec.microbatches, total = m * v;
  std::vector<std::vector<Action>> order(pp);
  for (int r = 0; r < pp; ++r) {
    order[r].reserve(2 * size_t(total));
    auto microbatch = [&](int k) { return (k / (pp * v)) * pp + k % pp; };
    auto chunk = [&](int k, bool forward) {
      int stage = (k % (pp * v)) / pp;
      return (forward ? stage : v - 1 - stage) * pp + r;
    };
    const int warmup = std::min(total, 2 * (pp - r - 1) + (v - 1) * pp);
    auto forward = [&](int k) { order[r].push_back(compute(ActionKind::F, microbatch(k), chunk(k, true))); };
    auto backward = [&](int k) { order[r].push_back(compute(ActionKind::BW, microbatch(k), chunk(k, false))); };
    for (int k = 0; k < warmup; ++k) forward(k);
    for (int k = 0; k < total - warmup; ++k) {
      forward(warmup + k);
      backward(k);
    }
    for (int k = total - warmup; k < total; ++k) backward(k);
  }
  return order;
}

// ZB-H1 (Qi et al. 2023, "Zero Bubble Pipeline Parallelism"; the order of the authors' reference
// schedule, sail-sg/zero-bubble-pipeline-parallelism): B and W split, W deferred into the cool-down. Rank i
// runs 1F1B's pp−i−1 warm-up forwards, then i (F, B) pairs that defer their W, then (F, B, W) triples,
// then (B, W) pairs, then the deferred Ws. At most pp activation slots are live on any rank, 1F1B's peak
// (on its stage 0). Each kind runs in micro-batch order, so B and W are ascending by construction.
std::vector<std::vector<Action>> zero_bubble_order(const ScheduleSpec& spec) {
  const int pp = spec.pp, m = spec.microbatches;
  std::vector<std::vector<Action>> order(pp);
  for (int r = 0; r < pp; ++r) {
    order[r].reserve(3 * size_t(m));
    int f = 0, b = 0, w = 0;
    auto F = [&] { order[r].push_back(compute(ActionKind::F, f++, r)); };
    auto B = [&] { order[r].push_back(compute(ActionKind::B, b++, r)); };
    auto W = [&] { order[r].push_back(compute(ActionKind::W, w++, r)); };
    for (int k = 0; k < pp - r - 1 && f < m; ++k) F();
    for (int k = 0; k < r && f < m; ++k) F(), B();
    while (f < m) F(), B(), W();
    while (b < m) B(), W();
    while (w < m) W();
  }
  return order;
}

// ZBV (Qi et al. 2024, "Pipeline Parallelism with Controllable Memory", §6; the order of PyTorch's
// ScheduleZBVZeroBubble, torch/distributed/pipelining/schedules.py, which torchtitan runs): two chunks per
// rank in a V, rank r holding chunk r (c0) and 2pp−1−r (c1), B and W split. The order is written for
// n = max(m, 2pp−1) micro-batches and the ones beyond m are dropped, as PyTorch does. Rank r: 2(pp−r)−1
// forwards of c0; r pairs (F c1, F c0); pp−r triples (F c1, B c1, W c1); then (F c0 while any are left,
// B c0, W c0, F c1, B c1, W c1) until both chunks have run every forward; r pairs (B c0, B c1); pp−r pairs
// (B c0, W c0); the deferred W of c1, then of c0. Each kind runs in micro-batch order per chunk.
std::vector<std::vector<Action>> zbv_order(const ScheduleSpec& spec) {
  const int pp = spec.pp, m = spec.microbatches, n = std::max(m, 2 * pp - 1), chunks = 2 * pp;
  std::vector<std::vector<Action>> order(pp);
  for (int r = 0; r < pp; ++r) {
    const int c0 = r, c1 = chunks - 1 - r;
    int f0 = 0, f1 = 0, b0 = 0, b1 = 0;
    std::vector<Action> all;
    all.reserve(6 * size_t(n));
    auto add = [&](ActionKind k, int mb, int chunk) { all.push_back(compute(k, mb, chunk)); };
    for (int k = 0; k < 2 * (pp - r) - 1; ++k) add(ActionKind::F, f0++, c0);
    for (int k = 0; k < r; ++k) add(ActionKind::F, f1++, c1), add(ActionKind::F, f0++, c0);
    for (int k = 0; k < pp - r; ++k) add(ActionKind::F, f1++, c1), add(ActionKind::B, b1, c1), add(ActionKind::W, b1++, c1);
    while (f1 < f0 || f0 < n) {
      if (f0 < n) add(ActionKind::F, f0++, c0);
      add(ActionKind::B, b0, c0), add(ActionKind::W, b0++, c0);
      add(ActionKind::F, f1++, c1), add(ActionKind::B, b1, c1), add(ActionKind::W, b1++, c1);
    }
    int w0 = b0, w1 = b1;
    for (int k = 0; k < r; ++k) add(ActionKind::B, b0++, c0), add(ActionKind::B, b1++, c1);
    for (int k = 0; k < pp - r; ++k) add(ActionKind::B, b0++, c0), add(ActionKind::W, w0++, c0);
    while (w1 < b1) add(ActionKind::W, w1++, c1);
    while (w0 < b0) add(ActionKind::W, w0++, c0);
    for (const Action& a : all)
      if (a.microbatch < m) order[r].push_back(a);
  }
  return order;
}

// DualPipeV (DeepSeek-V3's DualPipe, the V variant: deepseek-ai/DualPipe, dualpipe/dualpipev.py, DualPipeV.step,
// whose eight steps this follows; "F c0 + BW c1" is its overlapped forward-backward pair, run one after the
// other here). Rank r of pp holds chunk r (c0) and 2pp−1−r (c1); m ≥ 2pp. A split backward (its
// "enable_zb") queues its W, and each "W" step runs the oldest queued one (its WeightGradStore is FIFO):
//   1: 2(pp−r−1) × F c0            2: (r+1) × (F c0, F c1)          3: (pp−r−1) × (B c1, W, F c1)
//   4: (m−2pp+r+1) × (F c0, BW c1, F c1, BW c0)                     5: (pp−r−1) × (BW c1, F c1, BW c0)
//   6: (r+1) × (c1, c0 backward; split from the middle iteration on, c1 first on odd ranks)
//   7: (pp−r−1) × (W, B c0)        8: (r+1) × W
std::vector<std::vector<Action>> dualpipev_order(const ScheduleSpec& spec) {
  const int pp = spec.pp, m = spec.microbatches, chunks = 2 * pp;
  std::vector<std::vector<Action>> order(pp);
  for (int r = 0; r < pp; ++r) {
    const int c[2] = {r, chunks - 1 - r};
    int f[2] = {0, 0}, b[2] = {0, 0};
    std::vector<std::pair<int, int>> queued;  // (phase, micro-batch) of split backwards, oldest first
    size_t oldest = 0;
    auto& out = order[r];
    out.reserve(3 * 2 * size_t(m));
    auto F = [&](int ph) { out.push_back(compute(ActionKind::F, f[ph]++, c[ph])); };
    auto BW = [&](int ph) { out.push_back(compute(ActionKind::BW, b[ph]++, c[ph])); };
    auto B = [&](int ph) {
      queued.push_back({ph, b[ph]});
      out.push_back(compute(ActionKind::B, b[ph]++, c[ph]));
    };
    auto W = [&] {
      if (oldest == queued.size()) throw std::logic_error("dualpipev: a W step with no split backward queued");
      const auto [ph, mb] = queued[oldest++];
      out.push_back(compute(ActionKind::W, mb, c[ph]));
    };
    for (int k = 0; k < 2 * (pp - r - 1); ++k) F(0);
    for (int k = 0; k < r + 1; ++k) F(0), F(1);
    for (int k = 0; k < pp - r - 1; ++k) B(1), W(), F(1);
    for (int k = 0; k < m - 2 * pp + r + 1; ++k) F(0), BW(1), F(1), BW(0);
    for (int k = 0; k < pp - r - 1; ++k) BW(1), F(1), BW(0);
    bool split = false;
    for (int k = 0; k < r + 1; ++k) {
      if (k == (r + 1) / 2 && r % 2 == 1) split = true;
      split ? B(1) : BW(1);
      if (k == (r + 1) / 2 && r % 2 == 0) split = true;
      split ? B(0) : BW(0);
    }
    for (int k = 0; k < pp - r - 1; ++k) W(), B(0);
    for (int k = 0; k < r + 1; ++k) W();
    if (oldest != queued.size()) throw std::logic_error("dualpipev: split backwards left without their W");
  }
  return order;
}

double cost_of(const std::vector<double>& v, int chunk, const char* name) {
  if (v.empty()) throw std::invalid_argument(std::string("schedule costs: ") + name + " is empty; give one value or one per chunk");
  return v.size() == 1 ? v[0] : v.at(chunk);
}

}  // namespace

std::optional<PipelineSchedule> parse_pipeline_schedule(std::string_view name) {
  if (name == "gpipe") return PipelineSchedule::gpipe;
  if (name == "1f1b") return PipelineSchedule::one_f_one_b;
  if (name == "interleaved") return PipelineSchedule::interleaved;
  if (name == "zb") return PipelineSchedule::zero_bubble;
  if (name == "zbv") return PipelineSchedule::zbv;
  if (name == "dualpipev") return PipelineSchedule::dualpipev;
  return std::nullopt;
}

const std::vector<std::string>& pipeline_schedule_names() {
  static const std::vector<std::string> names{"gpipe", "1f1b", "interleaved", "zb", "zbv", "dualpipev"};
  return names;
}

ChunkPlacement chunk_placement(PipelineSchedule k) {
  return k == PipelineSchedule::zbv || k == PipelineSchedule::dualpipev ? ChunkPlacement::v : ChunkPlacement::looped;
}

ChunkPlacement chunk_placement(std::string_view schedule_name) {
  const auto k = parse_pipeline_schedule(schedule_name);
  return k ? chunk_placement(*k) : ChunkPlacement::looped;
}

int scheduled_virtual_stages(PipelineSchedule k, int requested) {
  return chunk_placement(k) == ChunkPlacement::v && requested == 1 ? 2 : requested;
}

int min_microbatches(PipelineSchedule k, int pp) {
  if (pp <= 1) return 1;
  return k == PipelineSchedule::dualpipev ? 2 * pp : pp;
}

const char* pipeline_schedule_name(PipelineSchedule k) {
  switch (k) {
    case PipelineSchedule::gpipe: return "gpipe";
    case PipelineSchedule::one_f_one_b: return "1f1b";
    case PipelineSchedule::interleaved: return "interleaved";
    case PipelineSchedule::zero_bubble: return "zb";
    case PipelineSchedule::zbv: return "zbv";
    case PipelineSchedule::dualpipev: return "dualpipev";
  }
  return "?";
}

const char* action_name(ActionKind k) {
  switch (k) {
    case ActionKind::F: return "F";
    case ActionKind::B: return "B";
    case ActionKind::W: return "W";
    case ActionKind::BW: return "BW";
    case ActionKind::send_act: return "send_act";
    case ActionKind::recv_act: return "recv_act";
    case ActionKind::send_grad: return "send_grad";
    case ActionKind::recv_grad: return "recv_grad";
  }
  return "?";
}

std::string action_text(const Action& a) {
  std::string t = std::string(action_name(a.kind)) + "(mb=" + s(a.microbatch) + ", chunk=" + s(a.chunk);
  if (is_send(a.kind)) t += " -> rank " + s(a.peer);
  if (is_recv(a.kind)) t += " <- rank " + s(a.peer);
  return t + ")";
}

std::string check_schedule_spec(const ScheduleSpec& spec) {
  const std::string name = pipeline_schedule_name(spec.kind);
  if (spec.pp < 1) return "pp=" + s(spec.pp) + " must be at least 1; set parallel.pp to a positive integer";
  if (spec.virtual_stages < 1)
    return "parallel.virtual_stages=" + s(spec.virtual_stages) + " must be at least 1; set it to a positive integer";
  if (spec.microbatches < 1)
    return "a step needs at least one micro-batch, not " + s(spec.microbatches) +
           "; raise training.global_batch_size or lower micro_batch_size";
  const bool v_shape = chunk_placement(spec.kind) == ChunkPlacement::v;
  if (v_shape && spec.virtual_stages != 2)
    return "parallel.virtual_stages=" + s(spec.virtual_stages) + " does not go with pipeline_schedule = \"" + name +
           "\", which runs exactly two chunks per pipeline rank in a V; set parallel.virtual_stages = 1 or 2 "
           "(both mean two), or pipeline_schedule = \"interleaved\"";
  if (v_shape && spec.pp == 1)
    return "pipeline_schedule = \"" + name + "\" needs a pipeline (pp > 1); set pp > 1, or pipeline_schedule = "
           "\"1f1b\"";
  if (!v_shape && spec.kind != PipelineSchedule::interleaved && spec.virtual_stages > 1)
    return "parallel.virtual_stages=" + s(spec.virtual_stages) + " needs pipeline_schedule = \"interleaved\" (\"" +
           name + "\" runs one chunk per pipeline rank); set parallel.pipeline_schedule = \"interleaved\" or "
           "virtual_stages = 1";
  if (spec.kind == PipelineSchedule::interleaved && spec.pp == 1)
    return "the interleaved schedule needs a pipeline (pp > 1); set pp > 1, or pipeline_schedule = \"1f1b\" "
           "with virtual_stages = 1";
  if (spec.kind == PipelineSchedule::interleaved && spec.virtual_stages < 2)
    return "pipeline_schedule = \"interleaved\" needs parallel.virtual_stages ≥ 2 (with 1 chunk per rank it is "
           "1F1B); set virtual_stages ≥ 2 or pipeline_schedule = \"1f1b\"";
  if (spec.pp > 1 && spec.microbatches < spec.pp && spec.kind != PipelineSchedule::dualpipev)
    return "only " + s(spec.microbatches) + " micro-batches per step for pp=" + s(spec.pp) +
           " stages (a pipeline needs at least one per stage); raise training.global_batch_size or lower "
           "micro_batch_size or pp";
  if (spec.kind == PipelineSchedule::dualpipev && spec.microbatches < min_microbatches(spec.kind, spec.pp))
    return "only " + s(spec.microbatches) + " micro-batches per step for pipeline_schedule = \"dualpipev\" at pp=" +
           s(spec.pp) + ", which needs at least 2·pp = " + s(min_microbatches(spec.kind, spec.pp)) +
           " (one per chunk, as DeepSeek's DualPipeV asserts); raise training.global_batch_size or lower "
           "micro_batch_size";
  if (spec.kind == PipelineSchedule::interleaved && spec.microbatches % spec.pp != 0)
    return "the interleaved schedule needs micro-batches per step (" + s(spec.microbatches) +
           ") to be a multiple of pp=" + s(spec.pp) + "; adjust global_batch_size";
  return "";
}

ScheduleTable generate_schedule(const ScheduleSpec& spec) {
  if (auto why = check_schedule_spec(spec); !why.empty()) throw std::invalid_argument(why);
  switch (spec.kind) {
    case PipelineSchedule::gpipe: return lower(spec, gpipe_order(spec));
    case PipelineSchedule::one_f_one_b: return lower(spec, one_f_one_b_order(spec));
    case PipelineSchedule::interleaved: return lower(spec, interleaved_order(spec));
    case PipelineSchedule::zero_bubble: return lower(spec, zero_bubble_order(spec));
    case PipelineSchedule::zbv: return lower(spec, zbv_order(spec));
    case PipelineSchedule::dualpipev: return lower(spec, dualpipev_order(spec));
  }
  throw std::invalid_argument("unknown pipeline schedule");
}

std::vector<std::string> validate_schedule(const ScheduleTable& table) {
  const ScheduleSpec& spec = table.spec;
  if (auto why = check_schedule_spec(spec); !why.empty()) return {"schedule spec: " + why};
  const int pp = spec.pp, m = spec.microbatches, chunks = table.chunks(), last = chunks - 1;
  if (int(table.ranks.size()) != pp)
    return {"the table has " + s(table.ranks.size()) + " rank lists for pp=" + s(pp) + "; give one list per pipeline rank"};
  std::vector<std::string> problems;
  auto at = [](int r, const Action& a) { return "rank " + s(r) + ": " + action_text(a); };

  // 1. Each action is in range and on the rank its chunk lives on, with the right peer. Later checks
  // index by (mb, chunk) and follow peers, so they run only when this one passes.
  for (int r = 0; r < pp; ++r)
    for (const Action& a : table.ranks[r]) {
      if (a.microbatch < 0 || a.microbatch >= m || a.chunk < 0 || a.chunk > last) {
        problems.push_back(at(r, a) + " is outside the step (micro-batches 0.." + s(m - 1) + ", chunks 0.." +
                           s(last) + "); use a micro-batch and chunk of this step");
        continue;
      }
      const int c = a.chunk;
      int home = spec.rank_of(c);  // rank that must hold the action
      int peer = -1;                 // rank the message must go to or come from
      bool has_peer = true;
      switch (a.kind) {
        case ActionKind::send_act: has_peer = c < last; peer = spec.rank_of(c + 1); break;
        case ActionKind::recv_act: has_peer = c < last; home = spec.rank_of(c + 1); peer = spec.rank_of(c); break;
        case ActionKind::send_grad: has_peer = c > 0; peer = spec.rank_of(c - 1); break;
        case ActionKind::recv_grad: has_peer = c > 0; home = spec.rank_of(c - 1); peer = spec.rank_of(c); break;
        default: break;
      }
      if (!is_compute(a.kind) && has_peer && peer == home) {
        const bool act = a.kind == ActionKind::send_act || a.kind == ActionKind::recv_act;
        problems.push_back(at(r, a) + " is a transfer between chunks " + s(act ? c : c - 1) + " and " +
                           s(act ? c + 1 : c) + ", which both live on rank " + s(home) +
                           " and hand over in memory; remove it");
        continue;
      }
      if (!is_compute(a.kind) && !has_peer) {
        problems.push_back(at(r, a) + " crosses the end of the pipeline (chunk " + s(c) + " of " + s(chunks) +
                           " has no neighbour that way); remove it");
      } else if (home != r) {
        problems.push_back(at(r, a) + " is on the wrong rank: chunk " + s(c) + " lives on rank " +
                           s(spec.rank_of(c)) + (is_compute(a.kind) ? "" : ", so this belongs on rank " + s(home)) +
                           "; move it to rank " + s(home));
      } else if (!is_compute(a.kind) && a.peer != peer) {
        problems.push_back(at(r, a) + " names the wrong peer: " +
                           (is_send(a.kind) ? "the consumer" : "the producer") + " of chunk " + s(c) +
                           "'s tensor is rank " + s(peer) + "; set peer = " + s(peer));
      }
    }
  if (!problems.empty()) return problems;

  // 2. Exactly one F and one backward (B + W, or BW) per (mb, chunk); exactly one send and one receive
  // per tensor that crosses ranks.
  const Grid g{m, chunks};
  enum { F, B, W, BW, kinds };
  std::vector<std::vector<int>> count(kinds, std::vector<int>(g.size(), 0));
  std::vector<int> sends(2 * g.size(), 0), recvs(2 * g.size(), 0);
  std::vector<const Action*> a_send(2 * g.size(), nullptr), a_recv(2 * g.size(), nullptr);
  std::vector<int> send_rank(2 * g.size(), -1), recv_rank(2 * g.size(), -1);
  for (int r = 0; r < pp; ++r)
    for (const Action& a : table.ranks[r]) {
      int i = g.at(a.microbatch, a.chunk);
      switch (a.kind) {
        case ActionKind::F: ++count[F][i]; break;
        case ActionKind::B: ++count[B][i]; break;
        case ActionKind::W: ++count[W][i]; break;
        case ActionKind::BW: ++count[BW][i]; break;
        default: {
          int k = message_key(g, a);
          if (is_send(a.kind)) ++sends[k], a_send[k] = &a, send_rank[k] = r;
          else ++recvs[k], a_recv[k] = &a, recv_rank[k] = r;
        }
      }
    }
  for (int mb = 0; mb < m; ++mb)
    for (int c = 0; c < chunks; ++c) {
      const int i = g.at(mb, c), home = spec.rank_of(c);
      auto named = [&](ActionKind k) { return "rank " + s(home) + ": " + action_text(compute(k, mb, c)); };
      auto once = [&](ActionKind k, int n, const char* role) {
        if (n == 0) problems.push_back(named(k) + " is missing (" + role + "); add it to rank " + s(home) + "'s list");
        if (n > 1) problems.push_back(named(k) + " runs " + s(n) + " times; keep exactly one");
      };
      once(ActionKind::F, count[F][i], "every micro-batch runs forward through every chunk");
      if (count[BW][i] > 0 && count[B][i] + count[W][i] > 0)
        problems.push_back(named(ActionKind::BW) + " is fused but B or W of the same micro-batch and chunk also "
                                                   "runs; use either BW or the B and W pair");
      else if (count[BW][i] > 0)
        once(ActionKind::BW, count[BW][i], "");
      else {
        once(ActionKind::B, count[B][i], "the input gradient, or a fused BW");
        once(ActionKind::W, count[W][i], "the weight gradient after its B, or a fused BW");
      }
    }
  for (int k = 0; k < 2 * g.size(); ++k) {
    if (sends[k] > 1) problems.push_back("rank " + s(send_rank[k]) + ": " + action_text(*a_send[k]) + " is posted " +
                                         s(sends[k]) + " times; keep exactly one");
    if (recvs[k] > 1) problems.push_back("rank " + s(recv_rank[k]) + ": " + action_text(*a_recv[k]) + " is posted " +
                                         s(recvs[k]) + " times; keep exactly one");
    if (sends[k] == 1 && recvs[k] == 0) {
      const Action& a = *a_send[k];
      problems.push_back("rank " + s(send_rank[k]) + ": " + action_text(a) + " has no matching " +
                         (a.kind == ActionKind::send_act ? "recv_act" : "recv_grad") + " on rank " + s(a.peer) +
                         "; add the receive before the action that consumes it");
    }
    if (recvs[k] == 1 && sends[k] == 0) {
      const Action& a = *a_recv[k];
      problems.push_back("rank " + s(recv_rank[k]) + ": " + action_text(a) + " has no matching " +
                         (a.kind == ActionKind::recv_act ? "send_act" : "send_grad") + " on rank " + s(a.peer) +
                         "; add the send after the action that produces it");
    }
  }

  const bool paired = problems.empty();  // one send and one receive per crossing tensor

  // 3. On each rank, every action after what it needs from this rank: F(m,c) after F(m,c−1) or its receive,
  // B(m,c) after F(m,c) and B(m,c+1) or its receive, W(m,c) after B(m,c), a send after what produced it.
  // Per (mb, chunk), the rank that has run its F / B or received its activation / gradient (−1: none yet):
  // one array for all ranks, so the check stays linear in the table's size however many ranks there are.
  std::vector<int> done_f(g.size(), -1), done_b(g.size(), -1), got_act(g.size(), -1), got_grad(g.size(), -1);
  for (int r = 0; r < pp; ++r) {
    for (const Action& a : table.ranks[r]) {
      const int mb = a.microbatch, c = a.chunk, i = g.at(mb, c);
      auto needs = [&](bool ok, ActionKind what, const char* note = "") {
        if (!ok)
          problems.push_back(at(r, a) + " runs before " + action_text(compute(what, mb, c)) + note +
                             "; move it after that on rank " + s(r));
      };
      auto input = [&](bool earlier_compute, bool received, ActionKind recv_kind, int from_chunk, ActionKind compute_kind) {
        if (earlier_compute || received) return;
        std::string what = spec.rank_of(from_chunk) == r
                               ? action_text(compute(compute_kind, mb, from_chunk))
                               : action_text(Action{recv_kind, mb, from_chunk, spec.rank_of(from_chunk)});
        problems.push_back(at(r, a) + " runs before " + what + "; move it after that on rank " + s(r));
      };
      auto here = [r](const std::vector<int>& v, int k) { return v[k] == r; };
      switch (a.kind) {
        case ActionKind::F:
          if (c > 0)
            input(here(done_f, g.at(mb, c - 1)), here(got_act, g.at(mb, c - 1)), ActionKind::recv_act, c - 1, ActionKind::F);
          done_f[i] = r;
          break;
        case ActionKind::B:
        case ActionKind::BW:
          needs(here(done_f, i), ActionKind::F);
          if (c < last)
            input(here(done_b, g.at(mb, c + 1)), here(got_grad, g.at(mb, c + 1)), ActionKind::recv_grad, c + 1, ActionKind::B);
          done_b[i] = r;
          break;
        case ActionKind::W: needs(here(done_b, i), ActionKind::B); break;
        case ActionKind::send_act: needs(here(done_f, i), ActionKind::F); break;
        case ActionKind::send_grad: needs(here(done_b, i), ActionKind::B, " (or BW)"); break;
        case ActionKind::recv_act: got_act[i] = r; break;
        case ActionKind::recv_grad: got_grad[i] = r; break;
      }
    }
  }

  // 4. Per-peer order: transfers carry no tag (NCCL has none), so rank a's k-th send to b meets b's k-th
  // receive from a, and both must name the same tensor. Only meaningful once every tensor is paired.
  if (paired) {
    // (from, to) -> positions of from's sends to `to` and of to's receives from `from`, in list order. Check 1
    // put every peer next to its rank on the ring (chunk c's neighbours live on ranks r ± 1 mod pp), so a
    // pair is (from, side): side 0 is to = from + 1, side 1 is to = from − 1 (mod pp; the same rank when
    // pp ≤ 2, then side 0). Pairs are checked in (from, to) order.
    auto side = [pp](int from, int to) { return to == (from + 1) % pp ? 0 : 1; };
    std::vector<std::pair<std::vector<int>, std::vector<int>>> pairs(2 * size_t(pp));
    for (int r = 0; r < pp; ++r)
      for (int i = 0; i < int(table.ranks[r].size()); ++i) {
        const Action& a = table.ranks[r][i];
        if (is_send(a.kind)) pairs[2 * r + side(r, a.peer)].first.push_back(i);
        if (is_recv(a.kind)) pairs[2 * a.peer + side(a.peer, r)].second.push_back(i);
      }
    std::vector<std::pair<int, int>> order;  // (from, to), ascending
    for (int from = 0; from < pp; ++from) {
      const int up = (from + 1) % pp, down = (from + pp - 1) % pp;
      if (up == down) order.push_back({from, up});
      else if (up < down) order.push_back({from, up}), order.push_back({from, down});
      else order.push_back({from, down}), order.push_back({from, up});
    }
    for (const auto& [from, to] : order) {
      const auto& [sent, received] = pairs[2 * from + side(from, to)];
      for (size_t k = 0; k < std::min(sent.size(), received.size()); ++k) {
        const Action &x = table.ranks[from][sent[k]], &y = table.ranks[to][received[k]];
        if (message_key(g, x) == message_key(g, y)) continue;
        problems.push_back(at(from, x) + " (action " + s(sent[k]) + ") is message " + s(k) + " to rank " + s(to) +
                           ", but rank " + s(to) + "'s message " + s(k) + " from rank " + s(from) + " is " +
                           action_text(y) + " (action " + s(received[k]) + "); transfers pair per peer in posting "
                           "order (no tags), so post rank " + s(from) + "'s sends to rank " + s(to) +
                           " in the order rank " + s(to) + " receives them");
        break;  // one line per pair: every later message is shifted by this one
      }
    }
  }
  if (!problems.empty()) return problems;

  // 5. Deadlock: run every rank with non-blocking sends and blocking receives until none can move. With
  // the per-peer order checked, a receive's message is the one its key names.
  std::vector<char> posted(2 * g.size(), 0);
  std::vector<size_t> next(pp, 0);
  std::vector<int> waiting_on(2 * g.size(), -1), runnable;
  for (int r = 0; r < pp; ++r) runnable.push_back(r);
  while (!runnable.empty()) {
    int r = runnable.back();
    runnable.pop_back();
    const auto& list = table.ranks[r];
    while (next[r] < list.size()) {
      const Action& a = list[next[r]];
      if (is_recv(a.kind) && !posted[message_key(g, a)]) {
        waiting_on[message_key(g, a)] = r;
        break;
      }
      if (is_send(a.kind)) {
        int k = message_key(g, a);
        posted[k] = 1;
        if (waiting_on[k] >= 0) runnable.push_back(waiting_on[k]), waiting_on[k] = -1;
      }
      ++next[r];
    }
  }
  for (int r = 0; r < pp; ++r)
    if (next[r] < table.ranks[r].size()) {
      const Action& a = table.ranks[r][next[r]];
      const auto& peer_list = table.ranks[a.peer];
      std::string peer_state = next[a.peer] < peer_list.size()
                                   ? "rank " + s(a.peer) + " is itself blocked at " + action_text(peer_list[next[a.peer]])
                                   : "rank " + s(a.peer) + " has finished";
      problems.push_back(at(r, a) + " (action " + s(next[r]) + ") deadlocks: its send is never posted because " +
                         peer_state + "; move the receive after the actions its sender waits for");
    }
  return problems;
}

std::vector<std::vector<int>> sends_known_received(const ScheduleTable& table, bool forward_only) {
  if (auto problems = validate_schedule(table); !problems.empty())
    throw std::invalid_argument("sends_known_received needs a valid table: " + problems.front());
  const int pp = table.spec.pp;
  const Grid g{table.spec.microbatches, table.chunks()};
  auto runs = [forward_only](const Action& a) {
    return !forward_only || a.kind == ActionKind::F || a.kind == ActionKind::send_act || a.kind == ActionKind::recv_act;
  };
  std::vector<std::vector<int>> known(pp);
  for (int r = 0; r < pp; ++r) known[r].assign(table.ranks[r].size(), -1);
  // Vector clocks: seen[r][p] = the last index of p's list that happened before r's current action.
  std::vector<std::vector<int>> seen(pp, std::vector<int>(pp, -1));
  std::vector<std::vector<int>> carried(2 * size_t(g.size()));  // a message's sender clock, once posted
  std::vector<int> received_at(2 * g.size(), -1);               // the receiver's index of its receive
  std::vector<std::vector<std::vector<std::pair<int, int>>>> pending(pp, std::vector<std::vector<std::pair<int, int>>>(pp));
  std::vector<size_t> next(pp, 0), front(size_t(pp) * pp, 0);
  std::vector<int> waiting_on(2 * g.size(), -1), runnable;
  for (int r = 0; r < pp; ++r) runnable.push_back(r);
  while (!runnable.empty()) {
    const int r = runnable.back();
    runnable.pop_back();
    const auto& list = table.ranks[r];
    for (; next[r] < list.size(); ++next[r]) {
      const int i = int(next[r]);
      const Action& a = list[i];
      if (!runs(a)) continue;
      seen[r][r] = i;
      if (is_recv(a.kind)) {
        const int k = message_key(g, a);
        if (carried[k].empty()) {
          waiting_on[k] = r;
          break;
        }
        for (int p = 0; p < pp; ++p) seen[r][p] = std::max(seen[r][p], carried[k][p]);
        received_at[k] = i;
        // Sends to each peer are received in posting order (the validator checked), so the oldest go first.
        for (int p = 0; p < pp; ++p) {
          auto& q = pending[r][p];
          size_t& f = front[size_t(r) * pp + p];
          while (f < q.size() && received_at[q[f].second] >= 0 && received_at[q[f].second] <= seen[r][p])
            known[r][q[f++].first] = i + 1;
        }
      } else if (is_send(a.kind)) {
        const int k = message_key(g, a);
        carried[k] = seen[r];
        pending[r][a.peer].push_back({i, k});
        if (waiting_on[k] >= 0) runnable.push_back(waiting_on[k]), waiting_on[k] = -1;
      }
    }
  }
  for (int r = 0; r < pp; ++r)
    for (int p = 0; p < pp; ++p)
      for (size_t f = front[size_t(r) * pp + p]; f < pending[r][p].size(); ++f)
        known[r][pending[r][p][f].first] = int(table.ranks[r].size());
  return known;
}

Timeline simulate_schedule(const ScheduleTable& table, const ScheduleCosts& costs) {
  if (auto problems = validate_schedule(table); !problems.empty())
    throw std::invalid_argument("simulate_schedule needs a valid table: " + problems.front());
  return simulate_validated_schedule(table, costs);
}

namespace {

// The event loop both simulate_validated_schedule and simulate_validated_makespan run: every rank's clock
// and busy time, each compute action reported to `on_compute(rank, index, start, end)` as it is timed.
template <class OnCompute>
void run_schedule(const ScheduleTable& table, const ScheduleCosts& costs, std::vector<double>& clock,
                  std::vector<double>& busy, OnCompute&& on_compute) {
  const int pp = table.spec.pp, chunks = table.chunks();
  if (int(table.ranks.size()) != pp) throw std::invalid_argument("schedule table: one action list per rank needed");
  for (const auto* v : {&costs.f, &costs.b, &costs.w})
    if (v->size() != 1 && int(v->size()) != chunks)
      throw std::invalid_argument("schedule costs: give one value or one per chunk (" + s(chunks) + "), not " +
                                  s(v->size()));
  // Per-chunk durations of F, B, W and BW, resolved once.
  std::vector<double> dur_f(chunks), dur_b(chunks), dur_w(chunks);
  for (int c = 0; c < chunks; ++c)
    dur_f[c] = cost_of(costs.f, c, "f"), dur_b[c] = cost_of(costs.b, c, "b"), dur_w[c] = cost_of(costs.w, c, "w");
  const Grid g{table.spec.microbatches, chunks};
  clock.assign(pp, 0.0);
  busy.assign(pp, 0.0);
  std::vector<double> posted_at(2 * g.size(), -1.0);
  std::vector<size_t> next(pp, 0);
  std::vector<int> waiting_on(2 * g.size(), -1), runnable;
  for (int r = 0; r < pp; ++r) runnable.push_back(r);
  // Same progress rule as the deadlock check; times follow from when each send was posted.
  while (!runnable.empty()) {
    const int r = runnable.back();
    runnable.pop_back();
    const Action* list = table.ranks[r].data();
    const size_t n = table.ranks[r].size();
    size_t i = next[r];
    double now = clock[r];
    for (; i < n; ++i) {
      const Action& a = list[i];
      if (unsigned(a.microbatch) >= unsigned(g.m) || unsigned(a.chunk) >= unsigned(chunks) ||
          (!is_compute(a.kind) && unsigned(a.peer) >= unsigned(pp)))
        throw std::invalid_argument("schedule table: rank " + s(r) + ": " + action_text(a) + " is out of range");
      double d = 0;
      switch (a.kind) {
        case ActionKind::recv_act:
        case ActionKind::recv_grad: {
          const int k = message_key(g, a);
          if (posted_at[k] < 0) {
            waiting_on[k] = r;
            goto blocked;
          }
          now = std::max(now, posted_at[k] + costs.transfer);
          continue;
        }
        case ActionKind::send_act:
        case ActionKind::send_grad: {
          const int k = message_key(g, a);
          posted_at[k] = now;
          if (waiting_on[k] >= 0) runnable.push_back(waiting_on[k]), waiting_on[k] = -1;
          continue;
        }
        case ActionKind::F: d = dur_f[a.chunk]; break;
        case ActionKind::B: d = dur_b[a.chunk]; break;
        case ActionKind::W: d = dur_w[a.chunk]; break;
        case ActionKind::BW: d = dur_b[a.chunk] + dur_w[a.chunk]; break;
      }
      on_compute(r, i, now, now + d);
      now += d;
      busy[r] += d;
    }
  blocked:
    next[r] = i;
    clock[r] = now;
  }
  for (int r = 0; r < pp; ++r)
    if (next[r] < table.ranks[r].size())
      throw std::invalid_argument("schedule table: rank " + s(r) + " deadlocks at " + action_text(table.ranks[r][next[r]]));
}

}  // namespace

Timeline simulate_validated_schedule(const ScheduleTable& table, const ScheduleCosts& costs) {
  const int pp = table.spec.pp;
  Timeline tl;
  tl.ranks.resize(pp);
  for (int r = 0; r < pp && r < int(table.ranks.size()); ++r) tl.ranks[r].reserve(table.ranks[r].size());
  std::vector<double> clock, busy;
  run_schedule(table, costs, clock, busy, [&tl](int r, size_t i, double start, double end) {
    tl.ranks[r].push_back({int(i), start, end});
  });
  tl.makespan = *std::max_element(clock.begin(), clock.end());
  tl.idle.resize(pp);
  tl.peak_live_per_rank.assign(pp, 0);
  double idle_sum = 0;
  for (int r = 0; r < pp; ++r) {
    tl.idle[r] = tl.makespan - busy[r];
    idle_sum += tl.idle[r];
    // A rank computes one action at a time, so walking its list in order sees slots open and close in time order.
    int live = 0;
    for (const TimedAction& ta : tl.ranks[r]) {
      ActionKind k = table.ranks[r][ta.index].kind;
      if (k == ActionKind::F) tl.peak_live_per_rank[r] = std::max(tl.peak_live_per_rank[r], ++live);
      if (frees_slot(k)) --live;
    }
  }
  tl.peak_live_microbatches = *std::max_element(tl.peak_live_per_rank.begin(), tl.peak_live_per_rank.end());
  tl.bubble_fraction = tl.makespan > 0 ? idle_sum / (pp * tl.makespan) : 0.0;
  return tl;
}

ScheduleMakespan simulate_validated_makespan(const ScheduleTable& table, const ScheduleCosts& costs) {
  std::vector<double> clock, busy;
  run_schedule(table, costs, clock, busy, [](int, size_t, double, double) {});
  ScheduleMakespan out;
  out.makespan = *std::max_element(clock.begin(), clock.end());
  out.idle.resize(clock.size());
  for (size_t r = 0; r < clock.size(); ++r) out.idle[r] = out.makespan - busy[r];
  return out;
}

}  // namespace meshrun
