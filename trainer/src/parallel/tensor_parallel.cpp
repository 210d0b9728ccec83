#include "meshrun/train/parallel/tensor_parallel.hpp"

#include <algorithm>

namespace meshrun::train {

template <class T>
void TensorParallel::reduce_rows(T* partial, T* out) const {
  if (tp->size() == 1) {
    if (partial != out) std::copy(partial, partial + n * h, out);
    return;
  }
  if (sp) return tp->reduce_scatter(partial, out, nl * h);
  tp->all_reduce(partial, n * h);
  if (partial != out) std::copy(partial, partial + n * h, out);
}

template <class T>
void TensorParallel::gather_rows(const T* local, T* full) const {
  if (!gathers()) {
    if (local != full) std::copy(local, local + nl * h, full);
    return;
  }
  tp->all_gather(local, full, nl * h);
}

template <class T>
const T* TensorParallel::full_rows(const T* local, T* scratch) const {
  if (!gathers()) return local;
  tp->all_gather(local, scratch, nl * h);
  return scratch;
}

template <class T>
void TensorParallel::sum_replicated_grad(T* v, std::int64_t len) const {
  if (gathers()) tp->all_reduce(v, len);
}

#define MESHRUN_TP_INSTANTIATE(T)                                                   \
  template void TensorParallel::reduce_rows<T>(T*, T*) const;                       \
  template void TensorParallel::gather_rows<T>(const T*, T*) const;                 \
  template const T* TensorParallel::full_rows<T>(const T*, T*) const;               \
  template void TensorParallel::sum_replicated_grad<T>(T*, std::int64_t) const;
MESHRUN_TP_INSTANTIATE(float)
MESHRUN_TP_INSTANTIATE(double)
#undef MESHRUN_TP_INSTANTIATE

}  // namespace meshrun::train
