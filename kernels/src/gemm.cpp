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
#include <utility>

#include "gemm.hpp"

namespace meshrun::kernels::detail {

namespace {

// A tile reads A k-major (element (r, k) at a[k * lda + r]: a packed micro-panel with lda = MR, or a
// transposed A in place) or row-major in place (element (r, k) at a[r * lda + k]: activations). R ≤ MR is the number of
// rows the tile computes: an edge panel of fewer rows runs a kernel of that height instead of MR rows
// padded with zeros (a 64-row product in 12-row tiles wasted 11%).
enum class ALayout { kmajor, rows };

// The twin: plain C++ with std::fma (GCC vectorizes it where the target has FMA; otherwise libm's fma).
template <class T, int MR, int NR, ALayout L, int R>
void tile_portable(T* c, std::int64_t ldc, const T* a, std::int64_t lda, const T* bp, std::int64_t ldb,
                   std::int64_t kc, bool load_c) {
  T acc[R][NR];
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < NR; ++j) acc[r][j] = load_c ? c[r * ldc + j] : T(0);
  for (std::int64_t k = 0; k < kc; ++k)
    for (int r = 0; r < R; ++r) {
      const T av = L == ALayout::kmajor ? a[k * lda + r] : a[r * lda + k];
      for (int j = 0; j < NR; ++j) acc[r][j] = std::fma(av, bp[k * ldb + j], acc[r][j]);
    }
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < NR; ++j) c[r * ldc + j] = acc[r][j];
}

// 12 × 32 floats: 24 zmm accumulators, two B vectors and a broadcast per step (28 of 32 registers), so
// both FMA pipes stay busy through the 4-cycle latency. In place, the rows are addressed from one
// pointer per three rows with lda and 2·lda as scaled index (few general registers).
constexpr int kMr512 = 12;
template <ALayout L, int R>
__attribute__((target("avx512f"))) void tile_avx512(float* c, std::int64_t ldc, const float* a, std::int64_t lda,
                                                    const float* bp, std::int64_t ldb, std::int64_t kc,
                                                    bool load_c) {
  __m512 acc[R][2];
#pragma GCC unroll 12
  for (int r = 0; r < R; ++r) {
    acc[r][0] = load_c ? _mm512_loadu_ps(c + r * ldc) : _mm512_setzero_ps();
    acc[r][1] = load_c ? _mm512_loadu_ps(c + r * ldc + 16) : _mm512_setzero_ps();
  }
  const float* third[(R + 2) / 3];  // rows 3q, 3q+1, 3q+2 (only pointers to rows this tile has)
#pragma GCC unroll 4
  for (int q = 0; q < (R + 2) / 3; ++q) third[q] = a + 3 * q * lda;
  for (std::int64_t k = 0; k < kc; ++k) {
    const __m512 b0 = _mm512_loadu_ps(bp + k * ldb), b1 = _mm512_loadu_ps(bp + k * ldb + 16);
#pragma GCC unroll 12
    for (int r = 0; r < R; ++r) {
      const __m512 av = _mm512_set1_ps(L == ALayout::kmajor ? a[k * lda + r] : third[r / 3][(r % 3) * lda + k]);
      acc[r][0] = _mm512_fmadd_ps(av, b0, acc[r][0]);
      acc[r][1] = _mm512_fmadd_ps(av, b1, acc[r][1]);
    }
  }
#pragma GCC unroll 12
  for (int r = 0; r < R; ++r) {
    _mm512_storeu_ps(c + r * ldc, acc[r][0]);
    _mm512_storeu_ps(c + r * ldc + 16, acc[r][1]);
  }
}

// 6 × 16 floats in ymm: 12 accumulators + 2 B vectors + a broadcast (15 of 16 registers).
constexpr int kMr256 = 6;
template <ALayout L, int R>
__attribute__((target("avx2,fma"))) void tile_avx2(float* c, std::int64_t ldc, const float* a, std::int64_t lda,
                                                   const float* bp, std::int64_t ldb, std::int64_t kc,
                                                   bool load_c) {
  __m256 acc[R][2];
#pragma GCC unroll 6
  for (int r = 0; r < R; ++r) {
    acc[r][0] = load_c ? _mm256_loadu_ps(c + r * ldc) : _mm256_setzero_ps();
    acc[r][1] = load_c ? _mm256_loadu_ps(c + r * ldc + 8) : _mm256_setzero_ps();
  }
  const float* third[(R + 2) / 3];
#pragma GCC unroll 2
  for (int q = 0; q < (R + 2) / 3; ++q) third[q] = a + 3 * q * lda;
  for (std::int64_t k = 0; k < kc; ++k) {
    const __m256 b0 = _mm256_loadu_ps(bp + k * ldb), b1 = _mm256_loadu_ps(bp + k * ldb + 8);
#pragma GCC unroll 6
    for (int r = 0; r < R; ++r) {
      const __m256 av = _mm256_broadcast_ss(L == ALayout::kmajor ? a + k * lda + r : third[r / 3] + (r % 3) * lda + k);
      acc[r][0] = _mm256_fmadd_ps(av, b0, acc[r][0]);
      acc[r][1] = _mm256_fmadd_ps(av, b1, acc[r][1]);
    }
  }
#pragma GCC unroll 6
  for (int r = 0; r < R; ++r) {
    _mm256_storeu_ps(c + r * ldc, acc[r][0]);
    _mm256_storeu_ps(c + r * ldc + 8, acc[r][1]);
  }
}

// The tables of kernels, one per layout and height 1..MR.
template <class T, int MR, template <ALayout, int> class K, std::size_t... I>
constexpr MicroKernel<T> make_kernel(std::int64_t nr, std::index_sequence<I...>) {
  return {MR, nr, {K<ALayout::kmajor, int(I) + 1>::fn...}, {K<ALayout::rows, int(I) + 1>::fn...}};
}
template <ALayout L, int R>
struct Avx512 {
  static constexpr TileFn<float> fn = tile_avx512<L, R>;
};
template <ALayout L, int R>
struct Avx2 {
  static constexpr TileFn<float> fn = tile_avx2<L, R>;
};
template <class T, int MR, int NR>
struct Portable {
  template <ALayout L, int R>
  struct K {
    static constexpr TileFn<T> fn = tile_portable<T, MR, NR, L, R>;
  };
};

constexpr MicroKernel<float> kFloatAvx512 = make_kernel<float, kMr512, Avx512>(32, std::make_index_sequence<kMr512>());
constexpr MicroKernel<float> kFloatAvx2 = make_kernel<float, kMr256, Avx2>(16, std::make_index_sequence<kMr256>());
constexpr MicroKernel<float> kFloatPortable =
    make_kernel<float, 6, Portable<float, 6, 16>::K>(16, std::make_index_sequence<6>());
// The float64 path serves gradient checks: the portable kernel only (correct, not fast).
constexpr MicroKernel<double> kDoublePortable =
    make_kernel<double, 4, Portable<double, 4, 8>::K>(8, std::make_index_sequence<4>());

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
