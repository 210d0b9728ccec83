#include "meshrun/train/model/layers.hpp"

#include <cmath>
#include <stdexcept>

namespace meshrun::train {

namespace {
constexpr bool kAcc = true;
Buf tensor(Buf unit, const TensorSlot& t) { return unit.at(t.offset, t.numel()); }
}  // namespace

LayerDims LayerDims::make(const ModelSpec& m, const BatchGeometry& g, int tp, int tp_rank) {
  LayerDims d;
  d.n = g.rows_per_microbatch;
  d.nl = g.rows_per_sp_rank;
  d.seq = g.tokens_per_cp_rank;
  d.mbs = g.micro_batch_size;
  d.h = m.hidden;
  d.dh = m.head_dim();
  d.hq = m.heads / tp;
  d.hkv = m.kv_heads / tp;
  d.ffn = m.experts > 0 ? 0 : m.ffn_hidden / tp;
  d.vl = m.vocab / tp;
  d.v0 = d.vl * tp_rank;
  d.head_rows = head_chunk_rows(d.n, d.h, d.vl);
  d.rope_theta = m.rope_theta;
  d.norm_eps = m.norm_eps;
  return d;
}

Recompute parse_recompute(const std::string& name) {
  if (name == "none") return Recompute::none;
  if (name == "selective") return Recompute::selective;
  if (name == "full") return Recompute::full;
  throw std::invalid_argument("training.recompute = \"" + name + "\": use \"none\", \"selective\" or \"full\"");
}

void DecoderActs::carve_forward(Carver& c, const LayerDims& d, Recompute keep, Buf input) {
  const std::int64_t n = d.n, nl = d.nl, h = d.h, qd = d.hq * d.dh, kvd = d.hkv * d.dh, f = d.ffn;
  kept = keep;
  x_in = input.p ? input : c.take(nl * h);
  if (keep == Recompute::full) return;
  const bool all = keep == Recompute::none;  // selective: not the norm outputs nor the MLP activation
  rstd1 = c.stat(nl); xn1 = all ? c.take(nl * h) : Buf{};
  q = c.take(n * qd); k = c.take(n * kvd); v = c.take(n * kvd); att = c.take(n * qd); lse = c.stat(n * d.hq);
  x2 = c.take(nl * h); rstd2 = c.stat(nl); xn2 = all ? c.take(nl * h) : Buf{};
  gate = c.take(n * f); up = c.take(n * f); hact = all ? c.take(n * f) : Buf{};
}

void DecoderActs::carve_backward(Carver& c, const LayerDims& d) {
  const std::int64_t n = d.n, nl = d.nl, h = d.h, qd = d.hq * d.dh, kvd = d.hkv * d.dh, f = d.ffn;
  dmlp = c.take(n * h); dgate = c.take(n * f); dup = c.take(n * f); dattn = c.take(n * h);
  dq = c.take(n * qd); dk = c.take(n * kvd); dv = c.take(n * kvd); dxn2 = c.take(nl * h); dxn1 = c.take(nl * h);
}

void HeadActs::carve_forward(Carver& c, const LayerDims& d) {
  xf_in = c.take(d.nl * d.h); rstd = c.stat(d.nl); xf = c.take(d.n * d.h);
  ce_max = c.stat(d.n); ce_sum = c.stat(d.n); ce_tgt = c.stat(d.n); ce_loss = c.stat(d.n);
}

void HeadActs::carve_backward(Carver& c, const LayerDims& d) { dxf = c.take(d.nl * d.h); }

void LayerWorkspace::resize(device::Backend& backend, const LayerDims& d, bool sequence_parallel,
                            Recompute mode) {
  be = &backend;
  recompute = mode;
  const DType t = backend.precision().param, st = backend.precision().stat;
  logits = device::DeviceBuffer(backend, std::max<std::int64_t>(1, d.head_rows * d.vl), st);
  // dlogits feed the lm_head products: activations' type (a buffer of its own only when that differs).
  if (st != t) dlogits = device::DeviceBuffer(backend, std::max<std::int64_t>(1, d.head_rows * d.vl), t);
  else dlogits.reset();
  auto make = [&](device::DeviceBuffer& b, std::int64_t n) {
    b = device::DeviceBuffer(backend, n, t);
    backend.zero(b);
  };
  make(nh, d.nl * d.h);
  make(nh_full, d.n * d.h);
  make(ff, d.n * d.ffn);
  make(att, d.n * d.hq * d.dh);
  make(xn_full, sequence_parallel ? d.n * d.h : 0);
  make(xn, mode == Recompute::selective ? d.nl * d.h : 0);
  if (mode == Recompute::full) {
    Carver size{Buf{nullptr, 0, t}, Buf{nullptr, 0, st}};
    DecoderActs probe;
    probe.carve_forward(size, d);
    make(layer, size.used - d.nl * d.h);  // all but x_in, which is the kept layer's (workspace_layer)
    layer_stat = device::DeviceBuffer(backend, std::max<std::int64_t>(1, size.stat_used), st);
    backend.zero(layer_stat);
    make(layer_out, d.nl * d.h);
  } else {
    layer.reset();
    layer_stat.reset();
    layer_out.reset();
  }
  layer_owner = nullptr;
}

std::int64_t LayerWorkspace::bytes() const {
  return nh.bytes() + nh_full.bytes() + ff.bytes() + att.bytes() + xn_full.bytes() + moe_scratch.bytes() +
         logits.bytes() + dlogits.bytes() + xn.bytes() + layer.bytes() + layer_stat.bytes() + layer_out.bytes();
}

// ---- embedding ---------------------------------------------------------------------------------------

void embedding_forward(const LayerDims& d, const TensorParallel& tp, const std::vector<TensorSlot>& ts, Buf w,
                       Buf ids, Buf x, LayerWorkspace& ws) {
  const Buf full = ws.nh_full.at(0, d.n * d.h);
  ws.be->embedding_forward(full, tensor(w, ts[0]), ids, d.n, d.h, d.v0, d.vl);
  tp.reduce_rows(full, x);
}

void embedding_backward_weight(const LayerDims& d, const TensorParallel& tp, const std::vector<TensorSlot>& ts,
                               Buf dw, Buf ids, Buf dx, LayerWorkspace& ws) {
  const Buf full = ws.nh_full.at(0, d.n * d.h);
  tp.gather_rows(dx, full);
  ws.be->embedding_backward(tensor(dw, ts[0]), full, ids, d.n, d.h, d.v0, d.vl);
}

// ---- decoder layer -----------------------------------------------------------------------------------

namespace {
// The attention's inputs: x_in, the first norm, q/k/v projections, RoPE at positions pos.
void attention_inputs(const LayerDims& d, const TensorParallel& tp, const std::vector<TensorSlot>& ts, Buf w,
                      DecoderActs& a, Buf x, Buf pos, LayerWorkspace& ws) {
  device::Backend& be = *ws.be;
  const std::int64_t n = d.n, nl = d.nl, h = d.h, dh = d.dh, qd = d.hq * d.dh, kvd = d.hkv * d.dh;
  auto W = [&](int t) { return tensor(w, ts[t]); };
  be.copy(a.x_in, x);
  be.rmsnorm_forward(a.xn1, a.rstd1, a.x_in, W(kLn1), nl, h, d.norm_eps);
  const Buf xn1 = tp.full_rows(a.xn1, ws.xn_full);
  be.linear_forward(a.q, xn1, W(kQ), n, h, qd);
  be.linear_forward(a.k, xn1, W(kK), n, h, kvd);
  be.linear_forward(a.v, xn1, W(kV), n, h, kvd);
  be.rope_forward(a.q, pos, n, d.hq, dh, d.rope_theta);
  be.rope_forward(a.k, pos, n, d.hkv, dh, d.rope_theta);
}

// From the attention's output a.att: o_proj, the residual, the second norm, the MLP (or the experts) and
// the residual: x becomes the layer's output.
void attention_output_and_mlp(const LayerDims& d, const TensorParallel& tp, const std::vector<TensorSlot>& ts, Buf w,
                              DecoderActs& a, Buf x, LayerWorkspace& ws, MoeLayer* moe) {
  device::Backend& be = *ws.be;
  const std::int64_t n = d.n, nl = d.nl, h = d.h, qd = d.hq * d.dh;
  auto W = [&](int t) { return tensor(w, ts[t]); };
  const Buf nh = ws.nh.at(0, nl * h), nh_full = ws.nh_full.at(0, n * h);
  // x2 = x_in + attention output. At tp 1 the residual add is folded into o_proj (Backend::
  // linear_forward_residual: the CPU's same two roundings, CUDA's beta = 1 product); a row-parallel output is a
  // partial sum, reduced before the add.
  be.copy(a.x2, a.x_in);
  const bool fold = tp.size() == 1;
  if (fold) {
    be.linear_forward_residual(a.x2, a.att, W(kO), n, qd, h, nh_full);
  } else {
    be.linear_forward(nh_full, a.att, W(kO), n, qd, h);
    tp.reduce_rows(nh_full, nh);
    be.add(a.x2, nh);
  }
  be.rmsnorm_forward(a.xn2, a.rstd2, a.x2, W(kLn2), nl, h, d.norm_eps);
  if (moe) {
    moe_forward(*moe->ep, tp, moe->layer, ts, w, moe->experts, *moe->ets, *moe->acts, a.xn2, nh, ws.xn_full,
                ws.nh_full);
  } else {
    const Buf xn2 = tp.full_rows(a.xn2, ws.xn_full);
    be.linear_forward(a.gate, xn2, W(kGate), n, h, d.ffn);
    be.linear_forward(a.up, xn2, W(kUp), n, h, d.ffn);
    be.swiglu_forward(a.hact, a.gate, a.up, n * d.ffn);
    if (fold) {  // x = x2 + the MLP's output, folded into down_proj
      be.copy(x, a.x2);
      be.linear_forward_residual(x, a.hact, W(kDown), n, d.ffn, h, nh_full);
      return;
    }
    be.linear_forward(nh_full, a.hact, W(kDown), n, d.ffn, h);
    tp.reduce_rows(nh_full, nh);
  }
  be.copy(x, a.x2);
  be.add(x, nh);
}
}  // namespace

namespace {
DecoderActs workspace_layer(const LayerDims& d, const DecoderActs& kept, LayerWorkspace& ws);
}  // namespace

void decoder_forward(const LayerDims& d, const TensorParallel& tp, ContextParallel& cp,
                     const std::vector<TensorSlot>& ts, Buf w, DecoderActs& a, Buf x, Buf pos, LayerWorkspace& ws,
                     MoeLayer* moe) {
  if (a.kept == Recompute::full) {  // only x_in is kept: the rest goes to the workspace's layer
    DecoderActs r = workspace_layer(d, a, ws);
    ws.layer_owner = nullptr;
    decoder_forward(d, tp, cp, ts, w, r, x, pos, ws, moe);
    return;
  }
  if (a.kept == Recompute::selective) {  // the norm outputs and the SwiGLU output only while they are read
    DecoderActs r = a;
    r.kept = Recompute::none;
    r.xn1 = r.xn2 = ws.xn.at(0, d.nl * d.h);  // xn1 is read by the q/k/v products, before xn2 is written
    r.hact = ws.ff.at(0, d.n * d.ffn);         // the MLP backward's scratch, idle in a forward
    decoder_forward(d, tp, cp, ts, w, r, x, pos, ws, moe);
    return;
  }
  attention_inputs(d, tp, ts, w, a, x, pos, ws);
  cp_attention_forward(cp, a.att, a.lse, a.q, a.k, a.v, pos, 1.0 / std::sqrt(static_cast<double>(d.dh)));
  attention_output_and_mlp(d, tp, ts, w, a, x, ws, moe);
}

void decoder_forward_cached(const LayerDims& d, const TensorParallel& tp, const std::vector<TensorSlot>& ts, Buf w,
                            DecoderActs& a, Buf x, Buf pos, LayerWorkspace& ws, MoeLayer* moe, Buf k_cache,
                            Buf v_cache, Buf cache_pos, std::int64_t cached) {
  device::Backend& be = *ws.be;
  const std::int64_t n = d.n, kvd = d.hkv * d.dh, seen = cached + n;
  attention_inputs(d, tp, ts, w, a, x, pos, ws);
  be.copy(k_cache.at(cached * kvd, n * kvd), a.k);
  be.copy(v_cache.at(cached * kvd, n * kvd), a.v);
  const device::AttentionDims ad{n, seen, d.hq, d.hkv, d.dh};
  be.attention_forward(a.att, a.lse, a.q, k_cache.at(0, seen * kvd), v_cache.at(0, seen * kvd), pos,
                       cache_pos.at(0, seen), ad, 1.0 / std::sqrt(static_cast<double>(d.dh)));
  attention_output_and_mlp(d, tp, ts, w, a, x, ws, moe);
}

void decoder_backward_input(const LayerDims& d, const TensorParallel& tp, ContextParallel& cp,
                            const std::vector<TensorSlot>& ts, Buf w, DecoderActs& a, Buf dy, Buf pos,
                            LayerWorkspace& ws, MoeLayer* moe) {
  if (a.kept == Recompute::full) throw std::logic_error("decoder_backward_input: a full-recompute layer's B needs decoder_recompute first");
  device::Backend& be = *ws.be;
  const std::int64_t n = d.n, nl = d.nl, h = d.h, dh = d.dh, qd = d.hq * d.dh, kvd = d.hkv * d.dh;
  auto W = [&](int t) { return tensor(w, ts[t]); };
  const Buf nh_full = ws.nh_full.at(0, n * h), ff = ws.ff.at(0, n * d.ffn), att = ws.att.at(0, n * qd);
  // MLP branch.
  tp.gather_rows(dy, a.dmlp);
  if (moe) {
    moe_backward_input(*moe->ep, tp, ts, w, moe->experts, *moe->ets, *moe->acts, a.dmlp, a.dxn2, ws.moe_scratch);
  } else {
    be.linear_backward_input(ff, a.dmlp, W(kDown), n, d.ffn, h, false);
    be.swiglu_backward(a.dgate, a.dup, ff, a.gate, a.up, n * d.ffn);
    be.linear_backward_input(nh_full, a.dgate, W(kGate), n, h, d.ffn, false);
    be.linear_backward_input(nh_full, a.dup, W(kUp), n, h, d.ffn, kAcc);
    tp.reduce_rows(nh_full, a.dxn2);
  }
  be.rmsnorm_backward_input(dy, a.dxn2, a.x2, W(kLn2), a.rstd2, nl, h, kAcc);
  // Attention branch; dy now holds d(x2).
  tp.gather_rows(dy, a.dattn);
  be.linear_backward_input(att, a.dattn, W(kO), n, qd, h, false);
  be.zero(a.dq);
  be.zero(a.dk);
  be.zero(a.dv);
  cp_attention_backward(cp, a.dq, a.dk, a.dv, att, a.att, a.lse, a.q, a.k, a.v, pos,
                        1.0 / std::sqrt(static_cast<double>(dh)));
  be.rope_backward(a.dq, pos, n, d.hq, dh, d.rope_theta);
  be.rope_backward(a.dk, pos, n, d.hkv, dh, d.rope_theta);
  be.linear_backward_input(nh_full, a.dq, W(kQ), n, h, qd, false);
  be.linear_backward_input(nh_full, a.dk, W(kK), n, h, kvd, kAcc);
  be.linear_backward_input(nh_full, a.dv, W(kV), n, h, kvd, kAcc);
  tp.reduce_rows(nh_full, a.dxn1);
  be.rmsnorm_backward_input(dy, a.dxn1, a.x_in, W(kLn1), a.rstd1, nl, h, kAcc);
}

void decoder_backward_weight(const LayerDims& d, const TensorParallel& tp, const std::vector<TensorSlot>& ts, Buf dw,
                             DecoderActs& a, LayerWorkspace& ws, MoeLayer* moe, Buf w) {
  device::Backend& be = *ws.be;
  const std::int64_t n = d.n, nl = d.nl, h = d.h, qd = d.hq * d.dh, kvd = d.hkv * d.dh;
  auto G = [&](int t) { return tensor(dw, ts[t]); };
  // Selective recomputation: each norm output again (its rstd rewritten with the same bits) into ws.xn, one
  // at a time, and the SwiGLU output into the MLP scratch (idle during W).
  const bool rebuild = a.kept == Recompute::selective;
  if (rebuild && !w.p) throw std::logic_error("decoder_backward_weight: a selective layer's W needs its weights");
  if (a.kept == Recompute::full) throw std::logic_error("decoder_backward_weight: a full-recompute layer's W needs decoder_recompute first");
  const Buf xn_rows = rebuild ? ws.xn.at(0, nl * h) : Buf{};
  if (rebuild) be.rmsnorm_forward(xn_rows, a.rstd2, a.x2, tensor(w, ts[kLn2]), nl, h, d.norm_eps);
  const Buf xn2 = tp.full_rows(rebuild ? xn_rows : a.xn2, ws.xn_full);  // sequence parallel: gathered again, as Megatron-SP does
  if (moe) {
    moe_router_backward_weight(*moe->ep, ts, dw, *moe->acts, xn2, n, h);  // experts: Stage, unit by unit
  } else {
    const Buf hact = rebuild ? ws.ff.at(0, n * d.ffn) : a.hact;
    if (rebuild) be.swiglu_forward(hact, a.gate, a.up, n * d.ffn);
    be.linear_backward_weight(G(kDown), a.dmlp, hact, n, d.ffn, h);
    be.linear_backward_weight(G(kGate), a.dgate, xn2, n, h, d.ffn);
    be.linear_backward_weight(G(kUp), a.dup, xn2, n, h, d.ffn);
  }
  be.rmsnorm_backward_weight(G(kLn2), a.dxn2, a.x2, a.rstd2, nl, h);
  be.linear_backward_weight(G(kO), a.dattn, a.att, n, qd, h);
  if (rebuild) be.rmsnorm_forward(xn_rows, a.rstd1, a.x_in, tensor(w, ts[kLn1]), nl, h, d.norm_eps);
  const Buf xn1 = tp.full_rows(rebuild ? xn_rows : a.xn1, ws.xn_full);
  be.linear_backward_weight(G(kQ), a.dq, xn1, n, h, qd);
  be.linear_backward_weight(G(kK), a.dk, xn1, n, h, kvd);
  be.linear_backward_weight(G(kV), a.dv, xn1, n, h, kvd);
  be.rmsnorm_backward_weight(G(kLn1), a.dxn1, a.x_in, a.rstd1, nl, h);
  // Under sequence parallelism each rank saw only its rows: complete the norm-weight gradients.
  tp.sum_replicated_grad(G(kLn1));
  tp.sum_replicated_grad(G(kLn2));
}

namespace {
// The workspace's decoder layer with kept's input and backward part (recompute = full).
DecoderActs workspace_layer(const LayerDims& d, const DecoderActs& kept, LayerWorkspace& ws) {
  if (ws.recompute != Recompute::full || kept.kept != Recompute::full)
    throw std::logic_error("decoder layer: a full-recompute layer without the workspace's layer to rebuild into");
  Carver c{ws.layer.buf(), ws.layer_stat.buf()};
  DecoderActs r;
  r.carve_forward(c, d, Recompute::none, kept.x_in);
  r.dmlp = kept.dmlp; r.dgate = kept.dgate; r.dup = kept.dup; r.dattn = kept.dattn;
  r.dq = kept.dq; r.dk = kept.dk; r.dv = kept.dv; r.dxn2 = kept.dxn2; r.dxn1 = kept.dxn1;
  return r;
}
}  // namespace

DecoderActs decoder_recompute(const LayerDims& d, const TensorParallel& tp, ContextParallel& cp,
                              const std::vector<TensorSlot>& ts, Buf w, const DecoderActs& kept, Buf pos,
                              LayerWorkspace& ws, MoeLayer* moe) {
  DecoderActs r = workspace_layer(d, kept, ws);
  if (ws.layer_owner == &kept) return r;
  // The forward from kept's input: x_in is rewritten with its own bits, the output goes to layer_out.
  const Buf x = ws.layer_out.at(0, d.nl * d.h);
  ws.be->copy(x, kept.x_in);
  decoder_forward(d, tp, cp, ts, w, r, x, pos, ws, moe);
  ws.layer_owner = &kept;
  return r;
}

// ---- head --------------------------------------------------------------------------------------------

namespace {
// The logits chunk of rows [r0, r0 + rows) (the lm_head product of the gathered norm output) and the buffer its
// gradient goes to.
struct HeadChunk {
  std::int64_t r0 = 0, rows = 0;
  Buf logits, dlogits;
};
template <class F>
void for_head_chunks(const LayerDims& d, Buf w_head, const HeadActs& a, LayerWorkspace& ws, F&& f) {
  device::Backend& be = *ws.be;
  const std::int64_t step = std::max<std::int64_t>(1, d.head_rows);
  for (std::int64_t r0 = 0; r0 < d.n; r0 += step) {
    HeadChunk c{r0, std::min(step, d.n - r0), {}, {}};
    c.logits = ws.logits.at(0, c.rows * d.vl);
    c.dlogits = ws.dlogits.buf().p ? ws.dlogits.at(0, c.rows * d.vl) : c.logits;
    be.linear_forward(c.logits, a.xf.at(r0 * d.h, c.rows * d.h), w_head, c.rows, d.h, d.vl);
    f(c);
  }
}
}  // namespace

double head_forward(const LayerDims& d, const TensorParallel& tp, const std::vector<TensorSlot>& ts, Buf w,
                    HeadActs& a, Buf x, Buf targets, LayerWorkspace& ws) {
  device::Backend& be = *ws.be;
  auto W = [&](int t) { return tensor(w, ts[t]); };
  const std::int64_t n = d.n, nl = d.nl, h = d.h;
  const Buf nh = ws.nh.at(0, nl * h);
  be.copy(a.xf_in, x);
  be.rmsnorm_forward(nh, a.rstd, a.xf_in, W(0), nl, h, d.norm_eps);
  tp.gather_rows(nh, a.xf);
  // Vocab-parallel cross-entropy from per-shard pieces (kernels/cpu.hpp), a chunk of rows at a time.
  const bool split = tp.size() > 1;
  for_head_chunks(d, W(1), a, ws, [&](const HeadChunk& c) {
    const Buf mx = a.ce_max.at(c.r0, c.rows), sm = a.ce_sum.at(c.r0, c.rows), tg = a.ce_tgt.at(c.r0, c.rows);
    be.ce_row_max(mx, c.logits, c.rows, d.vl);
    if (split) tp.tp->all_reduce(mx, ReduceOp::max);
    be.ce_row_sumexp(sm, c.logits, mx, c.rows, d.vl);
    if (split) tp.tp->all_reduce(sm, ReduceOp::sum);
    be.ce_target_logit(tg, c.logits, targets.at(c.r0, c.rows), c.rows, d.vl, d.v0);
    if (split) tp.tp->all_reduce(tg, ReduceOp::sum);
  });
  be.ce_row_loss(a.ce_loss, a.ce_max, a.ce_sum, a.ce_tgt, targets, n);
  // Σ in row order, in double, on the host (the backend hands the per-row losses over).
  std::vector<double> rows(static_cast<std::size_t>(n));
  be.download(rows.data(), a.ce_loss);
  double sum = 0;
  for (std::int64_t r = 0; r < n; ++r) sum += rows[static_cast<std::size_t>(r)];
  return sum;
}

void head_logits(const LayerDims& d, const TensorParallel& tp, const std::vector<TensorSlot>& ts, Buf w, HeadActs& a,
                 Buf x, Buf logits, LayerWorkspace& ws) {
  device::Backend& be = *ws.be;
  auto W = [&](int t) { return tensor(w, ts[t]); };
  const Buf nh = ws.nh.at(0, d.nl * d.h);
  be.copy(a.xf_in, x);
  be.rmsnorm_forward(nh, a.rstd, a.xf_in, W(0), d.nl, d.h, d.norm_eps);
  tp.gather_rows(nh, a.xf);
  be.linear_forward(logits, a.xf, W(1), d.n, d.h, d.vl);
}

void head_backward_input(const LayerDims& d, const TensorParallel& tp, const std::vector<TensorSlot>& ts, Buf w,
                         HeadActs& a, Buf targets, double loss_scale, Buf dx, LayerWorkspace& ws, Buf dw) {
  device::Backend& be = *ws.be;
  auto W = [&](int t) { return tensor(w, ts[t]); };
  const std::int64_t n = d.n, h = d.h;
  const Buf nh_full = ws.nh_full.at(0, n * h);
  a.loss_scale = loss_scale;
  a.weight_done = dw.p != nullptr;
  for_head_chunks(d, W(1), a, ws, [&](const HeadChunk& c) {
    be.ce_backward(c.dlogits, c.logits, a.ce_max.at(c.r0, c.rows), a.ce_sum.at(c.r0, c.rows),
                   targets.at(c.r0, c.rows), c.rows, d.vl, d.v0, loss_scale);
    be.linear_backward_input(nh_full.at(c.r0 * h, c.rows * h), c.dlogits, W(1), c.rows, h, d.vl, false);
    if (dw.p) be.linear_backward_weight(tensor(dw, ts[1]), c.dlogits, a.xf.at(c.r0 * h, c.rows * h), c.rows, h, d.vl);
  });
  tp.reduce_rows(nh_full, a.dxf);
  be.rmsnorm_backward_input(dx, a.dxf, a.xf_in, W(0), a.rstd, d.nl, h, false);
}

void head_backward_weight(const LayerDims& d, const TensorParallel& tp, const std::vector<TensorSlot>& ts, Buf w,
                          Buf dw, HeadActs& a, Buf targets, LayerWorkspace& ws) {
  device::Backend& be = *ws.be;
  auto G = [&](int t) { return tensor(dw, ts[t]); };
  if (!a.weight_done)
    for_head_chunks(d, tensor(w, ts[1]), a, ws, [&](const HeadChunk& c) {
      be.ce_backward(c.dlogits, c.logits, a.ce_max.at(c.r0, c.rows), a.ce_sum.at(c.r0, c.rows),
                     targets.at(c.r0, c.rows), c.rows, d.vl, d.v0, a.loss_scale);
      be.linear_backward_weight(G(1), c.dlogits, a.xf.at(c.r0 * d.h, c.rows * d.h), c.rows, d.h, d.vl);
    });
  be.rmsnorm_backward_weight(G(0), a.dxf, a.xf_in, a.rstd, d.nl, d.h);
  tp.sum_replicated_grad(G(0));
}

}  // namespace meshrun::train
