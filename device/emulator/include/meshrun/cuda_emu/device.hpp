// The CUDA device language, as the host compiler sees a .cu file in the EMULATED build (docs/gpu.md,
// "The emulator"): the build force-includes this header into device/cuda/kernels.cu, so the same kernel
// source compiles with g++. Every GPU thread runs as its own fiber (src/kernel.cpp): threadIdx, blockIdx,
// __syncthreads and the warp shuffles read and synchronise that fiber's block; a block's threads share its
// __shared__ arrays (function statics: blocks of all kernels run one at a time, under one lock). They sit in
// one section, which the engine fills with 0xFF before every block: shared memory starts undefined on a GPU,
// and a value a block did not write (a missing barrier, a read before the write) shows as NaN or -1.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "cuda_runtime_api.h"
#include "meshrun/cuda_emu/emu.hpp"

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __restrict__
#define __shared__ static __attribute__((section("meshrun_shared")))
#define __launch_bounds__(...)

#define threadIdx (::meshrun::emu::current_thread().thread_idx)
#define blockIdx (::meshrun::emu::current_thread().block_idx)
#define blockDim (::meshrun::emu::current_thread().block_dim)
#define gridDim (::meshrun::emu::current_thread().grid_dim)
constexpr int warpSize = 32;

inline void __syncthreads() { ::meshrun::emu::syncthreads(); }
inline void __syncwarp(unsigned mask = 0xffffffffu) { ::meshrun::emu::syncwarp(mask); }

template <class T>
T __shfl_sync(unsigned mask, T v, int src_lane, int width = 32) {
  static_assert(std::is_trivially_copyable_v<T> && sizeof(T) <= 8, "__shfl_*_sync of a type over 8 bytes");
  std::uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof(T));
  bits = ::meshrun::emu::shuffle(mask, bits, ::meshrun::emu::Shuffle::idx, src_lane, width);
  std::memcpy(&v, &bits, sizeof(T));
  return v;
}
template <class T>
T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = 32) {
  static_assert(std::is_trivially_copyable_v<T> && sizeof(T) <= 8, "__shfl_*_sync of a type over 8 bytes");
  std::uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof(T));
  bits = ::meshrun::emu::shuffle(mask, bits, ::meshrun::emu::Shuffle::down, static_cast<int>(delta), width);
  std::memcpy(&v, &bits, sizeof(T));
  return v;
}
template <class T>
T __shfl_up_sync(unsigned mask, T v, unsigned delta, int width = 32) {
  static_assert(std::is_trivially_copyable_v<T> && sizeof(T) <= 8, "__shfl_*_sync of a type over 8 bytes");
  std::uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof(T));
  bits = ::meshrun::emu::shuffle(mask, bits, ::meshrun::emu::Shuffle::up, static_cast<int>(delta), width);
  std::memcpy(&v, &bits, sizeof(T));
  return v;
}
template <class T>
T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32) {
  static_assert(std::is_trivially_copyable_v<T> && sizeof(T) <= 8, "__shfl_*_sync of a type over 8 bytes");
  std::uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof(T));
  bits = ::meshrun::emu::shuffle(mask, bits, ::meshrun::emu::Shuffle::bfly, lane_mask, width);
  std::memcpy(&v, &bits, sizeof(T));
  return v;
}

// Device math as CUDA spells it. The host's libm: results may differ from the GPU's in the last bits (docs/gpu.md).
// The _rn intrinsics are single roundings: the EMULATED build compiles with -ffp-contract=off.
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline double __dadd_rn(double a, double b) { return a + b; }
inline double __dmul_rn(double a, double b) { return a * b; }
inline float __expf(float x) { return std::exp(x); }
inline float __logf(float x) { return std::log(x); }
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
inline unsigned max(unsigned a, unsigned b) { return a > b ? a : b; }
inline long min(long a, long b) { return a < b ? a : b; }
inline long max(long a, long b) { return a > b ? a : b; }
inline long long min(long long a, long long b) { return a < b ? a : b; }
inline long long max(long long a, long long b) { return a > b ? a : b; }
inline float min(float a, float b) { return std::fmin(a, b); }
inline float max(float a, float b) { return std::fmax(a, b); }
inline double min(double a, double b) { return std::fmin(a, b); }
inline double max(double a, double b) { return std::fmax(a, b); }
