// The emulator's own interface (docs/gpu.md, "The emulator"): what the launch helper, the device language
// (device.hpp) and the emulator's tests call beyond the CUDA runtime API.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <tuple>
#include <utility>

#include "cuda_runtime_api.h"

namespace meshrun::emu {

// The GPU thread a fiber is running (threadIdx and friends read it).
struct ThreadState {
  uint3 thread_idx{};
  uint3 block_idx{};
  dim3 block_dim{};
  dim3 grid_dim{};
};
// Inline: kernels read threadIdx and friends in their inner loops.
extern thread_local const ThreadState* running_thread;   // null outside a kernel thread
[[noreturn]] void outside_kernel(const char* what);     // a hard error naming the caller
inline const ThreadState& current_thread() {
  if (!running_thread) outside_kernel("threadIdx/blockIdx/blockDim/gridDim");
  return *running_thread;
}

void syncthreads();
void syncwarp(unsigned mask);
enum class Shuffle { idx, up, down, bfly };
std::uint64_t shuffle(unsigned mask, std::uint64_t value, Shuffle kind, int arg, int width);
void* dynamic_shared();   // the block's extern __shared__ bytes (the launch's shared-memory argument)

// One kernel launch: every thread of every block runs `thread_body` (src/kernel.cpp). The arguments are
// copied at launch, as CUDA copies kernel parameters. Errors land in the runtime's last/sticky error.
void launch_kernel(const char* name, dim3 grid, dim3 block, std::size_t shared_bytes, cudaStream_t stream,
                   std::function<void()> thread_body);

template <class F>
struct Launch {
  const char* name;
  dim3 grid, block;
  std::size_t shared_bytes;
  cudaStream_t stream;
  F kernel;
  template <class... A>
  void operator()(A... args) const {
    launch_kernel(name, grid, block, shared_bytes, stream,
                  [k = kernel, tup = std::tuple<A...>(args...)] { std::apply(k, tup); });
  }
};
template <class F>
Launch<F> launch(const char* name, dim3 grid, dim3 block, std::size_t shared_bytes, cudaStream_t stream, F kernel) {
  return {name, grid, block, shared_bytes, stream, kernel};
}

// Runs `body` as one operation on `stream` (a copy, a memset, a matrix product): its device-memory accesses are
// tracked and ordered like a kernel's. Returns false (and sets the sticky error) when the body faulted.
bool run_on_stream(cudaStream_t stream, const char* what, const std::function<void()>& body);

// Each kernel launch runs twice, threads and blocks ascending then descending, and any difference in the
// device memory it wrote is an error naming the kernel (a missing __syncthreads, a race between threads).
// Off by default (twice the time); MESHRUN_EMULATED_ORDER_CHECK=1 turns it on, or this call.
void set_order_check(bool on);
bool order_check();

// Device memory statistics of the current device: bytes allocated now and at most since the last reset.
std::size_t bytes_in_use();
std::size_t peak_bytes();
void reset_peak_bytes();

// The message of the sticky error (or of the last error when none is sticky); empty when none.
std::string last_error_message();
// Clears the sticky error (the self-tests reset between cases; a real device would need a new process).
void reset_errors();

// The emulated cuBLASLt's message for its last failing status (which attribute, which combination).
std::string cublaslt_last_message();

}  // namespace meshrun::emu
