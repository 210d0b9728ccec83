// Step time of one setting (docs/planner.md, "Step time").
#include <algorithm>
#include <span>

#include "cost.hpp"

namespace meshrun::planner::detail {

double CostModel::gemm_fwd(double m, double n, double k, double count) const {
  return count * 2.0 * m * n * k / (hw_.bf16_tflops * 1e12 * gemm_efficiency(hw_, k_, m, n, k, count));
}

double CostModel::gemm_bwd(double m, double n, double k, double count) const {
  return gemm_fwd(m, k, n, count) + gemm_fwd(k, n, m, count);
}

LayerCost CostModel::layer_cost(const Setting& s, const AxisLinks& links) const {
  const double peak = hw_.bf16_tflops * 1e12;
  const double t = s.layout.tp, sp_div = s.batch.sequence_parallel ? t : 1.0;
  const double tokens = double(s.batch.rows_per_microbatch);
  const bool moe = m_.experts > 0;

  // One layer, one micro-batch. Each GEMM (and its two backward GEMMs) at its shape's share of the peak:
  // y = x·W with x of tokens × in, W of in × out (this rank's shard), after SP's all-gather of x.
  const double q_dim = double(m_.heads) * m_.head_dim();
  const double kv_dim = double(m_.kv_heads) * m_.head_dim();
  const double moe_ffn = m_.moe_ffn_hidden > 0 ? m_.moe_ffn_hidden : m_.ffn_hidden;
  const double h = m_.hidden, glu = m_.mlp == "gelu" ? 1.0 : 2.0;  // SwiGLU fuses gate and up
  struct Gemm { double rows, in, out, count; };
  Gemm gemms[5] = {{tokens, h, (q_dim + 2 * kv_dim) / t, 1}, {tokens, q_dim / t, h, 1}};
  int used = 2;
  if (moe) {
    // Each local expert gets tokens·top_k·ep/E rows under balanced routing, × planner.expert_imbalance on
    // the busiest rank (the step waits for it); one grouped GEMM per projection.
    const double rows = tokens * m_.top_k * s.layout.ep / m_.experts * imbalance_;
    const double local = double(m_.experts) / s.layout.ep;
    gemms[used++] = {tokens, h, double(m_.experts), 1};  // router
    gemms[used++] = {rows, h, glu * moe_ffn / t, local};
    gemms[used++] = {rows, moe_ffn / t, h, local};
  } else {
    gemms[used++] = {tokens, h, glu * m_.ffn_hidden / t, 1};
    gemms[used++] = {tokens, m_.ffn_hidden / t, h, 1};
  }
  double mm_fwd = 0, mm_bwd = 0, mm_bwd_weight = 0;
  for (const Gemm& g : std::span(gemms, used)) {
    mm_fwd += gemm_fwd(g.rows, g.out, g.in, g.count);
    mm_bwd += gemm_bwd(g.rows, g.out, g.in, g.count);
    mm_bwd_weight += gemm_fwd(g.in, g.out, g.rows, g.count);  // dW = xᵀ·dy, the second GEMM of gemm_bwd
  }
  // Attention: its matmul FLOPs at the fused kernel's efficiency, plus a cost per score (query-key pair, a
  // causal half of seq per query and head) that the CPU kernel pays in its softmax; the backward recomputes
  // the probabilities, so it pays the score cost once more (below).
  const double attn_flops_time =
      tokens * fwd_attention_flops_per_token_layer(m_, seq_) / t / (peak * k_.attention_efficiency);
  const double attn_score_time = tokens * m_.heads * (double(seq_) / 2) / t * k_.attention_score_s;
  const double attn_time = attn_flops_time + attn_score_time;
  // Memory-bound elementwise kernels, bytes per token. On the whole hidden state of every TP rank (split only
  // by sequence parallelism): two RMSNorms (read + write h), two residual adds (read 2h, write h) and, with
  // experts, dispatch and combine (read + write top_k·h each). On the rank's heads and FFN slice (÷ tp): RoPE
  // on Q and K, the activation function (read 2F, write F; GeLU read F, write F).
  const double f_act = moe ? m_.top_k * moe_ffn : double(m_.ffn_hidden);
  const double act_fn = (m_.mlp == "gelu" ? 2.0 : 3.0) * f_act;
  const double whole_bytes = act_ * (4.0 * h + 6.0 * h + (moe ? 4.0 * m_.top_k * h : 0.0)) / sp_div;
  // The CP ring merges each K/V block's partial attention output into the rank's accumulator (online
  // softmax: read the accumulator and the block's output, write the accumulator), once per block.
  // All-to-all CP (a group of A ranks: the ring runs over cp/A members, A·S/cp rows each for heads/A)
  // merges once per member; its head exchange copies q, k, v and out twice on the way there and back
  // (into the send buffer, out of the receive buffer: read + write each).
  const int cp_group = s.layout.cp > 1 ? std::max(1, cp_alltoall_group(cp_spec_, s.layout.cp)) : 1;
  const int ring_members = s.layout.cp / cp_group;
  const double ring_merges = ring_members > 1 && cp_ring_ ? double(ring_members) : 0.0;
  const double a2a_copies = cp_group > 1 ? 4.0 * (2.0 * q_dim + 2.0 * kv_dim) : 0.0;
  const double sliced_bytes = act_ * (2.0 * (q_dim + kv_dim) + act_fn + ring_merges * 3.0 * q_dim + a2a_copies) / t;
  const double elementwise_time =
      tokens * (whole_bytes + sliced_bytes) / (hw_.hbm_tbps * 1e12 * k_.memory_efficiency);
  // Selective recomputation re-runs the two norms and the activation function in the backward pass.
  LayerCost c;
  c.selective =
      tokens * act_ * (4.0 * h / sp_div + act_fn / t) / (hw_.hbm_tbps * 1e12 * k_.memory_efficiency);
  // Attention's matmuls and the elementwise kernels' backward: twice the forward work.
  const double attn_bwd = 2 * attn_flops_time + attn_score_time;
  const double routing = moe ? tokens * m_.top_k * k_.routing_assignment_s : 0.0;  // host work, forward
  c.fwd = mm_fwd + attn_time + elementwise_time + routing + k_.layer_overhead_s / 2;
  c.bwd = mm_bwd + attn_bwd + 2 * elementwise_time + k_.layer_overhead_s / 2;
  c.bwd_weight = mm_bwd_weight;
  c.parts = {mm_fwd + mm_bwd, attn_time + attn_bwd, 3 * elementwise_time};

  // Exposed collectives per layer per micro-batch and direction (backward moves the same volume), each
  // with its start-up latency (ring steps over the group, NCCL's model).
  const double tp_lat = ring_latency(s.layout.tp, links.tp_islands, links.tp);
  c.tp = s.layout.tp > 1 ? 4.0 * ((t - 1) / t * tokens * m_.hidden * act_ / collective_bandwidth(links.tp) + tp_lat) : 0.0;
  // CP: one all-gather of K, V (forward) or one reduce-scatter of dK, dV; time() counts how many.
  const double kv_bytes = double(seq_) * double(s.batch.micro_batch_size) * 2.0 * m_.kv_heads * m_.head_dim() / t * act_;
  c.cp = s.layout.cp > 1 ? double(s.layout.cp - 1) / s.layout.cp * kv_bytes / collective_bandwidth(links.cp) +
                        ring_latency(s.layout.cp, links.cp_islands, links.cp)
                  : 0.0;
  if (s.layout.cp > 1 && cp_ring_) {
    // Ring (the trainer's ContextParallel): G − 1 hops of one member's K/V block (G = cp/A members; the
    // block is the rank's own K/V size whatever A), each posted before the block in hand is computed.
    // With the zigzag split every hop computes 1/G of the member's attention, so a hop hides behind
    // attn/G of the forward and 2·attn/G of the backward. The backward also carries each block's dK/dV
    // home: G hops after the block's compute, exposed. alltoall (G = 1) has no hops.
    const int G = ring_members;
    const double hop = kv_bytes / s.layout.cp / bandwidth(links.cp) + p2p_latency(links.cp);
    c.cp_fwd = G > 1 ? (G - 1) * std::max(0.0, hop - attn_time / G) : 0.0;
    c.cp_bwd = G > 1 ? (G - 1) * std::max(0.0, hop - 2 * attn_time / G) + G * hop : 0.0;
    if (cp_group > 1) {
      // The head exchange inside the group, exposed: (A − 1)/A of what moves leaves the rank. Forward:
      // q, k, v there and out back (4 all-to-alls, the log-sum-exp a fifth); backward: q, k, v, out, dout
      // and the log-sum-exp there (nothing head-sharded is kept), dq, dk, dv back (9).
      const double A = cp_group, share = (A - 1) / A / bandwidth(links.cp_group);
      const double q_bytes = tokens * q_dim / t * act_, kv1 = tokens * kv_dim / t * act_;
      const double lse_bytes = tokens * double(m_.heads) / t * stat_;
      c.cp_fwd += (2 * q_bytes + 2 * kv1 + lse_bytes) * share + 5 * p2p_latency(links.cp_group);
      c.cp_bwd += (4 * q_bytes + 4 * kv1 + lse_bytes) * share + 9 * p2p_latency(links.cp_group);
    }
  } else {
    // All-gather: K, V gathered in the forward, gathered again in the backward (only the local shard is
    // saved) and dK, dV reduce-scattered.
    c.cp_fwd = c.cp;
    c.cp_bwd = 2 * c.cp;
  }
  // Dispatch or combine; the busiest rank receives (and returns) imbalance × the balanced rows.
  const double a2a_bytes = tokens * m_.top_k * m_.hidden * act_ / sp_div * imbalance_;
  c.ep = (moe && s.layout.ep > 1)
             ? 2.0 * (double(s.layout.ep - 1) / s.layout.ep * a2a_bytes / bandwidth(links.ep) +
                      p2p_latency(links.ep))
             : 0.0;
  c.head_fwd = gemm_fwd(tokens, double(m_.vocab) / t, h);
  // meshrun-train's head is fused with the cross-entropy and stores no logits: its backward computes them again.
  c.head_bwd = gemm_bwd(tokens, double(m_.vocab) / t, h) + (fused_head_ ? c.head_fwd : 0.0);
  c.head_bwd_weight = gemm_fwd(h, double(m_.vocab) / t, tokens);
  c.p2p = tokens * m_.hidden * act_ / sp_div / bandwidth(links.pp) + p2p_latency(links.pp);
  return c;
}

void CostModel::time(const Setting& s, const StageLayers& l, const AxisLinks& links, Cost* out) const {
  add_bubble(s, time_before_bubble(s, l, links, out), out);
}

void CostModel::add_bubble(const Setting& s, const PipelineCosts& pc, Cost* out) const {
  if (s.layout.pp > 1) {
    const int micro = int(s.batch.microbatches);
    out->time.pp_bubble += pipeline_.run(s.schedule, s.layout.pp, s.layout.virtual_stages, micro, pc).min_idle;
  }
  // Ranks outnumbering a node's CPUs take turns: the step lasts at least every rank's kernel work over the
  // CPUs (measured on this VM: 4 ranks on 2 CPUs each spend about a quarter of the one-rank kernel time
  // in kernels, so they do not run them at once; the rest of the step is waiting).
  if (hw_.core_share > 1) {
    TimeParts& t = out->time;
    t.shared_cores = std::max(0.0, hw_.core_share * (t.compute + t.recompute + t.optimizer + t.host) - t.step());
  }
}

double CostModel::bubble_lower_bound(const Setting& s, const PipelineCosts& pc) const {
  if (s.layout.pp == 1) return 0;
  const int micro = int(s.batch.microbatches);
  return pipeline_.idle_lower_bound(s.schedule, s.layout.pp, s.layout.virtual_stages, micro, pc);
}

PipelineCosts CostModel::time_before_bubble(const Setting& s, const StageLayers& l, const AxisLinks& links,
                                            Cost* out) const {
  return time_before_bubble(s, l, links, layer_cost(s, links), out);
}

PipelineCosts CostModel::time_before_bubble(const Setting& s, const StageLayers& l, const AxisLinks& links,
                                            const LayerCost& c, Cost* out) const {
  const double selective = s.recompute == Recompute::selective ? c.selective : 0.0;
  const int micro = int(s.batch.microbatches);
  const bool moe = m_.experts > 0;
  const double t = s.layout.tp;
  // Full recomputation re-runs the forward before B, and again before a W run apart from its B (zero-bubble).
  // (DualPipeV splits only a few backwards at its ends: costed as fused.)
  const bool split_w = s.schedule == PipelineSchedule::zero_bubble || s.schedule == PipelineSchedule::zbv;
  const bool v_shape = chunk_placement(s.schedule) == ChunkPlacement::v;
  const double again = s.recompute != Recompute::full ? 0.0 : split_w ? 2.0 : 1.0;
  // Zero-bubble: the head's W, run apart from its B, computes the logits once more.
  const double head_w_again = fused_head_ && split_w ? c.head_fwd : 0.0;

  // The slowest rank per micro-batch: most layers, or the head's rank's layers plus the output head (the last
  // rank; rank 0 in a V).
  struct PerMicroBatch {
    TimeParts p;
    double fwd = 0;  // the forward share of p.compute
  };
  auto per_mb = [&](int layers, bool with_head) {
    PerMicroBatch r;
    TimeParts& p = r.p;
    r.fwd = layers * c.fwd + (with_head ? c.head_fwd : 0);
    p.compute = layers * (c.fwd + c.bwd) + (with_head ? c.head_fwd + c.head_bwd + head_w_again : 0);
    p.compute_parts = {layers * c.parts.matmul + (with_head ? c.head_fwd + c.head_bwd + head_w_again : 0), layers * c.parts.attention,
                       layers * c.parts.elementwise};
    p.recompute = layers * (again * c.fwd + selective);
    p.tp_comm = layers * (2 + again) * c.tp;
    // CP (layer_cost): all-gather — forward gather, backward gather + reduce-scatter, full recomputation's
    // gather serving the backward; ring — the forward's hops again under full recomputation.
    p.cp_comm = layers * (c.cp_fwd + c.cp_bwd + (cp_ring_ ? again * c.cp_fwd : 0.0));
    p.ep_comm = layers * (2 + again) * c.ep;
    return r;
  };
  PerMicroBatch slowest = per_mb(l.max, false);
  const PerMicroBatch last = per_mb(v_shape ? l.first : l.last, true);
  if (last.p.step() > slowest.p.step()) slowest = last;
  const TimeParts& mb = slowest.p;
  // Compute windows of one micro-batch on this stage; recomputation runs inside the backward pass.
  const double t_f_stage = slowest.fwd, t_b_stage = mb.compute - slowest.fwd + mb.recompute;

  TimeParts step;
  step.compute = micro * mb.compute;
  step.compute_parts = {micro * mb.compute_parts.matmul, micro * mb.compute_parts.attention,
                        micro * mb.compute_parts.elementwise};
  step.recompute = micro * mb.recompute;
  step.tp_comm = micro * mb.tp_comm;
  step.cp_comm = micro * mb.cp_comm;
  step.ep_comm = micro * mb.ep_comm;
  // The pipeline bubble comes from the schedule's table simulated with these costs (add_bubble): each rank's
  // step is the makespan, of which the busiest rank computes the parts above, so its idle time is the
  // bubble. Per layer the forward carries its TP/CP/EP collectives, the backward the rest (recomputation,
  // the backward collectives); W is the weight-gradient GEMMs, which need no communication, and meshrun-train's
  // selective recomputation (it rebuilds the norm and SwiGLU outputs where W reads them); a W apart from its B
  // under full recomputation runs the forward again, collectives included.
  PipelineCosts pc;
  if (s.layout.pp > 1) {
    const double again_b = again > 0 ? 1.0 : 0.0, again_w = again - again_b;
    pc.f = c.fwd + c.tp + c.cp_fwd + c.ep;
    pc.w = c.bwd_weight + selective + again_w * (c.fwd + c.tp + c.ep + (cp_ring_ ? c.cp_fwd : 0.0));
    pc.b = c.bwd - c.bwd_weight + again_b * c.fwd + (1 + again_b) * (c.tp + c.ep) + c.cp_bwd +
           (cp_ring_ ? again_b * c.cp_fwd : 0.0);
    pc.head_f = c.head_fwd;
    pc.head_w = c.head_bwd_weight + head_w_again;
    pc.head_b = c.head_bwd - c.head_bwd_weight;
    pc.transfer = c.p2p;
    // Steady state: each chunk receives activations and sends gradients per micro-batch, overlapped.
    step.pp_bubble += k_.overlap_cost * micro * 2.0 * s.layout.virtual_stages * c.p2p;
  }

  // Data parallelism: collectives over dp·cp (dense) and the expert-data group, hidden behind the first
  // micro-batch's forward (parameter all-gather) and the last one's backward (gradient reduce-scatter).
  // The rank with the most weights: a full middle stage, or an end stage with the embedding / head.
  const double layer_params = p_.attention / t + p_.norms + (moe ? double(p_.router) : p_.mlp / t);
  const double end_params = double(p_.head > 0 ? p_.head : p_.embedding) / t;
  const int layers_dp = s.layout.pp == 1 ? l.max : std::max({l.max, l.first, l.last});
  // (In a V rank 0 holds the embedding and the head, as one rank does without a pipeline.)
  const double dense_params =
      s.layout.pp == 1 ? l.max * layer_params + double(p_.embedding + p_.head) / t
      : v_shape        ? std::max(l.max * layer_params, l.first * layer_params + double(p_.embedding + p_.head) / t)
                       : std::max(l.max * layer_params, std::max(l.first, l.last) * layer_params + end_params);
  const double expert_params = moe ? layers_dp * (double(m_.experts) / s.layout.ep) * p_.expert / t : 0.0;
  // A transfer of `comm` seconds behind a compute window: the excess is exposed, the hidden part slows
  // compute by overlap_cost.
  auto behind = [&](double comm, double window) {
    const double hidden = std::min(comm, window);
    return comm - hidden + k_.overlap_cost * hidden;
  };
  auto dp_exposed = [&](double params, double n, int islands, Link link) {
    if (n <= 1 || params <= 0) return 0.0;
    const double bw = collective_bandwidth(link), share = (n - 1) / n;
    const double calls = layers_dp * ring_latency(int(n), islands, link);  // issued per layer (bucket)
    const double ag = params * pb_ * share / bw + calls, rs = params * gb_ * share / bw + calls;
    switch (s.layout.zero_stage) {
      case 0: return behind(2 * rs, t_b_stage);
      case 1: return behind(rs, t_b_stage) + behind(ag, t_f_stage);
      case 2: return micro * behind(rs, t_b_stage) + behind(ag, t_f_stage);
      default: return micro * (behind(ag, t_f_stage) + behind(ag + rs, t_b_stage));
    }
  };
  const double n_dp = double(s.layout.dp) * s.layout.cp;
  step.dp_comm = dp_exposed(dense_params, n_dp, links.dp_islands, links.dp) +
                 dp_exposed(expert_params, n_dp / s.layout.ep, links.edp_islands, links.edp);

  // Optimizer step: read and write parameters, gradients and optimizer state of the local shard (ZeRO shards
  // dense weights over dp·cp, experts over their expert-data group, as the memory model does).
  const bool zero = s.layout.zero_stage >= 1;
  const double local_params =
      dense_params / (zero ? n_dp : 1.0) + expert_params / (zero ? std::max(1.0, n_dp / s.layout.ep) : 1.0);
  const double state_bytes = local_params * (pb_ + gb_ + ob_ * (2.0 + (pb_ != ob_)));
  step.optimizer = 2 * state_bytes / (hw_.hbm_tbps * 1e12 * k_.memory_efficiency);
  step.host = (dense_params + expert_params) * k_.host_bytes_per_param / (hw_.hbm_tbps * 1e12 * k_.memory_efficiency);
  out->time = step;
  return pc;
}

}  // namespace meshrun::planner::detail
