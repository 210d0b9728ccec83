// RMSNorm (Hugging Face LlamaRMSNorm) forward and backward; reductions run over j in increasing order.
#include <cmath>

#include "meshrun/kernels/cpu.hpp"

namespace meshrun::kernels::cpu {

template <class T>
void rmsnorm_forward(T* y, T* rstd, const T* x, const T* w, std::int64_t rows, std::int64_t dim,
                     double eps) {
  for (std::int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * dim;
    T* yr = y + r * dim;
    T ss = 0;
    for (std::int64_t j = 0; j < dim; ++j) ss += xr[j] * xr[j];
    const T rs = T(1) / std::sqrt(ss / T(dim) + T(eps));
    rstd[r] = rs;
    for (std::int64_t j = 0; j < dim; ++j) yr[j] = (xr[j] * rs) * w[j];
  }
}

template <class T>
void rmsnorm_backward_input(T* dx, const T* dy, const T* x, const T* w, const T* rstd, std::int64_t rows,
                            std::int64_t dim, Store store) {
  for (std::int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * dim;
    const T* dyr = dy + r * dim;
    T* dxr = dx + r * dim;
    const T rs = rstd[r];
    T dot = 0;
    for (std::int64_t j = 0; j < dim; ++j) dot += dyr[j] * w[j] * (xr[j] * rs);
    const T mean = dot / T(dim);
    if (store == Store::accumulate) {
      for (std::int64_t j = 0; j < dim; ++j) dxr[j] += rs * (dyr[j] * w[j] - xr[j] * rs * mean);
    } else {
      for (std::int64_t j = 0; j < dim; ++j) dxr[j] = rs * (dyr[j] * w[j] - xr[j] * rs * mean);
    }
  }
}

template <class T>
void rmsnorm_backward_weight(T* dw, const T* dy, const T* x, const T* rstd, std::int64_t rows, std::int64_t dim) {
  for (std::int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * dim;
    const T* dyr = dy + r * dim;
    const T rs = rstd[r];
    for (std::int64_t j = 0; j < dim; ++j) dw[j] += dyr[j] * (xr[j] * rs);
  }
}

// The fused form is the two halves (the same expressions, so the same bits as a single loop would give).
template <class T>
void rmsnorm_backward(T* dx, T* dw, const T* dy, const T* x, const T* w, const T* rstd, std::int64_t rows,
                      std::int64_t dim, Store store) {
  rmsnorm_backward_weight(dw, dy, x, rstd, rows, dim);
  rmsnorm_backward_input(dx, dy, x, w, rstd, rows, dim, store);
}

template void rmsnorm_forward<float>(float*, float*, const float*, const float*, std::int64_t,
                                     std::int64_t, double);
template void rmsnorm_forward<double>(double*, double*, const double*, const double*, std::int64_t,
                                      std::int64_t, double);
template void rmsnorm_backward<float>(float*, float*, const float*, const float*, const float*,
                                      const float*, std::int64_t, std::int64_t, Store);
template void rmsnorm_backward<double>(double*, double*, const double*, const double*, const double*,
                                       const double*, std::int64_t, std::int64_t, Store);

template void rmsnorm_backward_input<float>(float*, const float*, const float*, const float*, const float*,
                                            std::int64_t, std::int64_t, Store);
template void rmsnorm_backward_input<double>(double*, const double*, const double*, const double*, const double*,
                                             std::int64_t, std::int64_t, Store);
template void rmsnorm_backward_weight<float>(float*, const float*, const float*, const float*, std::int64_t,
                                             std::int64_t);
template void rmsnorm_backward_weight<double>(double*, const double*, const double*, const double*, std::int64_t,
                                              std::int64_t);

}  // namespace meshrun::kernels::cpu
