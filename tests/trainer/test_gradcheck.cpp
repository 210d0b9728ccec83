// Whole-model gradient check in float64: the hand-written backward of the full Llama (embedding, every
// decoder layer, final norm, lm_head, cross-entropy) against central finite differences of the loss,
// for every parameter. (The kernels' own per-op checks live in tests/kernels.)
#include <catch2/catch.hpp>

#include <algorithm>
#include <string>
#include <cmath>
#include <vector>

#include "meshrun/train/comm_names.hpp"
#include "meshrun/train/model/params.hpp"
#include "meshrun/train/parallel/stage.hpp"
#include "meshrun/train/parallel/zero.hpp"

using namespace meshrun;
using namespace meshrun::train;

namespace {

ModelSpec tiny_model() {
  ModelSpec m;
  m.layers = 2;
  m.hidden = 8;
  m.heads = 2;
  m.kv_heads = 1;  // grouped-query attention
  m.ffn_hidden = 12;
  m.vocab = 11;
  m.rope_theta = 100.0;  // large rotations at short positions, so RoPE matters
  return m;
}

// The same model with mixture-of-experts layers: 4 experts of width 6, top-2.
ModelSpec tiny_moe_model() {
  ModelSpec m = tiny_model();
  m.experts = 4;
  m.top_k = 2;
  m.moe_ffn_hidden = 6;
  return m;
}

struct Setup {
  ModelSpec spec;
  double aux_coef = 0;  // MoE: the load-balancing loss's weight (large, so its gradient matters)
  bool pooled = false;  // MoE: model.router_aux = "hf" (statistics pooled over the layers)
  std::int64_t head_rows = 0;  // > 0: the fused head's logits chunk (rows), instead of head_chunk_rows'
  ParamTable table = build_param_table(spec, 1, 0);
  std::unique_ptr<device::Backend> backend = device::strict_backend_requested() ? device::make_strict_cpu_backend("fp64")
                                                                             : device::make_cpu_backend("fp64");
  // Groups of one; their host copies open the backend's memory (the strict backend, as the trainer does).
  LocalComm local_tp, local_dp, local_ep, local_cp;
  comm::HostAccessComm tp = bracketed(local_tp), dp = bracketed(local_dp), ep_comm = bracketed(local_ep),
                 cp_comm = bracketed(local_cp);
  comm::HostAccessComm bracketed(Comm& c) {
    return comm::HostAccessComm(c, *backend);
  }
  ParamStore store{table, 0, dp, *backend};
  static constexpr std::int64_t S = 5, mbs = 2;
  BatchGeometry geometry = [] {
    TrainingSpec t;
    t.seq_len = S;
    t.micro_batch_size = mbs;
    t.global_batch_size = mbs;
    std::string err;
    return *batch_geometry(t, Layout{}, &err);
  }();
  LayerDims dims = [this] {
    LayerDims d = LayerDims::make(spec, geometry, 1, 0);
    if (head_rows > 0) d.head_rows = head_rows;
    return d;
  }();
  TensorParallel tpc{&tp, false, dims.n, dims.nl, dims.h, backend.get()};
  LayerWorkspace ws;
  device::DeviceBuffer pos = [this] {
    const std::vector<std::int32_t> p{0, 1, 2, 3, 4, 0, 1, 2, 3, 4};
    device::DeviceBuffer b(*backend, 10, device::DType::i32);
    backend->upload(b, p.data());
    return b;
  }();
  // The whole model as one pipeline chunk (embedding, both layers, head).
  ContextParallel cpc = [this] {
    ContextParallel c;  // a group of one: plain causal attention
    c.seq = S;
    c.mbs = mbs;
    c.hq = dims.hq;
    c.hkv = dims.hkv;
    c.dh = dims.dh;
    c.resize(*backend);
    return c;
  }();
  MoeStats stats;
  ExpertParallel epc = [this] {
    ExpertParallel e;  // one EP rank holding every expert
    e.be = backend.get();
    e.ep = &ep_comm;
    e.cp = &cp_comm;
    e.experts = spec.experts;
    e.top_k = spec.top_k;
    e.local = spec.experts;
    e.ffn = spec.moe_ffn_hidden;
    e.tokens = S * mbs;
    e.aux_coef = aux_coef;
    e.pooled = pooled;
    e.layers = spec.layers;
    e.stats = &stats;
    return e;
  }();
  Stage stage{chunk_units(table, {spec.layers}).front(), dims, tpc, cpc, table, store, ws, pos,
              spec.experts > 0 ? &epc : nullptr};
  std::vector<std::int32_t> ids{1, 5, 3, 9, 0, 7, 7, 2, 10, 4};
  std::vector<std::int32_t> tgt{5, 3, 9, 0, 6, 7, 2, 10, 4, 8};
  double scale = 1.0 / (S * mbs);

