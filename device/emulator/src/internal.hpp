// The emulator's shared state (runtime.cpp: memory, streams, events, faults; kernel.cpp: blocks and threads;
// cublaslt.cpp: products). One process-wide lock: device work of every host thread runs one operation at a
// time, at the moment it is enqueued; what a real device would run concurrently is checked by vector clocks.
#pragma once
#include <csetjmp>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "cuda_runtime_api.h"

namespace meshrun::emu::detail {

using Clock = std::vector<std::uint64_t>;   // a vector clock, indexed by stream id

struct Access {
  int stream = -1;   // -1: none
  std::uint64_t seq = 0;
  std::string op;
};

// One cudaMalloc: [map, map + map_bytes) is reserved; its first and last pages are guards (never accessible);
// [open_lo, open_hi) are the pages between. The user's bytes [base, base + bytes) start 256-byte aligned (as
// cudaMalloc's) as close to the last guard page as that allows; the slack between their end and the guard
// holds a canary, checked after every operation that wrote the allocation.
struct Alloc {
  int id = 0;
  int device = 0;
  bool freed = false;
  char* map = nullptr;
  std::size_t map_bytes = 0;
  char* open_lo = nullptr;
  char* open_hi = nullptr;
  char* base = nullptr;
  std::size_t bytes = 0;
  Access last_write;
  std::vector<Access> reads;   // since the last write, the latest per stream
  // The operation running now: what it did to this allocation (reset at its end).
  std::uint64_t op_epoch = 0;
  bool op_read = false, op_write = false;
  std::vector<char> before;   // order check: the bytes before the operation's first write
};

// The operation running now (a kernel, a copy, a product), between begin_op and end_op.
struct Op {
  const char* what = "";
  int stream = -1;
  int device = 0;
  std::uint64_t epoch = 0;
  bool capture_before = false;   // order check: keep each written allocation's bytes before its first write
  std::vector<Alloc*> touched;
  std::string fault;   // set by the fault handler or a kernel-side check
  cudaError_t fault_code = cudaSuccess;
};

extern std::recursive_mutex mu;
extern thread_local Op* current_op;
extern thread_local sigjmp_buf* fault_jump;   // where a fault inside an operation lands

// The sticky error of the process: set by a faulting operation, returned by every call after it.
void set_sticky(cudaError_t code, const std::string& message);
cudaError_t sticky();
cudaError_t set_last(cudaError_t code, const std::string& message);   // a non-sticky error of one call
[[noreturn]] void fatal(const std::string& message);                   // print and abort (host misuse)
// Called from device code (a fiber) or an operation: records the fault and leaves the thread/operation.
[[noreturn]] void device_fault(cudaError_t code, const std::string& message);

// Stream handles: validates `s` for the current device (nullptr: its legacy default stream); -1 and a set
// error when invalid.
int stream_id(cudaStream_t s, const char* call);
std::string stream_name(int id);
int current_device_checked(const char* call);   // -1 and a set error when there is no device

// An operation on a stream: begin (orders it after what it must follow), run `body` with its device-memory
// accesses tracked, end (race check, re-protect). False when it faulted (the sticky error is set).
bool run_op(int stream, const char* what, const std::function<void(Op&)>& body);
// For the order check: allocations the operation wrote, their bytes now, and a way to put the before back.
void restore_before(Op& op);
std::string describe_alloc(const Alloc& a);
Alloc* find_alloc(const void* p);   // the live or freed allocation whose reserved range holds p

// The kernel engine (kernel.cpp).
void run_grid(Op& op, const char* name, dim3 grid, dim3 block, std::size_t shared_bytes,
              const std::function<void()>& body, bool reversed);
bool in_kernel_thread();
// A fault at `addr` inside a kernel thread: whether it is the engine's (a shared-memory or stack guard), and
// the message for it.
bool engine_fault(const void* addr, std::string* what);

}  // namespace meshrun::emu::detail
