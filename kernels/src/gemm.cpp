// Register-tile micro-kernels of the matmul (gemm.hpp) and their run-time selection.
//
// Every kernel computes, for each element of its tile, c = fma(a[k], b[k], c) for k = 0..kc−1 in order:
// the AVX-512 and AVX2 kernels with vfmadd on 16 or 8 independent lanes, the portable twin with
// std::fma. A lane never mixes with another, and fma is one IEEE rounding everywhere, so the three give
// the same bits on any x86-64 CPU (and the twin on any IEEE platform with a correct fma).
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <immintrin.h>

#include "gemm.hpp"

namespace meshrun::kernels::detail {

namespace {

// The twin: plain C++ with std::fma (GCC vectorizes it where the target has FMA; otherwise libm's fma).
template <class T, int MR, int NR>
void tile_portable(T* c, std::int64_t ldc, const T* ap, const T* bp, std::int64_t kc, bool load_c) {
  T acc[MR][NR];
  for (int r = 0; r < MR; ++r)
    for (int j = 0; j < NR; ++j) acc[r][j] = load_c ? c[r * ldc + j] : T(0);
  for (std::int64_t k = 0; k < kc; ++k)
    for (int r = 0; r < MR; ++r)
      for (int j = 0; j < NR; ++j) acc[r][j] = std::fma(ap[k * MR + r], bp[k * NR + j], acc[r][j]);
  for (int r = 0; r < MR; ++r)
    for (int j = 0; j < NR; ++j) c[r * ldc + j] = acc[r][j];
}

// 12 × 32 floats: 24 zmm accumulators, two B vectors and a broadcast per step (28 of 32 registers), so
// both FMA pipes stay busy through the 4-cycle latency.
constexpr int kMr512 = 12;
__attribute__((target("avx512f"))) void tile_avx512(float* c, std::int64_t ldc, const float* ap, const float* bp,
                                                    std::int64_t kc, bool load_c) {
  __m512 acc[kMr512][2];
#pragma GCC unroll 12
  for (int r = 0; r < kMr512; ++r) {
    acc[r][0] = load_c ? _mm512_loadu_ps(c + r * ldc) : _mm512_setzero_ps();
    acc[r][1] = load_c ? _mm512_loadu_ps(c + r * ldc + 16) : _mm512_setzero_ps();
  }
  for (std::int64_t k = 0; k < kc; ++k) {
    const __m512 b0 = _mm512_loadu_ps(bp + k * 32), b1 = _mm512_loadu_ps(bp + k * 32 + 16);
#pragma GCC unroll 12
    for (int r = 0; r < kMr512; ++r) {
      const __m512 a = _mm512_set1_ps(ap[k * kMr512 + r]);
      acc[r][0] = _mm512_fmadd_ps(a, b0, acc[r][0]);
      acc[r][1] = _mm512_fmadd_ps(a, b1, acc[r][1]);
    }
  }
#pragma GCC unroll 12
  for (int r = 0; r < kMr512; ++r) {
    _mm512_storeu_ps(c + r * ldc, acc[r][0]);
    _mm512_storeu_ps(c + r * ldc + 16, acc[r][1]);
  }
}

// 6 × 16 floats in ymm: 12 accumulators + 2 B vectors + a broadcast (15 of 16 registers).
constexpr int kMr256 = 6;
__attribute__((target("avx2,fma"))) void tile_avx2(float* c, std::int64_t ldc, const float* ap, const float* bp,
                                                   std::int64_t kc, bool load_c) {
  __m256 acc[kMr256][2];
#pragma GCC unroll 6
  for (int r = 0; r < kMr256; ++r) {
    acc[r][0] = load_c ? _mm256_loadu_ps(c + r * ldc) : _mm256_setzero_ps();
    acc[r][1] = load_c ? _mm256_loadu_ps(c + r * ldc + 8) : _mm256_setzero_ps();
  }
  for (std::int64_t k = 0; k < kc; ++k) {
    const __m256 b0 = _mm256_loadu_ps(bp + k * 16), b1 = _mm256_loadu_ps(bp + k * 16 + 8);
#pragma GCC unroll 6
    for (int r = 0; r < kMr256; ++r) {
      const __m256 a = _mm256_broadcast_ss(ap + k * kMr256 + r);
      acc[r][0] = _mm256_fmadd_ps(a, b0, acc[r][0]);
      acc[r][1] = _mm256_fmadd_ps(a, b1, acc[r][1]);
    }
  }
#pragma GCC unroll 6
  for (int r = 0; r < kMr256; ++r) {
    _mm256_storeu_ps(c + r * ldc, acc[r][0]);
    _mm256_storeu_ps(c + r * ldc + 8, acc[r][1]);
  }
}

constexpr MicroKernel<float> kFloatAvx512{kMr512, 32, tile_avx512};
constexpr MicroKernel<float> kFloatAvx2{kMr256, 16, tile_avx2};
constexpr MicroKernel<float> kFloatPortable{6, 16, tile_portable<float, 6, 16>};
// The float64 path serves gradient checks: the portable kernel only (correct, not fast).
constexpr MicroKernel<double> kDoublePortable{4, 8, tile_portable<double, 4, 8>};

bool cpu_has(cpu::MatmulIsa isa) {
  switch (isa) {
    case cpu::MatmulIsa::portable: return true;
    case cpu::MatmulIsa::avx2_fma: return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    case cpu::MatmulIsa::avx512: return __builtin_cpu_supports("avx512f");
  }
  return false;
}

cpu::MatmulIsa best_isa() {
  __builtin_cpu_init();  // this runs from a static initializer, possibly before libgcc's own
  for (cpu::MatmulIsa isa : {cpu::MatmulIsa::avx512, cpu::MatmulIsa::avx2_fma})
    if (cpu_has(isa)) return isa;
  return cpu::MatmulIsa::portable;
}

cpu::MatmulIsa current = best_isa();

}  // namespace

template <>
const MicroKernel<float>& micro_kernel<float>() {
  switch (current) {
    case cpu::MatmulIsa::avx512: return kFloatAvx512;
    case cpu::MatmulIsa::avx2_fma: return kFloatAvx2;
    case cpu::MatmulIsa::portable: break;
  }
  return kFloatPortable;
}

template <>
const MicroKernel<double>& micro_kernel<double>() {
  return kDoublePortable;
}

}  // namespace meshrun::kernels::detail

namespace meshrun::kernels::cpu {

MatmulIsa matmul_isa() { return detail::current; }

bool set_matmul_isa(MatmulIsa isa) {
  if (!detail::cpu_has(isa)) return false;
  detail::current = isa;
  return true;
}

const char* matmul_isa_name(MatmulIsa isa) {
  switch (isa) {
    case MatmulIsa::avx512: return "avx512";
    case MatmulIsa::avx2_fma: return "avx2+fma";
    case MatmulIsa::portable: return "portable";
  }
  return "?";
}

}  // namespace meshrun::kernels::cpu