  void load() {
    backend->upload(stage.ids(0), ids.data());
    backend->upload(stage.targets(0), tgt.data());
  }

  explicit Setup(ModelSpec m = tiny_model(), double coef = 0, bool hf = false, std::int64_t chunk = 0)
      : spec(m), aux_coef(coef), pooled(hf), head_rows(chunk) {
    reset_stats();
    ws.resize(*backend, dims, false);
    for (std::size_t u = 0; u < table.units.size(); ++u) {
      std::vector<double> buf(table.units[u].size);
      init_unit(buf.data(), table.units[u], 3, spec.layers);
      // Norm weights away from 1 and matrices ×10 (std 0.2): O(1) activations, non-uniform attention,
      // so every op works beyond its linear regime.
      for (const TensorSlot& t : table.units[u].tensors)
        for (std::int64_t i = 0; i < t.numel(); ++i)
          buf[t.offset + i] = t.is_vector ? buf[t.offset + i] + 0.3 * std::sin(1.0 + i + t.offset) : buf[t.offset + i] * 10.0;
      store.write_unit<double>(int(u), buf.data());
    }
  }
  // Language-model loss plus the load-balancing loss (zero for a dense model).
  void reset_stats() { stats.reset(spec.layers, spec.experts, pooled ? 1 : 0); }
  double loss() {
    load();
    reset_stats();
    double l = stage.forward(0) * scale;
    if (pooled) l += pooled_aux_loss(epc);
    for (double a : stats.aux) l += a;
    stage.discard(0);
    return l;
  }
};

double rel_error(const std::vector<double>& a, const std::vector<double>& n) {
  double d = 0, na = 0, nn = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    d += (a[i] - n[i]) * (a[i] - n[i]);
    na += a[i] * a[i];
    nn += n[i] * n[i];
  }
  const double den = std::sqrt(std::max(na, nn));
  return den == 0 ? 0 : std::sqrt(d) / den;
}

// Analytic gradients (per unit) with the given loss scale, and numeric ones of loss()·1.
std::vector<std::vector<double>> analytic(Setup& s, double scale) {
  s.store.zero_grads();
  s.load();
  s.reset_stats();
  s.stage.forward(0);
  s.stage.backward_input(0, scale);
  s.stage.backward_weight(0);
  s.store.reduce_grads();
  std::vector<std::vector<double>> g;
  for (std::size_t u = 0; u < s.table.units.size(); ++u) {
    std::vector<double> p = s.store.read_grad_shard<double>(int(u));
    p.resize(static_cast<std::size_t>(s.table.units[u].size));
    g.push_back(std::move(p));
  }
  return g;
}

std::vector<std::vector<double>> numeric(Setup& s) {
  const double h = 1e-5;
  std::vector<std::vector<double>> g;
  for (std::size_t u = 0; u < s.table.units.size(); ++u) {
    std::vector<double> w = s.store.read_unit<double>(int(u));
    std::vector<double> gu(w.size());
    for (std::size_t i = 0; i < w.size(); ++i) {
      const double x = w[i];
      w[i] = x + h;
      s.store.write_unit<double>(int(u), w.data());
      const double lp = s.loss();
      w[i] = x - h;
      s.store.write_unit<double>(int(u), w.data());
      const double lm = s.loss();
      w[i] = x;
      s.store.write_unit<double>(int(u), w.data());
      gu[i] = (lp - lm) / (2 * h);
    }
    g.push_back(std::move(gu));
  }
  return g;
}

}  // namespace

