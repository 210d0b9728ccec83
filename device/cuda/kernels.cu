// The hand-written CUDA kernels of the backend (kernels.hpp). Storage is fp32 or bf16 (bf16.hpp bit
// patterns, rounded to nearest-even); arithmetic is fp32, RoPE angles fp64 as on the CPU twin. Block
// reductions go through shared memory in a fixed tree, so results do not depend on scheduling.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "kernels.hpp"
#include "launch.hpp"
#include "meshrun/device/bf16.hpp"

namespace meshrun::device::cuda {
namespace {

using bf16 = std::uint16_t;

__device__ __forceinline__ float ld(const float* p, std::int64_t i) { return p[i]; }
__device__ __forceinline__ float ld(const bf16* p, std::int64_t i) { return float_from_bf16(p[i]); }
__device__ __forceinline__ void st(float* p, std::int64_t i, float v) { p[i] = v; }
__device__ __forceinline__ void st(bf16* p, std::int64_t i, float v) { p[i] = bf16_from_float(v); }

void check_launch(const char* what) {
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) throw std::runtime_error(std::string("CUDA kernel ") + what + ": " + cudaGetErrorString(e));
}

constexpr int kThreads = 256;
unsigned blocks_for(std::int64_t n) {
  const std::int64_t b = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(b < 65535 * 64 ? (b > 0 ? b : 1) : 65535 * 64);
}
#define GRID_STRIDE(i, n) \
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < (n); i += std::int64_t(gridDim.x) * blockDim.x)

// Sum (or max) over a block of kThreads threads, fixed tree order; every thread gets the result.
template <class Op>
__device__ float block_reduce(float v, Op op) {
  __shared__ float sh[kThreads];
  __syncthreads();
  sh[threadIdx.x] = v;
  __syncthreads();
  for (int w = kThreads / 2; w > 0; w /= 2) {
    if (static_cast<int>(threadIdx.x) < w) sh[threadIdx.x] = op(sh[threadIdx.x], sh[threadIdx.x + w]);
    __syncthreads();
  }
  return sh[0];
}
struct Sum {
  __device__ float operator()(float a, float b) const { return a + b; }
};
struct Max {
  __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

// Dispatch a templated launch on the storage type.
#define DISPATCH(t, T, ...)          \
  if ((t) == St::bf16) {             \
    using T = bf16;                  \
    __VA_ARGS__;                     \
  } else {                           \
    using T = float;                 \
    __VA_ARGS__;                     \
  }

template <class D, class S>
__global__ void k_convert(D* d, const S* s, std::int64_t n) {
  GRID_STRIDE(i, n) st(d, i, ld(s, i));
}
template <class T>
__global__ void k_add(T* y, const T* x, std::int64_t n) {
  GRID_STRIDE(i, n) st(y, i, ld(y, i) + ld(x, i));
}

template <class T>
__global__ void k_rmsnorm_fwd(T* y, float* rstd, const T* x, const T* w, std::int64_t dim, float eps) {
  const std::int64_t r = blockIdx.x;
  const T* xr = x + r * dim;
  float ss = 0;
  for (std::int64_t j = threadIdx.x; j < dim; j += kThreads) {
    const float v = ld(xr, j);
    ss += v * v;
  }
  ss = block_reduce(ss, Sum{});
  const float rs = 1.0f / sqrtf(ss / static_cast<float>(dim) + eps);
  if (threadIdx.x == 0) rstd[r] = rs;
  for (std::int64_t j = threadIdx.x; j < dim; j += kThreads) st(y + r * dim, j, (ld(xr, j) * rs) * ld(w, j));
}

template <class T>
__global__ void k_rmsnorm_bwd_dx(T* dx, const T* dy, const T* x, const T* w, const float* rstd, std::int64_t dim,
                                 bool acc) {
  const std::int64_t r = blockIdx.x;
  const T *xr = x + r * dim, *dyr = dy + r * dim;
  const float rs = rstd[r];
  float dot = 0;
  for (std::int64_t j = threadIdx.x; j < dim; j += kThreads) dot += ld(dyr, j) * ld(w, j) * (ld(xr, j) * rs);
  dot = block_reduce(dot, Sum{}) / static_cast<float>(dim);
  for (std::int64_t j = threadIdx.x; j < dim; j += kThreads) {
    const float g = ld(dyr, j) * ld(w, j), xh = ld(xr, j) * rs;
    const float v = rs * (g - xh * dot);
    st(dx + r * dim, j, acc ? ld(dx + r * dim, j) + v : v);
  }
}

constexpr std::int64_t kRowsPerPartial = 256;
// partial[c, j] = Σ over rows of chunk c of dy·x·rstd; then dw[j] += Σ_c partial[c, j] in order.
template <class T>
__global__ void k_rmsnorm_bwd_dw_partial(float* partial, const T* dy, const T* x, const float* rstd,
                                         std::int64_t rows, std::int64_t dim) {
  const std::int64_t j = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x, c = blockIdx.y;
  if (j >= dim) return;
  float s = 0;
  const std::int64_t end = min(rows, (c + 1) * kRowsPerPartial);
  for (std::int64_t r = c * kRowsPerPartial; r < end; ++r) s += ld(dy, r * dim + j) * (ld(x, r * dim + j) * rstd[r]);
  partial[c * dim + j] = s;
}
__global__ void k_sum_partials(float* dw, const float* partial, std::int64_t chunks, std::int64_t dim) {
  GRID_STRIDE(j, dim) {
    float s = 0;
    for (std::int64_t c = 0; c < chunks; ++c) s += partial[c * dim + j];
    dw[j] += s;
  }
}

template <class T>
__global__ void k_rope(T* x, const std::int32_t* pos, std::int64_t tokens, std::int64_t heads, std::int64_t hd,
                       double theta, double sign) {
  const std::int64_t half = hd / 2;
  GRID_STRIDE(e, tokens * heads * half) {
    const std::int64_t i = e % half, th = e / half, t = th / heads;
    const double inv_freq = pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(hd));
    double sd, cd;
    sincos(sign * static_cast<double>(pos[t]) * inv_freq, &sd, &cd);
    const float c = static_cast<float>(cd), sn = static_cast<float>(sd);
    T* row = x + th * hd;
    const float a = ld(row, i), b = ld(row, i + half);
    st(row, i, a * c - b * sn);
    st(row, i + half, b * c + a * sn);
  }
}

