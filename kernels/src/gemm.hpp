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
// Blocks of B (KC × NC) are packed into NR-wide micro-panels and blocks of A (MC × KC) into MR-row
// micro-panels, or read in place where that measured faster (see gemm below); the micro-kernel keeps an
// MR × NR tile of C in registers, and a last panel of fewer rows runs a kernel of that height.
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

// c[rows × nr] (+)= A (rows × kc) · B (kc × nr) for one register tile. A is k-major (a[k * lda + r]: a
// packed micro-panel with lda = mr, or a transposed A in place) or, in the `rows` table, row-major in
// place (a[r * lda + k]); B's row k is b[k * ldb .. + nr): a packed micro-panel (ldb = nr) or B in place.
template <class T>
using TileFn = void (*)(T* c, std::int64_t ldc, const T* a, std::int64_t lda, const T* b, std::int64_t ldb,
                        std::int64_t kc, bool load_c);

constexpr int kMaxMr = 12;
template <class T>
struct MicroKernel {
  std::int64_t mr, nr;
  TileFn<T> kmajor[kMaxMr];  // [rows − 1]: tiles of 1..mr rows
  TileFn<T> rows[kMaxMr];
};

// The micro-kernel of the current ISA (gemm.cpp; cpu::set_matmul_isa changes it).
template <class T>
const MicroKernel<T>& micro_kernel();
template <>
const MicroKernel<float>& micro_kernel<float>();
template <>
const MicroKernel<double>& micro_kernel<double>();

// Depth and panel blocking, chosen by measurement on AMD EPYC (Zen 4: 32 KiB L1d, 1 MiB L2): the A
// micro-panel (MR × KC, 24 KiB for float) is reused from L1 across the block's tiles while B's micro-panels
// stream from L2/L3. KC 512 beat 256 at the mid sizes and 1024³ (bench/cpu_bench.sh; tiny K is ≤ 352).
template <class T>
struct GemmBlocking {
  static constexpr std::int64_t KC = 512, NC = 512, MC = 144;
};

template <class T>
constexpr std::int64_t kLine = 64 / sizeof(T);  // elements per cache line, the prefetch stride

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
      // B's row 4 ahead, a prefetch per cache line: this copy waited on L3 for 8% of a mid-size dW
      if (k + 4 < kc)
        for (std::int64_t l = 0; l < nc; l += kLine<T>) __builtin_prefetch(src + 4 * B.rs + l);
      for (std::int64_t p = 0; p < panels; ++p) {  // plain loops: std::copy was a memmove call per panel row
        const std::int64_t w = std::min(nr, nc - p * nr);
        T* d = dst + (p * kc + k) * nr;
        for (std::int64_t j = 0; j < w; ++j) d[j] = src[p * nr + j];
      }
    }
  } else {
    if (B.rs == 1) {  // the forward's Wᵀ: a transpose, in 8 × 8 blocks so each block's writes are 8 rows of 8
      constexpr std::int64_t kBlk = 8;
      for (std::int64_t jb = 0; jb < nc; jb += kBlk) {
        const std::int64_t jw = std::min(kBlk, nc - jb);
        T* d = dst + (jb / nr) * kc * nr + jb % nr;  // nr is a multiple of 8: a block stays in one panel
        const T* src = B.p + (j0 + jb) * B.cs + k0;
        std::int64_t k = 0;
        if (jw == kBlk)
          for (; k + kBlk <= kc; k += kBlk)
            for (std::int64_t kk = 0; kk < kBlk; ++kk)
              for (std::int64_t jj = 0; jj < kBlk; ++jj) d[(k + kk) * nr + jj] = src[jj * B.cs + k + kk];
        for (; k < kc; ++k)
          for (std::int64_t jj = 0; jj < jw; ++jj) d[k * nr + jj] = src[jj * B.cs + k];
      }
    } else {
      for (std::int64_t j = 0; j < nc; ++j) {
        T* d = dst + (j / nr) * kc * nr + j % nr;
        for (std::int64_t k = 0; k < kc; ++k) d[k * nr] = B(k0 + k, j0 + j);
      }
    }
  }
}

