// The trainer's linear products against OpenBLAS (not a test): for each shape, forward y = x·Wᵀ,
// dX = dy·W and dW += dyᵀ·x through meshrun's kernels and through cblas_sgemm with the same operands,
// alternating (ours, OpenBLAS) in pairs; prints each side's median GFLOP/s and the median of the
// per-pair ratios. OpenBLAS is forced to one thread. Times are this thread's CPU time
// (CLOCK_THREAD_CPUTIME_ID), so time spent descheduled on a shared machine counts for neither side. Linked to libopenblas only here, never into the
// trainer. Usage: meshrun-bench-gemm [--pairs N] [--isa avx512|avx2+fma|portable]
#include <cblas.h>

#include <algorithm>
#include <ctime>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
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

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

double thread_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

// CPU seconds of one call of f, repeated until at least 20 ms (small shapes take microseconds).
template <class F>
double time_call(F&& f) {
  int reps = 0;
  const double t0 = thread_seconds();
  double dt = 0;
  do {
    f();
    ++reps;
    dt = thread_seconds() - t0;
  } while (dt < 0.02);
  return dt / reps;
}

struct Result {
  double ours, ref, ratio;  // median GFLOP/s of each side, median of the per-pair ratios ours/ref
};

template <class Ours, class Ref>
Result pairs(double flops, int n_pairs, Ours&& ours, Ref&& ref) {
  ours();  // warm-up: page faults, packing buffers, OpenBLAS's first-call setup
  ref();
  std::vector<double> a, b, r;
  for (int p = 0; p < n_pairs; ++p) {
    const double to = time_call(ours), tr = time_call(ref);
    a.push_back(flops / to * 1e-9);
    b.push_back(flops / tr * 1e-9);
    r.push_back(tr / to);
  }
  return {median(a), median(b), median(r)};
}

void bench(const char* what, std::int64_t n, std::int64_t in, std::int64_t out, int n_pairs) {
  const auto x = random_floats(std::size_t(n * in), 1), w = random_floats(std::size_t(out * in), 2);
  const auto dy = random_floats(std::size_t(n * out), 3);
  std::vector<float> y(std::size_t(n * out)), dx(std::size_t(n * in)), dw(std::size_t(out * in), 0.f);
  const double flops = 2.0 * double(n) * double(in) * double(out);
  const int N = int(n), I = int(in), O = int(out);
  const Result f = pairs(
      flops, n_pairs, [&] { k::linear_forward(y.data(), x.data(), w.data(), n, in, out); },
      [&] {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, O, I, 1.f, x.data(), I, w.data(), I, 0.f, y.data(), O);
      });
  const Result i = pairs(
      flops, n_pairs, [&] { k::linear_backward_input(dx.data(), dy.data(), w.data(), n, in, out); },
      [&] {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, I, O, 1.f, dy.data(), O, w.data(), I, 0.f, dx.data(),
                    I);
      });
  const Result g = pairs(
      flops, n_pairs, [&] { k::linear_backward_weight(dw.data(), dy.data(), x.data(), n, in, out); },
      [&] {
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, O, I, N, 1.f, dy.data(), O, x.data(), I, 1.f, dw.data(),
                    I);
      });
  std::printf("%-16s %5lld x %5lld x %5lld | fwd %6.1f / %6.1f = %.2f | dX %6.1f / %6.1f = %.2f | dW %6.1f / %6.1f = %.2f\n",
              what, (long long)n, (long long)in, (long long)out, f.ours, f.ref, f.ratio, i.ours, i.ref, i.ratio,
              g.ours, g.ref, g.ratio);
}

}  // namespace

int main(int argc, char** argv) {
  int n_pairs = 7;
  for (int a = 1; a < argc; ++a) {
    const std::string arg = argv[a];
    if (arg == "--pairs" && a + 1 < argc) {
      n_pairs = std::max(1, std::atoi(argv[++a]));
    } else if (arg == "--isa" && a + 1 < argc) {
      const std::string isa = argv[++a];
      bool ok = false;
      for (k::MatmulIsa m : {k::MatmulIsa::avx512, k::MatmulIsa::avx2_fma, k::MatmulIsa::portable})
        if (isa == k::matmul_isa_name(m)) ok = k::set_matmul_isa(m);
      if (!ok) {
        std::fprintf(stderr, "meshrun-bench-gemm: --isa %s is unknown or not supported by this CPU; use avx512, avx2+fma or portable\n", isa.c_str());
        return 2;
      }
    } else {
      std::fprintf(stderr, "meshrun-bench-gemm: unknown argument '%s'; usage: meshrun-bench-gemm [--pairs N] [--isa NAME]\n", argv[a]);
      return 2;
    }
  }
  openblas_set_num_threads(1);
  std::printf("float32, one thread, thread CPU time; meshrun micro-kernel %s vs %s; GFLOP/s ours / OpenBLAS = median ratio of %d interleaved pairs\n",
              k::matmul_isa_name(k::matmul_isa()), openblas_get_config(), n_pairs);
  // templates/tiny.toml on one rank: 256 tokens per micro-batch, hidden 128, 4/2 heads of 32, SwiGLU 352.
  bench("tiny q/o", 256, 128, 128, n_pairs);
  bench("tiny k/v", 256, 128, 64, n_pairs);
  bench("tiny gate/up", 256, 128, 352, n_pairs);
  bench("tiny down", 256, 352, 128, n_pairs);
  bench("tiny head", 256, 128, 256, n_pairs);
  // The mid size: 1024 tokens (4 × 256), hidden 512, 8/4 heads of 64, SwiGLU 1408, vocab 256.
  bench("mid q/o", 1024, 512, 512, n_pairs);
  bench("mid k/v", 1024, 512, 256, n_pairs);
  bench("mid gate/up", 1024, 512, 1408, n_pairs);
  bench("mid down", 1024, 1408, 512, n_pairs);
  bench("mid head", 1024, 512, 256, n_pairs);
  bench("square", 1024, 1024, 1024, n_pairs);
  return 0;
}
