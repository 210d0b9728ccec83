// Rotary position embedding, Hugging Face Llama rotate_half convention, with explicit global positions.
#include <cmath>
#include <vector>

#include "meshrun/kernels/cpu.hpp"

namespace meshrun::kernels::cpu {
namespace {

// Rotates every (i, i + d/2) pair of each head of each token by sign · pos · inv_freq_i.
template <class T>
void rotate(T* x, const std::int32_t* pos, std::int64_t tokens, std::int64_t heads, std::int64_t d,
            double theta, double sign) {
  const std::int64_t half = d / 2;
  std::vector<double> inv_freq(static_cast<std::size_t>(half));
  for (std::int64_t i = 0; i < half; ++i)
    inv_freq[static_cast<std::size_t>(i)] = std::pow(theta, -2.0 * double(i) / double(d));
  std::vector<T> cs(static_cast<std::size_t>(half)), sn(static_cast<std::size_t>(half));
  for (std::int64_t t = 0; t < tokens; ++t) {
    // Angles depend only on the global position, so every context-parallel layout gets the same bits.
    for (std::int64_t i = 0; i < half; ++i) {
      const double a = double(pos[t]) * inv_freq[static_cast<std::size_t>(i)];
      cs[static_cast<std::size_t>(i)] = T(std::cos(a));
      sn[static_cast<std::size_t>(i)] = T(sign * std::sin(a));
    }
    for (std::int64_t h = 0; h < heads; ++h) {
      T* lo = x + (t * heads + h) * d;
      T* hi = lo + half;
      for (std::int64_t i = 0; i < half; ++i) {
        const T a = lo[i], b = hi[i];
        lo[i] = a * cs[static_cast<std::size_t>(i)] - b * sn[static_cast<std::size_t>(i)];
        hi[i] = b * cs[static_cast<std::size_t>(i)] + a * sn[static_cast<std::size_t>(i)];
      }
    }
  }
}

}  // namespace

template <class T>
void rope_forward(T* x, const std::int32_t* pos, std::int64_t tokens, std::int64_t heads,
                  std::int64_t head_dim, double theta) {
  rotate(x, pos, tokens, heads, head_dim, theta, +1.0);
}

template <class T>
void rope_backward(T* dx, const std::int32_t* pos, std::int64_t tokens, std::int64_t heads,
                   std::int64_t head_dim, double theta) {
  rotate(dx, pos, tokens, heads, head_dim, theta, -1.0);  // the transpose of a rotation is its inverse
}

template void rope_forward<float>(float*, const std::int32_t*, std::int64_t, std::int64_t, std::int64_t,
                                  double);
template void rope_forward<double>(double*, const std::int32_t*, std::int64_t, std::int64_t,
                                   std::int64_t, double);
template void rope_backward<float>(float*, const std::int32_t*, std::int64_t, std::int64_t,
                                   std::int64_t, double);
template void rope_backward<double>(double*, const std::int32_t*, std::int64_t, std::int64_t,
                                    std::int64_t, double);

}  // namespace meshrun::kernels::cpu