__device__ __forceinline__ float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }
template <class T>
__global__ void k_swiglu_fwd(T* h, const T* g, const T* u, std::int64_t n) {
  GRID_STRIDE(i, n) {
    const float gi = ld(g, i);
    st(h, i, gi * sigmoid(gi) * ld(u, i));
  }
}
template <class T>
__global__ void k_swiglu_bwd(T* dg, T* du, const T* dh, const T* g, const T* u, std::int64_t n) {
  GRID_STRIDE(i, n) {
    const float gi = ld(g, i), s = sigmoid(gi), d = ld(dh, i);
    st(dg, i, d * ld(u, i) * s * (1.0f + gi * (1.0f - s)));
    st(du, i, d * gi * s);
  }
}

template <class T>
__global__ void k_embedding_fwd(T* out, const T* table, const std::int32_t* ids, std::int64_t n, std::int64_t dim,
                                std::int64_t v0, std::int64_t vl) {
  GRID_STRIDE(e, n * dim) {
    const std::int64_t i = e / dim, j = e % dim, id = ids[i] - v0;
    st(out, e, id >= 0 && id < vl ? ld(table, id * dim + j) : 0.0f);
  }
}
// One thread per column, tokens in order: the CPU twin's summation order, no atomics.
template <class T>
__global__ void k_embedding_bwd(float* dtable, const T* dout, const std::int32_t* ids, std::int64_t n,
                                std::int64_t dim, std::int64_t v0, std::int64_t vl) {
  GRID_STRIDE(j, dim) {
    for (std::int64_t i = 0; i < n; ++i) {
      const std::int64_t id = ids[i] - v0;
      if (id >= 0 && id < vl) dtable[id * dim + j] += ld(dout, i * dim + j);
    }
  }
}

__global__ void k_ce_row_max(float* m, const float* lg, std::int64_t vl) {
  const std::int64_t r = blockIdx.x;
  float v = -INFINITY;
  for (std::int64_t j = threadIdx.x; j < vl; j += kThreads) v = fmaxf(v, lg[r * vl + j]);
  v = block_reduce(v, Max{});
  if (threadIdx.x == 0) m[r] = v;
}
__global__ void k_ce_row_sumexp(float* se, const float* lg, const float* m, std::int64_t vl) {
  const std::int64_t r = blockIdx.x;
  float v = 0;
  for (std::int64_t j = threadIdx.x; j < vl; j += kThreads) v += expf(lg[r * vl + j] - m[r]);
  v = block_reduce(v, Sum{});
  if (threadIdx.x == 0) se[r] = v;
}
__global__ void k_ce_target(float* z, const float* lg, const std::int32_t* tg, std::int64_t rows, std::int64_t vl,
                            std::int64_t v0) {
  GRID_STRIDE(r, rows) {
    const std::int64_t c = std::int64_t(tg[r]) - v0;
    z[r] = tg[r] >= 0 && c >= 0 && c < vl ? lg[r * vl + c] : 0.0f;
  }
}
__global__ void k_ce_loss(float* loss, const float* m, const float* se, const float* z, const std::int32_t* tg,
                          std::int64_t rows) {
  GRID_STRIDE(r, rows) loss[r] = tg[r] < 0 ? 0.0f : logf(se[r]) + m[r] - z[r];
}
template <class T>
__global__ void k_ce_backward(T* dl, const float* lg, const float* m, const float* se, const std::int32_t* tg,
                              std::int64_t rows, std::int64_t vl, std::int64_t v0, float scale) {
  GRID_STRIDE(e, rows * vl) {
    const std::int64_t r = e / vl, j = e % vl;
    float v = 0;
    if (tg[r] >= 0) v = (expf(lg[e] - m[r]) / se[r] - (v0 + j == tg[r] ? 1.0f : 0.0f)) * scale;
    st(dl, e, v);
  }
}

// Fused causal GQA attention (flash-attention style, never materialising the scores): one thread per
// (query row, head) for the forward and dQ, one per (key row, KV head) for dK/dV, so every sum has one owner
// and a fixed order (keys, then query heads and rows, ascending): no atomics, same inputs → same bits.
// Tiles of BK keys (or query rows) are staged in dynamic shared memory as fp32; a row's vectors live in
// registers, padded with zeros to the head-dim bucket D (32, 64, 128 or 256; d ≤ D). Not tuned for speed
// (the row-vectors of D floats are register-heavy): the semantics are those of kernels/cpu.hpp's
// attention_forward / attention_backward.
template <class Storage, int HeadDim>
struct FlashCfg {
  using T = Storage;
  static constexpr int D = HeadDim;
  static constexpr int BK = HeadDim <= 128 ? 32 : 16;   // 2·BK·D floats of tile: at most 32 KiB
  static constexpr int kRows = 64;                     // threads per block
};
constexpr int kNoPos = 2147483647;   // a padded key: visible to no query

// Keys j0 .. j0 + BK of KV head g into shared memory (fp32, zero-padded past tk and d; padded keys at kNoPos),
// between two barriers: on return every thread of the block sees the whole tile, and nobody still reads the last.
template <class C>
__device__ void load_kv_tile(float* ks, float* vs, std::int32_t* kp, const typename C::T* k, const typename C::T* v,
                             const std::int32_t* kpos, std::int64_t j0, std::int64_t tk, std::int64_t hkv,
                             std::int64_t g, int d) {
  constexpr int D = C::D, BK = C::BK;
  const std::int64_t nk = tk - j0 < BK ? tk - j0 : BK;
  __syncthreads();
  for (int e = threadIdx.x; e < BK * D; e += blockDim.x) {
    const int jj = e / D, c = e % D;
    const bool in = jj < nk && c < d;
    ks[e] = in ? ld(k, ((j0 + jj) * hkv + g) * d + c) : 0.0f;
    vs[e] = in ? ld(v, ((j0 + jj) * hkv + g) * d + c) : 0.0f;
  }
  for (int jj = threadIdx.x; jj < BK; jj += blockDim.x) kp[jj] = jj < nk ? kpos[j0 + jj] : kNoPos;
  __syncthreads();
}

