// Grouped-query causal attention, flash-attention style: queries in blocks of BQ, keys in blocks of BK,
// online softmax across key blocks, so memory is O(BQ·BK) instead of O(tq·tk). The block products go
// through the blocked gemm. The causal mask uses explicit global positions (kpos <= qpos), which makes
// context-parallel (ring) attention a matter of calling this per key block and merging.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "gemm.hpp"
#include "meshrun/kernels/cpu.hpp"
#include "vector_math.hpp"

namespace meshrun::kernels::cpu {
namespace {

using detail::GemmScratch;
using detail::View;

constexpr std::int64_t BQ = 48;   // query rows per block (a multiple of the gemm's 6-row register tile)
constexpr std::int64_t BK = 128;  // keys per block

// Positions of a block: a key block is skipped when its smallest position exceeds the largest query's.
struct Range {
  std::int32_t lo, hi;
};
Range pos_range(const std::int32_t* pos, std::int64_t begin, std::int64_t end) {
  Range r{pos[begin], pos[begin]};
  for (std::int64_t i = begin; i < end; ++i) {
    r.lo = std::min(r.lo, pos[i]);
    r.hi = std::max(r.hi, pos[i]);
  }
  return r;
}

// x[t, hkv, d] → xt[hkv, d, t], so that the block products with Kᵀ and Vᵀ read contiguous rows.
template <class T>
std::vector<T> transpose_heads(const T* x, const AttentionDims& dm) {
  std::vector<T> xt(static_cast<std::size_t>(dm.hkv * dm.d * dm.tk));
  for (std::int64_t t = 0; t < dm.tk; ++t)
    for (std::int64_t g = 0; g < dm.hkv; ++g)
      for (std::int64_t c = 0; c < dm.d; ++c)
        xt[static_cast<std::size_t>((g * dm.d + c) * dm.tk + t)] = x[(t * dm.hkv + g) * dm.d + c];
  return xt;
}

// Fills s[nq, nk] = scale · Q·Kᵀ for one block and one (query head, kv head) pair; masked entries get
// −inf. kt is K transposed by transpose_heads.
template <class T>
void block_scores(T* s, const T* q, const T* kt, const std::int32_t* qpos, const std::int32_t* kpos,
                  std::int64_t i0, std::int64_t nq, std::int64_t j0, std::int64_t nk, std::int64_t h,
                  std::int64_t g, const AttentionDims& dm, T scale, GemmScratch<T>& scratch) {
  const std::int64_t qs = dm.hq * dm.d;
  detail::gemm(s, BK, View<T>{q + i0 * qs + h * dm.d, qs, 1}, View<T>{kt + g * dm.d * dm.tk + j0, dm.tk, 1},
               nq, nk, dm.d, false, scratch);
  const T neg_inf = -std::numeric_limits<T>::infinity();
  for (std::int64_t i = 0; i < nq; ++i)
    for (std::int64_t j = 0; j < nk; ++j)
      s[i * BK + j] = kpos[j0 + j] <= qpos[i0 + i] ? s[i * BK + j] * scale : neg_inf;
}

}  // namespace

template <class T>
void attention_forward(T* out, T* lse, const T* q, const T* k, const T* v, const std::int32_t* qpos,
                       const std::int32_t* kpos, const AttentionDims& dm, double scale_d) {
  const T scale = T(scale_d);
  const T neg_inf = -std::numeric_limits<T>::infinity();
  const std::int64_t group = dm.hq / dm.hkv;
  const std::int64_t qs = dm.hq * dm.d, ks = dm.hkv * dm.d;
  std::vector<T> s(BQ * BK), acc(BQ * dm.d), m(BQ), l(BQ);
  const std::vector<T> kt = transpose_heads(k, dm);
  GemmScratch<T> scratch;
  for (std::int64_t h = 0; h < dm.hq; ++h) {
    const std::int64_t g = h / group;
    for (std::int64_t i0 = 0; i0 < dm.tq; i0 += BQ) {
      const std::int64_t nq = std::min(BQ, dm.tq - i0);
      const Range qr = pos_range(qpos, i0, i0 + nq);
      std::fill(acc.begin(), acc.end(), T(0));
      std::fill(m.begin(), m.end(), neg_inf);
      std::fill(l.begin(), l.end(), T(0));
      for (std::int64_t j0 = 0; j0 < dm.tk; j0 += BK) {
        const std::int64_t nk = std::min(BK, dm.tk - j0);
        if (pos_range(kpos, j0, j0 + nk).lo > qr.hi) continue;  // fully masked block
        block_scores(s.data(), q, kt.data(), qpos, kpos, i0, nq, j0, nk, h, g, dm, scale, scratch);
        // Online softmax: rescale the running sum and output to the new row maximum.
        for (std::int64_t i = 0; i < nq; ++i) {
          T* si = s.data() + i * BK;
          const T mx = detail::max_lanes(si, nk, m[i]);
          if (mx == neg_inf) {  // nothing visible yet: p = 0 everywhere
            std::fill(si, si + nk, T(0));
            continue;
          }
          const T corr = detail::exp_approx(m[i] - mx);  // exp(−inf) = 0 on the first visible block
          for (std::int64_t j = 0; j < nk; ++j) si[j] = detail::exp_approx(si[j] - mx);
          l[i] = l[i] * corr + detail::sum_lanes(si, nk);
          m[i] = mx;
          T* ai = acc.data() + i * dm.d;
          for (std::int64_t c = 0; c < dm.d; ++c) ai[c] *= corr;
        }
        // acc[nq, d] += P[nq, nk] · V[nk, d]
        detail::gemm(acc.data(), dm.d, View<T>{s.data(), BK, 1}, View<T>{v + j0 * ks + g * dm.d, ks, 1}, nq,
                     dm.d, nk, true, scratch);
      }
      for (std::int64_t i = 0; i < nq; ++i) {
        T* o = out + (i0 + i) * qs + h * dm.d;
        const T* ai = acc.data() + i * dm.d;
        if (l[i] == T(0)) {
          std::fill(o, o + dm.d, T(0));
          lse[(i0 + i) * dm.hq + h] = neg_inf;
        } else {
          const T inv = T(1) / l[i];
          for (std::int64_t c = 0; c < dm.d; ++c) o[c] = ai[c] * inv;
          lse[(i0 + i) * dm.hq + h] = m[i] + std::log(l[i]);
        }
      }
    }
  }
}

template <class T>
void attention_merge(T* out, T* lse, const T* out2, const T* lse2, std::int64_t rows, std::int64_t d) {
  const T neg_inf = -std::numeric_limits<T>::infinity();
  for (std::int64_t r = 0; r < rows; ++r) {
    const T l1 = lse[r], l2 = lse2[r];
    T* o1 = out + r * d;
    const T* o2 = out2 + r * d;
    if (l2 == neg_inf) continue;  // second part saw no key
    if (l1 == neg_inf) {
      std::copy(o2, o2 + d, o1);
      lse[r] = l2;
      continue;
    }
    // σ(x) = 1/(1+e^−x); log σ(x) = −log1p(e^−x), written for both signs of x without overflow.
    const T x = l1 - l2;
    const T log_sig = x >= 0 ? -std::log1p(std::exp(-x)) : x - std::log1p(std::exp(x));
    const T sig_21 = T(1) / (T(1) + std::exp(x));  // σ(lse2 − lse1)
    for (std::int64_t c = 0; c < d; ++c) o1[c] = o1[c] - sig_21 * (o1[c] - o2[c]);
    lse[r] = l1 - log_sig;
  }
}

template <class T>
void attention_backward(T* dq, T* dk, T* dv, const T* dout, const T* out, const T* lse, const T* q,
                        const T* k, const T* v, const std::int32_t* qpos, const std::int32_t* kpos,
                        const AttentionDims& dm, double scale_d) {
  const T scale = T(scale_d);
  const T neg_inf = -std::numeric_limits<T>::infinity();
  const std::int64_t group = dm.hq / dm.hkv;
  const std::int64_t qs = dm.hq * dm.d, ks = dm.hkv * dm.d;
  std::vector<T> p(BQ * BK), dp(BQ * BK), D(BQ);
  const std::vector<T> kt = transpose_heads(k, dm), vt = transpose_heads(v, dm);
  GemmScratch<T> scratch;
  for (std::int64_t h = 0; h < dm.hq; ++h) {
    const std::int64_t g = h / group;
    for (std::int64_t i0 = 0; i0 < dm.tq; i0 += BQ) {
      const std::int64_t nq = std::min(BQ, dm.tq - i0);
      const Range qr = pos_range(qpos, i0, i0 + nq);
      for (std::int64_t i = 0; i < nq; ++i) {  // D_i = dout_i · out_i
        const T* a = dout + (i0 + i) * qs + h * dm.d;
        const T* b = out + (i0 + i) * qs + h * dm.d;
        T acc = 0;
        for (std::int64_t c = 0; c < dm.d; ++c) acc += a[c] * b[c];
        D[i] = acc;
      }
      for (std::int64_t j0 = 0; j0 < dm.tk; j0 += BK) {
        const std::int64_t nk = std::min(BK, dm.tk - j0);
        if (pos_range(kpos, j0, j0 + nk).lo > qr.hi) continue;
        block_scores(p.data(), q, kt.data(), qpos, kpos, i0, nq, j0, nk, h, g, dm, scale, scratch);
        for (std::int64_t i = 0; i < nq; ++i) {  // P = exp(S − lse); masked and empty rows give 0
          const T li = lse[(i0 + i) * dm.hq + h];
          T* pi = p.data() + i * BK;
          if (li == neg_inf) {
            std::fill(pi, pi + nk, T(0));
          } else {
            for (std::int64_t j = 0; j < nk; ++j) pi[j] = detail::exp_approx(pi[j] - li);
          }
        }
        const View<T> dO{dout + i0 * qs + h * dm.d, qs, 1};
        // dv[nk, d] += Pᵀ · dO
        detail::gemm(dv + j0 * ks + g * dm.d, ks, View<T>{p.data(), 1, BK}, dO, nk, dm.d, nq, true, scratch);
        // dP[nq, nk] = dO · Vᵀ
        detail::gemm(dp.data(), BK, dO, View<T>{vt.data() + g * dm.d * dm.tk + j0, dm.tk, 1}, nq, nk, dm.d,
                     false, scratch);
        for (std::int64_t i = 0; i < nq; ++i) {  // dS = P ⊙ (dP − D), times the score scale
          T* dpi = dp.data() + i * BK;
          const T* pi = p.data() + i * BK;
          for (std::int64_t j = 0; j < nk; ++j) dpi[j] = pi[j] * (dpi[j] - D[i]) * scale;
        }
        // dq[nq, d] += dS · K ;  dk[nk, d] += dSᵀ · Q
        detail::gemm(dq + i0 * qs + h * dm.d, qs, View<T>{dp.data(), BK, 1},
                     View<T>{k + j0 * ks + g * dm.d, ks, 1}, nq, dm.d, nk, true, scratch);
        detail::gemm(dk + j0 * ks + g * dm.d, ks, View<T>{dp.data(), 1, BK},
                     View<T>{q + i0 * qs + h * dm.d, qs, 1}, nk, dm.d, nq, true, scratch);
      }
    }
  }
}

#define MESHRUN_INSTANTIATE(T)                                                                      \
  template void attention_forward<T>(T*, T*, const T*, const T*, const T*, const std::int32_t*,     \
                                     const std::int32_t*, const AttentionDims&, double);            \
  template void attention_merge<T>(T*, T*, const T*, const T*, std::int64_t, std::int64_t);         \
  template void attention_backward<T>(T*, T*, T*, const T*, const T*, const T*, const T*, const T*, \
                                      const T*, const std::int32_t*, const std::int32_t*,           \
                                      const AttentionDims&, double);
MESHRUN_INSTANTIATE(float)
MESHRUN_INSTANTIATE(double)
#undef MESHRUN_INSTANTIATE

}  // namespace meshrun::kernels::cpu
