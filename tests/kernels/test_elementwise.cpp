// RMSNorm, RoPE, SwiGLU and GeLU: float64 gradient checks plus independent forward references.
#include <catch2/catch.hpp>
#include <cmath>

#include "gradcheck.hpp"
#include "meshrun/kernels/cpu.hpp"

namespace k = meshrun::kernels::cpu;
using namespace meshrun::kernels::test;

TEST_CASE("rmsnorm forward matches its definition", "[kernels][rmsnorm]") {
  const int rows = 3, dim = 10;
  Vec x = random_vec(rows * dim, 1), w = random_vec(dim, 2), y(rows * dim), rstd(rows);
  k::rmsnorm_forward(y.data(), rstd.data(), x.data(), w.data(), rows, dim, 1e-5);
  for (int r = 0; r < rows; ++r) {
    double ms = 0;
    for (int j = 0; j < dim; ++j) ms += x[r * dim + j] * x[r * dim + j] / dim;
    CHECK(rstd[r] == Approx(1 / std::sqrt(ms + 1e-5)).epsilon(1e-14));
    for (int j = 0; j < dim; ++j)
      CHECK(y[r * dim + j] == Approx(x[r * dim + j] / std::sqrt(ms + 1e-5) * w[j]).epsilon(1e-13));
  }
}

TEST_CASE("rmsnorm backward matches float64 central differences", "[kernels][rmsnorm][gradcheck]") {
  const int rows = 4, dim = 12;
  Vec x = random_vec(rows * dim, 3), w = random_vec(dim, 4, 0.5, 1.5), r = random_vec(rows * dim, 5);
  Vec y(rows * dim), rstd(rows);
  auto loss = [&] {
    k::rmsnorm_forward(y.data(), rstd.data(), x.data(), w.data(), rows, dim, 1e-6);
    return dot(y, r);
  };
  const Vec gx = numeric_grad(x, loss), gw = numeric_grad(w, loss);
  loss();
  const Vec wprior = random_vec(dim, 6);
  Vec dx(rows * dim, 9.0), dw = wprior;
  k::rmsnorm_backward(dx.data(), dw.data(), r.data(), x.data(), w.data(), rstd.data(), rows, dim);
  CHECK(rel_error(dx, gx) <= kGradTol);
  CHECK(rel_error(minus(dw, wprior), gw) <= kGradTol);
  const Vec xprior = random_vec(rows * dim, 7);
  Vec dx_acc = xprior, dw2(dim, 0.0);
  k::rmsnorm_backward(dx_acc.data(), dw2.data(), r.data(), x.data(), w.data(), rstd.data(), rows, dim,
                      k::Store::accumulate);
  CHECK(rel_error(minus(dx_acc, xprior), gx) <= kGradTol);
}

TEST_CASE("rmsnorm backward split into input and weight halves equals the fused kernel bit for bit",
          "[kernels][rmsnorm]") {
  // Pipelines that defer weight gradients (zero-bubble B/W) call the halves at different times; the
  // numbers must not depend on the schedule. float32, where a changed operation order would show.
  const int rows = 5, dim = 16;
  std::vector<float> x(rows * dim), w(dim), dy(rows * dim), y(rows * dim), rstd(rows);
  for (int i = 0; i < rows * dim; ++i) {
    x[i] = float(std::sin(0.37 * i + 1.0));
    dy[i] = float(std::cos(0.11 * i));
  }
  for (int j = 0; j < dim; ++j) w[j] = float(1.0 + 0.1 * j);
  k::rmsnorm_forward(y.data(), rstd.data(), x.data(), w.data(), rows, dim, 1e-5);
  for (k::Store store : {k::Store::overwrite, k::Store::accumulate}) {
    std::vector<float> dx_fused(rows * dim, 0.5f), dw_fused(dim, 0.25f), dx_split = dx_fused, dw_split = dw_fused;
    k::rmsnorm_backward(dx_fused.data(), dw_fused.data(), dy.data(), x.data(), w.data(), rstd.data(), rows, dim, store);
    k::rmsnorm_backward_input(dx_split.data(), dy.data(), x.data(), w.data(), rstd.data(), rows, dim, store);
    k::rmsnorm_backward_weight(dw_split.data(), dy.data(), x.data(), rstd.data(), rows, dim);
    CHECK(dx_split == dx_fused);
    CHECK(dw_split == dw_fused);
  }
  // Negative: a different row order in the weight half is not the same bits (the test can fail).
  std::vector<float> dw_a(dim, 0.0f), dw_b(dim, 0.0f);
  k::rmsnorm_backward_weight(dw_a.data(), dy.data(), x.data(), rstd.data(), rows, dim);
  for (int r = rows - 1; r >= 0; --r)
    k::rmsnorm_backward_weight(dw_b.data(), dy.data() + r * dim, x.data() + r * dim, rstd.data() + r, 1, dim);
  CHECK(dw_a != dw_b);
}