template <class C>
__global__ void k_flash_fwd(typename C::T* out, float* lse, const typename C::T* q, const typename C::T* k,
                            const typename C::T* v, const std::int32_t* qpos, const std::int32_t* kpos,
                            std::int64_t tq, std::int64_t tk, std::int64_t hq, std::int64_t hkv, int d, float scale) {
  constexpr int D = C::D, BK = C::BK;
  SHARED_DYNAMIC(float, shm);
  float* ks = shm;
  float* vs = shm + BK * D;
  std::int32_t* kp = reinterpret_cast<std::int32_t*>(vs + BK * D);
  const std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x, h = blockIdx.y, g = h / (hq / hkv);
  const bool row = i < tq;
  const std::int32_t qp = row ? qpos[i] : 0;
  float qr[D], acc[D];
  for (int c = 0; c < D; ++c) {
    qr[c] = row && c < d ? ld(q, (i * hq + h) * d + c) : 0.0f;
    acc[c] = 0;
  }
  float m = -INFINITY, l = 0;
  for (std::int64_t j0 = 0; j0 < tk; j0 += BK) {
    load_kv_tile<C>(ks, vs, kp, k, v, kpos, j0, tk, hkv, g, d);
    if (!row) continue;
    float sc[BK];
    float tile_max = -INFINITY;
    for (int jj = 0; jj < BK; ++jj) {
      sc[jj] = -INFINITY;
      if (kp[jj] != kNoPos && kp[jj] <= qp) {
        float dot = 0;
        for (int c = 0; c < D; ++c) dot += qr[c] * ks[jj * D + c];
        sc[jj] = dot * scale;
        tile_max = fmaxf(tile_max, sc[jj]);
      }
    }
    if (tile_max == -INFINITY) continue;
    const float m_new = fmaxf(m, tile_max);
    const float rescale = expf(m - m_new);   // 0 while nothing was seen (m = −inf)
    l *= rescale;
    for (int c = 0; c < D; ++c) acc[c] *= rescale;
    for (int jj = 0; jj < BK; ++jj) {
      if (sc[jj] == -INFINITY) continue;
      const float p = expf(sc[jj] - m_new);
      l += p;
      for (int c = 0; c < D; ++c) acc[c] += p * vs[jj * D + c];
    }
    m = m_new;
  }
  if (!row) return;
  const bool seen = l > 0;
  for (int c = 0; c < d; ++c) st(out, (i * hq + h) * d + c, seen ? acc[c] / l : 0.0f);
  lse[i * hq + h] = seen ? m + logf(l) : -INFINITY;
}

// dQ_i += scale · Σ_j P_ij (dO_i·v_j − D_i) k_j, one thread per (query row, head), keys in order.
template <class C>
__global__ void k_flash_bwd_dq(typename C::T* dq, const typename C::T* dout, const typename C::T* q,
                               const typename C::T* k, const typename C::T* v, const float* lse, const float* Dr,
                               const std::int32_t* qpos, const std::int32_t* kpos, std::int64_t tq, std::int64_t tk,
                               std::int64_t hq, std::int64_t hkv, int d, float scale) {
  constexpr int D = C::D, BK = C::BK;
  SHARED_DYNAMIC(float, shm);
  float* ks = shm;
  float* vs = shm + BK * D;
  std::int32_t* kp = reinterpret_cast<std::int32_t*>(vs + BK * D);
  const std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x, h = blockIdx.y, g = h / (hq / hkv);
  const bool row = i < tq;
  const std::int32_t qp = row ? qpos[i] : 0;
  const float li = row ? lse[i * hq + h] : -INFINITY, Di = row ? Dr[i * hq + h] : 0.0f;
  const bool live = row && li != -INFINITY;
  float qr[D], dor[D], acc[D];
  for (int c = 0; c < D; ++c) {
    qr[c] = row && c < d ? ld(q, (i * hq + h) * d + c) : 0.0f;
    dor[c] = row && c < d ? ld(dout, (i * hq + h) * d + c) : 0.0f;
    acc[c] = 0;
  }
  for (std::int64_t j0 = 0; j0 < tk; j0 += BK) {
    load_kv_tile<C>(ks, vs, kp, k, v, kpos, j0, tk, hkv, g, d);
    if (!live) continue;
    for (int jj = 0; jj < BK; ++jj) {
      if (kp[jj] == kNoPos || kp[jj] > qp) continue;
      float dot = 0, dp = 0;
      for (int c = 0; c < D; ++c) {
        dot += qr[c] * ks[jj * D + c];
        dp += dor[c] * vs[jj * D + c];
      }
      const float p = expf(dot * scale - li);
      const float ds = p * (dp - Di);
      for (int c = 0; c < D; ++c) acc[c] += ds * ks[jj * D + c];
    }
  }
  if (!row) return;
  for (int c = 0; c < d; ++c) {
    const std::int64_t e = (i * hq + h) * d + c;
    st(dq, e, ld(dq, e) + scale * acc[c]);
  }
}

