#include "meshrun/train/model/layers.hpp"

#include <algorithm>
#include <cmath>

#include "meshrun/kernels/cpu.hpp"

namespace meshrun::train {

namespace kc = meshrun::kernels::cpu;
using kc::Store;

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
  kc::embedding_forward(ws.nh_full.data(), w + ts[0].offset, ids, d.n, d.h, d.v0, d.vl);
  tp.reduce_rows(ws.nh_full.data(), x);
}

template <class T>
void embedding_backward_weight(const LayerDims& d, const TensorParallel& tp, const std::vector<TensorSlot>& ts,
                               T* dw, const std::int32_t* ids, const T* dx, LayerWorkspace<T>& ws) {
  tp.gather_rows(dx, ws.nh_full.data());
  kc::embedding_backward(dw + ts[0].offset, ws.nh_full.data(), ids, d.n, d.h, d.v0, d.vl);
}

// ---- decoder layer -----------------------------------------------------------------------------------

template <class T>
void decoder_forward(const LayerDims& d, const TensorParallel& tp, ContextParallel<T>& cp,
                     const std::vector<TensorSlot>& ts, const T* w, DecoderActs<T>& a, T* x, const std::int32_t* pos,
                     LayerWorkspace<T>& ws, MoeLayer<T>* moe) {
  const std::int64_t n = d.n, nl = d.nl, h = d.h, dh = d.dh;
  std::copy(x, x + nl * h, a.x_in);
  kc::rmsnorm_forward(a.xn1, a.rstd1, a.x_in, w + ts[kLn1].offset, nl, h, d.norm_eps);
  const T* xn1 = tp.full_rows(a.xn1, ws.xn_full.data());
  kc::linear_forward(a.q, xn1, w + ts[kQ].offset, n, h, d.hq * dh);
  kc::linear_forward(a.k, xn1, w + ts[kK].offset, n, h, d.hkv * dh);
  kc::linear_forward(a.v, xn1, w + ts[kV].offset, n, h, d.hkv * dh);
  kc::rope_forward(a.q, pos, n, d.hq, dh, d.rope_theta);
  kc::rope_forward(a.k, pos, n, d.hkv, dh, d.rope_theta);
  cp_attention_forward(cp, a.att, a.lse, a.q, a.k, a.v, pos, 1.0 / std::sqrt(static_cast<double>(dh)));
  kc::linear_forward(ws.nh_full.data(), a.att, w + ts[kO].offset, n, d.hq * dh, h);
  tp.reduce_rows(ws.nh_full.data(), ws.nh.data());
  for (std::int64_t i = 0; i < nl * h; ++i) a.x2[i] = a.x_in[i] + ws.nh[i];
  kc::rmsnorm_forward(a.xn2, a.rstd2, a.x2, w + ts[kLn2].offset, nl, h, d.norm_eps);
  if (moe) {
    moe_forward(*moe->ep, tp, moe->layer, ts, w, moe->experts, *moe->ets, *moe->acts, a.xn2, ws.nh.data(), ws.xn_full,
                ws.nh_full);
  } else {
    const T* xn2 = tp.full_rows(a.xn2, ws.xn_full.data());
    kc::linear_forward(a.gate, xn2, w + ts[kGate].offset, n, h, d.ffn);
    kc::linear_forward(a.up, xn2, w + ts[kUp].offset, n, h, d.ffn);
    kc::swiglu_forward(a.hact, a.gate, a.up, n * d.ffn);
    kc::linear_forward(ws.nh_full.data(), a.hact, w + ts[kDown].offset, n, d.ffn, h);
    tp.reduce_rows(ws.nh_full.data(), ws.nh.data());
  }
  for (std::int64_t i = 0; i < nl * h; ++i) x[i] = a.x2[i] + ws.nh[i];
}

