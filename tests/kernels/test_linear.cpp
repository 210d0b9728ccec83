// Linear layer: the blocked matmul equals the naive fused-multiply-add chain bit for bit on every
// micro-kernel this CPU runs, and float64 finite differences confirm both backward products (input
// gradient overwrite/accumulate, weight gradient accumulate).
#include <catch2/catch.hpp>

#include <array>
#include <cmath>

#include "gradcheck.hpp"
#include "meshrun/kernels/cpu.hpp"

namespace k = meshrun::kernels::cpu;
using namespace meshrun::kernels::test;

namespace {

// Naive y = x·Wᵀ as the chain s = fma(x_k, w_k, s), k increasing: the order the blocked kernel promises.
// fused = false gives the plain s += x_k·w_k (two roundings), the negative control.
template <class T>
std::vector<T> naive_forward(const std::vector<T>& x, const std::vector<T>& w, int n, int in, int out,
                             bool fused = true) {
  std::vector<T> y(std::size_t(n) * out);
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < out; ++j) {
      T s = 0;
      for (int kk = 0; kk < in; ++kk) {
        const T a = x[std::size_t(i) * in + kk], b = w[std::size_t(j) * in + kk];
        if (fused) {
          s = std::fma(a, b, s);
        } else {
          const volatile T p = a * b;  // volatile: keep the compiler from contracting this into an fma
          s += p;
        }
      }
      y[std::size_t(i) * out + j] = s;
    }
  return y;
}

// Restores the CPU's default micro-kernel when a test that switches it ends.
struct IsaGuard {
  k::MatmulIsa saved = k::matmul_isa();
  ~IsaGuard() { k::set_matmul_isa(saved); }
};

}  // namespace