// dV_j += Σ P_ij dO_i and dK_j += scale · Σ P_ij (dO_i·v_j − D_i) q_i over the query heads of KV head g (in
// order) and their rows (in order): one thread per (key row, KV head).
template <class C>
__global__ void k_flash_bwd_dkdv(typename C::T* dk, typename C::T* dv, const typename C::T* dout,
                                 const typename C::T* q, const typename C::T* k, const typename C::T* v,
                                 const float* lse, const float* Dr, const std::int32_t* qpos,
                                 const std::int32_t* kpos, std::int64_t tq, std::int64_t tk, std::int64_t hq,
                                 std::int64_t hkv, int d, float scale) {
  constexpr int D = C::D, BQ = C::BK;
  SHARED_DYNAMIC(float, shm);
  float* qs = shm;
  float* dos = shm + BQ * D;
  float* ls = dos + BQ * D;
  float* ds_ = ls + BQ;
  std::int32_t* qp = reinterpret_cast<std::int32_t*>(ds_ + BQ);
  const std::int64_t j = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x, g = blockIdx.y, rep = hq / hkv;
  const bool key = j < tk;
  const std::int32_t kpj = key ? kpos[j] : kNoPos;
  float kr[D], vr[D], dka[D], dva[D];
  for (int c = 0; c < D; ++c) {
    kr[c] = key && c < d ? ld(k, (j * hkv + g) * d + c) : 0.0f;
    vr[c] = key && c < d ? ld(v, (j * hkv + g) * d + c) : 0.0f;
    dka[c] = dva[c] = 0;
  }
  for (std::int64_t r = 0; r < rep; ++r) {
    const std::int64_t h = g * rep + r;
    for (std::int64_t i0 = 0; i0 < tq; i0 += BQ) {
      const std::int64_t nq = tq - i0 < BQ ? tq - i0 : BQ;
      __syncthreads();
      for (int e = threadIdx.x; e < BQ * D; e += blockDim.x) {
        const int ii = e / D, c = e % D;
        const bool in = ii < nq && c < d;
        qs[e] = in ? ld(q, ((i0 + ii) * hq + h) * d + c) : 0.0f;
        dos[e] = in ? ld(dout, ((i0 + ii) * hq + h) * d + c) : 0.0f;
      }
      for (int ii = threadIdx.x; ii < BQ; ii += blockDim.x) {
        const bool in = ii < nq;
        ls[ii] = in ? lse[(i0 + ii) * hq + h] : -INFINITY;
        ds_[ii] = in ? Dr[(i0 + ii) * hq + h] : 0.0f;
        qp[ii] = in ? qpos[i0 + ii] : 0;
      }
      __syncthreads();
      if (!key) continue;
      for (int ii = 0; ii < BQ; ++ii) {
        if (ls[ii] == -INFINITY || kpj > qp[ii]) continue;
        float dot = 0, dp = 0;
        for (int c = 0; c < D; ++c) {
          dot += qs[ii * D + c] * kr[c];
          dp += dos[ii * D + c] * vr[c];
        }
        const float p = expf(dot * scale - ls[ii]);
        const float dsv = p * (dp - ds_[ii]);
        for (int c = 0; c < D; ++c) {
          dva[c] += p * dos[ii * D + c];
          dka[c] += dsv * qs[ii * D + c];
        }
      }
    }
  }
  if (!key) return;
  for (int c = 0; c < d; ++c) {
    const std::int64_t e = (j * hkv + g) * d + c;
    st(dk, e, ld(dk, e) + scale * dka[c]);
    st(dv, e, ld(dv, e) + dva[c]);
  }
}

// One warp per row: D[r] = Σ_c dout[r, c]·out[r, c].
template <class T>
__global__ void k_attn_rowdot(float* D, const T* dout, const T* out, std::int64_t rows, std::int64_t d) {
  const std::int64_t r = blockIdx.x * std::int64_t(blockDim.x / 32) + threadIdx.x / 32;
  if (r >= rows) return;
  const int lane = threadIdx.x % 32;
  float s = 0;
  for (std::int64_t c = lane; c < d; c += 32) s += ld(dout, r * d + c) * ld(out, r * d + c);
  for (int o = 16; o > 0; o /= 2) s += __shfl_down_sync(0xffffffffu, s, o);
  if (lane == 0) D[r] = s;
}
template <class T>
__global__ void k_attn_merge(T* out, float* lse, const T* out2, const float* lse2, std::int64_t rows, std::int64_t d) {
  GRID_STRIDE(e, rows * d) {
    const std::int64_t r = e / d;
    const float l1 = lse[r], l2 = lse2[r];
    if (l2 == -INFINITY) continue;
    if (l1 == -INFINITY) {
      st(out, e, ld(out2, e));
      continue;
    }
    const float sig21 = 1.0f / (1.0f + expf(l1 - l2));
    const float o1 = ld(out, e);
    st(out, e, o1 - sig21 * (o1 - ld(out2, e)));
  }
}
// lse is updated after every element of its row has used the old value (second kernel).
__global__ void k_attn_merge_lse(float* lse, const float* lse2, std::int64_t rows) {
  GRID_STRIDE(r, rows) {
    const float l1 = lse[r], l2 = lse2[r];
    if (l2 == -INFINITY) continue;
    if (l1 == -INFINITY) {
      lse[r] = l2;
      continue;
    }
    const float x = l1 - l2;
    const float log_sig = x >= 0 ? -log1pf(expf(-x)) : x - log1pf(expf(x));
    lse[r] = l1 - log_sig;
  }
}

// Rows of any 2-, 4- or 8-byte element: a copy.
template <class E>
__global__ void k_gather_rows(E* dst, const E* src, const std::int32_t* ix, std::int64_t rows, std::int64_t width) {
  GRID_STRIDE(e, rows * width) {
    const std::int64_t q = e / width, c = e % width;
    dst[e] = src[std::int64_t(ix[q]) * width + c];
  }
}