TEST_CASE("rope matches the Hugging Face rotate_half formula", "[kernels][rope]") {
  const int tokens = 5, heads = 3, d = 8;
  const double theta = 10000.0;
  const std::vector<std::int32_t> pos{0, 7, 3, 100, 4096};  // arbitrary global positions
  const Vec x0 = random_vec(tokens * heads * d, 10);
  Vec x = x0;
  k::rope_forward(x.data(), pos.data(), tokens, heads, d, theta);
  for (int t = 0; t < tokens; ++t)
    for (int h = 0; h < heads; ++h)
      for (int e = 0; e < d; ++e) {
        // HF: q·cos + rotate_half(q)·sin, cos/sin of pos·inv_freq[e mod d/2], rotate_half = (−x2, x1).
        const int i = e % (d / 2);
        const double a = pos[t] * std::pow(theta, -2.0 * i / d);
        const double* xr = x0.data() + (t * heads + h) * d;
        const double rot = e < d / 2 ? -xr[e + d / 2] : xr[e - d / 2];
        CHECK(x[(t * heads + h) * d + e] == Approx(xr[e] * std::cos(a) + rot * std::sin(a)).margin(1e-12));
      }
  // Position 0 is the identity.
  CHECK(x[0] == x0[0]);
}

TEST_CASE("rope backward matches float64 central differences", "[kernels][rope][gradcheck]") {
  const int tokens = 4, heads = 2, d = 6;
  const std::vector<std::int32_t> pos{3, 1, 8, 2};
  Vec x = random_vec(tokens * heads * d, 11), r = random_vec(tokens * heads * d, 12), y;
  auto loss = [&] {
    y = x;
    k::rope_forward(y.data(), pos.data(), tokens, heads, d, 500000.0);
    return dot(y, r);
  };
  const Vec gx = numeric_grad(x, loss);
  Vec dx = r;
  k::rope_backward(dx.data(), pos.data(), tokens, heads, d, 500000.0);
  CHECK(rel_error(dx, gx) <= kGradTol);
}

TEST_CASE("swiglu and gelu backward match float64 central differences", "[kernels][mlp][gradcheck]") {
  const int n = 50;
  Vec gate = random_vec(n, 20, -6, 6), up = random_vec(n, 21, -2, 2), r = random_vec(n, 22), h(n);
  auto loss = [&] {
    k::swiglu_forward(h.data(), gate.data(), up.data(), n);
    return dot(h, r);
  };
  const Vec gg = numeric_grad(gate, loss), gu = numeric_grad(up, loss);
  Vec dgate(n), dup(n);
  k::swiglu_backward(dgate.data(), dup.data(), r.data(), gate.data(), up.data(), n);
  CHECK(rel_error(dgate, gg) <= kGradTol);
  CHECK(rel_error(dup, gu) <= kGradTol);
  k::swiglu_forward(h.data(), gate.data(), up.data(), n);
  CHECK(h[3] == Approx(gate[3] / (1 + std::exp(-gate[3])) * up[3]).epsilon(1e-14));

  Vec x = random_vec(n, 23, -5, 5), y(n);
  auto gloss = [&] {
    k::gelu_tanh_forward(y.data(), x.data(), n);
    return dot(y, r);
  };
  const Vec gx = numeric_grad(x, gloss);
  Vec dx(n);
  k::gelu_tanh_backward(dx.data(), r.data(), x.data(), n);
  CHECK(rel_error(dx, gx) <= kGradTol);
  k::gelu_tanh_forward(y.data(), x.data(), n);
  const double v = x[7];
  CHECK(y[7] ==
        Approx(0.5 * v * (1 + std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v)))).epsilon(1e-14));
}