template <class T>
void decoder_backward_input(const LayerDims& d, const TensorParallel& tp, ContextParallel<T>& cp,
                            const std::vector<TensorSlot>& ts, const T* w, DecoderActs<T>& a, T* dy,
                            const std::int32_t* pos, LayerWorkspace<T>& ws, MoeLayer<T>* moe) {
  const std::int64_t n = d.n, nl = d.nl, h = d.h, dh = d.dh;
  // MLP branch.
  tp.gather_rows(dy, a.dmlp);
  if (moe) {
    moe_backward_input(*moe->ep, tp, ts, w, moe->experts, *moe->ets, *moe->acts, a.dmlp, a.dxn2, ws.moe_scratch);
  } else {
    kc::linear_backward_input(ws.ff.data(), a.dmlp, w + ts[kDown].offset, n, d.ffn, h);
    kc::swiglu_backward(a.dgate, a.dup, ws.ff.data(), a.gate, a.up, n * d.ffn);
    kc::linear_backward_input(ws.nh_full.data(), a.dgate, w + ts[kGate].offset, n, h, d.ffn);
    kc::linear_backward_input(ws.nh_full.data(), a.dup, w + ts[kUp].offset, n, h, d.ffn, Store::accumulate);
    tp.reduce_rows(ws.nh_full.data(), a.dxn2);
  }
  kc::rmsnorm_backward_input(dy, a.dxn2, a.x2, w + ts[kLn2].offset, a.rstd2, nl, h, Store::accumulate);
  // Attention branch; dy now holds d(x2).
  tp.gather_rows(dy, a.dattn);
  kc::linear_backward_input(ws.att.data(), a.dattn, w + ts[kO].offset, n, d.hq * dh, h);
  std::fill(a.dq, a.dq + n * d.hq * dh, T(0));
  std::fill(a.dk, a.dk + n * d.hkv * dh, T(0));
  std::fill(a.dv, a.dv + n * d.hkv * dh, T(0));
  cp_attention_backward(cp, a.dq, a.dk, a.dv, ws.att.data(), a.att, a.lse, a.q, a.k, a.v, pos,
                        1.0 / std::sqrt(static_cast<double>(dh)));
  kc::rope_backward(a.dq, pos, n, d.hq, dh, d.rope_theta);
  kc::rope_backward(a.dk, pos, n, d.hkv, dh, d.rope_theta);
  kc::linear_backward_input(ws.nh_full.data(), a.dq, w + ts[kQ].offset, n, h, d.hq * dh);
  kc::linear_backward_input(ws.nh_full.data(), a.dk, w + ts[kK].offset, n, h, d.hkv * dh, Store::accumulate);
  kc::linear_backward_input(ws.nh_full.data(), a.dv, w + ts[kV].offset, n, h, d.hkv * dh, Store::accumulate);
  tp.reduce_rows(ws.nh_full.data(), a.dxn1);
  kc::rmsnorm_backward_input(dy, a.dxn1, a.x_in, w + ts[kLn1].offset, a.rstd1, nl, h, Store::accumulate);
}

template <class T>
void decoder_backward_weight(const LayerDims& d, const TensorParallel& tp, const std::vector<TensorSlot>& ts, T* dw,
                             DecoderActs<T>& a, LayerWorkspace<T>& ws, MoeLayer<T>* moe) {
  const std::int64_t n = d.n, nl = d.nl, h = d.h, dh = d.dh;
  const T* xn2 = tp.full_rows(a.xn2, ws.xn_full.data());  // sequence parallel: gathered again, as Megatron-SP does
  if (moe) {
    moe_router_backward_weight(*moe->ep, ts, dw, *moe->acts, xn2, n, h);  // experts: Stage, unit by unit
  } else {
    kc::linear_backward_weight(dw + ts[kDown].offset, a.dmlp, a.hact, n, d.ffn, h);
    kc::linear_backward_weight(dw + ts[kGate].offset, a.dgate, xn2, n, h, d.ffn);
    kc::linear_backward_weight(dw + ts[kUp].offset, a.dup, xn2, n, h, d.ffn);
  }
  kc::rmsnorm_backward_weight(dw + ts[kLn2].offset, a.dxn2, a.x2, a.rstd2, nl, h);
  kc::linear_backward_weight(dw + ts[kO].offset, a.dattn, a.att, n, d.hq * dh, h);
  const T* xn1 = tp.full_rows(a.xn1, ws.xn_full.data());
  kc::linear_backward_weight(dw + ts[kQ].offset, a.dq, xn1, n, h, d.hq * dh);
  kc::linear_backward_weight(dw + ts[kK].offset, a.dk, xn1, n, h, d.hkv * dh);
  kc::linear_backward_weight(dw + ts[kV].offset, a.dv, xn1, n, h, d.hkv * dh);
  kc::rmsnorm_backward_weight(dw + ts[kLn1].offset, a.dxn1, a.x_in, a.rstd1, nl, h);
  // Under sequence parallelism each rank saw only its rows: complete the norm-weight gradients.
  tp.sum_replicated_grad(dw + ts[kLn1].offset, h);
  tp.sum_replicated_grad(dw + ts[kLn2].offset, h);
}

