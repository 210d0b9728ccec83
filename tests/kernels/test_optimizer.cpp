// AdamW against an independent double-precision transcription of torch.optim.AdamW, shard invariance,
// and the sum of squares used for the global gradient norm.
#include <catch2/catch.hpp>
#include <cmath>

#include "gradcheck.hpp"
#include "meshrun/kernels/cpu.hpp"

namespace k = meshrun::kernels::cpu;
using namespace meshrun::kernels::test;

TEST_CASE("adamw follows torch.optim.AdamW over several steps", "[kernels][adamw]") {
  const int n = 64;
  Vec p = random_vec(n, 1), m(n, 0.0), v(n, 0.0);
  Vec rp = p, rm = m, rv = v;  // reference state
  k::AdamW hp{.lr = 1e-2, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1};
  for (int step = 1; step <= 5; ++step) {
    const Vec g = random_vec(n, 100 + step);
    hp.step = step;
    hp.grad_scale = step == 3 ? 0.5 : 1.0;  // a clipped step
    k::adamw_update(p.data(), m.data(), v.data(), g.data(), n, hp);
    for (int i = 0; i < n; ++i) {  // torch: mul_(1-lr·wd); lerp_; mul_.addcmul_; addcdiv_
      const double gi = g[i] * hp.grad_scale;
      rp[i] *= 1 - hp.lr * hp.weight_decay;
      rm[i] += (gi - rm[i]) * (1 - hp.beta1);
      rv[i] = rv[i] * hp.beta2 + (1 - hp.beta2) * gi * gi;
      const double denom = std::sqrt(rv[i]) / std::sqrt(1 - std::pow(hp.beta2, step)) + hp.eps;
      rp[i] -= hp.lr / (1 - std::pow(hp.beta1, step)) * rm[i] / denom;
    }
  }
  CHECK(rel_error(p, rp) <= 1e-14);
  CHECK(rel_error(m, rm) <= 1e-14);
  CHECK(rel_error(v, rv) <= 1e-14);
}

TEST_CASE("adamw first step moves each weight by about lr against its gradient", "[kernels][adamw]") {
  std::vector<float> p{1.f, -2.f, 0.5f}, m(3, 0.f), v(3, 0.f), g{3.f, -0.25f, 1e-3f};
  k::adamw_update(p.data(), m.data(), v.data(), g.data(), 3, k::AdamW{.lr = 1e-3});
  CHECK(p[0] == Approx(1.f - 1e-3f).epsilon(1e-6));
  CHECK(p[1] == Approx(-2.f + 1e-3f).epsilon(1e-6));
  CHECK(p[2] == Approx(0.5f - 1e-3f).epsilon(1e-4));
}

TEST_CASE("adamw on shards equals adamw on the whole array bit for bit (ZeRO)", "[kernels][adamw]") {
  const int n = 100;
  auto p = to_float(random_vec(n, 5)), g = to_float(random_vec(n, 6));
  std::vector<float> m(n, 0.f), v(n, 0.f);
  auto ps = p, ms = m, vs = v;
  const k::AdamW hp{.lr = 3e-3, .weight_decay = 0.01, .step = 7};
  k::adamw_update(p.data(), m.data(), v.data(), g.data(), n, hp);
  k::adamw_update(ps.data(), ms.data(), vs.data(), g.data(), 37, hp);
  k::adamw_update(ps.data() + 37, ms.data() + 37, vs.data() + 37, g.data() + 37, n - 37, hp);
  CHECK(ps == p);
  CHECK(ms == m);
  CHECK(vs == v);
}

TEST_CASE("sum of squares accumulates in double", "[kernels][norm]") {
  std::vector<float> x(1000, 0.1f);
  double expect = 0;
  for (float f : x) expect += double(f) * double(f);
  CHECK(k::sum_squares(x.data(), 1000) == expect);
  CHECK(k::sum_squares(x.data(), 0) == 0.0);
  const Vec d{3.0, 4.0};
  CHECK(std::sqrt(k::sum_squares(d.data(), 2)) == 5.0);
}