TEST_CASE("linear forward equals the naive fma chain bit for bit on every micro-kernel of this CPU",
          "[kernels][linear]") {
  IsaGuard guard;
  // Sizes straddle every block edge of the gemm (MR 12/6/4, NR 32/16/8, KC=512, NC=512, MC=144).
  const int shapes[][3] = {{1, 1, 1}, {3, 5, 7}, {67, 300, 259}, {130, 513, 17}, {150, 40, 530}};
  for (k::MatmulIsa isa : {k::MatmulIsa::portable, k::MatmulIsa::avx2_fma, k::MatmulIsa::avx512}) {
    if (!k::set_matmul_isa(isa)) continue;  // this CPU lacks it
    INFO("micro-kernel " << k::matmul_isa_name(isa));
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
  // Negative: the unfused sum (two roundings per step) is a different function; the comparison sees it.
  const int n = 67, in = 300, out = 259;
  auto xf = to_float(random_vec(std::size_t(n) * in, 1)), wf = to_float(random_vec(std::size_t(out) * in, 2));
  std::vector<float> y(std::size_t(n) * out);
  k::linear_forward(y.data(), xf.data(), wf.data(), n, in, out);
  CHECK(y != naive_forward(xf, wf, n, in, out, false));
}

TEST_CASE("the three linear products give the same bits on every micro-kernel of this CPU", "[kernels][linear]") {
  // dX and dW read transposed operands (other packing paths) and accumulate across depth blocks
  // (n > KC): the ISA may change only speed.
  IsaGuard guard;
  const int n = 600, in = 70, out = 45;
  const auto x = to_float(random_vec(n * in, 40)), w = to_float(random_vec(out * in, 41));
  const auto dy = to_float(random_vec(n * out, 42)), prior = to_float(random_vec(out * in, 43));
  auto run = [&] {
    std::vector<float> y(n * out), dx(n * in), dw = prior;
    k::linear_forward(y.data(), x.data(), w.data(), n, in, out);
    k::linear_backward_input(dx.data(), dy.data(), w.data(), n, in, out);
    k::linear_backward_weight(dw.data(), dy.data(), x.data(), n, in, out);
    y.insert(y.end(), dx.begin(), dx.end());
    y.insert(y.end(), dw.begin(), dw.end());
    return y;
  };
  REQUIRE(k::set_matmul_isa(k::MatmulIsa::portable));
  const auto twin = run();
  for (k::MatmulIsa isa : {k::MatmulIsa::avx2_fma, k::MatmulIsa::avx512}) {
    if (!k::set_matmul_isa(isa)) continue;
    INFO("micro-kernel " << k::matmul_isa_name(isa));
    CHECK(run() == twin);
  }
  // Negative: a different prior in the accumulating dW changes the bits, so equality is not vacuous.
  std::vector<float> dw = prior;
  dw[0] += 1.f;
  k::linear_backward_weight(dw.data(), dy.data(), x.data(), n, in, out);
  CHECK(std::vector<float>(twin.end() - out * in, twin.end()) != dw);
}

namespace {

// Naive dX = dy·W and dW = prior + dyᵀ·x, each output one fma chain in increasing order of its sum index.
std::vector<float> naive_input_grad(const std::vector<float>& dy, const std::vector<float>& w, int n, int in,
                                    int out) {
  std::vector<float> dx(std::size_t(n) * in);
  for (int i = 0; i < n; ++i)
    for (int c = 0; c < in; ++c) {
      float s = 0;
      for (int j = 0; j < out; ++j) s = std::fma(dy[std::size_t(i) * out + j], w[std::size_t(j) * in + c], s);
      dx[std::size_t(i) * in + c] = s;
    }
  return dx;
}
std::vector<float> naive_weight_grad(std::vector<float> dw, const std::vector<float>& dy, const std::vector<float>& x,
                                     int n, int in, int out) {
  for (int j = 0; j < out; ++j)
    for (int c = 0; c < in; ++c) {
      float s = dw[std::size_t(j) * in + c];
      for (int i = 0; i < n; ++i) s = std::fma(dy[std::size_t(i) * out + j], x[std::size_t(i) * in + c], s);
      dw[std::size_t(j) * in + c] = s;
    }
  return dw;
}

}  // namespace

TEST_CASE("every path of the matmul gives the naive fma chain for all three linear products", "[kernels][linear]") {
  // The gemm reads row-major operands in place or packs them, and runs tiles of every height 1..MR: each
  // choice may change only speed. Shapes: heights 1..13 (every remainder of MR 12/6/4 for the forward
  // and dX, whose M is n, and for dW, whose M is out; dW's dyᵀ read in place); rows 4 KiB apart
  // (in = 1024: packed instead of read in place); M and N above the in-place limit (384) with N above NC
  // (512) and a dW depth above KC (512).
  IsaGuard guard;
  std::vector<std::array<int, 3>> shapes;  // n, in, out
  for (int h = 1; h <= 13; ++h) shapes.push_back({h, 37, h});
  shapes.push_back({25, 1024, 20});
  shapes.push_back({515, 520, 390});
  shapes.push_back({600, 40, 300});  // dW short (N 40) but its dyᵀ block too large to read in place (614 KiB)
  for (k::MatmulIsa isa : {k::MatmulIsa::portable, k::MatmulIsa::avx2_fma, k::MatmulIsa::avx512}) {
    if (!k::set_matmul_isa(isa)) continue;
    INFO("micro-kernel " << k::matmul_isa_name(isa));
    for (const auto& [n, in, out] : shapes) {
      INFO("n " << n << ", in " << in << ", out " << out);
      const auto x = to_float(random_vec(std::size_t(n) * in, 50)), w = to_float(random_vec(std::size_t(out) * in, 51));
      const auto dy = to_float(random_vec(std::size_t(n) * out, 52));
      const auto prior = to_float(random_vec(std::size_t(out) * in, 53));
      std::vector<float> y(std::size_t(n) * out, 9.f), dx(std::size_t(n) * in, 9.f), dw = prior;
      k::linear_forward(y.data(), x.data(), w.data(), n, in, out);
      k::linear_backward_input(dx.data(), dy.data(), w.data(), n, in, out);
      k::linear_backward_weight(dw.data(), dy.data(), x.data(), n, in, out);
      CHECK(y == naive_forward(x, w, n, in, out));
      CHECK(dx == naive_input_grad(dy, w, n, in, out));
      CHECK(dw == naive_weight_grad(prior, dy, x, n, in, out));
    }
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
