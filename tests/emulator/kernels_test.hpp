// The self-test kernels' launchers (kernels_test.cu).
#pragma once
#include <cstddef>

#include <cuda_runtime_api.h>

namespace emutest {
void reverse(float* out, const float* in, bool barrier, cudaStream_t s);
void warp_sum(float* out, const float* in, unsigned mask, bool all_call, cudaStream_t s);
void shared_index(float* out, int count, int n, cudaStream_t s);
void fill(float* p, int n, float v, unsigned threads, cudaStream_t s);
void fill_with_shared(float* p, int n, float v, std::size_t shared_bytes, cudaStream_t s);
void copy(float* dst, const float* src, int n, cudaStream_t s);
void lonely_barrier(float* out, cudaStream_t s);
}  // namespace emutest
