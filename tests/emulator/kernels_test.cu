// Kernels written to break one rule each, for the emulator's self-tests (test_emulator.cpp), and their
// correct twins. Compiled like device/cuda/kernels.cu in the EMULATED build (the same device language, the
// same LAUNCH); they are not part of meshrun.
#include <cuda_runtime.h>

#include "../../device/cuda/launch.hpp"
#include "kernels_test.hpp"

namespace {

// out[i] = in[63 - i] through shared memory; without the barrier a thread reads a slot not yet written.
__global__ void k_reverse(float* out, const float* in, bool barrier) {
  __shared__ float sh[64];
  sh[threadIdx.x] = in[threadIdx.x];
  if (barrier) __syncthreads();
  out[threadIdx.x] = sh[63 - threadIdx.x];
}

// A warp sum over the lanes of `mask`; every lane of the block calls it when `all_call`, else only lanes < 16.
__global__ void k_warp_sum(float* out, const float* in, unsigned mask, bool all_call) {
  float v = in[threadIdx.x];
  if (!all_call && threadIdx.x >= 16) return;
  for (int o = 16; o > 0; o /= 2) v += __shfl_down_sync(mask, v, o);
  if (threadIdx.x == 0) out[0] = v;
}

// Reads dynamic shared memory at index n (n == count: one past the end).
__global__ void k_shared_index(float* out, int count, int n) {
  SHARED_DYNAMIC(float, sh);
  if (static_cast<int>(threadIdx.x) < count) sh[threadIdx.x] = static_cast<float>(threadIdx.x);
  __syncthreads();
  if (threadIdx.x == 0) out[0] = sh[n];
}

__global__ void k_fill(float* p, int n, float v) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) p[i] = v;
}
__global__ void k_copy(float* dst, const float* src, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) dst[i] = src[i];
}

// Thread 0 waits at a barrier the others skip.
__global__ void k_lonely_barrier(float* out) {
  if (threadIdx.x == 0) {
    __syncthreads();
    out[0] = 1;
  }
}

}  // namespace

namespace emutest {

void reverse(float* out, const float* in, bool barrier, cudaStream_t s) {
  LAUNCH(k_reverse, 1, 64, 0, s)(out, in, barrier);
}
void warp_sum(float* out, const float* in, unsigned mask, bool all_call, cudaStream_t s) {
  LAUNCH(k_warp_sum, 1, 32, 0, s)(out, in, mask, all_call);
}
void shared_index(float* out, int count, int n, cudaStream_t s) {
  LAUNCH(k_shared_index, 1, 32, count * sizeof(float), s)(out, count, n);
}
void fill(float* p, int n, float v, unsigned threads, cudaStream_t s) {
  LAUNCH(k_fill, (n + threads - 1) / threads, threads, 0, s)(p, n, v);
}
void fill_with_shared(float* p, int n, float v, std::size_t shared_bytes, cudaStream_t s) {
  LAUNCH(k_fill, (n + 255) / 256, 256, shared_bytes, s)(p, n, v);
}
void copy(float* dst, const float* src, int n, cudaStream_t s) {
  LAUNCH(k_copy, (n + 255) / 256, 256, 0, s)(dst, src, n);
}
void lonely_barrier(float* out, cudaStream_t s) { LAUNCH(k_lonely_barrier, 1, 64, 0, s)(out); }

}  // namespace emutest
