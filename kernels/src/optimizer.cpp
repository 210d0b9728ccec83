// AdamW (PyTorch torch.optim.AdamW, single-tensor path) and the sum of squares for gradient norms.
#include <cmath>

#include "meshrun/kernels/cpu.hpp"

namespace meshrun::kernels::cpu {

template <class T>
void adamw_update(T* p, T* m, T* v, const T* g, std::int64_t n, const AdamW& hp) {
  const double bc1 = 1.0 - std::pow(hp.beta1, double(hp.step));
  const double bc2 = 1.0 - std::pow(hp.beta2, double(hp.step));
  const T decay = T(1.0 - hp.lr * hp.weight_decay);
  const T step_size = T(hp.lr / bc1);
  const T bc2_sqrt = T(std::sqrt(bc2));
  const T b1 = T(hp.beta1), b2 = T(hp.beta2), eps = T(hp.eps), gs = T(hp.grad_scale);
  const T one_b1 = T(1.0 - hp.beta1), one_b2 = T(1.0 - hp.beta2);
  for (std::int64_t i = 0; i < n; ++i) {
    const T gi = g[i] * gs;
    m[i] = b1 * m[i] + one_b1 * gi;
    v[i] = b2 * v[i] + one_b2 * gi * gi;
    const T denom = std::sqrt(v[i]) / bc2_sqrt + eps;
    p[i] = p[i] * decay - step_size * m[i] / denom;
  }
}

template <class T>
double sum_squares(const T* x, std::int64_t n) {
  double s = 0;
  for (std::int64_t i = 0; i < n; ++i) s += double(x[i]) * double(x[i]);
  return s;
}

template void adamw_update<float>(float*, float*, float*, const float*, std::int64_t, const AdamW&);
template void adamw_update<double>(double*, double*, double*, const double*, std::int64_t,
                                   const AdamW&);
template double sum_squares<float>(const float*, std::int64_t);
template double sum_squares<double>(const double*, std::int64_t);

}  // namespace meshrun::kernels::cpu