// Packs rows i0..i0+mc of A[:, k0:k0+kc] as micro-panels of mr rows: panel p holds rows p·mr.. at
// dst[p·kc·mr + k·mr + r] (a last panel's rows beyond mc are left unset: the tile of that height never
// reads them). Both loops run k outer, so A is read one row of memory at a time.
template <class T>
void pack_a(T* dst, std::int64_t mr, View<T> A, std::int64_t i0, std::int64_t mc, std::int64_t k0,
            std::int64_t kc) {
  const T* base = A.p + i0 * A.rs + k0 * A.cs;
  if (A.rs == 1) {  // a transposed operand (dW's dyᵀ): the block's values for one k are contiguous. Panel
                    // by panel, each k touched a new page (1.1 ms of a 19 ms dW at the mid size; now 0.5)
    for (std::int64_t k = 0; k < kc; ++k) {
      const T* src = base + k * A.cs;
      if (k + 8 < kc)  // A's row 8 ahead, a prefetch per cache line
        for (std::int64_t l = 0; l < mc; l += kLine<T>) __builtin_prefetch(src + 8 * A.cs + l);
      for (std::int64_t p = 0; p < mc; p += mr) {
        T* d = dst + p * kc + k * mr;
        const std::int64_t rows = std::min(mr, mc - p);
        for (std::int64_t r = 0; r < rows; ++r) d[r] = src[p + r];  // std::copy: a memmove call per 48 bytes
      }
    }
  } else {  // k outer: contiguous writes from `rows` sequential read streams (row by row, the mid-size
            // forward measured 0.81-0.89 of OpenBLAS instead of 0.89-0.95)
    for (std::int64_t p = 0; p < mc; p += mr) {
      const std::int64_t rows = std::min(mr, mc - p);
      for (std::int64_t k = 0; k < kc; ++k)
        for (std::int64_t r = 0; r < rows; ++r) dst[p * kc + k * mr + r] = base[(p + r) * A.rs + k * A.cs];
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
  T edge[kMaxMr * 32];  // a tile narrower than nr goes through this full-width copy (no column branches)
  // Operands are read in place where that measured faster than packing them (docs/kernels.md):
  //  - row-major A (the forward's and dX's activations) always: packing cost 7-17% of a narrow product;
  //  - row-major B and transposed A (dW's dyᵀ, k-major like a packed panel) when the product is short in
  //    the other dimension (M resp. N ≤ 384): a packed copy costs about a cycle per element and is shared
  //    by only that many rows or columns of arithmetic, while a large operand read in place strides
  //    through L2 (mid-size dX and dW lost 5-13% that way; tiny dW gained 9-17%);
  //  - never when its rows are a multiple of 4 KiB apart: a tile's rows then fall into one L1 set
  //    (8 ways) and evict each other (1024³ lost 13-20% in place).
  const auto no_alias = [](std::int64_t stride) { return (stride * std::int64_t(sizeof(T))) % 4096 != 0; };
  // ... and, for the k-major operands, a depth block spanning at most half the L2 (kc rows of the stride)
  const auto fits = [&](std::int64_t stride) { return kc_max * stride * std::int64_t(sizeof(T)) <= (512 << 10); };
  constexpr std::int64_t kShort = 384;
  const bool a_rows = A.cs == 1 && no_alias(A.rs);
  const bool a_kmajor = !a_rows && A.rs == 1 && no_alias(A.cs) && fits(A.cs) && N <= kShort;
  const bool b_in_place = B.cs == 1 && no_alias(B.rs) && fits(B.rs) && M <= kShort;

  for (std::int64_t j0 = 0; j0 < N; j0 += Blk::NC) {
    const std::int64_t nc = std::min(Blk::NC, N - j0);
    const std::int64_t full = b_in_place ? nc / NR * NR : 0;  // columns read in place; the rest is packed
    for (std::int64_t k0 = 0; k0 < K; k0 += Blk::KC) {
      const std::int64_t kc = std::min(Blk::KC, K - k0);
      const bool load_c = accumulate || k0 > 0;
      if (full < nc) pack_b(bp + full * kc, NR, B, k0, kc, j0 + full, nc - full);
      for (std::int64_t i0 = 0; i0 < M; i0 += Blk::MC) {
        const std::int64_t mc = std::min(Blk::MC, M - i0);
        if (!a_rows && !a_kmajor) pack_a(ap, MR, A, i0, mc, k0, kc);
        for (std::int64_t p = 0; p < mc; p += MR) {
          const std::int64_t rows = std::min(MR, mc - p);
          const TileFn<T> tile = a_rows ? mk.rows[rows - 1] : mk.kmajor[rows - 1];
          const T* a = a_rows ? A.p + (i0 + p) * A.rs + k0 : a_kmajor ? A.p + (i0 + p) + k0 * A.cs : ap + p * kc;
          const std::int64_t lda = a_rows ? A.rs : a_kmajor ? A.cs : MR;
          for (std::int64_t j = 0; j < nc; j += NR) {
            const std::int64_t cols = std::min(NR, nc - j);
            T* ct = c + (i0 + p) * ldc + j0 + j;
            const bool b_here = j < full;
            const T* bt = b_here ? B.p + k0 * B.rs + j0 + j : bp + j * kc;
            const std::int64_t ldb = b_here ? B.rs : NR;
            if (load_c && (j + NR < nc || i0 + p + MR < M)) {  // the next tile's C (it often lives in L3)
              const T* next = j + NR < nc ? ct + NR : c + (i0 + p + MR) * ldc + j0;
              const std::int64_t next_rows = j + NR < nc ? rows : std::min(MR, M - (i0 + p + MR));
              for (std::int64_t r = 0; r < next_rows; ++r)
                for (std::int64_t l = 0; l < NR; l += kLine<T>) __builtin_prefetch(next + r * ldc + l);
            }
            if (cols == NR) {
              tile(ct, ldc, a, lda, bt, ldb, kc, load_c);
              continue;
            }
            if (load_c)
              for (std::int64_t r = 0; r < rows; ++r) std::copy(ct + r * ldc, ct + r * ldc + cols, edge + r * NR);
            tile(edge, NR, a, lda, bt, ldb, kc, load_c);
            for (std::int64_t r = 0; r < rows; ++r) std::copy(edge + r * NR, edge + r * NR + cols, ct + r * ldc);
          }
        }
      }
    }
  }
}

}  // namespace meshrun::kernels::detail
