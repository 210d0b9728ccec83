// bfloat16 storage shared by host and device code: the upper 16 bits of an IEEE float, rounded to
// nearest-even (the rounding of __float2bfloat16_rn and of PyTorch's .to(torch.bfloat16)). The CUDA
// kernels store bf16 as these bit patterns (CUDA_R_16BF for cuBLASLt), so host and device round alike.
#pragma once
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define MESHRUN_HD __host__ __device__ __forceinline__
#else
#define MESHRUN_HD inline
#endif

namespace meshrun::device {

MESHRUN_HD std::uint32_t float_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
#endif
}

MESHRUN_HD float bits_float(std::uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
#endif
}

// Round to nearest, ties to even; NaN stays a (quiet) NaN, overflow rounds to ±inf as IEEE does.
MESHRUN_HD std::uint16_t bf16_from_float(float f) {
  std::uint32_t u = float_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((u >> 16) | 0x0040u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<std::uint16_t>(u >> 16);
}

MESHRUN_HD float float_from_bf16(std::uint16_t b) { return bits_float(static_cast<std::uint32_t>(b) << 16); }

// The value a float has after a round trip through bf16.
MESHRUN_HD float round_bf16(float f) { return float_from_bf16(bf16_from_float(f)); }

}  // namespace meshrun::device