// MoE router, one thread per row (E and K are small): the CPU twin's loops in its order. Softmax in double
// into probs (rounded to P); the top-k walks the order (probability descending, index ascending): the
// next pick is the largest after the previous one in that order, which is the twin's "largest not yet
// taken, ties to the lower index" without a taken[] array. Weights renormalised in fp32 in pick order.
template <class P>
__global__ void k_moe_route(P* probs, std::int32_t* sel, P* wts, std::int64_t n, int E, int K) {
  GRID_STRIDE(r, n) {
    P* p = probs + r * E;
    double mx = ld(p, 0);
    for (int c = 1; c < E; ++c) {
      const double v = ld(p, c);
      mx = mx < v ? v : mx;
    }
    double sum = 0;
    for (int c = 0; c < E; ++c) sum += exp(static_cast<double>(ld(p, c)) - mx);
    for (int c = 0; c < E; ++c) st(p, c, static_cast<float>(exp(static_cast<double>(ld(p, c)) - mx) / sum));
    int prev = -1;
    float prev_v = 0, wsum = 0;
    for (int kk = 0; kk < K; ++kk) {
      int best = -1;
      float bv = 0;
      for (int c = 0; c < E; ++c) {
        const float v = ld(p, c);
        const bool after = prev < 0 || v < prev_v || (v == prev_v && c > prev);
        if (after && (best < 0 || v > bv)) {
          best = c;
          bv = v;
        }
      }
      sel[r * K + kk] = best;
      st(wts, r * K + kk, bv);
      wsum += bv;
      prev = best;
      prev_v = bv;
    }
    for (int kk = 0; kk < K; ++kk) st(wts, r * K + kk, ld(wts, r * K + kk) / wsum);
  }
}
// stat[c] += tokens routed to expert c, stat[E + c] += Σ_r probs[r, c]: one block per expert, each thread
// its rows in order, then a fixed shared-memory tree in double. No atomics: the same bits every run.
template <class P>
__global__ void k_moe_stat(double* stat, const P* probs, const std::int32_t* sel, std::int64_t n, int E, int K) {
  __shared__ double cnt[kThreads], ps[kThreads];
  const int c = blockIdx.x;
  double a = 0, b = 0;
  for (std::int64_t r = threadIdx.x; r < n; r += kThreads) {
    b += static_cast<double>(ld(probs, r * E + c));
    for (int kk = 0; kk < K; ++kk) a += sel[r * K + kk] == c ? 1.0 : 0.0;
  }
  cnt[threadIdx.x] = a;
  ps[threadIdx.x] = b;
  __syncthreads();
  for (int w = kThreads / 2; w > 0; w /= 2) {
    if (static_cast<int>(threadIdx.x) < w) {
      cnt[threadIdx.x] += cnt[threadIdx.x + w];
      ps[threadIdx.x] += ps[threadIdx.x + w];
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    stat[c] += cnt[0];
    stat[E + c] += ps[0];
  }
}
// y[r, c] = Σ_k w·rows[slot[r, k], c], k in order, fp32 accumulation without contraction (the twin's
// fp32 bits), one rounding to T at the end.
template <class T, class P>
__global__ void k_moe_combine(T* y, const T* rows, const P* wts, const std::int32_t* slot, std::int64_t n, int K,
                              std::int64_t h) {
  GRID_STRIDE(e, n * h) {
    const std::int64_t r = e / h, c = e % h;
    float acc = 0;
    for (int kk = 0; kk < K; ++kk) {
      const std::int32_t q = slot[r * K + kk];
      if (q < 0) continue;
      const float v = ld(rows, std::int64_t(q) * h + c);
      acc = __fadd_rn(acc, wts ? __fmul_rn(ld(wts, r * K + kk), v) : v);
    }
    st(y, e, acc);
  }
}
// drows[slot[r, k]] = wts[r, k]·dy[r] (slots are distinct, as the dispatch makes them).
template <class T, class P>
__global__ void k_moe_combine_bwd_rows(T* drows, const T* dy, const P* wts, const std::int32_t* slot, std::int64_t n,
                                       int K, std::int64_t h) {
  GRID_STRIDE(e, n * K * h) {
    const std::int64_t rk = e / h, c = e % h;
    const std::int32_t q = slot[rk];
    if (q < 0) continue;
    st(drows, std::int64_t(q) * h + c, __fmul_rn(ld(wts, rk), ld(dy, (rk / K) * h + c)));
  }
}
// dwts[r, k] = <dy[r], rows[slot[r, k]]> in double: one warp per (r, k), lanes strided, a fixed shuffle tree.
template <class T, class P>
__global__ void k_moe_combine_bwd_wts(P* dwts, const T* dy, const T* rows, const std::int32_t* slot, std::int64_t n,
                                      int K, std::int64_t h) {
  const std::int64_t rk = blockIdx.x * std::int64_t(blockDim.x / 32) + threadIdx.x / 32;
  if (rk >= n * K) return;
  const std::int32_t q = slot[rk];
  if (q < 0) return;   // the whole warp leaves together
  const int lane = threadIdx.x % 32;
  const T *g = dy + (rk / K) * h, *e = rows + std::int64_t(q) * h;
  double s = 0;
  for (std::int64_t c = lane; c < h; c += 32) s += static_cast<double>(ld(g, c)) * static_cast<double>(ld(e, c));
  for (int o = 16; o > 0; o /= 2) s += __shfl_down_sync(0xffffffffu, s, o);
  if (lane == 0) st(dwts, rk, static_cast<float>(s));
}
// Router backward, one thread per row, in double as the twin: dp = aux_grad + (dw − <w, dw>)/Σ_sel p on
// the selected experts, then dlogits = p·(dp − <p, dp>) over probs.
template <class P>
__global__ void k_moe_router_bwd(P* probs, const std::int32_t* sel, const P* wts, const P* dwts, const P* ag,
                                 std::int64_t n, int E, int K) {
  GRID_STRIDE(r, n) {
    P* p = probs + r * E;
    const std::int32_t* sl = sel + r * K;
    double ssum = 0, wdw = 0;
    for (int kk = 0; kk < K; ++kk) {
      ssum += static_cast<double>(ld(p, sl[kk]));
      wdw += static_cast<double>(ld(wts, r * K + kk)) * static_cast<double>(ld(dwts, r * K + kk));
    }
    auto dp = [&](int c) {
      double d = ld(ag, c);
      for (int kk = 0; kk < K; ++kk)
        if (sl[kk] == c) d += (static_cast<double>(ld(dwts, r * K + kk)) - wdw) / ssum;
      return d;
    };
    double pdp = 0;
    for (int c = 0; c < E; ++c) pdp += static_cast<double>(ld(p, c)) * dp(c);
    for (int c = 0; c < E; ++c) st(p, c, static_cast<float>(static_cast<double>(ld(p, c)) * (dp(c) - pdp)));
  }
}

struct AdamArgs {
  AdamDesc t[kAdamMaxTensors];
  int count;
};
// blockIdx.y picks the tensor (multi-tensor apply: one launch for all shards).
template <class T>
__global__ void k_adamw(AdamArgs args, AdamScalars a) {
  const AdamDesc& d = args.t[blockIdx.y];
  GRID_STRIDE(i, d.n) {
    const float g = d.grad[i] * a.grad_scale;
    const float m = a.b1 * d.m[i] + a.one_b1 * g;
    const float v = a.b2 * d.v[i] + a.one_b2 * g * g;
    d.m[i] = m;
    d.v[i] = v;
    const float p = d.master[i] * a.decay - a.step_size * m / (sqrtf(v) / a.bc2_sqrt + a.eps);
    d.master[i] = p;
    if (d.param) st(static_cast<T*>(d.param), i, p);
  }
}

struct SumArgs {
  const float* x[kSumSquaresMaxTensors];
  std::int64_t n[kSumSquaresMaxTensors];
  int count;
};
__global__ void k_sum_squares_partial(double* partial, SumArgs args) {
  __shared__ double sh[kThreads];
  double s = 0;
  for (int t = 0; t < args.count; ++t) GRID_STRIDE(i, args.n[t]) s += double(args.x[t][i]) * double(args.x[t][i]);
  sh[threadIdx.x] = s;
  __syncthreads();
  for (int w = kThreads / 2; w > 0; w /= 2) {
    if (static_cast<int>(threadIdx.x) < w) sh[threadIdx.x] += sh[threadIdx.x + w];
    __syncthreads();
  }
  if (threadIdx.x == 0) partial[blockIdx.x] = sh[0];
}
__global__ void k_sum_doubles(double* result, const double* partial, int n) {
  if (threadIdx.x == 0 && blockIdx.x == 0) {
    double s = 0;
    for (int i = 0; i < n; ++i) s += partial[i];
    *result = s;
  }
}

}  // namespace

