// Vectorizable building blocks of the softmax loops (attention, cross-entropy): exp, sum and max.
//
// exp_approx: libm's expf is a scalar call per element and took ~17% of attention time. For float this
// is the Cephes expf scheme: n = round(x·log2 e), r = x − n·ln 2 (ln 2 split in two constants), exp(r) by
// a degree-6 polynomial, times 2^n built from the exponent bits. Measured error < 1 ulp over the normal
// range (tests/kernels/test_vector_math.cpp checks ≤ 2 ulp). Plain IEEE arithmetic without FMA
// contraction, so the result is the same on every x86-64 vector ISA. Inputs below −87.34 (including −inf)
// give exactly 0, which the causal mask relies on; inputs above 88.72 saturate near FLT_MAX (softmax
// arguments are ≤ 0). double (the gradient-check path) uses std::exp.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>

namespace meshrun::kernels::detail {

inline float exp_approx(float x) {
  const bool underflow = x < -87.33654f;  // exp(x) < FLT_MIN: return 0 (also for −inf and NaN-free masks)
  x = x > 88.72283905206835f ? 88.72283905206835f : x;
  x = x < -87.33654f ? -87.33654f : x;
  constexpr float kRound = 12582912.0f;  // 1.5·2^23: adding and subtracting it rounds to nearest
  const float n = (x * 1.44269504088896341f + kRound) - kRound;
  float r = x - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  const float z = r * r;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * z + r + 1.0f;
  // 2^n as a float, n in [−126, 128]: two factors, so that 2^128 and 2^−126 need no special case.
  const std::int32_t ni = static_cast<std::int32_t>(n);
  const std::int32_t half = ni >> 1;  // floor(n/2)
  const float s1 = std::bit_cast<float>((half + 127) << 23);
  const float s2 = std::bit_cast<float>((ni - half + 127) << 23);
  const float y = p * s1 * s2;
  return underflow ? 0.0f : y;
}

inline double exp_approx(double x) { return std::exp(x); }

// Sum and max over n values with kLanes independent accumulators: element j goes to lane j mod kLanes,
// lanes are combined by a fixed pairwise tree. The order depends only on n (not on the ISA), and unlike
// one serial accumulator it vectorizes and is not bound by the latency of the add.
inline constexpr std::int64_t kLanes = 16;

template <class T>
T sum_lanes(const T* x, std::int64_t n) {
  T acc[kLanes] = {};
  std::int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes)
    for (std::int64_t l = 0; l < kLanes; ++l) acc[l] += x[j + l];
  for (std::int64_t l = 0; j + l < n; ++l) acc[l] += x[j + l];
  for (std::int64_t w = kLanes / 2; w >= 1; w /= 2)
    for (std::int64_t l = 0; l < w; ++l) acc[l] += acc[l + w];
  return acc[0];
}

// Maximum of x[0..n) and `init` (max is exact, so only speed depends on the order).
template <class T>
T max_lanes(const T* x, std::int64_t n, T init) {
  T acc[kLanes];
  for (std::int64_t l = 0; l < kLanes; ++l) acc[l] = init;
  std::int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes)
    for (std::int64_t l = 0; l < kLanes; ++l) acc[l] = x[j + l] > acc[l] ? x[j + l] : acc[l];
  for (std::int64_t l = 0; j + l < n; ++l) acc[l] = x[j + l] > acc[l] ? x[j + l] : acc[l];
  for (std::int64_t w = kLanes / 2; w >= 1; w /= 2)
    for (std::int64_t l = 0; l < w; ++l) acc[l] = acc[l + w] > acc[l] ? acc[l + w] : acc[l];
  return acc[0];
}

}  // namespace meshrun::kernels::detail
