// The gradient checker must be able to fail: deliberately wrong backward passes exceed the tolerance.
#include <catch2/catch.hpp>

#include "gradcheck.hpp"
#include "meshrun/kernels/cpu.hpp"

namespace k = meshrun::kernels::cpu;
using namespace meshrun::kernels::test;

TEST_CASE("a perturbed gradient fails the gradient check", "[kernels][gradcheck][negative]") {
  const int rows = 4, dim = 12;
  Vec x = random_vec(rows * dim, 3), w = random_vec(dim, 4, 0.5, 1.5), r = random_vec(rows * dim, 5);
  Vec y(rows * dim), rstd(rows);
  auto loss = [&] {
    k::rmsnorm_forward(y.data(), rstd.data(), x.data(), w.data(), rows, dim, 1e-6);
    return dot(y, r);
  };
  const Vec gx = numeric_grad(x, loss);
  loss();
  Vec dx(rows * dim), dw(dim, 0.0);
  k::rmsnorm_backward(dx.data(), dw.data(), r.data(), x.data(), w.data(), rstd.data(), rows, dim);
  REQUIRE(rel_error(dx, gx) <= kGradTol);
  Vec bad = dx;
  bad[5] *= 1.001;  // one element off by 0.1%
  CHECK(rel_error(bad, gx) > kGradTol);
}

TEST_CASE("a wrong backward formula fails the gradient check", "[kernels][gradcheck][negative]") {
  // RoPE backward must rotate by −angle; using the forward rotation instead is caught.
  const int tokens = 3, heads = 2, d = 4;
  const std::vector<std::int32_t> pos{1, 5, 9};
  Vec x = random_vec(tokens * heads * d, 7), r = random_vec(tokens * heads * d, 8), y;
  auto loss = [&] {
    y = x;
    k::rope_forward(y.data(), pos.data(), tokens, heads, d, 10000.0);
    return dot(y, r);
  };
  const Vec gx = numeric_grad(x, loss);
  Vec wrong = r;
  k::rope_forward(wrong.data(), pos.data(), tokens, heads, d, 10000.0);
  CHECK(rel_error(wrong, gx) > kGradTol);

  // Attention backward without the −D_i term (softmax Jacobian dropped) is caught too.
  const k::AttentionDims dm{6, 6, 2, 1, 4};
  Vec q = random_vec(6 * 2 * 4, 9), kk = random_vec(6 * 4, 10), v = random_vec(6 * 4, 11);
  const Vec dout = random_vec(6 * 2 * 4, 12);
  const std::vector<std::int32_t> p{0, 1, 2, 3, 4, 5};
  Vec out(dout.size()), lse(12);
  auto aloss = [&] {
    k::attention_forward(out.data(), lse.data(), q.data(), kk.data(), v.data(), p.data(), p.data(), dm, 0.5);
    return dot(out, dout);
  };
  const Vec gq = numeric_grad(q, aloss);
  aloss();
  Vec dq(q.size(), 0.0), dk(kk.size(), 0.0), dv(v.size(), 0.0);
  const Vec zero_out(out.size(), 0.0);  // passing out = 0 makes D_i = 0
  k::attention_backward(dq.data(), dk.data(), dv.data(), dout.data(), zero_out.data(), lse.data(), q.data(),
                        kk.data(), v.data(), p.data(), p.data(), dm, 0.5);
  CHECK(rel_error(dq, gq) > kGradTol);
}