void convert(void* dst, St dt, const void* src, St st_, std::int64_t n, cudaStream_t s) {
  DISPATCH(dt, D, DISPATCH(st_, S, LAUNCH(k_convert, blocks_for(n), kThreads, 0, s)(static_cast<D*>(dst),
                                                                              static_cast<const S*>(src), n)));
  check_launch("convert");
}
void add(void* y, const void* x, St t, std::int64_t n, cudaStream_t s) {
  DISPATCH(t, T, LAUNCH(k_add, blocks_for(n), kThreads, 0, s)(static_cast<T*>(y), static_cast<const T*>(x), n));
  check_launch("add");
}
void rmsnorm_forward(void* y, float* rstd, const void* x, const void* w, St t, std::int64_t rows, std::int64_t dim,
                     float eps, cudaStream_t s) {
  DISPATCH(t, T, LAUNCH(k_rmsnorm_fwd, rows, kThreads, 0, s)(static_cast<T*>(y), rstd, static_cast<const T*>(x),
                                                          static_cast<const T*>(w), dim, eps));
  check_launch("rmsnorm_forward");
}
std::int64_t rmsnorm_partial_rows(std::int64_t rows) { return (rows + kRowsPerPartial - 1) / kRowsPerPartial; }
void rmsnorm_backward(void* dx, float* dw, const void* dy, const void* x, const void* w, const float* rstd, St t,
                      std::int64_t rows, std::int64_t dim, bool acc, float* partial, cudaStream_t s) {
  const std::int64_t chunks = rmsnorm_partial_rows(rows);
  const dim3 grid(static_cast<unsigned>((dim + kThreads - 1) / kThreads), static_cast<unsigned>(chunks));
  DISPATCH(t, T, {
    if (dx)
      LAUNCH(k_rmsnorm_bwd_dx, rows, kThreads, 0, s)(static_cast<T*>(dx), static_cast<const T*>(dy),
                                                 static_cast<const T*>(x), static_cast<const T*>(w), rstd, dim, acc);
    if (dw)
      LAUNCH(k_rmsnorm_bwd_dw_partial, grid, kThreads, 0, s)(partial, static_cast<const T*>(dy), static_cast<const T*>(x),
                                                         rstd, rows, dim);
  });
  if (dw) LAUNCH(k_sum_partials, blocks_for(dim), kThreads, 0, s)(dw, partial, chunks, dim);
  check_launch("rmsnorm_backward");
}
void rope(void* x, const std::int32_t* pos, St t, std::int64_t tokens, std::int64_t heads, std::int64_t hd,
          double theta, bool inverse, cudaStream_t s) {
  DISPATCH(t, T, LAUNCH(k_rope, blocks_for(tokens * heads * hd / 2), kThreads, 0, s)(static_cast<T*>(x), pos, tokens, heads,
                                                                                  hd, theta, inverse ? -1.0 : 1.0));
  check_launch("rope");
}
void swiglu_forward(void* h, const void* g, const void* u, St t, std::int64_t n, cudaStream_t s) {
  DISPATCH(t, T, LAUNCH(k_swiglu_fwd, blocks_for(n), kThreads, 0, s)(static_cast<T*>(h), static_cast<const T*>(g),
                                                                  static_cast<const T*>(u), n));
  check_launch("swiglu_forward");
}
void swiglu_backward(void* dg, void* du, const void* dh, const void* g, const void* u, St t, std::int64_t n,
                     cudaStream_t s) {
  DISPATCH(t, T, LAUNCH(k_swiglu_bwd, blocks_for(n), kThreads, 0, s)(static_cast<T*>(dg), static_cast<T*>(du),
                                                                  static_cast<const T*>(dh), static_cast<const T*>(g),
                                                                  static_cast<const T*>(u), n));
  check_launch("swiglu_backward");
}
void embedding_forward(void* out, const void* table, const std::int32_t* ids, St t, std::int64_t n, std::int64_t dim,
                       std::int64_t v0, std::int64_t vl, cudaStream_t s) {
  DISPATCH(t, T, LAUNCH(k_embedding_fwd, blocks_for(n * dim), kThreads, 0, s)(static_cast<T*>(out),
                                                                           static_cast<const T*>(table), ids, n, dim, v0, vl));
  check_launch("embedding_forward");
}
void embedding_backward(float* dtable, const void* dout, const std::int32_t* ids, St t, std::int64_t n,
                        std::int64_t dim, std::int64_t v0, std::int64_t vl, cudaStream_t s) {
  DISPATCH(t, T, LAUNCH(k_embedding_bwd, blocks_for(dim), kThreads, 0, s)(dtable, static_cast<const T*>(dout), ids, n, dim,
                                                                       v0, vl));
  check_launch("embedding_backward");
}
void ce_row_max(float* m, const float* lg, std::int64_t rows, std::int64_t vl, cudaStream_t s) {
  LAUNCH(k_ce_row_max, rows, kThreads, 0, s)(m, lg, vl);
  check_launch("ce_row_max");
}
void ce_row_sumexp(float* se, const float* lg, const float* m, std::int64_t rows, std::int64_t vl, cudaStream_t s) {
  LAUNCH(k_ce_row_sumexp, rows, kThreads, 0, s)(se, lg, m, vl);
  check_launch("ce_row_sumexp");
}
void ce_target_logit(float* z, const float* lg, const std::int32_t* tg, std::int64_t rows, std::int64_t vl,
                     std::int64_t v0, cudaStream_t s) {
  LAUNCH(k_ce_target, blocks_for(rows), kThreads, 0, s)(z, lg, tg, rows, vl, v0);
  check_launch("ce_target_logit");
}
void ce_row_loss(float* loss, const float* m, const float* se, const float* z, const std::int32_t* tg,
                 std::int64_t rows, cudaStream_t s) {
  LAUNCH(k_ce_loss, blocks_for(rows), kThreads, 0, s)(loss, m, se, z, tg, rows);
  check_launch("ce_row_loss");
}
void ce_backward(void* dl, St t, const float* lg, const float* m, const float* se, const std::int32_t* tg,
                 std::int64_t rows, std::int64_t vl, std::int64_t v0, float scale, cudaStream_t s) {
  DISPATCH(t, T, LAUNCH(k_ce_backward, blocks_for(rows * vl), kThreads, 0, s)(static_cast<T*>(dl), lg, m, se, tg, rows, vl,
                                                                           v0, scale));
  check_launch("ce_backward");
}
void attn_rowdot(float* D, const void* dout, const void* out, St t, std::int64_t rows, std::int64_t d, cudaStream_t s) {
  const unsigned grid = static_cast<unsigned>((rows + kThreads / 32 - 1) / (kThreads / 32));
  DISPATCH(t, T, LAUNCH(k_attn_rowdot, grid, kThreads, 0, s)(D, static_cast<const T*>(dout), static_cast<const T*>(out),
                                                          rows, d));
  check_launch("attn_rowdot");
}
namespace {
template <class C>
std::size_t flash_fwd_shared() { return (2 * C::BK * C::D) * sizeof(float) + C::BK * sizeof(std::int32_t); }
template <class C>
std::size_t flash_dkdv_shared() { return (2 * C::BK * C::D + 2 * C::BK) * sizeof(float) + C::BK * sizeof(std::int32_t); }
dim3 flash_grid(std::int64_t rows, std::int64_t heads, int per_block) {
  return dim3(static_cast<unsigned>((rows + per_block - 1) / per_block), static_cast<unsigned>(heads));
}
template <class C, class T>
void flash_fwd_launch(void* out, float* lse, const void* q, const void* k, const void* v, const std::int32_t* qpos,
                      const std::int32_t* kpos, std::int64_t tq, std::int64_t tk, std::int64_t hq, std::int64_t hkv,
                      int d, float scale, cudaStream_t s) {
  LAUNCH(k_flash_fwd<C>, flash_grid(tq, hq, C::kRows), C::kRows, flash_fwd_shared<C>(), s)(
      static_cast<T*>(out), lse, static_cast<const T*>(q), static_cast<const T*>(k), static_cast<const T*>(v), qpos,
      kpos, tq, tk, hq, hkv, d, scale);
}
template <class C, class T>
void flash_bwd_launch(void* dq, void* dk, void* dv, const void* dout, const void* q, const void* k, const void* v,
                      const float* lse, const float* D, const std::int32_t* qpos, const std::int32_t* kpos,
                      std::int64_t tq, std::int64_t tk, std::int64_t hq, std::int64_t hkv, int d, float scale,
                      cudaStream_t s) {
  LAUNCH(k_flash_bwd_dq<C>, flash_grid(tq, hq, C::kRows), C::kRows, flash_fwd_shared<C>(), s)(
      static_cast<T*>(dq), static_cast<const T*>(dout), static_cast<const T*>(q), static_cast<const T*>(k),
      static_cast<const T*>(v), lse, D, qpos, kpos, tq, tk, hq, hkv, d, scale);
  LAUNCH(k_flash_bwd_dkdv<C>, flash_grid(tk, hkv, C::kRows), C::kRows, flash_dkdv_shared<C>(), s)(
      static_cast<T*>(dk), static_cast<T*>(dv), static_cast<const T*>(dout), static_cast<const T*>(q),
      static_cast<const T*>(k), static_cast<const T*>(v), lse, D, qpos, kpos, tq, tk, hq, hkv, d, scale);
}
// The smallest head-dim bucket that holds d.
#define BY_HEAD_DIM(T, d, fn, ...)                  \
  if ((d) <= 32)                                    \
    fn<FlashCfg<T, 32>, T>(__VA_ARGS__);            \
  else if ((d) <= 64)                               \
    fn<FlashCfg<T, 64>, T>(__VA_ARGS__);            \
  else if ((d) <= 128)                              \
    fn<FlashCfg<T, 128>, T>(__VA_ARGS__);           \
  else                                              \
    fn<FlashCfg<T, 256>, T>(__VA_ARGS__);
void check_head_dim(std::int64_t d, const char* what) {
  if (d < 1 || d > kFlashMaxHeadDim)
    throw std::invalid_argument(std::string("CUDA ") + what + ": head dimension " + std::to_string(d) +
                                " is outside 1.." + std::to_string(kFlashMaxHeadDim) + " (the fused kernel's buckets)");
}
}  // namespace

