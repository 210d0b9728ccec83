// Token embedding lookup and its gradient, aware of the vocab shard [v0, v0 + vl) a rank holds.
#include <algorithm>

#include "meshrun/kernels/cpu.hpp"

namespace meshrun::kernels::cpu {

template <class T>
void embedding_forward(T* out, const T* table, const std::int32_t* ids, std::int64_t n,
                       std::int64_t dim, std::int64_t v0, std::int64_t vl) {
  for (std::int64_t i = 0; i < n; ++i) {
    const std::int64_t id = ids[i];
    T* o = out + i * dim;
    if (id >= v0 && id < v0 + vl) {
      const T* row = table + (id - v0) * dim;
      std::copy(row, row + dim, o);
    } else {
      std::fill(o, o + dim, T(0));
    }
  }
}

template <class T>
void embedding_backward(T* dtable, const T* dout, const std::int32_t* ids, std::int64_t n,
                        std::int64_t dim, std::int64_t v0, std::int64_t vl) {
  for (std::int64_t i = 0; i < n; ++i) {  // in token order: repeated ids sum deterministically
    const std::int64_t id = ids[i];
    if (id < v0 || id >= v0 + vl) continue;
    T* row = dtable + (id - v0) * dim;
    const T* g = dout + i * dim;
    for (std::int64_t j = 0; j < dim; ++j) row[j] += g[j];
  }
}

#define MESHRUN_INSTANTIATE(T)                                                                     \
  template void embedding_forward<T>(T*, const T*, const std::int32_t*, std::int64_t, std::int64_t, \
                                     std::int64_t, std::int64_t);                                  \
  template void embedding_backward<T>(T*, const T*, const std::int32_t*, std::int64_t,             \
                                      std::int64_t, std::int64_t, std::int64_t);
MESHRUN_INSTANTIATE(float)
MESHRUN_INSTANTIATE(double)
#undef MESHRUN_INSTANTIATE

}  // namespace meshrun::kernels::cpu
