// Cache-blocked matrix product used by linear and attention (internal to meshrun_kernels).
//
//   C[M, N] = (accumulate ? C : 0) + A[M, K] · B[K, N]
//
// A and B are strided views (any transpose is a choice of strides); C is row-major with leading dimension
// ldc. Every C element is computed as c = fma(A[i,k], B[k,j], c) for k = 0, 1, ..., K−1 in that order,
// starting from its old value or zero. Each output is its own chain of correctly rounded fused
// multiply-adds, so the result does not depend on the blocking, the register tile or the vector width:
// the AVX-512 and AVX2 micro-kernels and the portable std::fma twin give the same bits (gemm.cpp picks
// one from the CPU at run time). Between depth blocks the partial sum is carried in C (an exact float).
//
// Blocks of B (KC × NC) are packed into NR-wide micro-panels, blocks of A (MC × KC) into MR-row
// micro-panels; the micro-kernel keeps an MR × NR tile of C in registers.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "meshrun/kernels/cpu.hpp"

namespace meshrun::kernels::detail {

template <class T>
struct View {  // element (r, c) is p[r * rs + c * cs]
  const T* p;
  std::int64_t rs;
  std::int64_t cs;
  T operator()(std::int64_t r, std::int64_t c) const { return p[r * rs + c * cs]; }
};

// c[mr × nr] (+)= ap (kc × mr, k-major) · bp (kc × nr, k-major), for one full register tile.
template <class T>
using TileFn = void (*)(T* c, std::int64_t ldc, const T* ap, const T* bp, std::int64_t kc, bool load_c);

template <class T>
struct MicroKernel {
  std::int64_t mr, nr;
  TileFn<T> tile;
};

// The micro-kernel of the current ISA (gemm.cpp; cpu::set_matmul_isa changes it).
template <class T>
const MicroKernel<T>& micro_kernel();
template <>
const MicroKernel<float>& micro_kernel<float>();
template <>
const MicroKernel<double>& micro_kernel<double>();

// Depth and panel blocking, chosen by measurement on AMD EPYC (Zen 4: 32 KiB L1d, 1 MiB L2): the A
// micro-panel (MR × KC) stays in L1 while the packed B block (KC × NC, 512 KiB for float) streams from L2.
template <class T>
struct GemmBlocking {
  static constexpr std::int64_t KC = 256, NC = 512, MC = 144;
};

// Packs B[k0:k0+kc, j0:j0+nc] as micro-panels of nr columns: dst[panel][k][j], zero padded columns.
// The two layouts that occur (rows contiguous, or columns contiguous = a transpose) read memory in order.
template <class T>
void pack_b(T* dst, std::int64_t nr, View<T> B, std::int64_t k0, std::int64_t kc, std::int64_t j0,
            std::int64_t nc) {
  const std::int64_t panels = (nc + nr - 1) / nr;
  if (nc % nr) std::fill(dst + (panels - 1) * kc * nr, dst + panels * kc * nr, T(0));
  if (B.cs == 1) {
    for (std::int64_t k = 0; k < kc; ++k) {
      const T* src = B.p + (k0 + k) * B.rs + j0;
      for (std::int64_t p = 0; p < panels; ++p) {
        const std::int64_t w = std::min(nr, nc - p * nr);
        std::copy(src + p * nr, src + p * nr + w, dst + (p * kc + k) * nr);
      }
    }
  } else {
    for (std::int64_t j = 0; j < nc; ++j) {
      T* d = dst + (j / nr) * kc * nr + j % nr;
      if (B.rs == 1) {
        const T* src = B.p + (j0 + j) * B.cs + k0;
        for (std::int64_t k = 0; k < kc; ++k) d[k * nr] = src[k];
      } else {
        for (std::int64_t k = 0; k < kc; ++k) d[k * nr] = B(k0 + k, j0 + j);
      }
    }
  }
}

// Packs rows i0..i0+rows (rows ≤ mr) of A[:, k0:k0+kc] as one micro-panel dst[k][r], zero padded rows.
template <class T>
void pack_a(T* dst, std::int64_t mr, View<T> A, std::int64_t i0, std::int64_t rows, std::int64_t k0,
            std::int64_t kc) {
  if (rows < mr) std::fill(dst, dst + kc * mr, T(0));
  const T* base = A.p + i0 * A.rs + k0 * A.cs;
  if (A.rs == 1) {  // a transposed operand: the panel's values for one k are contiguous
    for (std::int64_t k = 0; k < kc; ++k) std::copy(base + k * A.cs, base + k * A.cs + rows, dst + k * mr);
  } else {  // k outer: contiguous writes from `rows` sequential read streams (row by row, the mid-size
            // forward measured 0.81-0.89 of OpenBLAS instead of 0.89-0.95)
    for (std::int64_t k = 0; k < kc; ++k)
      for (std::int64_t r = 0; r < rows; ++r) dst[k * mr + r] = base[r * A.rs + k * A.cs];
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
  const MicroKernel<T>& mk = micro_kernel<T>();
  const std::int64_t MR = mk.mr, NR = mk.nr;
  if (M <= 0 || N <= 0) return;
  if (K <= 0) {  // empty sum
    if (!accumulate)
      for (std::int64_t i = 0; i < M; ++i) std::fill(c + i * ldc, c + i * ldc + N, T(0));
    return;
  }
  const std::int64_t nc_max = std::min<std::int64_t>(Blk::NC, N);
  const std::int64_t kc_max = std::min<std::int64_t>(Blk::KC, K);
  const std::int64_t mc_max = std::min<std::int64_t>(Blk::MC, M);
  scratch.b.resize(static_cast<std::size_t>(kc_max * ((nc_max + NR - 1) / NR * NR)));
  scratch.a.resize(static_cast<std::size_t>(kc_max * ((mc_max + MR - 1) / MR * MR)));
  T* bp = scratch.b.data();
  T* ap = scratch.a.data();
  T edge[16 * 32];  // an edge tile goes through this full-size copy so the micro-kernel never branches

  for (std::int64_t j0 = 0; j0 < N; j0 += Blk::NC) {
    const std::int64_t nc = std::min(Blk::NC, N - j0);
    for (std::int64_t k0 = 0; k0 < K; k0 += Blk::KC) {
      const std::int64_t kc = std::min(Blk::KC, K - k0);
      const bool load_c = accumulate || k0 > 0;
      pack_b(bp, NR, B, k0, kc, j0, nc);
      for (std::int64_t i0 = 0; i0 < M; i0 += Blk::MC) {
        const std::int64_t mc = std::min(Blk::MC, M - i0);
        for (std::int64_t p = 0; p < mc; p += MR) pack_a(ap + p * kc, MR, A, i0 + p, std::min(MR, mc - p), k0, kc);
        for (std::int64_t p = 0; p < mc; p += MR) {
          const std::int64_t rows = std::min(MR, mc - p);
          for (std::int64_t j = 0; j < nc; j += NR) {
            const std::int64_t cols = std::min(NR, nc - j);
            T* ct = c + (i0 + p) * ldc + j0 + j;
            const T* bt = bp + j * kc;
            if (rows == MR && cols == NR) {
              mk.tile(ct, ldc, ap + p * kc, bt, kc, load_c);
              continue;
            }
            if (load_c)
              for (std::int64_t r = 0; r < rows; ++r) std::copy(ct + r * ldc, ct + r * ldc + cols, edge + r * NR);
            mk.tile(edge, NR, ap + p * kc, bt, kc, load_c);
            for (std::int64_t r = 0; r < rows; ++r) std::copy(edge + r * NR, edge + r * NR + cols, ct + r * ldc);
          }
        }
      }
    }
  }
}

}  // namespace meshrun::kernels::detail