// ---- head --------------------------------------------------------------------------------------------

template <class T>
double head_forward(const LayerDims& d, const TensorParallel& tp, const std::vector<TensorSlot>& ts, const T* w,
                    HeadActs<T>& a, const T* x, const std::int32_t* targets, LayerWorkspace<T>& ws) {
  const std::int64_t n = d.n, nl = d.nl, h = d.h;
  std::copy(x, x + nl * h, a.xf_in);
  kc::rmsnorm_forward(ws.nh.data(), a.rstd, a.xf_in, w + ts[0].offset, nl, h, d.norm_eps);
  tp.gather_rows(ws.nh.data(), a.xf);
  kc::linear_forward(a.logits, a.xf, w + ts[1].offset, n, h, d.vl);
  // Vocab-parallel cross-entropy from per-shard pieces (kernels/cpu.hpp).
  const bool split = tp.size() > 1;
  kc::ce_row_max(a.ce_max, a.logits, n, d.vl);
  if (split) tp.tp->all_reduce(a.ce_max, n, ReduceOp::max);
  kc::ce_row_sumexp(a.ce_sum, a.logits, a.ce_max, n, d.vl);
  if (split) tp.tp->all_reduce(a.ce_sum, n);
  kc::ce_target_logit(a.ce_tgt, a.logits, targets, n, d.vl, d.v0);
  if (split) tp.tp->all_reduce(a.ce_tgt, n);
  kc::ce_row_loss(a.ce_loss, a.ce_max, a.ce_sum, a.ce_tgt, targets, n);
  double sum = 0;
  for (std::int64_t r = 0; r < n; ++r) sum += static_cast<double>(a.ce_loss[r]);
  return sum;
}

template <class T>
void head_backward_input(const LayerDims& d, const TensorParallel& tp, const std::vector<TensorSlot>& ts, const T* w,
                         HeadActs<T>& a, const std::int32_t* targets, double loss_scale, T* dx,
                         LayerWorkspace<T>& ws) {
  const std::int64_t n = d.n, h = d.h;
  kc::ce_backward(a.logits, a.logits, a.ce_max, a.ce_sum, targets, n, d.vl, d.v0, loss_scale);
  kc::linear_backward_input(ws.nh_full.data(), a.logits, w + ts[1].offset, n, h, d.vl);
  tp.reduce_rows(ws.nh_full.data(), a.dxf);
  kc::rmsnorm_backward_input(dx, a.dxf, a.xf_in, w + ts[0].offset, a.rstd, d.nl, h);
}

template <class T>
void head_backward_weight(const LayerDims& d, const TensorParallel& tp, const std::vector<TensorSlot>& ts, T* dw,
                          HeadActs<T>& a, LayerWorkspace<T>&) {
  kc::linear_backward_weight(dw + ts[1].offset, a.logits, a.xf, d.n, d.h, d.vl);
  kc::rmsnorm_backward_weight(dw + ts[0].offset, a.dxf, a.xf_in, a.rstd, d.nl, d.h);
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