TEST_CASE("whole-model float64 gradient check: every parameter within relative 1e-6", "[trainer][gradcheck]") {
  Setup s;
  const auto a = analytic(s, s.scale);
  const auto n = numeric(s);
  std::vector<double> all_a, all_n;
  for (std::size_t u = 0; u < a.size(); ++u) {
    // Per tensor, so a wrong gradient in a small tensor cannot hide behind a large one.
    for (const TensorSlot& t : s.table.units[u].tensors) {
      std::vector<double> ta(a[u].begin() + t.offset, a[u].begin() + t.offset + t.numel());
      std::vector<double> tn(n[u].begin() + t.offset, n[u].begin() + t.offset + t.numel());
      INFO(t.name);
      CHECK(rel_error(ta, tn) <= 1e-6);
      double norm = 0;
      for (double x : ta) norm += x * x;
      CHECK(norm > 0);  // every tensor really receives a gradient
    }
    all_a.insert(all_a.end(), a[u].begin(), a[u].end());
    all_n.insert(all_n.end(), n[u].begin(), n[u].end());
  }
  CHECK(rel_error(all_a, all_n) <= 1e-6);
}

TEST_CASE("gradient check detects a wrong gradient (loss scale off by 1%)", "[trainer][gradcheck]") {
  Setup s;
  const auto a = analytic(s, s.scale * 1.01);
  const auto n = numeric(s);
  std::vector<double> all_a, all_n;
  for (std::size_t u = 0; u < a.size(); ++u) {
    all_a.insert(all_a.end(), a[u].begin(), a[u].end());
    all_n.insert(all_n.end(), n[u].begin(), n[u].end());
  }
  CHECK(rel_error(all_a, all_n) > 1e-3);
}

// Mixture of experts: through the router (softmax), the top-k selection and its renormalised weights, the
// experts' SwiGLU on their row segments, the combine and the load-balancing loss (coefficient 0.5 so its
// gradient is a visible part of the router's). Top-k is piecewise constant: no routing tie lies within
// the finite-difference step here (checked by the per-tensor bound itself, which a flipped selection
// would break).
TEST_CASE("MoE float64 gradient check: router, top-k weights, experts and aux loss within 1e-6", "[trainer][gradcheck][moe]") {
  Setup s(tiny_moe_model(), 0.5);
  const auto a = analytic(s, s.scale);
  const auto n = numeric(s);
  int experts_seen = 0;
  for (std::size_t u = 0; u < a.size(); ++u)
    for (const TensorSlot& t : s.table.units[u].tensors) {
      std::vector<double> ta(a[u].begin() + t.offset, a[u].begin() + t.offset + t.numel());
      std::vector<double> tn(n[u].begin() + t.offset, n[u].begin() + t.offset + t.numel());
      INFO(t.name);
      CHECK(rel_error(ta, tn) <= 1e-6);
      double norm = 0;
      for (double x : ta) norm += x * x;
      CHECK(norm > 0);  // every expert got tokens, every tensor a gradient
      if (t.name.find(".experts.") != std::string::npos) ++experts_seen;
    }
  CHECK(experts_seen == 2 * 4 * 3);
  double aux = 0;
  for (double x : s.stats.aux) aux += x;
  CHECK(aux > 0);
}

TEST_CASE("MoE gradient check detects a missing aux-loss gradient", "[trainer][gradcheck][moe]") {
  Setup with_aux(tiny_moe_model(), 0.5), without_aux(tiny_moe_model(), 0.0);
  const auto a = analytic(without_aux, without_aux.scale);  // backward ignores the aux loss
  const auto n = numeric(with_aux);                         // the loss includes it
  const int u = with_aux.table.layer_unit(0);
  const TensorSlot& r = with_aux.table.units[u].tensors[kRouter];
  std::vector<double> ta(a[u].begin() + r.offset, a[u].begin() + r.offset + r.numel());
  std::vector<double> tn(n[u].begin() + r.offset, n[u].begin() + r.offset + r.numel());
  CHECK(rel_error(ta, tn) > 1e-3);
}

