// The single-device Llama model over the Backend seam (see model.hpp). Flat parameter, gradient and
// optimizer buffers; per-layer tensors are views into them, so AdamW is one multi-tensor call.
#include "meshrun/device/model.hpp"

#include <cmath>
#include <stdexcept>

namespace meshrun::device {

const char* const kFlopFormula =
    "6*N_matmul*tokens + 6*layers*batch*seq^2*heads*head_dim (causal attention), "
    "N_matmul = layers*(hidden*(heads+2*kv_heads)*head_dim + heads*head_dim*hidden + 3*hidden*ffn) + vocab*hidden";

std::string ModelConfig::problem() const {
  auto pos = [](std::int64_t v) { return v > 0; };
  if (!pos(vocab) || !pos(hidden) || !pos(layers) || !pos(heads) || !pos(kv_heads) || !pos(ffn) || !pos(seq) ||
      !pos(batch))
    return "every model size (vocab, hidden, layers, heads, kv_heads, ffn, seq, batch) must be positive";
  if (hidden % heads != 0) return "hidden must be a multiple of heads";
  if (heads % kv_heads != 0) return "heads must be a multiple of kv_heads";
  if (head_dim() % 2 != 0) return "hidden / heads (the head dimension) must be even for RoPE";
  if (vocab > (std::int64_t{1} << 31) - 1) return "vocab must fit a 32-bit token id";
  return "";
}

std::int64_t matmul_param_count(const ModelConfig& c) {
  const std::int64_t h = c.hidden, dh = c.head_dim();
  return c.layers * (h * (c.heads + 2 * c.kv_heads) * dh + c.heads * dh * h + 3 * h * c.ffn) + c.vocab * h;
}

std::int64_t param_count(const ModelConfig& c) {
  return matmul_param_count(c) + c.vocab * c.hidden + (2 * c.layers + 1) * c.hidden;
}

double train_flops_per_step(const ModelConfig& c) {
  const double attn = 6.0 * static_cast<double>(c.layers) * c.batch * static_cast<double>(c.seq) * c.seq * c.heads *
                      c.head_dim();
  return 6.0 * static_cast<double>(matmul_param_count(c)) * static_cast<double>(c.tokens()) + attn;
}

struct Model::Layer {
  Buf norm1, wq, wk, wv, wo, norm2, wg, wu, wd;              // weights (param dtype)
  Buf g_norm1, g_wq, g_wk, g_wv, g_wo, g_norm2, g_wg, g_wu, g_wd;
  Buf rstd1, xn1, q, k, v, att, lse, x2, rstd2, xn2, gate, up, hact;   // activations kept for the backward
};

namespace {
// splitmix64 of (seed, index) → uniform in [−a, a]: fast, reproducible and independent of the backend.
double hash_uniform(std::uint64_t seed, std::uint64_t i, double a) {
  std::uint64_t z = seed * 0x9e3779b97f4a7c15ull + i + 1;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return a * (2.0 * static_cast<double>(z >> 11) * 0x1.0p-53 - 1.0);
}
}  // namespace

Model::Model(Backend& be, const ModelConfig& c, std::uint64_t seed) : be_(be), c_(c), pr_(be.precision()) {
  if (std::string p = c.problem(); !p.empty()) throw std::invalid_argument("model: " + p);
  n_params_ = param_count(c);
  master_ = be_.alloc(n_params_, pr_.optim);
  param_ = pr_.has_master() ? be_.alloc(n_params_, pr_.param) : master_;
  grad_ = be_.alloc(n_params_, pr_.grad);
  m_ = be_.alloc(n_params_, pr_.optim);
  v_ = be_.alloc(n_params_, pr_.optim);
  be_.zero(m_);
  be_.zero(v_);
  be_.zero(grad_);

  // Carve the views in one fixed order; remember which ranges are norm weights (initialized to 1).
  std::int64_t off = 0;
  std::vector<std::pair<std::int64_t, std::int64_t>> ones;
  auto take = [&](Buf& w, Buf& g, std::int64_t n, bool is_norm) {
    w = param_.at(off, n);
    g = grad_.at(off, n);
    if (is_norm) ones.emplace_back(off, n);
    off += n;
  };
  const std::int64_t h = c.hidden, dh = c.head_dim();
  take(embed_, embed_g_, c.vocab * h, false);
  layers_.resize(static_cast<std::size_t>(c.layers));
  for (Layer& L : layers_) {
    take(L.norm1, L.g_norm1, h, true);
    take(L.wq, L.g_wq, c.heads * dh * h, false);
    take(L.wk, L.g_wk, c.kv_heads * dh * h, false);
    take(L.wv, L.g_wv, c.kv_heads * dh * h, false);
    take(L.wo, L.g_wo, h * c.heads * dh, false);
    take(L.norm2, L.g_norm2, h, true);
    take(L.wg, L.g_wg, c.ffn * h, false);
    take(L.wu, L.g_wu, c.ffn * h, false);
    take(L.wd, L.g_wd, h * c.ffn, false);
  }
  take(fnorm_, fnorm_g_, h, true);
  take(lm_, lm_g_, c.vocab * h, false);
  if (off != n_params_) throw std::logic_error("model: parameter table does not add up");

  // Matrices uniform with std 0.02 (a = 0.02·√3), norms 1.
  std::vector<float> init(static_cast<std::size_t>(n_params_));
  const double a = 0.02 * std::sqrt(3.0);
  for (std::int64_t i = 0; i < n_params_; ++i) init[i] = static_cast<float>(hash_uniform(seed, i, a));
  for (auto [o, n] : ones)
    for (std::int64_t i = 0; i < n; ++i) init[o + i] = 1.0f;
  be_.upload(master_, init.data());
  if (pr_.has_master()) be_.copy(param_, master_);
  alloc_acts();
}

Model::~Model() {
  for (Buf& b : owned_) be_.release(b);
  if (pr_.has_master()) be_.release(param_);
  be_.release(master_);
  be_.release(grad_);
  be_.release(m_);
  be_.release(v_);
}

Buf Model::act(std::int64_t n) {
  owned_.push_back(be_.alloc(n, pr_.param));
  return owned_.back();
}

void Model::alloc_acts() {
  const std::int64_t n = c_.tokens(), h = c_.hidden, dh = c_.head_dim(), f = c_.ffn;
  const std::int64_t nq = n * c_.heads * dh, nkv = n * c_.kv_heads * dh;
  auto stat = [&](std::int64_t k) {
    owned_.push_back(be_.alloc(k, pr_.stat));
    return owned_.back();
  };
  auto i32 = [&](std::int64_t k) {
    owned_.push_back(be_.alloc(k, DType::i32));
    return owned_.back();
  };
  for (std::int64_t l = 0; l <= c_.layers; ++l) x_.push_back(act(n * h));
  for (Layer& L : layers_) {
    L.rstd1 = stat(n);
    L.xn1 = act(n * h);
    L.q = act(nq);
    L.k = act(nkv);
    L.v = act(nkv);
    L.att = act(nq);
    L.lse = stat(n * c_.heads);
    L.x2 = act(n * h);
    L.rstd2 = stat(n);
    L.xn2 = act(n * h);
    L.gate = act(n * f);
    L.up = act(n * f);
    L.hact = act(n * f);
  }
  xf_ = act(n * h);
  rstd_f_ = stat(n);
  logits_ = stat(n * c_.vocab);
  dlogits_ = act(n * c_.vocab);
  ce_m_ = stat(n);
  ce_s_ = stat(n);
  ce_z_ = stat(n);
  ce_loss_ = stat(n);
  ws_h_ = act(n * h);
  ws_f_ = act(n * f);
  dgate_ = act(n * f);
  dup_ = act(n * f);
  dxn_ = act(n * h);
  datt_ = act(nq);
  dq_ = act(nq);
  dk_ = act(nkv);
  dv_ = act(nkv);
  dres_ = act(n * h);
  ids_ = i32(n);
  targets_ = i32(n);
  pos_ = i32(n);
  pos_seq_ = i32(c_.seq);
  std::vector<std::int32_t> pos(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) pos[i] = static_cast<std::int32_t>(i % c_.seq);
  be_.upload(pos_, pos.data());
  be_.upload(pos_seq_, pos.data());
}

void Model::layer_forward(int l) {
  Layer& L = layers_[l];
  const std::int64_t n = c_.tokens(), h = c_.hidden, dh = c_.head_dim(), hq = c_.heads, hkv = c_.kv_heads;
  const std::int64_t T = c_.seq;
  be_.rmsnorm_forward(L.xn1, L.rstd1, x_[l], L.norm1, n, h, c_.norm_eps);
  be_.linear_forward(L.q, L.xn1, L.wq, n, h, hq * dh);
  be_.linear_forward(L.k, L.xn1, L.wk, n, h, hkv * dh);
  be_.linear_forward(L.v, L.xn1, L.wv, n, h, hkv * dh);
  be_.rope_forward(L.q, pos_, n, hq, dh, c_.rope_theta);
  be_.rope_forward(L.k, pos_, n, hkv, dh, c_.rope_theta);
  const AttentionDims ad{T, T, hq, hkv, dh};
  const double scale = 1.0 / std::sqrt(static_cast<double>(dh));
  for (std::int64_t b = 0; b < c_.batch; ++b)
    be_.attention_forward(L.att.at(b * T * hq * dh, T * hq * dh), L.lse.at(b * T * hq, T * hq),
                          L.q.at(b * T * hq * dh, T * hq * dh), L.k.at(b * T * hkv * dh, T * hkv * dh),
                          L.v.at(b * T * hkv * dh, T * hkv * dh), pos_seq_, pos_seq_, ad, scale);
  be_.linear_forward(ws_h_, L.att, L.wo, n, hq * dh, h);
  be_.copy(L.x2, x_[l]);
  be_.add(L.x2, ws_h_);
  be_.rmsnorm_forward(L.xn2, L.rstd2, L.x2, L.norm2, n, h, c_.norm_eps);
  be_.linear_forward(L.gate, L.xn2, L.wg, n, h, c_.ffn);
  be_.linear_forward(L.up, L.xn2, L.wu, n, h, c_.ffn);
  be_.swiglu_forward(L.hact, L.gate, L.up, n * c_.ffn);
  be_.linear_forward(ws_h_, L.hact, L.wd, n, c_.ffn, h);
  be_.copy(x_[l + 1], L.x2);
  be_.add(x_[l + 1], ws_h_);
}

// dres_ holds the gradient at the layer's output on entry and at its input on return.
void Model::layer_backward(int l) {
  Layer& L = layers_[l];
  const std::int64_t n = c_.tokens(), h = c_.hidden, dh = c_.head_dim(), hq = c_.heads, hkv = c_.kv_heads;
  const std::int64_t T = c_.seq, f = c_.ffn;
  be_.linear_backward_input(ws_f_, dres_, L.wd, n, f, h, false);
  be_.linear_backward_weight(L.g_wd, dres_, L.hact, n, f, h);
  be_.swiglu_backward(dgate_, dup_, ws_f_, L.gate, L.up, n * f);
  be_.linear_backward_input(dxn_, dgate_, L.wg, n, h, f, false);
  be_.linear_backward_input(dxn_, dup_, L.wu, n, h, f, true);
  be_.linear_backward_weight(L.g_wg, dgate_, L.xn2, n, h, f);
  be_.linear_backward_weight(L.g_wu, dup_, L.xn2, n, h, f);
  be_.rmsnorm_backward(dres_, L.g_norm2, dxn_, L.x2, L.norm2, L.rstd2, n, h, true);

  be_.linear_backward_input(datt_, dres_, L.wo, n, hq * dh, h, false);
  be_.linear_backward_weight(L.g_wo, dres_, L.att, n, hq * dh, h);
  be_.zero(dq_);
  be_.zero(dk_);
  be_.zero(dv_);
  const AttentionDims ad{T, T, hq, hkv, dh};
  const double scale = 1.0 / std::sqrt(static_cast<double>(dh));
  const std::int64_t sq = T * hq * dh, skv = T * hkv * dh;
  for (std::int64_t b = 0; b < c_.batch; ++b)
    be_.attention_backward(dq_.at(b * sq, sq), dk_.at(b * skv, skv), dv_.at(b * skv, skv), datt_.at(b * sq, sq),
                           L.att.at(b * sq, sq), L.lse.at(b * T * hq, T * hq), L.q.at(b * sq, sq),
                           L.k.at(b * skv, skv), L.v.at(b * skv, skv), pos_seq_, pos_seq_, ad, scale);
  be_.rope_backward(dq_, pos_, n, hq, dh, c_.rope_theta);
  be_.rope_backward(dk_, pos_, n, hkv, dh, c_.rope_theta);
  be_.linear_backward_input(dxn_, dq_, L.wq, n, h, hq * dh, false);
  be_.linear_backward_input(dxn_, dk_, L.wk, n, h, hkv * dh, true);
  be_.linear_backward_input(dxn_, dv_, L.wv, n, h, hkv * dh, true);
  be_.linear_backward_weight(L.g_wq, dq_, L.xn1, n, h, hq * dh);
  be_.linear_backward_weight(L.g_wk, dk_, L.xn1, n, h, hkv * dh);
  be_.linear_backward_weight(L.g_wv, dv_, L.xn1, n, h, hkv * dh);
  be_.rmsnorm_backward(dres_, L.g_norm1, dxn_, x_[l], L.norm1, L.rstd1, n, h, true);
}

double Model::forward(const std::int32_t* tokens) {
  const std::int64_t n = c_.tokens(), T = c_.seq, V = c_.vocab, h = c_.hidden;
  host_ids_.resize(static_cast<std::size_t>(2 * n));
  for (std::int64_t b = 0; b < c_.batch; ++b)
    for (std::int64_t t = 0; t < T; ++t) {
      const std::int32_t in = tokens[b * (T + 1) + t], out = tokens[b * (T + 1) + t + 1];
      if (in < 0 || in >= V || out < 0 || out >= V) throw std::invalid_argument("model: token id outside the vocabulary");
      host_ids_[b * T + t] = in;
      host_ids_[n + b * T + t] = out;
    }
  be_.upload(ids_, host_ids_.data());
  be_.upload(targets_, host_ids_.data() + n);
  be_.embedding_forward(x_[0], embed_, ids_, n, h, 0, V);
  for (int l = 0; l < c_.layers; ++l) layer_forward(l);
  be_.rmsnorm_forward(xf_, rstd_f_, x_[c_.layers], fnorm_, n, h, c_.norm_eps);
  be_.linear_forward(logits_, xf_, lm_, n, h, V);
  be_.ce_row_max(ce_m_, logits_, n, V);
  be_.ce_row_sumexp(ce_s_, logits_, ce_m_, n, V);
  be_.ce_target_logit(ce_z_, logits_, targets_, n, V, 0);
  be_.ce_row_loss(ce_loss_, ce_m_, ce_s_, ce_z_, targets_, n);
  std::vector<double> loss(static_cast<std::size_t>(n));
  be_.download(loss.data(), ce_loss_);
  double s = 0;
  for (double x : loss) s += x;
  return s / static_cast<double>(n);
}

double Model::forward_backward(const std::int32_t* tokens) {
  const double loss = forward(tokens);
  const std::int64_t n = c_.tokens(), V = c_.vocab, h = c_.hidden;
  be_.zero(grad_);
  be_.ce_backward(dlogits_, logits_, ce_m_, ce_s_, targets_, n, V, 0, 1.0 / static_cast<double>(n));
  be_.linear_backward_input(dxn_, dlogits_, lm_, n, h, V, false);
  be_.linear_backward_weight(lm_g_, dlogits_, xf_, n, h, V);
  be_.rmsnorm_backward(dres_, fnorm_g_, dxn_, x_[c_.layers], fnorm_, rstd_f_, n, h, false);
  for (int l = static_cast<int>(c_.layers) - 1; l >= 0; --l) layer_backward(l);
  be_.embedding_backward(embed_g_, dres_, ids_, n, h, 0, V);
  return loss;
}

double Model::step(AdamW hp, double clip) {
  const double norm = std::sqrt(be_.sum_squares(std::span<const Buf>(&grad_, 1)));
  hp.grad_scale = clip > 0 && norm > clip ? clip / norm : 1.0;
  hp.step = ++adam_step_;
  const AdamTensor t{master_, m_, v_, grad_, param_};
  be_.adamw(std::span<const AdamTensor>(&t, 1), hp);
  return norm;
}

std::vector<double> Model::params() {
  std::vector<double> p(static_cast<std::size_t>(n_params_));
  be_.download(p.data(), master_);
  return p;
}

std::vector<double> Model::grads() {
  std::vector<double> g(static_cast<std::size_t>(n_params_));
  be_.download(g.data(), grad_);
  return g;
}

void Model::set_params(const std::vector<double>& p) {
  if (static_cast<std::int64_t>(p.size()) != n_params_) throw std::invalid_argument("model: wrong parameter count");
  be_.upload(master_, p.data());
  if (pr_.has_master()) be_.copy(param_, master_);
}

}  // namespace meshrun::device
