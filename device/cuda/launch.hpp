// The one way kernels.cu launches a kernel: LAUNCH(kernel, grid, block, shared_bytes, stream)(args...).
// Under nvcc it is the <<<>>> launch; in the EMULATED build (docs/gpu.md, "The emulator") it is the emulator's,
// which runs every thread of the grid on the host from the same kernel source. SHARED_DYNAMIC declares a
// kernel's dynamic shared memory (extern __shared__ under nvcc).
#pragma once

#if defined(MESHRUN_CUDA_EMULATED)
#include "meshrun/cuda_emu/emu.hpp"
#define LAUNCH(kernel, grid, block, shared_bytes, stream) \
  ::meshrun::emu::launch(#kernel, (grid), (block), (shared_bytes), (stream), [](auto... a) { kernel(a...); })
#define SHARED_DYNAMIC(type, name) type* name = static_cast<type*>(::meshrun::emu::dynamic_shared())
#else
#define LAUNCH(kernel, grid, block, shared_bytes, stream) kernel<<<(grid), (block), (shared_bytes), (stream)>>>
#define SHARED_DYNAMIC(type, name) extern __shared__ type name[]
#endif
