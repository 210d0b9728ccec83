// The emulator's kernel engine (docs/gpu.md, "The emulator"): a launch runs its blocks one after another; a
// block's threads are fibers (Boost.Context's fcontext: a switch is a few instructions, no system call, and a
// block abandoned after a fault leaves nothing to unwind) on one host thread, switched only at __syncthreads
// and the warp intrinsics. What CUDA leaves undefined and a GPU would punish by chance is an error here: a
// barrier some threads skip, a shuffle whose mask names an exited lane or a lane that is not there, lanes that
// disagree on the mask, a read from a lane outside the mask, an index past the dynamic shared memory.
#include <boost/context/detail/fcontext.hpp>
#include <sys/mman.h>

#include <algorithm>
#include <csetjmp>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "internal.hpp"
#include "meshrun/cuda_emu/emu.hpp"

namespace bctx = boost::context::detail;

// The bounds of the static __shared__ arrays of every kernel linked in (device.hpp puts them in this section;
// the linker defines the symbols when one exists).
extern "C" char __start_meshrun_shared[] __attribute__((weak));
extern "C" char __stop_meshrun_shared[] __attribute__((weak));

namespace meshrun::emu {
namespace detail {
namespace {

constexpr std::size_t kPage = 4096;
constexpr std::size_t kStackBytes = 64 * 1024;          // per GPU thread (kernels are shallow)
constexpr std::size_t kMaxDynamicShared = 48 * 1024;    // the default limit without cudaFuncSetAttribute
constexpr unsigned char kSharedCanary = 0x5A;

enum class Wait { none, barrier, warp };
enum class Run { not_started, ready, waiting, done };

struct Stack {
  char* map = nullptr;   // [map, map + kPage) is the guard
  bctx::fcontext_t idle = nullptr;   // a fiber parked at the top of its loop, ready for the next thread
};

struct GpuThread {
  ThreadState ts;
  int linear = 0, lane = 0, warp = 0;
  Run run = Run::not_started;
  Wait wait = Wait::none;
  bctx::fcontext_t ctx = nullptr;
  Stack* stack = nullptr;
  sigjmp_buf jb;
  // At a warp intrinsic:
  unsigned mask = 0;
  bool is_sync = false;   // __syncwarp (no data)
  Shuffle kind = Shuffle::idx;
  int arg = 0, width = 32;
  std::uint64_t value = 0, result = 0;
};

struct Engine {
  const char* kernel = "";
  const std::function<void()>* body = nullptr;
  std::vector<GpuThread> threads;
  GpuThread* running = nullptr;
  bctx::fcontext_t sched = nullptr;
  bool faulted = false;
  int warp_waiters = 0;   // threads waiting in a warp intrinsic now
  std::vector<Stack*> free_stacks;
  std::vector<std::unique_ptr<Stack>> stacks;
  // Dynamic shared memory: [shm_map, +kPage) guard, then the bytes, a guard page at the end.
  char* shm_map = nullptr;
  char* shm_hi = nullptr;   // the end guard's start
  char* shm = nullptr;      // the launch's bytes end at (or within 15 bytes of) shm_hi
  std::size_t shm_bytes = 0;
  dim3 block_idx;
};
thread_local Engine* engine = nullptr;   // set while a grid runs

Engine& the_engine() {
  static thread_local Engine e;
  return e;
}

Stack* take_stack(Engine& e) {
  if (!e.free_stacks.empty()) {
    Stack* s = e.free_stacks.back();
    e.free_stacks.pop_back();
    return s;
  }
  auto s = std::make_unique<Stack>();
  void* m = mmap(nullptr, kStackBytes + kPage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                 -1, 0);
  if (m == MAP_FAILED) fatal("no memory for a GPU thread's stack");
  mprotect(m, kPage, PROT_NONE);
  s->map = static_cast<char*>(m);
  e.stacks.push_back(std::move(s));
  return e.stacks.back().get();
}

std::string where(const GpuThread& t) {
  char b[160];
  std::snprintf(b, sizeof b, "block (%u,%u,%u) thread (%u,%u,%u)", t.ts.block_idx.x, t.ts.block_idx.y,
                t.ts.block_idx.z, t.ts.thread_idx.x, t.ts.thread_idx.y, t.ts.thread_idx.z);
  return b;
}
std::string hex(unsigned m) {
  char b[16];
  std::snprintf(b, sizeof b, "0x%08x", m);
  return b;
}

// Back to the scheduler; returns when the scheduler resumes this thread.
void yield_to_scheduler() {
  Engine& e = *engine;
  GpuThread* self = e.running;
  const bctx::transfer_t t = bctx::jump_fcontext(e.sched, nullptr);
  e.sched = t.fctx;
  e.running = self;
  running_thread = &self->ts;
  fault_jump = &self->jb;
}

void fiber_main(bctx::transfer_t t) {
  Engine& e = *static_cast<Engine*>(t.data);
  e.sched = t.fctx;
  for (;;) {
    GpuThread* th = e.running;
    fault_jump = &th->jb;
    if (sigsetjmp(th->jb, 0) == 0) {
      (*e.body)();
    } else {
      e.faulted = true;
    }
    th = e.running;
    th->run = Run::done;
    const bctx::transfer_t r = bctx::jump_fcontext(e.sched, nullptr);
    e.sched = r.fctx;
  }
}

// Runs (or resumes) one thread until it finishes or waits.
void resume(Engine& e, GpuThread& t) {
  if (t.run == Run::not_started) {
    t.stack = take_stack(e);
    if (t.stack->idle) {
      t.ctx = t.stack->idle;
      t.stack->idle = nullptr;
    } else {
      t.ctx = bctx::make_fcontext(t.stack->map + kPage + kStackBytes, kStackBytes, fiber_main);
    }
  }
  t.run = Run::ready;
  e.running = &t;
  running_thread = &t.ts;
  sigjmp_buf* outer = fault_jump;
  const bctx::transfer_t r = bctx::jump_fcontext(t.ctx, &e);
  fault_jump = outer;
  e.running = nullptr;
  running_thread = nullptr;
  t.ctx = r.fctx;
  if (t.run == Run::done) {   // parked at the top of fiber_main's loop: the stack can take another thread
    t.stack->idle = r.fctx;
    e.free_stacks.push_back(t.stack);
    t.stack = nullptr;
  } else {
    t.run = Run::waiting;
  }
}

// After a fault: every fiber still holding a stack is dropped (nothing of it is resumed).
void abandon(Engine& e) {
  for (GpuThread& t : e.threads)
    if (t.stack) {
      t.stack->idle = nullptr;
      e.free_stacks.push_back(t.stack);
      t.stack = nullptr;
    }
}

int src_lane(const GpuThread& t) {
  const int w = t.width, seg = t.lane & ~(w - 1), in = t.lane & (w - 1);
  switch (t.kind) {
    case Shuffle::idx: return seg + (((t.arg % w) + w) % w);
    case Shuffle::up: return in - t.arg < 0 ? t.lane : t.lane - t.arg;
    case Shuffle::down: return in + t.arg >= w ? t.lane : t.lane + t.arg;
    case Shuffle::bfly: {
      const int s = t.lane ^ t.arg;
      return (s & ~(w - 1)) != seg || s >= 32 ? t.lane : s;
    }
  }
  return t.lane;
}

// Releases the warp intrinsics whose lanes have all arrived; an error for lanes that never can.
bool release_warps(Engine& e, Op& op, int nthreads) {
  bool progressed = false;
  const int warps = (nthreads + 31) / 32;
  for (int w = 0; w < warps; ++w) {
    for (int l = 0; l < 32; ++l) {
      const int i = w * 32 + l;
      if (i >= nthreads) break;
      GpuThread& t = e.threads[i];
      if (t.run != Run::waiting || t.wait != Wait::warp) continue;
      const char* fn = t.is_sync ? "__syncwarp" : "__shfl_*_sync";
      bool all = true;
      for (int m = 0; m < 32 && all; ++m) {
        if (!(t.mask & (1u << m))) continue;
        const int j = w * 32 + m;
        if (j >= nthreads) {
          op.fault = std::string("kernel ") + e.kernel + ": " + where(t) + ": " + fn + " mask " + hex(t.mask) +
                     " names lane " + std::to_string(m) + ", which this block of " + std::to_string(nthreads) +
                     " threads does not have";
          return false;
        }
        const GpuThread& o = e.threads[j];
        if (o.run == Run::done) {
          op.fault = std::string("kernel ") + e.kernel + ": " + where(t) + ": " + fn + " mask " + hex(t.mask) +
                     " names lane " + std::to_string(m) + ", which has exited";
          return false;
        }
        if (o.run != Run::waiting) {
          all = false;
          continue;
        }
        if (o.wait == Wait::barrier) {
          op.fault = std::string("kernel ") + e.kernel + ": " + where(t) + " waits in " + fn + " (mask " +
                     hex(t.mask) + ") for lane " + std::to_string(m) + ", which waits at __syncthreads";
          return false;
        }
        if (o.mask != t.mask || o.is_sync != t.is_sync) {
          op.fault = std::string("kernel ") + e.kernel + ": lanes " + std::to_string(t.lane) + " and " +
                     std::to_string(m) + " of warp " + std::to_string(w) + " of block (" +
                     std::to_string(t.ts.block_idx.x) + "," + std::to_string(t.ts.block_idx.y) + "," +
                     std::to_string(t.ts.block_idx.z) + ") met in warp intrinsics with masks " + hex(t.mask) +
                     " and " + hex(o.mask) + " (every lane a mask names must pass the same mask)";
          return false;
        }
      }
      if (!all) continue;
      for (int m = 0; m < 32; ++m) {
        if (!(t.mask & (1u << m))) continue;
        GpuThread& o = e.threads[w * 32 + m];
        if (!o.is_sync) {
          const int s = src_lane(o);
          if (!(t.mask & (1u << s))) {
            op.fault = std::string("kernel ") + e.kernel + ": " + where(o) + ": __shfl_*_sync reads lane " +
                       std::to_string(s) + ", which mask " + hex(t.mask) + " does not name (its value is undefined)";
            return false;
          }
          o.result = e.threads[w * 32 + s].value;
        }
      }
      for (int m = 0; m < 32; ++m)
        if (t.mask & (1u << m)) {
          GpuThread& o = e.threads[w * 32 + m];
          o.run = Run::ready;
          o.wait = Wait::none;
          --e.warp_waiters;
        }
      progressed = true;
    }
  }
  return progressed;
}

// Runs one block to completion; false when it faulted (op.fault says why).
bool run_block(Engine& e, Op& op, const dim3& grid, const dim3& block, const dim3& bi, bool reversed) {
  const int n = static_cast<int>(block.x * block.y * block.z);
  if (e.threads.size() != static_cast<std::size_t>(n)) e.threads.resize(static_cast<std::size_t>(n));
  e.warp_waiters = 0;
  for (int i = 0; i < n; ++i) {
    GpuThread& t = e.threads[i];
    t.run = Run::not_started;
    t.wait = Wait::none;
    t.ctx = nullptr;
    t.stack = nullptr;
    t.linear = i;
    t.lane = i % 32;
    t.warp = i / 32;
    t.ts.thread_idx = {static_cast<unsigned>(i) % block.x, (static_cast<unsigned>(i) / block.x) % block.y,
                       static_cast<unsigned>(i) / (block.x * block.y)};
    t.ts.block_idx = {bi.x, bi.y, bi.z};
    t.ts.block_dim = block;
    t.ts.grid_dim = grid;
  }
  e.block_idx = bi;
  {
    char* lo = __start_meshrun_shared;
    char* hi = __stop_meshrun_shared;
    if (lo && hi > lo) std::memset(lo, 0xFF, static_cast<std::size_t>(hi - lo));
  }
  if (e.shm_bytes) {
    std::memset(e.shm, 0xFF, e.shm_bytes);   // shared memory starts undefined: NaN / -1 patterns
    std::memset(e.shm + e.shm_bytes, kSharedCanary, static_cast<std::size_t>(e.shm_hi - (e.shm + e.shm_bytes)));
  }
  for (;;) {
    for (int k = 0; k < n; ++k) {
      GpuThread& t = e.threads[reversed ? n - 1 - k : k];
      if (t.run == Run::not_started || t.run == Run::ready) {
        resume(e, t);
        if (e.faulted) return false;
      }
    }
    int live = 0, at_barrier = 0;
    for (const GpuThread& t : e.threads) {
      if (t.run != Run::done) ++live;
      if (t.run == Run::waiting && t.wait == Wait::barrier) ++at_barrier;
    }
    if (live == 0) break;
    if (e.warp_waiters > 0) {
      if (release_warps(e, op, n)) continue;
      if (!op.fault.empty()) return false;
    }
    if (at_barrier == live) {
      if (live < n) {
        op.fault = std::string("kernel ") + e.kernel + ": __syncthreads in block (" + std::to_string(bi.x) + "," +
                   std::to_string(bi.y) + "," + std::to_string(bi.z) + ") is reached by " + std::to_string(live) +
                   " of its " + std::to_string(n) + " threads; the others exited (a barrier must be reached by all)";
        return false;
      }
      for (GpuThread& t : e.threads) {
        t.run = Run::ready;
        t.wait = Wait::none;
      }
      continue;
    }
    op.fault = std::string("kernel ") + e.kernel + ": block (" + std::to_string(bi.x) + "," + std::to_string(bi.y) +
               "," + std::to_string(bi.z) + ") cannot go on: " + std::to_string(at_barrier) +
               " threads wait at __syncthreads while " + std::to_string(live - at_barrier) +
               " wait in warp intrinsics (a barrier inside a branch some threads skip)";
    return false;
  }
  if (e.shm_bytes)
    for (char* p = e.shm + e.shm_bytes; p < e.shm_hi; ++p)
      if (static_cast<unsigned char>(*p) != kSharedCanary) {
        op.fault = std::string("kernel ") + e.kernel + ": block (" + std::to_string(bi.x) + "," +
                   std::to_string(bi.y) + "," + std::to_string(bi.z) + ") wrote dynamic shared memory at byte " +
                   std::to_string(p - e.shm) + ", past the end of its " + std::to_string(e.shm_bytes) + " bytes";
        op.fault_code = cudaErrorIllegalAddress;
        return false;
      }
  return true;
}

GpuThread& self(const char* what) {
  if (!engine || !engine->running) fatal(std::string(what) + " called outside a kernel");
  return *engine->running;
}

}  // namespace

bool in_kernel_thread() { return engine && engine->running; }

bool engine_fault(const void* addr, std::string* what) {
  Engine& e = *engine;
  const char* a = static_cast<const char*>(addr);
  const GpuThread& t = *e.running;
  if (e.shm_map && a >= e.shm_map && a < e.shm_hi + kPage) {
    *what = std::string("kernel ") + e.kernel + ": " + where(t) + ": index " +
            (a >= e.shm_hi ? "past the end" : "before the start") + " of its " + std::to_string(e.shm_bytes) +
            " bytes of dynamic shared memory (byte " + std::to_string(a - e.shm) + ")";
    return true;
  }
  for (const auto& s : e.stacks)
    if (a >= s->map && a < s->map + kPage) {
      *what = std::string("kernel ") + e.kernel + ": " + where(t) + ": stack overflow (an emulated GPU thread has " +
              std::to_string(kStackBytes / 1024) + " KiB)";
      return true;
    }
  return false;
}

void run_grid(Op& op, const char* name, dim3 grid, dim3 block, std::size_t shared_bytes,
              const std::function<void()>& body, bool reversed) {
  Engine& e = the_engine();
  if (engine) fatal(std::string("kernel ") + name + " launched from inside a kernel (dynamic parallelism is not emulated)");
  e.kernel = name;
  e.body = &body;
  e.faulted = false;
  if (!e.shm_map) {
    void* m = mmap(nullptr, kMaxDynamicShared + 3 * kPage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) fatal("no memory for dynamic shared memory");
    e.shm_map = static_cast<char*>(m);
    e.shm_hi = e.shm_map + kPage + kMaxDynamicShared + kPage;
    mprotect(e.shm_map, kPage, PROT_NONE);
    mprotect(e.shm_hi, kPage, PROT_NONE);
  }
  e.shm_bytes = shared_bytes;
  e.shm = e.shm_hi - ((shared_bytes + 15) / 16) * 16;
  engine = &e;
  const std::uint64_t blocks = std::uint64_t(grid.x) * grid.y * grid.z;
  for (std::uint64_t k = 0; k < blocks; ++k) {
    const std::uint64_t b = reversed ? blocks - 1 - k : k;
    const dim3 bi(static_cast<unsigned>(b % grid.x), static_cast<unsigned>((b / grid.x) % grid.y),
                  static_cast<unsigned>(b / (std::uint64_t(grid.x) * grid.y)));
    const bool ok = run_block(e, op, grid, block, bi, reversed);
    if (!ok) {
      abandon(e);
      if (op.fault_code == cudaSuccess) op.fault_code = cudaErrorLaunchFailure;
      break;
    }
  }
  e.running = nullptr;
  engine = nullptr;
}

}  // namespace detail

using namespace detail;

thread_local const ThreadState* running_thread = nullptr;
void outside_kernel(const char* what) { fatal(std::string(what) + " used outside a kernel"); }

void syncthreads() {
  GpuThread& t = self("__syncthreads");
  t.wait = Wait::barrier;
  yield_to_scheduler();
}

namespace {
void at_warp_intrinsic(GpuThread& t, const char* fn, unsigned mask) {
  if (!(mask & (1u << t.lane)))
    device_fault(cudaErrorLaunchFailure, std::string("kernel ") + engine->kernel + ": " + where(t) + ": " + fn +
                                             " mask " + hex(mask) + " does not name the calling lane " +
                                             std::to_string(t.lane));
  t.mask = mask;
  t.wait = Wait::warp;
  ++engine->warp_waiters;
  yield_to_scheduler();
}
}  // namespace

void syncwarp(unsigned mask) {
  GpuThread& t = self("__syncwarp");
  t.is_sync = true;
  at_warp_intrinsic(t, "__syncwarp", mask);
}

std::uint64_t shuffle(unsigned mask, std::uint64_t value, Shuffle kind, int arg, int width) {
  GpuThread& t = self("__shfl_*_sync");
  if (width < 1 || width > 32 || (width & (width - 1)))
    device_fault(cudaErrorLaunchFailure, std::string("kernel ") + engine->kernel + ": " + where(t) +
                                             ": __shfl_*_sync width " + std::to_string(width) +
                                             " is not a power of two up to 32");
  t.is_sync = false;
  t.kind = kind;
  t.arg = arg;
  t.width = width;
  t.value = value;
  at_warp_intrinsic(t, "__shfl_*_sync", mask);
  return t.result;
}

void* dynamic_shared() {
  self("dynamic shared memory");
  return engine->shm;
}

namespace {
bool order_check_on() {
  static const bool env = [] {
    const char* v = std::getenv("MESHRUN_EMULATED_ORDER_CHECK");
    return v && std::strcmp(v, "0") != 0 && *v;
  }();
  return env;
}
int order_override = -1;
}  // namespace

void set_order_check(bool on) { order_override = on ? 1 : 0; }
bool order_check() { return order_override >= 0 ? order_override == 1 : order_check_on(); }

void launch_kernel(const char* name, dim3 grid, dim3 block, std::size_t shared_bytes, cudaStream_t stream,
                   std::function<void()> thread_body) {
  std::lock_guard<std::recursive_mutex> lock(mu);
  const int id = stream_id(stream, name);
  if (id < 0) return;
  const std::uint64_t threads = std::uint64_t(block.x) * block.y * block.z;
  std::string bad;
  if (grid.x == 0 || grid.y == 0 || grid.z == 0 || block.x == 0 || block.y == 0 || block.z == 0)
    bad = "a zero grid or block dimension";
  else if (threads > 1024 || block.x > 1024 || block.y > 1024 || block.z > 64)
    bad = "block (" + std::to_string(block.x) + "," + std::to_string(block.y) + "," + std::to_string(block.z) +
          ") is over the limits (1024 threads; x, y <= 1024, z <= 64)";
  else if (grid.x > 2147483647u || grid.y > 65535 || grid.z > 65535)
    bad = "grid (" + std::to_string(grid.x) + "," + std::to_string(grid.y) + "," + std::to_string(grid.z) +
          ") is over the limits (x < 2^31, y and z <= 65535)";
  if (!bad.empty()) {
    set_last(cudaErrorInvalidConfiguration, "kernel " + std::string(name) + ": launch with " + bad);
    return;
  }
  if (shared_bytes > kMaxDynamicShared) {
    set_last(cudaErrorInvalidValue, "kernel " + std::string(name) + ": " + std::to_string(shared_bytes) +
                                        " bytes of dynamic shared memory, over the 48 KiB limit");
    return;
  }
  const bool twice = order_check();
  run_op(id, name, [&](Op& op) {
    if (!twice) {
      run_grid(op, name, grid, block, shared_bytes, thread_body, false);
      return;
    }
    op.capture_before = true;
    run_grid(op, name, grid, block, shared_bytes, thread_body, false);
    if (!op.fault.empty()) return;
    std::vector<std::pair<Alloc*, std::vector<char>>> first;
    for (Alloc* a : op.touched)
      if (a->op_write) first.emplace_back(a, std::vector<char>(a->open_lo, a->open_hi));
    restore_before(op);
    run_grid(op, name, grid, block, shared_bytes, thread_body, true);
    if (!op.fault.empty()) return;
    for (Alloc* a : op.touched) {
      if (a->before.empty()) continue;   // not written by either pass
      const std::vector<char>* ref = &a->before;
      for (const auto& [fa, bytes] : first)
        if (fa == a) ref = &bytes;
      for (std::size_t i = 0; i < ref->size(); ++i)
        if ((*ref)[i] != a->open_lo[i]) {
          op.fault = "kernel " + std::string(name) + " wrote different bytes when its blocks and threads ran in " +
                     "ascending and in descending order: offset " +
                     std::to_string(static_cast<long long>(a->open_lo + i - a->base)) + " of " + describe_alloc(*a) +
                     " (a missing __syncthreads, or threads racing on one address)";
          op.fault_code = cudaErrorLaunchFailure;
          return;
        }
    }
  });
}

}  // namespace meshrun::emu
