// Cache-blocked matrix product used by linear and attention (internal to meshrun_kernels).
//
//   C[M, N] = (accumulate ? C : 0) + A[M, K] · B[K, N]
//
// A and B are strided views (any transpose is a choice of strides); C is row-major with leading dimension
// ldc. Every C element is summed over k = 0, 1, ..., K−1 in that order, starting from its old value or
// zero, so the result equals the naive triple loop bit for bit and does not depend on the blocking.
// Blocks of A and B are packed into contiguous buffers; the micro-kernel updates an MR × NR tile of C held
// in registers with an inner loop over NR contiguous columns that the compiler vectorizes.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

namespace meshrun::kernels::detail {

template <class T>
struct View {  // element (r, c) is p[r * rs + c * cs]
  const T* p;
  std::int64_t rs;
  std::int64_t cs;
  T operator()(std::int64_t r, std::int64_t c) const { return p[r * rs + c * cs]; }
};

// Register tile MR × NR chosen by measurement with GCC 12 (-O3, SSE2 baseline and -march=native): these
// shapes keep the accumulators in vector registers; e.g. 4 × 16 floats ran 5× slower.
template <class T>
struct GemmBlocking;
template <>
struct GemmBlocking<float> {
  static constexpr std::int64_t MR = 6, NR = 32;
  static constexpr std::int64_t KC = 256, NC = 256, MC = 96;  // packed B panel 256 KiB (L2), A block 96 KiB
};
template <>
struct GemmBlocking<double> {  // the float64 path is for gradient checks; keep it simple
  static constexpr std::int64_t MR = 4, NR = 8;
  static constexpr std::int64_t KC = 256, NC = 128, MC = 64;
};

// One full register tile: c[MR × NR] (+)= ap (MR-interleaved, kc deep) · bp (kc rows of stride ldb).
template <class T>
inline void micro_tile(T* __restrict c, std::int64_t ldc, const T* __restrict ap, const T* __restrict bp,
                       std::int64_t ldb, std::int64_t kc, bool load_c) {
  constexpr std::int64_t MR = GemmBlocking<T>::MR;
  constexpr std::int64_t NR = GemmBlocking<T>::NR;
  T acc[MR][NR];
  if (load_c) {
    for (std::int64_t r = 0; r < MR; ++r)
      for (std::int64_t j = 0; j < NR; ++j) acc[r][j] = c[r * ldc + j];
  } else {
    for (std::int64_t r = 0; r < MR; ++r)
      for (std::int64_t j = 0; j < NR; ++j) acc[r][j] = T(0);
  }
  for (std::int64_t k = 0; k < kc; ++k) {
    const T* b = bp + k * ldb;
    const T* a = ap + k * MR;
    for (std::int64_t r = 0; r < MR; ++r)
      for (std::int64_t j = 0; j < NR; ++j) acc[r][j] += a[r] * b[j];
  }
  for (std::int64_t r = 0; r < MR; ++r)
    for (std::int64_t j = 0; j < NR; ++j) c[r * ldc + j] = acc[r][j];
}

// A possibly partial tile (rows ≤ MR, cols ≤ NR): edge tiles go through a full-size local copy so the
// hot loop never branches.
template <class T>
inline void micro_kernel(T* c, std::int64_t ldc, std::int64_t rows, std::int64_t cols, const T* ap,
                         const T* bp, std::int64_t ldb, std::int64_t kc, bool load_c) {
  constexpr std::int64_t MR = GemmBlocking<T>::MR;
  constexpr std::int64_t NR = GemmBlocking<T>::NR;
  if (rows == MR && cols == NR) {
    micro_tile(c, ldc, ap, bp, ldb, kc, load_c);
    return;
  }
  T tmp[MR * NR] = {};
  if (load_c)
    for (std::int64_t r = 0; r < rows; ++r)
      for (std::int64_t j = 0; j < cols; ++j) tmp[r * NR + j] = c[r * ldc + j];
  micro_tile(tmp, NR, ap, bp, ldb, kc, load_c);
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t j = 0; j < cols; ++j) c[r * ldc + j] = tmp[r * NR + j];
}

