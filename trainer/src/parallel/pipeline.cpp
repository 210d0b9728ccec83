#include "meshrun/train/parallel/pipeline.hpp"

#include <chrono>
#include <stdexcept>
#include <string>

#include "meshrun/train/run/trace.hpp"

namespace meshrun::train {

namespace {
using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }
// Every transfer uses this one tag: messages pair per peer in list order, which validate_schedule checks
// (NCCL has no tags, so nothing may depend on them).
constexpr int kTag = 0;
}  // namespace

PipelineRuntime::PipelineRuntime(std::vector<Stage*> stages, Comm& pp, int prev, int next, ChunkPlacement placement,
                                 std::vector<int> known_done, std::vector<int> known_done_forward)
    : stages_(std::move(stages)), pp_(pp), prev_(prev), next_(next), placement_(placement),
      known_done_(std::move(known_done)), known_done_forward_(std::move(known_done_forward)) {}

int PipelineRuntime::peer(const Action& a, int consumer_chunk) const {
  const int expected = chunk_rank(consumer_chunk, pp_.size(), placement_);
  if (a.peer != expected || (expected != prev_ && expected != next_))
    throw std::logic_error("pipeline rank " + std::to_string(pp_.rank()) + ": " + action_text(a) + " names peer " +
                           std::to_string(a.peer) + " but chunk " + std::to_string(consumer_chunk) + " is on rank " +
                           std::to_string(expected) + " (the rank grid's neighbours are " + std::to_string(prev_) +
                           " and " + std::to_string(next_) + ")");
  return expected;
}

Stage* PipelineRuntime::held(int chunk) const {
  return chunk >= 0 && chunk < static_cast<int>(stages_.size()) ? stages_[chunk] : nullptr;
}

Stage& PipelineRuntime::stage(int chunk, const Action& a) {
  if (chunk < 0 || chunk >= static_cast<int>(stages_.size()) || !stages_[chunk])
    throw std::logic_error("pipeline rank " + std::to_string(pp_.rank()) + " does not hold chunk " +
                           std::to_string(chunk) + " needed by " + action_text(a));
  return *stages_[chunk];
}

std::vector<double> PipelineRuntime::run(const std::vector<Action>& actions, int microbatches, const Loader& load,
                                            double loss_scale, PipelineTiming* timing, bool forward_only) {
  const int chunks = static_cast<int>(stages_.size());
  std::vector<double> losses(static_cast<std::size_t>(microbatches), 0.0);
  PipelineTiming t;
  t.chunk_f_s.assign(static_cast<std::size_t>(chunks), 0.0);
  t.chunk_b_s.assign(static_cast<std::size_t>(chunks), 0.0);
  t.chunk_w_s.assign(static_cast<std::size_t>(chunks), 0.0);
  const auto start = Clock::now();
  trace::Recorder* const tracer = trace::active();  // a traced step (--trace): every action is recorded
  const std::vector<int>& known = forward_only ? known_done_forward_ : known_done_;
  if (known.size() != actions.size())
    throw std::logic_error("pipeline: the list's send knowledge has " + std::to_string(known.size()) + " entries for " +
                           std::to_string(actions.size()) + " actions");
  for (std::size_t index = 0; index < actions.size(); ++index) {
    const Action& a = actions[index];
    if (forward_only && a.kind != ActionKind::F && a.kind != ActionKind::send_act && a.kind != ActionKind::recv_act)
      continue;
    for (Stage* s : stages_)
      if (s) s->at_action(static_cast<int>(index));
    const auto t0 = Clock::now();
    auto account = [&](double& total, std::vector<double>& per_chunk, int& count) {
      const double dt = seconds_since(t0);
      total += dt;
      per_chunk[a.chunk] += dt;
      ++count;
    };
    switch (a.kind) {
      case ActionKind::F: {
        Stage& s = stage(a.chunk, a);
        if (Stage* previous = held(a.chunk - 1)) {  // the turn of a V: the previous chunk's output is here
          s.take_input(a.microbatch, *previous);
          if (forward_only) previous->discard(a.microbatch);
        }
        if (s.units().first || s.units().last) load(a.microbatch, s.ids(a.microbatch), s.targets(a.microbatch));
        losses[a.microbatch] += s.forward(a.microbatch);
        if (forward_only && s.units().last) s.discard(a.microbatch);
        account(t.f_s, t.chunk_f_s, t.f);
        break;
      }
      case ActionKind::B:
        if (Stage* next = held(a.chunk + 1)) stage(a.chunk, a).take_output_gradient(a.microbatch, *next);
        stage(a.chunk, a).backward_input(a.microbatch, loss_scale);
        account(t.b_s, t.chunk_b_s, t.b);
        break;
      case ActionKind::W:
        stage(a.chunk, a).backward_weight(a.microbatch);
        account(t.w_s, t.chunk_w_s, t.w);
        break;
      case ActionKind::BW:  // fused: B and W interleave unit by unit, so they are timed together (as B)
        if (Stage* next = held(a.chunk + 1)) stage(a.chunk, a).take_output_gradient(a.microbatch, *next);
        stage(a.chunk, a).backward_fused(a.microbatch, loss_scale);
        account(t.b_s, t.chunk_b_s, t.b);
        break;
      case ActionKind::send_act:
      case ActionKind::send_grad: {
        // Activations go to the next pipeline rank, input gradients to the previous one.
        const bool grad = a.kind == ActionKind::send_grad;
        Stage& s = stage(a.chunk, a);
        s.hold(a.microbatch,
               pp_.isend(grad ? s.gradient(a.microbatch) : s.activation(a.microbatch),
                         peer(a, grad ? a.chunk - 1 : a.chunk + 1), kTag),
               grad, known[index]);
        if (forward_only) s.discard(a.microbatch);  // reused only once the send is known received
        break;
      }
      case ActionKind::recv_act:
      case ActionKind::recv_grad: {
        // Into the consuming chunk's slot: chunk+1 for an activation, chunk−1 for a gradient.
        const bool grad = a.kind == ActionKind::recv_grad;
        Stage& s = stage(grad ? a.chunk - 1 : a.chunk + 1, a);
        pp_.irecv(grad ? s.gradient(a.microbatch) : s.activation(a.microbatch), peer(a, a.chunk), kTag).wait();
        t.wait_s += seconds_since(t0);
        break;
      }
    }
    if (tracer) tracer->action(a, std::chrono::duration<double>(t0.time_since_epoch()).count(), trace::now());
  }
  for (Stage* s : stages_)
    if (s) s->finish();
  for (Stage* s : stages_)
    if (s && s->live_slots() != 0)
      throw std::logic_error("pipeline: chunk " + std::to_string(s->units().chunk) + " still holds " +
                             std::to_string(s->live_slots()) + " micro-batches after the step (a W is missing)");
  t.total_s = seconds_since(start);
  if (timing) *timing = t;
  return losses;
}


}  // namespace meshrun::train