void flash_attention_forward(void* out, float* lse, const void* q, const void* k, const void* v,
                             const std::int32_t* qpos, const std::int32_t* kpos, St t, std::int64_t tq, std::int64_t tk,
                             std::int64_t hq, std::int64_t hkv, std::int64_t d, float scale, cudaStream_t s) {
  check_head_dim(d, "attention_forward");
  if (tq == 0) return;
  DISPATCH(t, T, BY_HEAD_DIM(T, d, flash_fwd_launch, out, lse, q, k, v, qpos, kpos, tq, tk, hq, hkv,
                             static_cast<int>(d), scale, s));
  check_launch("flash_attention_forward");
}
void flash_attention_backward(void* dq, void* dk, void* dv, const void* dout, const void* q, const void* k,
                              const void* v, const float* lse, const float* D, const std::int32_t* qpos,
                              const std::int32_t* kpos, St t, std::int64_t tq, std::int64_t tk, std::int64_t hq,
                              std::int64_t hkv, std::int64_t d, float scale, cudaStream_t s) {
  check_head_dim(d, "attention_backward");
  if (tq == 0 || tk == 0) return;
  DISPATCH(t, T, BY_HEAD_DIM(T, d, flash_bwd_launch, dq, dk, dv, dout, q, k, v, lse, D, qpos, kpos, tq, tk, hq,
                             hkv, static_cast<int>(d), scale, s));
  check_launch("flash_attention_backward");
}
void attn_merge(void* out, float* lse, const void* out2, const float* lse2, St t, std::int64_t rows, std::int64_t d,
                cudaStream_t s) {
  DISPATCH(t, T, LAUNCH(k_attn_merge, blocks_for(rows * d), kThreads, 0, s)(static_cast<T*>(out), lse,
                                                                         static_cast<const T*>(out2), lse2, rows, d));
  LAUNCH(k_attn_merge_lse, blocks_for(rows), kThreads, 0, s)(lse, lse2, rows);
  check_launch("attn_merge");
}
void gather_rows(void* dst, const void* src, const std::int32_t* index, int elem_size, std::int64_t rows,
                 std::int64_t width, cudaStream_t s) {
  const unsigned g = blocks_for(rows * width);
  switch (elem_size) {
    case 2:
      LAUNCH(k_gather_rows, g, kThreads, 0, s)(static_cast<std::uint16_t*>(dst), static_cast<const std::uint16_t*>(src),
                                           index, rows, width);
      break;
    case 4:
      LAUNCH(k_gather_rows, g, kThreads, 0, s)(static_cast<std::uint32_t*>(dst), static_cast<const std::uint32_t*>(src),
                                           index, rows, width);
      break;
    case 8:
      LAUNCH(k_gather_rows, g, kThreads, 0, s)(static_cast<std::uint64_t*>(dst), static_cast<const std::uint64_t*>(src),
                                           index, rows, width);
      break;
    default: throw std::invalid_argument("gather_rows: elements of " + std::to_string(elem_size) + " bytes");
  }
  check_launch("gather_rows");
}
void moe_route(void* probs, St p, std::int32_t* sel, void* wts, double* stat, std::int64_t n, int experts, int top_k,
               cudaStream_t s) {
  if (experts <= 0 || top_k <= 0 || top_k > experts)
    throw std::invalid_argument("moe_route: top_k " + std::to_string(top_k) + " of " + std::to_string(experts) +
                                " experts");
  DISPATCH(p, P, {
    LAUNCH(k_moe_route, blocks_for(n), kThreads, 0, s)(static_cast<P*>(probs), sel, static_cast<P*>(wts), n, experts,
                                                   top_k);
    LAUNCH(k_moe_stat, static_cast<unsigned>(experts), kThreads, 0, s)(stat, static_cast<const P*>(probs), sel, n, experts,
                                                                   top_k);
  });
  check_launch("moe_route");
}
void moe_combine(void* y, const void* rows, St t, const void* wts, St p, const std::int32_t* slot, std::int64_t n,
                 int top_k, std::int64_t h, cudaStream_t s) {
  DISPATCH(t, T, DISPATCH(p, P, LAUNCH(k_moe_combine, blocks_for(n * h), kThreads, 0, s)(
                                    static_cast<T*>(y), static_cast<const T*>(rows), static_cast<const P*>(wts), slot,
                                    n, top_k, h)));
  check_launch("moe_combine");
}
void moe_combine_backward(void* drows, void* dwts, St p, const void* dy, const void* rows, St t, const void* wts,
                          const std::int32_t* slot, std::int64_t n, int top_k, std::int64_t h, cudaStream_t s) {
  const std::int64_t pairs = n * top_k;
  const unsigned warps = static_cast<unsigned>((pairs + kThreads / 32 - 1) / (kThreads / 32));
  DISPATCH(t, T, DISPATCH(p, P, {
    LAUNCH(k_moe_combine_bwd_rows, blocks_for(pairs * h), kThreads, 0, s)(
        static_cast<T*>(drows), static_cast<const T*>(dy), static_cast<const P*>(wts), slot, n, top_k, h);
    LAUNCH(k_moe_combine_bwd_wts, warps > 0 ? warps : 1, kThreads, 0, s)(
        static_cast<P*>(dwts), static_cast<const T*>(dy), static_cast<const T*>(rows), slot, n, top_k, h);
  }));
  check_launch("moe_combine_backward");
}
void moe_router_backward(void* probs, St p, const std::int32_t* sel, const void* wts, const void* dwts,
                         const void* aux_grad, std::int64_t n, int experts, int top_k, cudaStream_t s) {
  DISPATCH(p, P, LAUNCH(k_moe_router_bwd, blocks_for(n), kThreads, 0, s)(
                     static_cast<P*>(probs), sel, static_cast<const P*>(wts), static_cast<const P*>(dwts),
                     static_cast<const P*>(aux_grad), n, experts, top_k));
  check_launch("moe_router_backward");
}
void adamw(const AdamDesc* tensors, int count, St param_t, const AdamScalars& a, cudaStream_t s) {
  for (int first = 0; first < count; first += kAdamMaxTensors) {
    AdamArgs args{};
    args.count = std::min(kAdamMaxTensors, count - first);
    std::int64_t longest = 0;
    for (int i = 0; i < args.count; ++i) {
      args.t[i] = tensors[first + i];
      longest = std::max(longest, args.t[i].n);
    }
    const dim3 grid(std::min<unsigned>(blocks_for(longest), 4096u), static_cast<unsigned>(args.count));
    DISPATCH(param_t, T, LAUNCH(k_adamw<T>, grid, kThreads, 0, s)(args, a));
  }
  check_launch("adamw");
}
void sum_squares(double* result, double* partial, const float* const* xs, const std::int64_t* ns, int count,
                 cudaStream_t s) {
  if (count > kSumSquaresMaxTensors) throw std::invalid_argument("sum_squares: more than 16 tensors in one call");
  SumArgs args{};
  args.count = count;
  for (int i = 0; i < count; ++i) {
    args.x[i] = xs[i];
    args.n[i] = ns[i];
  }
  LAUNCH(k_sum_squares_partial, kSumSquaresBlocks, kThreads, 0, s)(partial, args);
  LAUNCH(k_sum_doubles, 1, 1, 0, s)(result, partial, kSumSquaresBlocks);
  check_launch("sum_squares");
}

}  // namespace meshrun::device::cuda
