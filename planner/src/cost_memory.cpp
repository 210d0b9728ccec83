// Memory per GPU of one setting (docs/planner.md, "Memory per GPU").
#include <algorithm>

#include "cost.hpp"

namespace meshrun::planner::detail {

MemoryParts CostModel::stage_memory(const Setting& s, int layers, int rank) const {
  MemoryParts mem;
  const bool first = rank == 0, last = rank == s.pp - 1;
  const double t = s.tp, sp_div = s.sp ? t : 1.0;
  const double tokens = double(seq_) / s.cp * s.micro_batch;
  const int micro = global_batch_ / (s.dp * s.micro_batch);

  // Weights on this rank: attention and MLP sharded by TP, norms replicated, experts split by EP then TP.
  const bool moe = m_.experts > 0;
  double dense = layers * (p_.attention / t + p_.norms + (moe ? double(p_.router) : p_.mlp / t));
  if (first) dense += p_.embedding / t;
  if (last) dense += (p_.head > 0 ? p_.head : (s.pp > 1 ? p_.embedding : 0)) / t + p_.final_norm;
  const double experts = moe ? layers * (double(m_.experts) / s.ep) * p_.expert / t : 0.0;
  const double n_dense = double(s.dp) * s.cp, n_exp = n_dense / s.ep;  // ZeRO sharding groups
  auto shard = [&](double bytes_per_param, bool sharded) {
    return dense * bytes_per_param / (sharded ? n_dense : 1) + experts * bytes_per_param / (sharded ? n_exp : 1);
  };
  mem.params = shard(pb_, s.zero >= 3);
  mem.grads = shard(gb_, s.zero >= 2);
  const double optim_per_param = ob_ * (2.0 + (pb_ != ob_ ? 1.0 : 0.0));  // Adam m, v (+ master copy)
  mem.optimizer = shard(optim_per_param, s.zero >= 1);

  // Activations: one layer's saved tensors × layers × micro-batches in flight on this rank.
  ActivationShape a{seq_, s.micro_batch, s.tp, s.sp, s.cp, s.recompute, act_};
  const double per_layer = activation_bytes_per_layer(m_, a);
  // Peak live (micro-batch, chunk) slots on this rank, what the schedule's simulated table gives (GPipe m,
  // 1F1B pp − r, interleaved Megatron's warm-up depth + 1, ZB-H1 min(pp, m)) in closed form (pipeline.cpp),
  // each a chunk's share of the layers.
  const int live = simulated_live_ ? pipeline_.peak_live_simulated(s.schedule, s.pp, s.virtual_stages, micro)[rank]
                                   : PipelineSims::peak_live(s.schedule, s.pp, s.virtual_stages, micro, rank);
  const double in_flight_layers = double(live) * layers / s.virtual_stages;
  mem.activations = per_layer * in_flight_layers;
  if (s.recompute == Recompute::full) {  // the layer being recomputed is materialised in full
    a.recompute = Recompute::none;
    mem.activations += activation_bytes_per_layer(m_, a);
  }
  if (last) mem.logits = 2.0 * tokens * double(m_.vocab) / t * 4;  // fp32 logits and their gradient

  // Communication buffers.
  const double hidden_bytes = tokens * m_.hidden * act_;
  double buf = 0;
  if (s.tp > 1) buf += 2 * hidden_bytes;                                              // SP all-gather outputs
  if (s.cp > 1) buf += 2.0 * 2 * seq_ * s.micro_batch * double(m_.kv_heads) * m_.head_dim() / t * act_;  // K,V (+grads)
  if (s.pp > 1) buf += 4 * hidden_bytes / sp_div;                                      // send/recv, fwd and bwd
  if (moe && s.ep > 1) buf += 2 * tokens * m_.top_k * m_.hidden * act_ / sp_div;       // all-to-all
  if (s.zero >= 3) buf += 2.0 * (p_.attention + (moe ? p_.expert * double(m_.experts) / s.ep : p_.mlp)) / t * pb_;
  mem.comm_buffers = buf;
  mem.reserve = k_.reserve_gib * double(1 << 30);
  return mem;
}

void CostModel::memory(const Setting& s, const StageLayers& l, Cost* out) const {
  MemoryParts first = stage_memory(s, l.first, 0);
  if (s.pp == 1) {
    out->memory = first;
    out->last_stage = false;
    return;
  }
  MemoryParts last = stage_memory(s, l.last, s.pp - 1);
  out->last_stage = last.total() > first.total();
  out->memory = out->last_stage ? last : first;
}

}  // namespace meshrun::planner::detail
