#include "meshrun/train/model.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include "meshrun/kernels/cpu.hpp"

namespace meshrun::train {

namespace kc = meshrun::kernels::cpu;
using kc::Store;

ModelDims ModelDims::from(const ModelSpec& m) {
  return ModelDims{m.layers, m.hidden, m.ffn_hidden, m.heads, m.kv_heads, m.head_dim(), m.vocab,
                   m.rope_theta, m.norm_eps};
}

namespace {
template <class T>
void resize(std::vector<T>& v, std::int64_t n) { v.assign(static_cast<std::size_t>(n), T(0)); }
template <class T>
void copy_n(const T* src, std::int64_t n, T* dst) { if (src != dst) std::copy(src, src + n, dst); }
}  // namespace

template <class T>
Model<T>::Model(const ModelDims& dims, const ParamTable& table, Comm& tp, bool sequence_parallel,
                std::int64_t seq_len, std::int64_t mbs)
    : d_(dims), table_(table), tp_(tp), sp_(sequence_parallel), seq_(seq_len), mbs_(mbs) {
  const int p = tp.size();
  n_ = mbs_ * seq_;
  if (sp_ && n_ % p != 0)
    throw std::invalid_argument("sequence parallelism needs micro_batch_size·seq_len (" + std::to_string(n_) +
                                ") divisible by parallel.tp (" + std::to_string(p) + ")");
  nl_ = sp_ ? n_ / p : n_;
  hq_ = d_.heads / p;
  hkv_ = d_.kv_heads / p;
  ffn_ = d_.ffn / p;
  vl_ = d_.vocab / p;
  v0_ = vl_ * tp.rank();
  pos_.resize(static_cast<std::size_t>(n_));
  for (std::int64_t i = 0; i < n_; ++i) pos_[i] = static_cast<std::int32_t>(i % seq_);
  const std::int64_t h = d_.hidden, dh = d_.head_dim;
  acts_.resize(static_cast<std::size_t>(d_.layers));
  for (LayerActs& a : acts_) {
    resize(a.x_in, nl_ * h); resize(a.rstd1, nl_); resize(a.xn1, nl_ * h);
    resize(a.q, n_ * hq_ * dh); resize(a.k, n_ * hkv_ * dh); resize(a.v, n_ * hkv_ * dh);
    resize(a.att, n_ * hq_ * dh); resize(a.lse, n_ * hq_);
    resize(a.x2, nl_ * h); resize(a.rstd2, nl_); resize(a.xn2, nl_ * h);
    resize(a.gate, n_ * ffn_); resize(a.up, n_ * ffn_); resize(a.hact, n_ * ffn_);
  }
  resize(x_, nl_ * h); resize(emb_full_, n_ * h); resize(xn_full_, sp_ && p > 1 ? n_ * h : 0);
  resize(xf_in_, nl_ * h); resize(rstd_f_, nl_); resize(xf_local_, nl_ * h); resize(xf_, n_ * h);
  resize(logits_, n_ * vl_); resize(ce_max_, n_); resize(ce_sum_, n_); resize(ce_tgt_, n_); resize(ce_loss_, n_);
  resize(buf_nh_, nl_ * h); resize(buf_nh2_, n_ * h); resize(buf_att_, n_ * hq_ * dh);
  resize(buf_ff_, n_ * ffn_); resize(buf_ff2_, n_ * ffn_);
  resize(dq_, n_ * hq_ * dh); resize(dk_, n_ * hkv_ * dh); resize(dv_, n_ * hkv_ * dh);
}

template <class T>
void Model<T>::reduce_rows(T* partial, T* out) {
  const std::int64_t h = d_.hidden;
  if (tp_.size() == 1) return copy_n(partial, n_ * h, out);
  if (sp_) return tp_.reduce_scatter(partial, out, nl_ * h);
  tp_.all_reduce(partial, n_ * h);
  copy_n(partial, n_ * h, out);
}

template <class T>
void Model<T>::gather_rows(const T* local, T* full) {
  if (tp_.size() == 1 || !sp_) return copy_n(local, nl_ * d_.hidden, full);
  tp_.all_gather(local, full, nl_ * d_.hidden);
}

template <class T>
const T* Model<T>::full_rows(const T* local) {
  if (tp_.size() == 1 || !sp_) return local;
  tp_.all_gather(local, xn_full_.data(), nl_ * d_.hidden);
  return xn_full_.data();
}

template <class T>
std::int64_t Model<T>::activation_bytes() const {
  std::int64_t n = 0;
  for (const LayerActs& a : acts_)
    for (const std::vector<T>* v : {&a.x_in, &a.rstd1, &a.xn1, &a.q, &a.k, &a.v, &a.att, &a.lse, &a.x2, &a.rstd2,
                                    &a.xn2, &a.gate, &a.up, &a.hact})
      n += static_cast<std::int64_t>(v->size());
  for (const std::vector<T>* v : {&x_, &emb_full_, &xf_in_, &rstd_f_, &xf_local_, &xf_, &logits_, &ce_max_, &ce_sum_,
                                  &ce_tgt_, &ce_loss_, &buf_nh_, &buf_nh2_, &buf_att_, &buf_ff_, &buf_ff2_, &dq_, &dk_,
                                  &dv_, &xn_full_})
    n += static_cast<std::int64_t>(v->size());
  return n * static_cast<std::int64_t>(sizeof(T));
}

template <class T>
void Model<T>::tp_sum_vector(T* v, std::int64_t n) {
  if (sp_ && tp_.size() > 1) tp_.all_reduce(v, n);
}

template <class T>
void Model<T>::layer_forward(const T* w, LayerActs& a, const T* x, T* y) {
  const auto& ts = table_.units[1].tensors;  // every layer unit has the same offsets
  const std::int64_t h = d_.hidden, dh = d_.head_dim, S = seq_;
  copy_n(x, nl_ * h, a.x_in.data());
  kc::rmsnorm_forward(a.xn1.data(), a.rstd1.data(), a.x_in.data(), w + ts[kLn1].offset, nl_, h, d_.norm_eps);
  const T* xn1 = full_rows(a.xn1.data());
  kc::linear_forward(a.q.data(), xn1, w + ts[kQ].offset, n_, h, hq_ * dh);
  kc::linear_forward(a.k.data(), xn1, w + ts[kK].offset, n_, h, hkv_ * dh);
  kc::linear_forward(a.v.data(), xn1, w + ts[kV].offset, n_, h, hkv_ * dh);
  kc::rope_forward(a.q.data(), pos_.data(), n_, hq_, dh, d_.rope_theta);
  kc::rope_forward(a.k.data(), pos_.data(), n_, hkv_, dh, d_.rope_theta);
  const kc::AttentionDims ad{S, S, hq_, hkv_, dh};
  const double scale = 1.0 / std::sqrt(static_cast<double>(dh));
  for (std::int64_t b = 0; b < mbs_; ++b)
    kc::attention_forward(a.att.data() + b * S * hq_ * dh, a.lse.data() + b * S * hq_, a.q.data() + b * S * hq_ * dh,
                          a.k.data() + b * S * hkv_ * dh, a.v.data() + b * S * hkv_ * dh, pos_.data(), pos_.data(),
                          ad, scale);
  kc::linear_forward(buf_nh2_.data(), a.att.data(), w + ts[kO].offset, n_, hq_ * dh, h);
  reduce_rows(buf_nh2_.data(), buf_nh_.data());
  for (std::int64_t i = 0; i < nl_ * h; ++i) a.x2[i] = a.x_in[i] + buf_nh_[i];
  kc::rmsnorm_forward(a.xn2.data(), a.rstd2.data(), a.x2.data(), w + ts[kLn2].offset, nl_, h, d_.norm_eps);
  const T* xn2 = full_rows(a.xn2.data());
  kc::linear_forward(a.gate.data(), xn2, w + ts[kGate].offset, n_, h, ffn_);
  kc::linear_forward(a.up.data(), xn2, w + ts[kUp].offset, n_, h, ffn_);
  kc::swiglu_forward(a.hact.data(), a.gate.data(), a.up.data(), n_ * ffn_);
  kc::linear_forward(buf_nh2_.data(), a.hact.data(), w + ts[kDown].offset, n_, ffn_, h);
  reduce_rows(buf_nh2_.data(), buf_nh_.data());
  for (std::int64_t i = 0; i < nl_ * h; ++i) y[i] = a.x2[i] + buf_nh_[i];
}

template <class T>
void Model<T>::layer_backward(const T* w, T* dw, LayerActs& a, T* dy) {
  const auto& ts = table_.units[1].tensors;
  const std::int64_t h = d_.hidden, dh = d_.head_dim, S = seq_;
  // MLP branch. a.hact is consumed by the weight gradient of down_proj, then reused for d(up).
  gather_rows(dy, buf_nh2_.data());
  kc::linear_backward_input(buf_ff_.data(), buf_nh2_.data(), w + ts[kDown].offset, n_, ffn_, h);
  kc::linear_backward_weight(dw + ts[kDown].offset, buf_nh2_.data(), a.hact.data(), n_, ffn_, h);
  kc::swiglu_backward(buf_ff2_.data(), a.hact.data(), buf_ff_.data(), a.gate.data(), a.up.data(), n_ * ffn_);
  const T* xn2 = full_rows(a.xn2.data());  // sequence parallel: gathered again, as Megatron-SP does
  kc::linear_backward_weight(dw + ts[kGate].offset, buf_ff2_.data(), xn2, n_, h, ffn_);
  kc::linear_backward_weight(dw + ts[kUp].offset, a.hact.data(), xn2, n_, h, ffn_);
  kc::linear_backward_input(buf_nh2_.data(), buf_ff2_.data(), w + ts[kGate].offset, n_, h, ffn_);
  kc::linear_backward_input(buf_nh2_.data(), a.hact.data(), w + ts[kUp].offset, n_, h, ffn_, Store::accumulate);
  reduce_rows(buf_nh2_.data(), buf_nh_.data());
  kc::rmsnorm_backward(dy, dw + ts[kLn2].offset, buf_nh_.data(), a.x2.data(), w + ts[kLn2].offset, a.rstd2.data(),
                       nl_, h, Store::accumulate);
  // Attention branch; dy now holds d(x2).
  gather_rows(dy, buf_nh2_.data());
  kc::linear_backward_input(buf_att_.data(), buf_nh2_.data(), w + ts[kO].offset, n_, hq_ * dh, h);
  kc::linear_backward_weight(dw + ts[kO].offset, buf_nh2_.data(), a.att.data(), n_, hq_ * dh, h);
  std::fill(dq_.begin(), dq_.end(), T(0));
  std::fill(dk_.begin(), dk_.end(), T(0));
  std::fill(dv_.begin(), dv_.end(), T(0));
  const kc::AttentionDims ad{S, S, hq_, hkv_, dh};
  const double scale = 1.0 / std::sqrt(static_cast<double>(dh));
  for (std::int64_t b = 0; b < mbs_; ++b) {
    const std::int64_t oq = b * S * hq_ * dh, okv = b * S * hkv_ * dh;
    kc::attention_backward(dq_.data() + oq, dk_.data() + okv, dv_.data() + okv, buf_att_.data() + oq,
                           a.att.data() + oq, a.lse.data() + b * S * hq_, a.q.data() + oq, a.k.data() + okv,
                           a.v.data() + okv, pos_.data(), pos_.data(), ad, scale);
  }
  kc::rope_backward(dq_.data(), pos_.data(), n_, hq_, dh, d_.rope_theta);
  kc::rope_backward(dk_.data(), pos_.data(), n_, hkv_, dh, d_.rope_theta);
  const T* xn1 = full_rows(a.xn1.data());
  kc::linear_backward_weight(dw + ts[kQ].offset, dq_.data(), xn1, n_, h, hq_ * dh);
  kc::linear_backward_weight(dw + ts[kK].offset, dk_.data(), xn1, n_, h, hkv_ * dh);
  kc::linear_backward_weight(dw + ts[kV].offset, dv_.data(), xn1, n_, h, hkv_ * dh);
  kc::linear_backward_input(buf_nh2_.data(), dq_.data(), w + ts[kQ].offset, n_, h, hq_ * dh);
  kc::linear_backward_input(buf_nh2_.data(), dk_.data(), w + ts[kK].offset, n_, h, hkv_ * dh, Store::accumulate);
  kc::linear_backward_input(buf_nh2_.data(), dv_.data(), w + ts[kV].offset, n_, h, hkv_ * dh, Store::accumulate);
  reduce_rows(buf_nh2_.data(), buf_nh_.data());
  kc::rmsnorm_backward(dy, dw + ts[kLn1].offset, buf_nh_.data(), a.x_in.data(), w + ts[kLn1].offset,
                       a.rstd1.data(), nl_, h, Store::accumulate);
  // Under sequence parallelism each rank saw only its rows: complete the norm-weight gradients.
  tp_sum_vector(dw + ts[kLn1].offset, h);
  tp_sum_vector(dw + ts[kLn2].offset, h);
}

template <class T>
double Model<T>::head_forward(const T* w, const std::int32_t* targets) {
  const auto& ts = table_.units[table_.head_unit()].tensors;
  const std::int64_t h = d_.hidden;
  copy_n(x_.data(), nl_ * h, xf_in_.data());
  kc::rmsnorm_forward(xf_local_.data(), rstd_f_.data(), xf_in_.data(), w + ts[0].offset, nl_, h, d_.norm_eps);
  gather_rows(xf_local_.data(), xf_.data());
  kc::linear_forward(logits_.data(), xf_.data(), w + ts[1].offset, n_, h, vl_);
  // Vocab-parallel cross-entropy from per-shard pieces (kernels/cpu.hpp).
  kc::ce_row_max(ce_max_.data(), logits_.data(), n_, vl_);
  if (tp_.size() > 1) tp_.all_reduce(ce_max_.data(), n_, ReduceOp::max);
  kc::ce_row_sumexp(ce_sum_.data(), logits_.data(), ce_max_.data(), n_, vl_);
  if (tp_.size() > 1) tp_.all_reduce(ce_sum_.data(), n_);
  kc::ce_target_logit(ce_tgt_.data(), logits_.data(), targets, n_, vl_, v0_);
  if (tp_.size() > 1) tp_.all_reduce(ce_tgt_.data(), n_);
  kc::ce_row_loss(ce_loss_.data(), ce_max_.data(), ce_sum_.data(), ce_tgt_.data(), targets, n_);
  double sum = 0;
  for (std::int64_t r = 0; r < n_; ++r) sum += static_cast<double>(ce_loss_[r]);
  return sum;
}

template <class T>
void Model<T>::head_backward(const T* w, T* dw, const std::int32_t* targets, double loss_scale, T* dx) {
  const auto& ts = table_.units[table_.head_unit()].tensors;
  const std::int64_t h = d_.hidden;
  kc::ce_backward(logits_.data(), logits_.data(), ce_max_.data(), ce_sum_.data(), targets, n_, vl_, v0_, loss_scale);
  kc::linear_backward_weight(dw + ts[1].offset, logits_.data(), xf_.data(), n_, h, vl_);
  kc::linear_backward_input(buf_nh2_.data(), logits_.data(), w + ts[1].offset, n_, h, vl_);
  reduce_rows(buf_nh2_.data(), buf_nh_.data());
  kc::rmsnorm_backward(dx, dw + ts[0].offset, buf_nh_.data(), xf_in_.data(), w + ts[0].offset, rstd_f_.data(), nl_, h);
  tp_sum_vector(dw + ts[0].offset, h);
}

template <class T>
double Model<T>::forward_impl(ParamStore<T>& store, const std::int32_t* ids, const std::int32_t* targets,
                              bool keep_head) {
  const std::int64_t h = d_.hidden;
  const int E = table_.embed_unit(), H = table_.head_unit();
  kc::embedding_forward(emb_full_.data(), store.acquire(E), ids, n_, h, v0_, vl_);
  store.release(E);
  reduce_rows(emb_full_.data(), x_.data());
  for (int l = 0; l < d_.layers; ++l) {
    layer_forward(store.acquire(table_.layer_unit(l)), acts_[l], x_.data(), x_.data());
    store.release(table_.layer_unit(l));
  }
  const double loss = head_forward(store.acquire(H), targets);
  if (!keep_head) store.release(H);
  return loss;
}

template <class T>
double Model<T>::forward(ParamStore<T>& store, const std::int32_t* ids, const std::int32_t* targets) {
  return forward_impl(store, ids, targets, false);
}

template <class T>
double Model<T>::forward_backward(ParamStore<T>& store, const std::int32_t* ids, const std::int32_t* targets,
                                  double loss_scale) {
  const int E = table_.embed_unit(), H = table_.head_unit();
  const double loss = forward_impl(store, ids, targets, true);
  head_backward(store.acquire(H), store.grad_begin(H), targets, loss_scale, x_.data());
  store.grad_end(H);
  store.release(H);
  for (int l = d_.layers - 1; l >= 0; --l) {
    const int u = table_.layer_unit(l);
    layer_backward(store.acquire(u), store.grad_begin(u), acts_[l], x_.data());
    store.grad_end(u);
    store.release(u);
  }
  gather_rows(x_.data(), buf_nh2_.data());
  kc::embedding_backward(store.grad_begin(E), buf_nh2_.data(), ids, n_, d_.hidden, v0_, vl_);
  store.grad_end(E);
  return loss;
}

template class Model<float>;
template class Model<double>;

}  // namespace meshrun::train