// model.router_aux = "hf": the aux loss of the statistics pooled over both layers (HF Mixtral's
// load_balancing_loss_func); its ∂/∂p reaches each layer's router from the pool in the backward.
TEST_CASE("MoE float64 gradient check with router_aux = hf (pooled over layers) within 1e-6", "[trainer][gradcheck][moe]") {
  Setup s(tiny_moe_model(), 0.5, true);
  REQUIRE(s.spec.layers == 2);
  const auto a = analytic(s, s.scale);
  const auto n = numeric(s);
  for (std::size_t u = 0; u < a.size(); ++u)
    for (const TensorSlot& t : s.table.units[u].tensors) {
      std::vector<double> ta(a[u].begin() + t.offset, a[u].begin() + t.offset + t.numel());
      std::vector<double> tn(n[u].begin() + t.offset, n[u].begin() + t.offset + t.numel());
      INFO(t.name);
      CHECK(rel_error(ta, tn) <= 1e-6);
    }
  CHECK(pooled_aux_loss(s.epc) > 0);
  // Negative: the meshrun convention's backward against the hf loss misses on the routers.
  Setup per_layer(tiny_moe_model(), 0.5, false);
  const auto b = analytic(per_layer, per_layer.scale);
  const int u = s.table.layer_unit(0);
  const TensorSlot& r = s.table.units[u].tensors[kRouter];
  CHECK(rel_error(std::vector<double>(b[u].begin() + r.offset, b[u].begin() + r.offset + r.numel()),
                  std::vector<double>(n[u].begin() + r.offset, n[u].begin() + r.offset + r.numel())) > 1e-3);
}

// The LM head fused with the cross-entropy computes its logits a chunk of rows at a time (and again in the
// backward); every kernel is row by row and every product's sums run in one order whatever the rows, so any
// chunk size gives the bits of one chunk, with W after B (zero-bubble: W recomputes the logits) or fused.
TEST_CASE("the fused LM head gives the same bits in chunks of any size, B then W or fused BW", "[trainer][head]") {
  struct Result {
    double loss = 0;
    std::vector<std::vector<double>> grads;
  };
  auto run = [](std::int64_t rows, bool fused, int target_shift = 0) {
    Setup s(tiny_model(), 0, false, rows);
    for (auto& t : s.tgt) t = (t + target_shift) % 11;
    CHECK(s.dims.head_rows == rows);
    CHECK(s.ws.logits.buf().n == rows * s.dims.vl);  // the workspace holds one chunk of logits, not the batch's
    s.store.zero_grads();
    s.load();
    s.reset_stats();
    Result r;
    r.loss = s.stage.forward(0);
    if (fused) {
      s.stage.backward_fused(0, s.scale);
    } else {
      s.stage.backward_input(0, s.scale);
      s.stage.backward_weight(0);
    }
    s.store.reduce_grads();
    for (std::size_t u = 0; u < s.table.units.size(); ++u) r.grads.push_back(s.store.read_grad_shard<double>(int(u)));
    return r;
  };
  const Result whole = run(10, false);  // one chunk: all 10 rows
  for (const std::int64_t rows : {1, 3, 7, 9})
    for (const bool fused : {false, true}) {
      INFO("chunk rows " << rows << (fused ? ", fused BW" : ", B then W"));
      const Result r = run(rows, fused);
      CHECK(r.loss == whole.loss);
      CHECK(r.grads == whole.grads);
    }
  // The comparison can fail: other targets change the loss and the head's gradients.
  const Result other = run(3, true, 1);
  CHECK(other.loss != whole.loss);
  CHECK(other.grads.back() != whole.grads.back());
}
