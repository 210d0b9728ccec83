// Linear layer with weights W[out, in]: the three products of forward and backward, all through the
// blocked gemm (gemm.hpp), so each output element is an fma chain over the contracted index in increasing
// order. The packing buffers are kept per thread between calls: small layers would otherwise spend a
// noticeable part of each product in malloc and zero-fill.
#include "gemm.hpp"
#include "meshrun/kernels/cpu.hpp"

namespace meshrun::kernels::cpu {

using detail::GemmScratch;
using detail::View;

namespace {
template <class T>
GemmScratch<T>& scratch() {
  thread_local GemmScratch<T> s;
  return s;
}
}  // namespace

template <class T>
void linear_forward(T* y, const T* x, const T* w, std::int64_t n, std::int64_t in, std::int64_t out) {
  GemmScratch<T>& s = scratch<T>();
  // y[n, out] = x[n, in] · Wᵀ: B(k, j) = W[j, k].
  detail::gemm(y, out, View<T>{x, in, 1}, View<T>{w, 1, in}, n, out, in, false, s);
}

template <class T>
void linear_backward_input(T* dx, const T* dy, const T* w, std::int64_t n, std::int64_t in,
                           std::int64_t out, Store store) {
  GemmScratch<T>& s = scratch<T>();
  // dx[n, in] = dy[n, out] · W[out, in].
  detail::gemm(dx, in, View<T>{dy, out, 1}, View<T>{w, in, 1}, n, in, out, store == Store::accumulate, s);
}

template <class T>
void linear_backward_weight(T* dw, const T* dy, const T* x, std::int64_t n, std::int64_t in,
                            std::int64_t out) {
  GemmScratch<T>& s = scratch<T>();
  // dW[out, in] += dyᵀ[out, n] · x[n, in]: A(i, k) = dy[k, i].
  detail::gemm(dw, in, View<T>{dy, 1, out}, View<T>{x, in, 1}, out, in, n, true, s);
}

#define MESHRUN_INSTANTIATE(T)                                                                          \
  template void linear_forward<T>(T*, const T*, const T*, std::int64_t, std::int64_t, std::int64_t);   \
  template void linear_backward_input<T>(T*, const T*, const T*, std::int64_t, std::int64_t,           \
                                         std::int64_t, Store);                                         \
  template void linear_backward_weight<T>(T*, const T*, const T*, std::int64_t, std::int64_t,          \
                                          std::int64_t);
MESHRUN_INSTANTIATE(float)
MESHRUN_INSTANTIATE(double)
#undef MESHRUN_INSTANTIATE

}  // namespace meshrun::kernels::cpu
