#include "meshrun/train/model/layers.hpp"

#include <algorithm>
#include <cmath>

#include "meshrun/device/backend.hpp"

namespace meshrun::train {

namespace {
// The layers' tensors are still host arrays here (the stage owns them); each kernel call hands the
// backend views of them. The CPU backend's memory is host memory, so the views are the arrays.
template <class T>
Buf B(const T* p, std::int64_t n) {
  return host_buf(p, n);
}
constexpr bool kAcc = true;
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
  d.rope_theta = m.rope_theta;
  d.norm_eps = m.norm_eps;
  return d;
}

template <class T>
void DecoderActs<T>::carve_forward(Carver<T>& c, const LayerDims& d) {
  const std::int64_t n = d.n, nl = d.nl, h = d.h, qd = d.hq * d.dh, kvd = d.hkv * d.dh, f = d.ffn;
  x_in = c.take(nl * h); rstd1 = c.take(nl); xn1 = c.take(nl * h);
  q = c.take(n * qd); k = c.take(n * kvd); v = c.take(n * kvd); att = c.take(n * qd); lse = c.take(n * d.hq);
  x2 = c.take(nl * h); rstd2 = c.take(nl); xn2 = c.take(nl * h);
  gate = c.take(n * f); up = c.take(n * f); hact = c.take(n * f);
}

template <class T>
void DecoderActs<T>::carve_backward(Carver<T>& c, const LayerDims& d) {
  const std::int64_t n = d.n, nl = d.nl, h = d.h, qd = d.hq * d.dh, kvd = d.hkv * d.dh, f = d.ffn;
  dmlp = c.take(n * h); dgate = c.take(n * f); dup = c.take(n * f); dattn = c.take(n * h);
  dq = c.take(n * qd); dk = c.take(n * kvd); dv = c.take(n * kvd); dxn2 = c.take(nl * h); dxn1 = c.take(nl * h);
}

template <class T>
void HeadActs<T>::carve_forward(Carver<T>& c, const LayerDims& d) {
  xf_in = c.take(d.nl * d.h); rstd = c.take(d.nl); xf = c.take(d.n * d.h); logits = c.take(d.n * d.vl);
  ce_max = c.take(d.n); ce_sum = c.take(d.n); ce_tgt = c.take(d.n); ce_loss = c.take(d.n);
}

template <class T>
void HeadActs<T>::carve_backward(Carver<T>& c, const LayerDims& d) {
  dxf = c.take(d.nl * d.h);
}

template <class T>
void LayerWorkspace<T>::resize(const LayerDims& d, bool sequence_parallel) {
  nh.assign(static_cast<std::size_t>(d.nl * d.h), T(0));
  nh_full.assign(static_cast<std::size_t>(d.n * d.h), T(0));
  ff.assign(static_cast<std::size_t>(d.n * d.ffn), T(0));
  att.assign(static_cast<std::size_t>(d.n * d.hq * d.dh), T(0));
  xn_full.assign(static_cast<std::size_t>(sequence_parallel ? d.n * d.h : 0), T(0));
}

template <class T>
std::int64_t LayerWorkspace<T>::bytes() const {
  return static_cast<std::int64_t>((nh.size() + nh_full.size() + ff.size() + att.size() + xn_full.size() +
                                    moe_scratch.capacity()) * sizeof(T));
}

// ---- embedding ---------------------------------------------------------------------------------------

template <class T>
void embedding_forward(const LayerDims& d, const TensorParallel& tp, const std::vector<TensorSlot>& ts, const T* w,
                       const std::int32_t* ids, T* x, LayerWorkspace<T>& ws) {
  device::Backend& be = *ws.be;
  be.embedding_forward(B(ws.nh_full.data(), d.n * d.h), B(w + ts[0].offset, ts[0].numel()), B(ids, d.n), d.n, d.h, d.v0, d.vl);
  tp.reduce_rows(ws.nh_full.data(), x);
}

template <class T>
void embedding_backward_weight(const LayerDims& d, const TensorParallel& tp, const std::vector<TensorSlot>& ts,
                               T* dw, const std::int32_t* ids, const T* dx, LayerWorkspace<T>& ws) {
  device::Backend& be = *ws.be;
  tp.gather_rows(dx, ws.nh_full.data());
  be.embedding_backward(B(dw + ts[0].offset, ts[0].numel()), B(ws.nh_full.data(), d.n * d.h), B(ids, d.n), d.n, d.h, d.v0, d.vl);
}

// ---- decoder layer -----------------------------------------------------------------------------------

template <class T>
void decoder_forward(const LayerDims& d, const TensorParallel& tp, ContextParallel<T>& cp,
                     const std::vector<TensorSlot>& ts, const T* w, DecoderActs<T>& a, T* x, const std::int32_t* pos,
                     LayerWorkspace<T>& ws, MoeLayer<T>* moe) {
  device::Backend& be = *ws.be;
  const std::int64_t qd = d.hq * d.dh, kvd = d.hkv * d.dh;
  auto W = [&](int t) { return B(w + ts[t].offset, ts[t].numel()); };
  const std::int64_t n = d.n, nl = d.nl, h = d.h, dh = d.dh;
  be.copy(B(a.x_in, nl * h), B(x, nl * h));
  be.rmsnorm_forward(B(a.xn1, nl * h), B(a.rstd1, nl), B(a.x_in, nl * h), W(kLn1), nl, h, d.norm_eps);
  const T* xn1 = tp.full_rows(a.xn1, ws.xn_full.data());
  be.linear_forward(B(a.q, n * qd), B(xn1, n * h), W(kQ), n, h, qd);
  be.linear_forward(B(a.k, n * kvd), B(xn1, n * h), W(kK), n, h, kvd);
  be.linear_forward(B(a.v, n * kvd), B(xn1, n * h), W(kV), n, h, kvd);
  be.rope_forward(B(a.q, n * qd), B(pos, n), n, d.hq, dh, d.rope_theta);
  be.rope_forward(B(a.k, n * kvd), B(pos, n), n, d.hkv, dh, d.rope_theta);
  cp_attention_forward(cp, a.att, a.lse, a.q, a.k, a.v, pos, 1.0 / std::sqrt(static_cast<double>(dh)));
  be.linear_forward(B(ws.nh_full.data(), n * h), B(a.att, n * qd), W(kO), n, qd, h);
  tp.reduce_rows(ws.nh_full.data(), ws.nh.data());
  be.copy(B(a.x2, nl * h), B(a.x_in, nl * h));  // x2 = x_in + attention output: one rounding, as before
  be.add(B(a.x2, nl * h), B(ws.nh.data(), nl * h));
  be.rmsnorm_forward(B(a.xn2, nl * h), B(a.rstd2, nl), B(a.x2, nl * h), W(kLn2), nl, h, d.norm_eps);
  if (moe) {
    moe_forward(*moe->ep, tp, moe->layer, ts, w, moe->experts, *moe->ets, *moe->acts, a.xn2, ws.nh.data(), ws.xn_full,
                ws.nh_full);
  } else {
    const T* xn2 = tp.full_rows(a.xn2, ws.xn_full.data());
    be.linear_forward(B(a.gate, n * d.ffn), B(xn2, n * h), W(kGate), n, h, d.ffn);
    be.linear_forward(B(a.up, n * d.ffn), B(xn2, n * h), W(kUp), n, h, d.ffn);
    be.swiglu_forward(B(a.hact, n * d.ffn), B(a.gate, n * d.ffn), B(a.up, n * d.ffn), n * d.ffn);
    be.linear_forward(B(ws.nh_full.data(), n * h), B(a.hact, n * d.ffn), W(kDown), n, d.ffn, h);
    tp.reduce_rows(ws.nh_full.data(), ws.nh.data());
  }
  be.copy(B(x, nl * h), B(a.x2, nl * h));
  be.add(B(x, nl * h), B(ws.nh.data(), nl * h));
}

template <class T>
void decoder_backward_input(const LayerDims& d, const TensorParallel& tp, ContextParallel<T>& cp,
                            const std::vector<TensorSlot>& ts, const T* w, DecoderActs<T>& a, T* dy,
                            const std::int32_t* pos, LayerWorkspace<T>& ws, MoeLayer<T>* moe) {
  device::Backend& be = *ws.be;
  const std::int64_t qd = d.hq * d.dh, kvd = d.hkv * d.dh;
  auto W = [&](int t) { return B(w + ts[t].offset, ts[t].numel()); };
  const std::int64_t n = d.n, nl = d.nl, h = d.h, dh = d.dh;
  // MLP branch.
  tp.gather_rows(dy, a.dmlp);
  if (moe) {
    moe_backward_input(*moe->ep, tp, ts, w, moe->experts, *moe->ets, *moe->acts, a.dmlp, a.dxn2, ws.moe_scratch);
  } else {
    be.linear_backward_input(B(ws.ff.data(), n * d.ffn), B(a.dmlp, n * h), W(kDown), n, d.ffn, h, false);
    be.swiglu_backward(B(a.dgate, n * d.ffn), B(a.dup, n * d.ffn), B(ws.ff.data(), n * d.ffn), B(a.gate, n * d.ffn), B(a.up, n * d.ffn), n * d.ffn);
    be.linear_backward_input(B(ws.nh_full.data(), n * h), B(a.dgate, n * d.ffn), W(kGate), n, h, d.ffn, false);
    be.linear_backward_input(B(ws.nh_full.data(), n * h), B(a.dup, n * d.ffn), W(kUp), n, h, d.ffn, kAcc);
    tp.reduce_rows(ws.nh_full.data(), a.dxn2);
  }
  be.rmsnorm_backward_input(B(dy, nl * h), B(a.dxn2, nl * h), B(a.x2, nl * h), W(kLn2), B(a.rstd2, nl), nl, h, kAcc);
  // Attention branch; dy now holds d(x2).
  tp.gather_rows(dy, a.dattn);
  be.linear_backward_input(B(ws.att.data(), n * qd), B(a.dattn, n * h), W(kO), n, qd, h, false);
  be.zero(B(a.dq, n * qd));
  be.zero(B(a.dk, n * kvd));
  be.zero(B(a.dv, n * kvd));
  cp_attention_backward(cp, a.dq, a.dk, a.dv, ws.att.data(), a.att, a.lse, a.q, a.k, a.v, pos,
                        1.0 / std::sqrt(static_cast<double>(dh)));
  be.rope_backward(B(a.dq, n * qd), B(pos, n), n, d.hq, dh, d.rope_theta);
  be.rope_backward(B(a.dk, n * kvd), B(pos, n), n, d.hkv, dh, d.rope_theta);
  be.linear_backward_input(B(ws.nh_full.data(), n * h), B(a.dq, n * qd), W(kQ), n, h, qd, false);
  be.linear_backward_input(B(ws.nh_full.data(), n * h), B(a.dk, n * kvd), W(kK), n, h, kvd, kAcc);
  be.linear_backward_input(B(ws.nh_full.data(), n * h), B(a.dv, n * kvd), W(kV), n, h, kvd, kAcc);
  tp.reduce_rows(ws.nh_full.data(), a.dxn1);
  be.rmsnorm_backward_input(B(dy, nl * h), B(a.dxn1, nl * h), B(a.x_in, nl * h), W(kLn1), B(a.rstd1, nl), nl, h, kAcc);
}

template <class T>
void decoder_backward_weight(const LayerDims& d, const TensorParallel& tp, const std::vector<TensorSlot>& ts, T* dw,
                             DecoderActs<T>& a, LayerWorkspace<T>& ws, MoeLayer<T>* moe) {
  device::Backend& be = *ws.be;
  const std::int64_t qd = d.hq * d.dh, kvd = d.hkv * d.dh;
  auto G = [&](int t) { return B(dw + ts[t].offset, ts[t].numel()); };
  const std::int64_t n = d.n, nl = d.nl, h = d.h;
  const T* xn2 = tp.full_rows(a.xn2, ws.xn_full.data());  // sequence parallel: gathered again, as Megatron-SP does
  if (moe) {
    moe_router_backward_weight(*moe->ep, ts, dw, *moe->acts, xn2, n, h);  // experts: Stage, unit by unit
  } else {
    be.linear_backward_weight(G(kDown), B(a.dmlp, n * h), B(a.hact, n * d.ffn), n, d.ffn, h);
    be.linear_backward_weight(G(kGate), B(a.dgate, n * d.ffn), B(xn2, n * h), n, h, d.ffn);
    be.linear_backward_weight(G(kUp), B(a.dup, n * d.ffn), B(xn2, n * h), n, h, d.ffn);
  }
  be.rmsnorm_backward_weight(G(kLn2), B(a.dxn2, nl * h), B(a.x2, nl * h), B(a.rstd2, nl), nl, h);
  be.linear_backward_weight(G(kO), B(a.dattn, n * h), B(a.att, n * qd), n, qd, h);
  const T* xn1 = tp.full_rows(a.xn1, ws.xn_full.data());
  be.linear_backward_weight(G(kQ), B(a.dq, n * qd), B(xn1, n * h), n, h, qd);
  be.linear_backward_weight(G(kK), B(a.dk, n * kvd), B(xn1, n * h), n, h, kvd);
  be.linear_backward_weight(G(kV), B(a.dv, n * kvd), B(xn1, n * h), n, h, kvd);
  be.rmsnorm_backward_weight(G(kLn1), B(a.dxn1, nl * h), B(a.x_in, nl * h), B(a.rstd1, nl), nl, h);
  // Under sequence parallelism each rank saw only its rows: complete the norm-weight gradients.
  tp.sum_replicated_grad(dw + ts[kLn1].offset, h);
  tp.sum_replicated_grad(dw + ts[kLn2].offset, h);
}

// ---- head --------------------------------------------------------------------------------------------

template <class T>
double head_forward(const LayerDims& d, const TensorParallel& tp, const std::vector<TensorSlot>& ts, const T* w,
                    HeadActs<T>& a, const T* x, const std::int32_t* targets, LayerWorkspace<T>& ws) {
  device::Backend& be = *ws.be;
  auto W = [&](int t) { return B(w + ts[t].offset, ts[t].numel()); };
  const std::int64_t n = d.n, nl = d.nl, h = d.h;
  be.copy(B(a.xf_in, nl * h), B(x, nl * h));
  be.rmsnorm_forward(B(ws.nh.data(), nl * h), B(a.rstd, nl), B(a.xf_in, nl * h), W(0), nl, h, d.norm_eps);
  tp.gather_rows(ws.nh.data(), a.xf);
  be.linear_forward(B(a.logits, n * d.vl), B(a.xf, n * h), W(1), n, h, d.vl);
  // Vocab-parallel cross-entropy from per-shard pieces (kernels/cpu.hpp).
  const bool split = tp.size() > 1;
  be.ce_row_max(B(a.ce_max, n), B(a.logits, n * d.vl), n, d.vl);
  if (split) tp.tp->all_reduce(a.ce_max, n, ReduceOp::max);
  be.ce_row_sumexp(B(a.ce_sum, n), B(a.logits, n * d.vl), B(a.ce_max, n), n, d.vl);
  if (split) tp.tp->all_reduce(a.ce_sum, n);
  be.ce_target_logit(B(a.ce_tgt, n), B(a.logits, n * d.vl), B(targets, n), n, d.vl, d.v0);
  if (split) tp.tp->all_reduce(a.ce_tgt, n);
  be.ce_row_loss(B(a.ce_loss, n), B(a.ce_max, n), B(a.ce_sum, n), B(a.ce_tgt, n), B(targets, n), n);
  // Σ in row order, in double, on the host (the backend hands the per-row losses over).
  std::vector<double> rows(static_cast<std::size_t>(n));
  be.download(rows.data(), B(a.ce_loss, n));
  double sum = 0;
  for (std::int64_t r = 0; r < n; ++r) sum += rows[static_cast<std::size_t>(r)];
  return sum;
}

template <class T>
void head_backward_input(const LayerDims& d, const TensorParallel& tp, const std::vector<TensorSlot>& ts, const T* w,
                         HeadActs<T>& a, const std::int32_t* targets, double loss_scale, T* dx,
                         LayerWorkspace<T>& ws) {
  device::Backend& be = *ws.be;
  auto W = [&](int t) { return B(w + ts[t].offset, ts[t].numel()); };
  const std::int64_t n = d.n, h = d.h;
  be.ce_backward(B(a.logits, n * d.vl), B(a.logits, n * d.vl), B(a.ce_max, n), B(a.ce_sum, n), B(targets, n), n, d.vl, d.v0, loss_scale);
  be.linear_backward_input(B(ws.nh_full.data(), n * h), B(a.logits, n * d.vl), W(1), n, h, d.vl, false);
  tp.reduce_rows(ws.nh_full.data(), a.dxf);
  be.rmsnorm_backward_input(B(dx, d.nl * h), B(a.dxf, d.nl * h), B(a.xf_in, d.nl * h), W(0), B(a.rstd, d.nl), d.nl, h, false);
}

template <class T>
void head_backward_weight(const LayerDims& d, const TensorParallel& tp, const std::vector<TensorSlot>& ts, T* dw,
                          HeadActs<T>& a, LayerWorkspace<T>& ws) {
  device::Backend& be = *ws.be;
  auto G = [&](int t) { return B(dw + ts[t].offset, ts[t].numel()); };
  be.linear_backward_weight(G(1), B(a.logits, d.n * d.vl), B(a.xf, d.n * d.h), d.n, d.h, d.vl);
  be.rmsnorm_backward_weight(G(0), B(a.dxf, d.nl * d.h), B(a.xf_in, d.nl * d.h), B(a.rstd, d.nl), d.nl, d.h);
  tp.sum_replicated_grad(dw + ts[0].offset, d.h);
}

#define MESHRUN_LAYERS_INSTANTIATE(T)                                                                              \
  template struct DecoderActs<T>;                                                                                  \
  template struct HeadActs<T>;                                                                                     \
  template struct LayerWorkspace<T>;                                                                               \
  template void embedding_forward<T>(const LayerDims&, const TensorParallel&, const std::vector<TensorSlot>&,      \
                                     const T*, const std::int32_t*, T*, LayerWorkspace<T>&);                      \
  template void embedding_backward_weight<T>(const LayerDims&, const TensorParallel&,                              \
                                             const std::vector<TensorSlot>&, T*, const std::int32_t*, const T*,    \
                                             LayerWorkspace<T>&);                                                  \
  template void decoder_forward<T>(const LayerDims&, const TensorParallel&, ContextParallel<T>&,                   \
                                   const std::vector<TensorSlot>&, const T*, DecoderActs<T>&, T*,                  \
                                   const std::int32_t*, LayerWorkspace<T>&, MoeLayer<T>*);                        \
  template void decoder_backward_input<T>(const LayerDims&, const TensorParallel&, ContextParallel<T>&,            \
                                          const std::vector<TensorSlot>&, const T*, DecoderActs<T>&, T*,           \
                                          const std::int32_t*, LayerWorkspace<T>&, MoeLayer<T>*);                 \
  template void decoder_backward_weight<T>(const LayerDims&, const TensorParallel&,                                \
                                           const std::vector<TensorSlot>&, T*, DecoderActs<T>&,                    \
                                           LayerWorkspace<T>&, MoeLayer<T>*);                                      \
  template double head_forward<T>(const LayerDims&, const TensorParallel&, const std::vector<TensorSlot>&,         \
                                  const T*, HeadActs<T>&, const T*, const std::int32_t*, LayerWorkspace<T>&);      \
  template void head_backward_input<T>(const LayerDims&, const TensorParallel&, const std::vector<TensorSlot>&,    \
                                       const T*, HeadActs<T>&, const std::int32_t*, double, T*,                    \
                                       LayerWorkspace<T>&);                                                        \
  template void head_backward_weight<T>(const LayerDims&, const TensorParallel&, const std::vector<TensorSlot>&,   \
                                        T*, HeadActs<T>&, LayerWorkspace<T>&);
MESHRUN_LAYERS_INSTANTIATE(float)
MESHRUN_LAYERS_INSTANTIATE(double)
#undef MESHRUN_LAYERS_INSTANTIATE

}  // namespace meshrun::train