// Packs B[k0:k0+kc, j0:j0+nc] row-major into dst (row stride ncp), zero padding columns nc..ncp.
// The two layouts that occur (rows contiguous, or columns contiguous = a transpose) read memory in order.
template <class T>
void pack_b(T* dst, std::int64_t ncp, View<T> B, std::int64_t k0, std::int64_t kc, std::int64_t j0,
            std::int64_t nc) {
  if (B.cs == 1) {
    for (std::int64_t k = 0; k < kc; ++k) {
      const T* src = B.p + (k0 + k) * B.rs + j0;
      std::copy(src, src + nc, dst + k * ncp);
    }
  } else if (B.rs == 1) {
    for (std::int64_t j = 0; j < nc; ++j) {
      const T* src = B.p + (j0 + j) * B.cs + k0;
      for (std::int64_t k = 0; k < kc; ++k) dst[k * ncp + j] = src[k];
    }
  } else {
    for (std::int64_t k = 0; k < kc; ++k)
      for (std::int64_t j = 0; j < nc; ++j) dst[k * ncp + j] = B(k0 + k, j0 + j);
  }
  for (std::int64_t k = 0; k < kc; ++k) std::fill(dst + k * ncp + nc, dst + (k + 1) * ncp, T(0));
}

// Packs rows i0..i0+rows (rows ≤ MR) of A[:, k0:k0+kc] as one micro-panel dst[k][r], zero padded rows.
template <class T>
void pack_a(T* dst, View<T> A, std::int64_t i0, std::int64_t rows, std::int64_t k0, std::int64_t kc) {
  constexpr std::int64_t MR = GemmBlocking<T>::MR;
  if (rows < MR) std::fill(dst, dst + kc * MR, T(0));
  const T* base = A.p + i0 * A.rs + k0 * A.cs;
  if (A.rs == 1) {  // a transposed operand: the panel's MR values for one k are contiguous
    for (std::int64_t k = 0; k < kc; ++k) std::copy(base + k * A.cs, base + k * A.cs + rows, dst + k * MR);
  } else {
    for (std::int64_t r = 0; r < rows; ++r) {
      const T* src = base + r * A.rs;
      for (std::int64_t k = 0; k < kc; ++k) dst[k * MR + r] = src[k * A.cs];
    }
  }
}

// Scratch buffers reused across calls by the caller (avoids an allocation per call in attention loops).
template <class T>
struct GemmScratch {
  std::vector<T> a;
  std::vector<T> b;
};

template <class T>
void gemm(T* c, std::int64_t ldc, View<T> A, View<T> B, std::int64_t M, std::int64_t N, std::int64_t K,
          bool accumulate, GemmScratch<T>& scratch) {
  using Blk = GemmBlocking<T>;
  constexpr std::int64_t MR = Blk::MR, NR = Blk::NR;
  if (M <= 0 || N <= 0) return;
  if (K <= 0) {  // empty sum
    if (!accumulate)
      for (std::int64_t i = 0; i < M; ++i) std::fill(c + i * ldc, c + i * ldc + N, T(0));
    return;
  }
  const std::int64_t nc_max = std::min<std::int64_t>(Blk::NC, (N + NR - 1) / NR * NR);
  const std::int64_t kc_max = std::min<std::int64_t>(Blk::KC, K);
  const std::int64_t mc_max = std::min<std::int64_t>(Blk::MC, (M + MR - 1) / MR * MR);
  scratch.b.resize(static_cast<std::size_t>(kc_max * nc_max));
  scratch.a.resize(static_cast<std::size_t>(kc_max * mc_max));
  T* bp = scratch.b.data();
  T* ap = scratch.a.data();

  for (std::int64_t j0 = 0; j0 < N; j0 += Blk::NC) {
    const std::int64_t nc = std::min(Blk::NC, N - j0);
    const std::int64_t ncp = (nc + NR - 1) / NR * NR;  // padded width
    for (std::int64_t k0 = 0; k0 < K; k0 += Blk::KC) {
      const std::int64_t kc = std::min(Blk::KC, K - k0);
      const bool load_c = accumulate || k0 > 0;
      pack_b(bp, ncp, B, k0, kc, j0, nc);
      for (std::int64_t i0 = 0; i0 < M; i0 += Blk::MC) {
        const std::int64_t mc = std::min(Blk::MC, M - i0);
        for (std::int64_t p = 0; p < mc; p += MR)
          pack_a(ap + p * kc, A, i0 + p, std::min(MR, mc - p), k0, kc);
        for (std::int64_t p = 0; p < mc; p += MR) {
          const std::int64_t rows = std::min(MR, mc - p);
          for (std::int64_t j = 0; j < nc; j += NR) {
            micro_kernel(c + (i0 + p) * ldc + j0 + j, ldc, rows, std::min(NR, nc - j), ap + p * kc, bp + j,
                         ncp, kc, load_c);
          }
        }
      }
    }
  }
}

}  // namespace meshrun::kernels::detail
