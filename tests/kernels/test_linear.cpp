// Linear layer: the blocked matmul equals the naive sum bit for bit, and float64 finite differences
// confirm both backward products (input gradient overwrite/accumulate, weight gradient accumulate).
#include <catch2/catch.hpp>

#include "gradcheck.hpp"
#include "meshrun/kernels/cpu.hpp"

namespace k = meshrun::kernels::cpu;
using namespace meshrun::kernels::test;

namespace {

// Naive y = x·Wᵀ summing k in increasing order, the order the blocked kernel promises.
template <class T>
std::vector<T> naive_forward(const std::vector<T>& x, const std::vector<T>& w, int n, int in, int out) {
  std::vector<T> y(std::size_t(n) * out);
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < out; ++j) {
      T s = 0;
      for (int kk = 0; kk < in; ++kk) s += x[std::size_t(i) * in + kk] * w[std::size_t(j) * in + kk];
      y[std::size_t(i) * out + j] = s;
    }
  return y;
}

}  // namespace

TEST_CASE("linear forward equals the naive k-ordered sum bit for bit", "[kernels][linear]") {
  // Sizes straddle every block edge of the gemm (MR=4, NR=16/8, KC=256, NC=256, MC=64).
  const int shapes[][3] = {{1, 1, 1}, {3, 5, 7}, {67, 300, 259}, {130, 513, 17}};
  for (const auto& s : shapes) {
    const int n = s[0], in = s[1], out = s[2];
    auto xf = to_float(random_vec(std::size_t(n) * in, 1));
    auto wf = to_float(random_vec(std::size_t(out) * in, 2));
    std::vector<float> y(std::size_t(n) * out, 123.f);  // garbage: forward must overwrite
    k::linear_forward(y.data(), xf.data(), wf.data(), n, in, out);
    CHECK(y == naive_forward(xf, wf, n, in, out));
    auto xd = random_vec(std::size_t(n) * in, 3), wd = random_vec(std::size_t(out) * in, 4);
    Vec yd(std::size_t(n) * out);
    k::linear_forward(yd.data(), xd.data(), wd.data(), n, in, out);
    CHECK(yd == naive_forward(xd, wd, n, in, out));
  }
}

TEST_CASE("linear backward matches float64 central differences", "[kernels][linear][gradcheck]") {
  const int n = 9, in = 13, out = 6;
  Vec x = random_vec(n * in, 10), w = random_vec(out * in, 11), r = random_vec(n * out, 12);
  Vec y(n * out);
  auto loss = [&] {  // L = Σ y ⊙ r, so dL/dy = r
    k::linear_forward(y.data(), x.data(), w.data(), n, in, out);
    return dot(y, r);
  };
  const Vec gx_num = numeric_grad(x, loss), gw_num = numeric_grad(w, loss);

  Vec dx(n * in, 7.0);
  k::linear_backward_input(dx.data(), r.data(), w.data(), n, in, out);
  CHECK(rel_error(dx, gx_num) <= kGradTol);

  const Vec prior = random_vec(n * in, 13);  // accumulate mode adds onto what is there
  Vec dx_acc = prior;
  k::linear_backward_input(dx_acc.data(), r.data(), w.data(), n, in, out, k::Store::accumulate);
  CHECK(rel_error(minus(dx_acc, prior), gx_num) <= kGradTol);

  const Vec wprior = random_vec(out * in, 14);
  Vec dw = wprior;
  k::linear_backward_weight(dw.data(), r.data(), x.data(), n, in, out);
  CHECK(rel_error(minus(dw, wprior), gw_num) <= kGradTol);
}

TEST_CASE("weight gradients of two micro-batches accumulate to the gradient of both", "[kernels][linear]") {
  const int n = 8, in = 5, out = 3;
  Vec x = random_vec(n * in, 20), dy = random_vec(n * out, 21);
  Vec both(out * in, 0.0), split(out * in, 0.0);
  k::linear_backward_weight(both.data(), dy.data(), x.data(), n, in, out);
  k::linear_backward_weight(split.data(), dy.data(), x.data(), n / 2, in, out);
  k::linear_backward_weight(split.data(), dy.data() + (n / 2) * out, x.data() + (n / 2) * in, n / 2, in, out);
  CHECK(rel_error(split, both) <= 1e-15);
  // Sanity that the check can fail: dropping the second micro-batch changes the result.
  Vec half(out * in, 0.0);
  k::linear_backward_weight(half.data(), dy.data(), x.data(), n / 2, in, out);
  CHECK(rel_error(half, both) > 1e-3);
}

TEST_CASE("column-parallel shards of a linear layer equal the serial columns bit for bit",
          "[kernels][linear]") {
  // Tensor parallelism splits W[out, in] by rows; each output element's sum is unchanged, so the shard's
  // y columns and dW rows must be identical to the serial ones (the trainer's bit-exact TP claims).
  const int n = 70, in = 96, out = 90, v0 = 30, vl = 40;
  const auto x = to_float(random_vec(n * in, 30)), w = to_float(random_vec(out * in, 31));
  const auto dy = to_float(random_vec(n * out, 32));
  std::vector<float> y(n * out), dw(out * in, 0.f);
  k::linear_forward(y.data(), x.data(), w.data(), n, in, out);
  k::linear_backward_weight(dw.data(), dy.data(), x.data(), n, in, out);

  std::vector<float> ys(n * vl), dws(vl * in, 0.f), dys;
  for (int i = 0; i < n; ++i)
    dys.insert(dys.end(), dy.begin() + i * out + v0, dy.begin() + i * out + v0 + vl);
  k::linear_forward(ys.data(), x.data(), w.data() + v0 * in, n, in, vl);
  k::linear_backward_weight(dws.data(), dys.data(), x.data(), n, in, vl);
  int mismatches = 0;
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < vl; ++j) mismatches += ys[i * vl + j] != y[i * out + v0 + j];
  for (int r = 0; r < vl * in; ++r) mismatches += dws[r] != dw[v0 * in + r];
  CHECK(mismatches == 0);
  // Negative: an off-by-one shard offset is detected by the same comparison.
  k::linear_forward(ys.data(), x.data(), w.data() + (v0 + 1) * in, n, in, vl);
  CHECK(ys[0] != y[v0]);
}
