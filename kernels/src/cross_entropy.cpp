// Softmax cross-entropy split into pieces that combine across vocab shards (Megatron-style
// vocab-parallel cross-entropy), plus the unsharded convenience built from the same pieces.
#include <algorithm>
#include <cmath>
#include <limits>

#include "meshrun/kernels/cpu.hpp"
#include "vector_math.hpp"

namespace meshrun::kernels::cpu {

template <class T>
void ce_row_max(T* row_max, const T* logits, std::int64_t rows, std::int64_t vl) {
  for (std::int64_t r = 0; r < rows; ++r) {
    row_max[r] = detail::max_lanes(logits + r * vl, vl, -std::numeric_limits<T>::infinity());
  }
}

template <class T>
void ce_row_sumexp(T* sumexp, const T* logits, const T* row_max, std::int64_t rows, std::int64_t vl) {
  constexpr std::int64_t kChunk = 1024;  // exp into a small buffer, then sum it in lanes
  T e[kChunk];
  for (std::int64_t r = 0; r < rows; ++r) {
    const T* z = logits + r * vl;
    const T m = row_max[r];
    T s = 0;
    for (std::int64_t j0 = 0; j0 < vl; j0 += kChunk) {
      const std::int64_t n = std::min(kChunk, vl - j0);
      for (std::int64_t j = 0; j < n; ++j) e[j] = detail::exp_approx(z[j0 + j] - m);
      s += detail::sum_lanes(e, n);
    }
    sumexp[r] = s;
  }
}

template <class T>
void ce_target_logit(T* target_logit, const T* logits, const std::int32_t* targets, std::int64_t rows,
                     std::int64_t vl, std::int64_t v0) {
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::int64_t t = targets[r];
    target_logit[r] = (t >= v0 && t < v0 + vl) ? logits[r * vl + (t - v0)] : T(0);
  }
}

template <class T>
void ce_row_loss(T* loss, const T* row_max, const T* sumexp, const T* target_logit,
                 const std::int32_t* targets, std::int64_t rows) {
  for (std::int64_t r = 0; r < rows; ++r)
    loss[r] = targets[r] < 0 ? T(0) : std::log(sumexp[r]) + row_max[r] - target_logit[r];
}

template <class T>
void ce_backward(T* dlogits, const T* logits, const T* row_max, const T* sumexp,
                 const std::int32_t* targets, std::int64_t rows, std::int64_t vl, std::int64_t v0,
                 double scale) {
  const T sc = T(scale);
  for (std::int64_t r = 0; r < rows; ++r) {
    const T* z = logits + r * vl;
    T* dz = dlogits + r * vl;
    const std::int64_t t = targets[r];
    if (t < 0) {
      for (std::int64_t j = 0; j < vl; ++j) dz[j] = T(0);
      continue;
    }
    const T m = row_max[r];
    const T inv = T(1) / sumexp[r];
    const bool mine = t >= v0 && t < v0 + vl;
    const T zt = mine ? z[t - v0] : T(0);  // read before the loop: dlogits may alias logits
    for (std::int64_t j = 0; j < vl; ++j) dz[j] = detail::exp_approx(z[j] - m) * inv * sc;
    if (mine) dz[t - v0] = (detail::exp_approx(zt - m) * inv - T(1)) * sc;
  }
}

template <class T>
double cross_entropy_forward(T* loss, T* row_max, T* sumexp, const T* logits,
                             const std::int32_t* targets, std::int64_t rows, std::int64_t vocab) {
  ce_row_max(row_max, logits, rows, vocab);
  ce_row_sumexp(sumexp, logits, row_max, rows, vocab);
  ce_target_logit(loss, logits, targets, rows, vocab, 0);  // loss[] holds the target logit for a moment
  ce_row_loss(loss, row_max, sumexp, loss, targets, rows);
  double total = 0;
  for (std::int64_t r = 0; r < rows; ++r) total += double(loss[r]);
  return total;
}

template <class T>
void cross_entropy_backward(T* dlogits, const T* logits, const T* row_max, const T* sumexp,
                            const std::int32_t* targets, std::int64_t rows, std::int64_t vocab,
                            double scale) {
  ce_backward(dlogits, logits, row_max, sumexp, targets, rows, vocab, 0, scale);
}

#define MESHRUN_INSTANTIATE(T)                                                                        \
  template void ce_row_max<T>(T*, const T*, std::int64_t, std::int64_t);                             \
  template void ce_row_sumexp<T>(T*, const T*, const T*, std::int64_t, std::int64_t);                \
  template void ce_target_logit<T>(T*, const T*, const std::int32_t*, std::int64_t, std::int64_t,    \
                                   std::int64_t);                                                     \
  template void ce_row_loss<T>(T*, const T*, const T*, const T*, const std::int32_t*, std::int64_t); \
  template void ce_backward<T>(T*, const T*, const T*, const T*, const std::int32_t*, std::int64_t,  \
                               std::int64_t, std::int64_t, double);                                  \
  template double cross_entropy_forward<T>(T*, T*, T*, const T*, const std::int32_t*, std::int64_t,  \
                                           std::int64_t);                                            \
  template void cross_entropy_backward<T>(T*, const T*, const T*, const T*, const std::int32_t*,     \
                                          std::int64_t, std::int64_t, double);
MESHRUN_INSTANTIATE(float)
MESHRUN_INSTANTIATE(double)
#undef MESHRUN_INSTANTIATE

}  // namespace meshrun::kernels::cpu
