// MLP activations: SwiGLU (Llama) and GeLU in its tanh form (GPT-2 style alternative).
#include <cmath>

#include "meshrun/kernels/cpu.hpp"

namespace meshrun::kernels::cpu {
namespace {

template <class T>
T sigmoid(T x) {
  return T(1) / (T(1) + std::exp(-x));  // exp overflow gives inf → 0, the correct limit
}

template <class T>
constexpr T kGeluC = T(0.7978845608028654);  // sqrt(2/pi)
template <class T>
constexpr T kGeluA = T(0.044715);

}  // namespace

template <class T>
void swiglu_forward(T* h, const T* gate, const T* up, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) h[i] = gate[i] * sigmoid(gate[i]) * up[i];
}

template <class T>
void swiglu_backward(T* dgate, T* dup, const T* dh, const T* gate, const T* up, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) {
    const T g = gate[i];
    const T s = sigmoid(g);
    dgate[i] = dh[i] * up[i] * (s * (T(1) + g * (T(1) - s)));
    dup[i] = dh[i] * (g * s);
  }
}

template <class T>
void gelu_tanh_forward(T* y, const T* x, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) {
    const T v = x[i];
    y[i] = T(0.5) * v * (T(1) + std::tanh(kGeluC<T> * (v + kGeluA<T> * v * v * v)));
  }
}

template <class T>
void gelu_tanh_backward(T* dx, const T* dy, const T* x, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) {
    const T v = x[i];
    const T th = std::tanh(kGeluC<T> * (v + kGeluA<T> * v * v * v));
    const T du = kGeluC<T> * (T(1) + T(3) * kGeluA<T> * v * v);
    dx[i] = dy[i] * (T(0.5) * (T(1) + th) + T(0.5) * v * (T(1) - th * th) * du);
  }
}

#define MESHRUN_INSTANTIATE(T)                                                                   \
  template void swiglu_forward<T>(T*, const T*, const T*, std::int64_t);                        \
  template void swiglu_backward<T>(T*, T*, const T*, const T*, const T*, std::int64_t);         \
  template void gelu_tanh_forward<T>(T*, const T*, std::int64_t);                               \
  template void gelu_tanh_backward<T>(T*, const T*, const T*, std::int64_t);
MESHRUN_INSTANTIATE(float)
MESHRUN_INSTANTIATE(double)
#undef MESHRUN_INSTANTIATE

}  // namespace meshrun::kernels::cpu
