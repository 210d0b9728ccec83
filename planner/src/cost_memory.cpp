// Memory per GPU of one setting (docs/planner.md, "Memory per GPU"). Activations and workspaces follow what
// meshrun-train allocates (trainer/src/parallel/stage.cpp, trainer/src/model/layers.cpp,
// trainer/src/parallel/context_parallel.cpp, trainer/src/parallel/moe.cpp), in the run's precision.
#include <algorithm>

#include "cost.hpp"
#include "meshrun/geometry.hpp"

namespace meshrun::planner::detail {

MemoryParts CostModel::stage_memory(const Setting& s, int layers, int rank) const {
  MemoryParts mem;
  // In a V (zbv, dualpipev) rank 0 holds the first chunk and the last one.
  const bool v_shape = chunk_placement(s.schedule) == ChunkPlacement::v;
  const bool first = rank == 0, last = v_shape ? rank == 0 : rank == s.layout.pp - 1;
  const double t = s.layout.tp;
  const int micro = int(s.batch.microbatches);

  // Weights on this rank: attention and MLP sharded by TP, norms replicated, experts split by EP then TP.
  const bool moe = m_.experts > 0;
  double dense = layers * (p_.attention / t + p_.norms + (moe ? double(p_.router) : p_.mlp / t));
  if (first) dense += p_.embedding / t;
  if (last) dense += (p_.head > 0 ? p_.head : (s.layout.pp > 1 ? p_.embedding : 0)) / t + p_.final_norm;
  const double experts = moe ? layers * (double(m_.experts) / s.layout.ep) * p_.expert / t : 0.0;
  const double n_dense = double(s.layout.dp) * s.layout.cp, n_exp = n_dense / s.layout.ep;  // ZeRO groups
  auto shard = [&](double bytes_per_param, bool sharded) {
    return dense * bytes_per_param / (sharded ? n_dense : 1) + experts * bytes_per_param / (sharded ? n_exp : 1);
  };
  mem.params = shard(pb_, s.layout.zero_stage >= 3);
  mem.grads = shard(gb_, s.layout.zero_stage >= 2);
  const double optim_per_param = ob_ * (2.0 + (pb_ != ob_ ? 1.0 : 0.0));  // Adam m, v (+ master copy)
  mem.optimizer = shard(optim_per_param, s.layout.zero_stage >= 1);

  // Shapes of one micro-batch on this rank (meshrun-train's LayerDims): n rows (micro-batch × S/cp), nl of
  // them kept in the residual stream (n/tp under sequence parallelism), local heads and widths (÷ tp).
  const double A = act_, St = stat_;
  const double n = double(s.batch.rows_per_microbatch), nl = double(s.batch.rows_per_sp_rank);
  const double h = m_.hidden, qd = double(m_.q_dim()) / t, kvd = double(m_.kv_dim()) / t;
  const double hq = double(m_.heads) / t, ffn = moe ? 0.0 : double(m_.ffn_hidden) / t, vl = double(m_.vocab) / t;
  // Mixture of experts: n·top_k rows leave each rank and, balanced, as many arrive; the busiest rank receives
  // planner.expert_imbalance times that (rows_in). Experts are ÷ tp wide.
  const double rows_e = moe ? n * m_.top_k : 0.0, fe = moe ? double(m_.expert_ffn()) / t : 0.0;
  const double rows_in = rows_e * imbalance_;

  // Live (micro-batch, chunk) slots: what the schedule's simulated table gives (GPipe m, 1F1B pp − r,
  // interleaved Megatron's warm-up depth + 1, ZB-H1 min(pp, m), ZBV min(2pp, m + r + 1), DualPipeV 2pp + 1)
  // in closed form (pipeline.cpp), each holding
  // a chunk's share of the layers. Interleaved: the rank's peak spread evenly over its chunks (meshrun-train
  // grows each chunk's slots to that chunk's own peak, which can add up to more: docs/planner.md).
  const Layout& l = s.layout;
  // (V schedules: the slots meshrun-train's chunks allocate, read off the table: a chunk keeps its own peak.)
  const int live = v_shape           ? pipeline_.activation_slots(s.schedule, l.pp, l.virtual_stages, micro)[rank]
                   : simulated_live_ ? pipeline_.peak_live_simulated(s.schedule, l.pp, l.virtual_stages, micro)[rank]
                                     : PipelineSims::peak_live(s.schedule, l.pp, l.virtual_stages, micro, rank);
  const double in_flight_layers = double(live) * layers / l.virtual_stages;
  const double chunk_slots = double(live) / l.virtual_stages;  // slots of the first / the last chunk

  // Activations: one layer's saved tensors (the published formula, model_math.cpp) plus what meshrun-train
  // keeps beside them: both norms' rstd, the attention log-sum-exp in the statistics' type (the formula
  // counts fp32) and, with experts, the router's outputs, the index lists and the expert backward buffers.
  ActivationShape a{seq_, int(s.batch.micro_batch_size), s.layout.tp, s.batch.sequence_parallel, s.layout.cp,
                    s.recompute, act_};
  double per_layer = activation_bytes_per_layer(m_, a);
  if (s.recompute != Recompute::full) {
    per_layer += 2 * nl * St + n * hq * (St - 4);
    if (moe)
      per_layer += rows_e * h * A * (s.batch.sequence_parallel ? 1 - 1 / t : 0)  // dispatched copies: not SP-sharded
                   + n * m_.experts * (St - 4) + rows_e * (St + 8) + m_.experts * St  // probs, weights, indices
                   + rows_in * (h + 2 * fe) * A;                // expert output gradient, gate/up gradients
  }
  mem.activations = per_layer * in_flight_layers;
  if (s.recompute == Recompute::full) {
    // The layer being recomputed is materialised in full, statistics too (meshrun-train: one per rank, in its
    // layer workspace; its input is the kept one, its thrown-away output in its place).
    a.recompute = Recompute::none;
    mem.activations += activation_bytes_per_layer(m_, a) + 2 * nl * St + n * hq * (St - 4);
  }
  // Per slot: the stage's input and its gradient (the pipeline transfers read and write them in place), token
  // ids and targets on the first and last chunk, the final norm's input and output on the last.
  mem.activations += double(live) * 2 * nl * h * A;
  if (first) mem.activations += chunk_slots * 2 * n * 4;
  if (last) {
    mem.activations += chunk_slots * ((s.layout.pp > 1 ? 2 * n * 4 : 0) + (nl + n) * h * A + (nl + 4 * n) * St);
    // meshrun-train's head, fused with the cross-entropy, keeps no logits per micro-batch: one chunk of rows at
    // a time in the workspace (statistics' type), its gradient beside it in the activations' type when that
    // differs. A trainer that keeps them whole: every live slot's, until the backward.
    const double chunk = double(head_chunk_rows(s.batch.rows_per_microbatch, m_.hidden, m_.vocab / s.layout.tp));
    mem.logits = fused_head_ ? chunk * vl * (St + (act_ != stat_ ? A : 0)) : chunk_slots * n * vl * St;
  }

  // Workspaces. Backward buffers: one layer's gradients at its projections, held from B to W (a chunk's
  // worth per deferred W: ZB-H1 defers r + 1 on rank r, fused schedules none) and one unit's for the fused BW.
  const double layer_grads = 2 * n * h + 2 * n * ffn + n * qd + 2 * n * kvd + 2 * nl * h;
  const bool split_types = act_ != stat_;  // unfused: dlogits then get their own buffer (activations' type)
  const double head_grads = last ? nl * h + (!fused_head_ && split_types ? n * vl : 0) : 0;
  const double chunk_grads = layer_grads * layers / s.layout.virtual_stages + head_grads;
  // (zbv and dualpipev: the buffers of the rank's chunks from their tables, as meshrun-train allocates them.)
  const double deferred = s.schedule == PipelineSchedule::zero_bubble ? std::min(rank + 1, micro)
                          : v_shape ? pipeline_.backward_buffers(s.schedule, l.pp, l.virtual_stages, micro)[rank] : 0;
  double ws = deferred * chunk_grads * A + s.layout.virtual_stages * std::max(layer_grads, head_grads) * A;
  // The layer workspace (one per rank): row-parallel outputs (nl and n rows), the MLP and attention
  // backward scratch (the MLP's holds the recomputed SwiGLU output too), the gathered norm output under
  // sequence parallelism, the experts' scratch.
  ws += (nl * h + n * h + n * ffn + n * qd + (s.batch.sequence_parallel ? n * h : 0) + rows_in * fe) * A;
  // Selective recomputation: the norm output a forward or a W computes without keeping it.
  if (s.recompute == Recompute::selective) ws += nl * h * A;
  // Context parallelism: K/V send and receive blocks and their gradients (all-gather: the gathered K/V and
  // dK/dV of all cp ranks too), one half-chunk's partial attention output and its log-sum-exp, for a ring
  // of more than one member. All-to-all (a group of G ranks): the head-sharded q, k, v, out, lse, dout, dq,
  // dk, dv (each the rank's own size), the send and receive buffers and the four int32 row permutations.
  if (s.layout.cp > 1) {
    const int G = std::max(1, cp_alltoall_group(cp_spec_, s.layout.cp));
    const double kv_block = double(s.batch.micro_batch_size) * double(s.batch.tokens_per_cp_rank) * kvd;
    const double half_chunk = double(s.batch.tokens_per_cp_rank) / 2;
    if (s.layout.cp / G > 1)
      ws += (8 * kv_block + (cp_ring_ ? 0 : 4 * kv_block * s.layout.cp) + half_chunk * qd / G) * A +
            half_chunk * hq / G * St;
    if (G > 1) ws += (6 * n * qd + 4 * kv_block) * A + 3 * n * hq * St + 4 * n * G * 4;
  }
  mem.workspace = ws;

  // ZeRO-3 gathers one layer's weights at a time (meshrun-train counts it in its transient peak).
  if (s.layout.zero_stage >= 3)
    mem.comm_buffers = 2.0 * (p_.attention + (moe ? p_.expert * double(m_.experts) / s.layout.ep : p_.mlp)) / t * pb_;
  mem.reserve = k_.reserve_gib * double(1 << 30);
  return mem;
}

void CostModel::memory(const Setting& s, const StageLayers& l, Cost* out) const {
  MemoryParts first = stage_memory(s, l.first, 0);
  if (s.layout.pp == 1) {
    out->memory = first;
    out->last_stage = false;
    return;
  }
  MemoryParts last = stage_memory(s, l.last, s.layout.pp - 1);
  out->last_stage = last.total() > first.total();
  out->memory = out->last_stage ? last : first;
}

}  // namespace meshrun::planner::detail
