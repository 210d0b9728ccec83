// Benchmark of the CPU kernels (not a test): GFLOP/s of the three linear products at a few sizes and the
// time of attention forward + backward. Usage: meshrun-bench-kernels [--quick]
// Numbers are recorded in docs/kernels.md with the command that produced them.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "meshrun/kernels/cpu.hpp"

namespace k = meshrun::kernels::cpu;

namespace {

std::vector<float> random_floats(std::size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(-1.f, 1.f);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

// Best-of-reps wall time in seconds of f() (after one warm-up call).
template <class F>
double best_time(F&& f, int reps) {
  f();
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

void bench_linear(std::int64_t n, std::int64_t in, std::int64_t out, int reps) {
  auto x = random_floats(std::size_t(n * in), 1), w = random_floats(std::size_t(out * in), 2);
  auto dy = random_floats(std::size_t(n * out), 3);
  std::vector<float> y(std::size_t(n * out)), dx(std::size_t(n * in)), dw(std::size_t(out * in), 0.f);
  const double flops = 2.0 * double(n) * double(in) * double(out);
  const double tf = best_time([&] { k::linear_forward(y.data(), x.data(), w.data(), n, in, out); }, reps);
  const double ti =
      best_time([&] { k::linear_backward_input(dx.data(), dy.data(), w.data(), n, in, out); }, reps);
  const double tw =
      best_time([&] { k::linear_backward_weight(dw.data(), dy.data(), x.data(), n, in, out); }, reps);
  std::printf("linear n=%-5lld in=%-5lld out=%-6lld  forward %6.2f  dx %6.2f  dW %6.2f GFLOP/s\n",
              (long long)n, (long long)in, (long long)out, flops / tf * 1e-9, flops / ti * 1e-9,
              flops / tw * 1e-9);
}

void bench_attention(std::int64_t t, std::int64_t hq, std::int64_t hkv, std::int64_t d, int reps) {
  const k::AttentionDims dm{t, t, hq, hkv, d};
  auto q = random_floats(std::size_t(t * hq * d), 4), kk = random_floats(std::size_t(t * hkv * d), 5);
  auto v = random_floats(std::size_t(t * hkv * d), 6), dout = random_floats(std::size_t(t * hq * d), 7);
  std::vector<float> out(q.size()), lse(std::size_t(t * hq)), dq(q.size()), dk(kk.size()), dv(v.size());
  std::vector<std::int32_t> pos(static_cast<std::size_t>(t));
  std::iota(pos.begin(), pos.end(), 0);
  const double scale = 1.0 / std::sqrt(double(d));
  const double tf = best_time(
      [&] {
        k::attention_forward(out.data(), lse.data(), q.data(), kk.data(), v.data(), pos.data(), pos.data(),
                             dm, scale);
      },
      reps);
  const double tb = best_time(
      [&] {
        k::attention_backward(dq.data(), dk.data(), dv.data(), dout.data(), out.data(), lse.data(), q.data(),
                              kk.data(), v.data(), pos.data(), pos.data(), dm, scale);
      },
      reps);
  // Causal: about half of the t² score matrix is needed: 4·t²·d·hq/2 flops forward.
  const double flops_f = 2.0 * double(t) * double(t) * double(d) * double(hq);
  std::printf(
      "attention t=%-5lld hq=%-3lld hkv=%-3lld d=%-4lld  forward %8.2f ms (%5.2f GFLOP/s)  backward %8.2f "
      "ms\n",
      (long long)t, (long long)hq, (long long)hkv, (long long)d, tf * 1e3, flops_f / tf * 1e-9, tb * 1e3);
}

}  // namespace

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  const int reps = quick ? 1 : 3;
  std::printf("meshrun kernels benchmark (single thread, float32, best of %d)\n", reps);
  // templates/tiny.toml on one rank: 512 tokens (8 × 64), hidden 128, SwiGLU 352, vocab 256.
  bench_linear(512, 128, 128, reps);
  bench_linear(512, 128, 352, reps);
  // A ~100M-parameter Llama (hidden 768, SwiGLU 2048, 512 tokens per micro-batch).
  bench_linear(512, 768, 768, reps);
  bench_linear(512, 768, 2048, reps);
  bench_linear(512, 2048, 768, reps);
  if (!quick) {
    bench_linear(512, 768, 32000, reps);  // its output head (vocab 32000)
    bench_linear(1024, 1024, 1024, reps);
  }
  bench_attention(64, 4, 2, 32, reps);     // tiny: seq 64, 4 heads / 2 KV heads, head dim 32
  bench_attention(1024, 12, 4, 64, reps);  // seq 1024, 12 heads / 4 KV heads, head dim 64
  return 0;
}
