// The emulated CUDA runtime (docs/gpu.md, "The emulator"): devices, device memory, streams, events, errors.
//
// Every operation (kernel, copy, memset, product) runs on the host when it is enqueued, under one lock.
// Device memory is mapped PROT_NONE outside operations, so host code that dereferences a device pointer faults
// at once (a fatal message). Inside an operation the first access to an allocation faults too: the handler
// notes read or write, opens the allocation and restarts the instruction; at the operation's end the notes are
// checked against the allocation's last writer and readers with vector clocks, which is how a real device
// orders streams (in order within one, by events between two, by synchronisation with the host).
#include <signal.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "internal.hpp"
#include "meshrun/cuda_emu/emu.hpp"

struct CUstream_st {
  int id;
};
struct CUevent_st {
  int id;
};

namespace meshrun::emu {
namespace detail {

std::recursive_mutex mu;
thread_local Op* current_op = nullptr;
thread_local sigjmp_buf* fault_jump = nullptr;

namespace {

constexpr std::size_t kPage = 4096;
constexpr std::size_t kTotalMemory = 80ull << 30;   // what cudaMemGetInfo reports as total (an H100's 80 GB)
constexpr unsigned char kCanary = 0xA5;

struct Stream {
  int id = 0;
  int device = 0;
  bool legacy = false;     // the device's NULL stream (legacy default stream semantics)
  bool blocking = true;    // created without cudaStreamNonBlocking: synchronises with the legacy stream
  bool destroyed = false;
  Clock clock;             // clock[id] = operations enqueued so far
  double time_ms = 0;      // emulated time: the sum of its operations' host run times
  std::unique_ptr<CUstream_st> handle;
};
struct Event {
  bool recorded = false, timing = true, destroyed = false;
  int stream = -1;
  Clock clock;
  double time_ms = 0;
  std::unique_ptr<CUevent_st> handle;
};

struct State {
  bool initialised = false;
  int devices = 0;
  std::vector<std::unique_ptr<Stream>> streams;   // by id
  std::vector<int> legacy;                        // per device: its legacy stream id
  std::vector<std::unique_ptr<Event>> events;
  std::map<char*, std::unique_ptr<Alloc>> allocs;   // by map start; freed ones stay (their range stays reserved)
  std::vector<std::size_t> in_use, peak;            // per device
  int next_alloc = 1;
  std::uint64_t epoch = 0;
  Clock host;   // what the host has waited for
  cudaError_t sticky = cudaSuccess;
  std::string sticky_message;
  std::map<int, std::string> messages;   // per error code, the latest detailed message (cudaGetErrorString)
};
State& st() {
  static State s;
  return s;
}
thread_local int tl_device = 0;
thread_local cudaError_t tl_last = cudaSuccess;

void join(Clock& a, const Clock& b) {
  if (a.size() < b.size()) a.resize(b.size(), 0);
  for (std::size_t i = 0; i < b.size(); ++i) a[i] = std::max(a[i], b[i]);
}
std::uint64_t at(const Clock& c, int i) { return i >= 0 && static_cast<std::size_t>(i) < c.size() ? c[i] : 0; }

const char* code_name(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInitializationError: return "cudaErrorInitializationError";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    case cudaErrorInvalidDevicePointer: return "cudaErrorInvalidDevicePointer";
    case cudaErrorInvalidMemcpyDirection: return "cudaErrorInvalidMemcpyDirection";
    case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
    case cudaErrorNotReady: return "cudaErrorNotReady";
    case cudaErrorIllegalAddress: return "cudaErrorIllegalAddress";
    case cudaErrorLaunchOutOfResources: return "cudaErrorLaunchOutOfResources";
    case cudaErrorLaunchFailure: return "cudaErrorLaunchFailure";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorNoDevice: return "cudaErrorNoDevice";
    case cudaErrorUnknown: return "cudaErrorUnknown";
  }
  return "cudaErrorUnknown";
}
// The runtime's own descriptions (cudaGetErrorString of CUDA 13).
const char* code_text(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInitializationError: return "initialization error";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorInvalidDevicePointer: return "invalid device pointer";
    case cudaErrorInvalidMemcpyDirection: return "invalid copy direction for memcpy";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    case cudaErrorNotReady: return "device not ready";
    case cudaErrorIllegalAddress: return "an illegal memory access was encountered";
    case cudaErrorLaunchOutOfResources: return "too many resources requested for launch";
    case cudaErrorLaunchFailure: return "unspecified launch failure";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected";
    case cudaErrorUnknown: return "unknown error";
  }
  return "unknown error";
}

void note(cudaError_t code, const std::string& message) {
  st().messages[int(code)] = std::string(code_text(code)) + " (meshrun CUDA emulator: " + message + ")";
  std::fprintf(stderr, "meshrun CUDA emulator: %s: %s\n", code_name(code), message.c_str());
}

// Devices: MESHRUN_EMULATED_DEVICES (default 8), then CUDA_VISIBLE_DEVICES as the CUDA runtime reads it: a
// comma-separated list of indices; the list ends at the first invalid (out of range, repeated, not a number)
// entry; set but empty means no device.
void init() {
  State& s = st();
  if (s.initialised) return;
  s.initialised = true;
  int physical = 8;
  if (const char* e = std::getenv("MESHRUN_EMULATED_DEVICES")) {
    char* end = nullptr;
    const long v = std::strtol(e, &end, 10);
    if (end == e || *end != '\0' || v < 0 || v > 64)
      fatal(std::string("MESHRUN_EMULATED_DEVICES='") + e + "' is not a device count in 0..64");
    physical = static_cast<int>(v);
  }
  std::vector<int> visible;
  if (const char* v = std::getenv("CUDA_VISIBLE_DEVICES")) {
    std::string list(v);
    std::size_t pos = 0;
    while (pos <= list.size() && !list.empty()) {
      const std::size_t comma = std::min(list.find(',', pos), list.size());
      const std::string item = list.substr(pos, comma - pos);
      char* end = nullptr;
      const long idx = std::strtol(item.c_str(), &end, 10);
      if (item.empty() || *end != '\0' || idx < 0 || idx >= physical ||
          std::find(visible.begin(), visible.end(), int(idx)) != visible.end())
        break;
      visible.push_back(static_cast<int>(idx));
      pos = comma + 1;
    }
    s.devices = static_cast<int>(visible.size());
  } else {
    s.devices = physical;
  }
  s.in_use.assign(s.devices, 0);
  s.peak.assign(s.devices, 0);
  for (int d = 0; d < s.devices; ++d) {
    auto stream = std::make_unique<Stream>();
    stream->id = static_cast<int>(s.streams.size());
    stream->device = d;
    stream->legacy = true;
    stream->handle = nullptr;
    s.legacy.push_back(stream->id);
    s.streams.push_back(std::move(stream));
  }
}

// Protection of an allocation's open pages.
void protect(Alloc& a, int prot) {
  if (mprotect(a.open_lo, static_cast<std::size_t>(a.open_hi - a.open_lo), prot) != 0)
    fatal(std::string("mprotect failed: ") + std::strerror(errno));
}

void write_str(const char* s) {
  const std::size_t n = std::strlen(s);
  ssize_t r = ::write(2, s, n);
  (void)r;
}

struct sigaction previous_segv;
void segv(int sig, siginfo_t* si, void* ctx) {
  char* addr = static_cast<char*>(si->si_addr);
  Alloc* a = find_alloc(addr);
  Op* op = current_op;
  if (!a) {
    std::string what;
    if (op && in_kernel_thread() && engine_fault(addr, &what)) device_fault(cudaErrorIllegalAddress, what);
    // Not the emulator's memory: the previous handler (or the default action) takes it.
    sigaction(SIGSEGV, &previous_segv, nullptr);
    (void)sig;
    return;   // the instruction faults again, under the previous disposition
  }
  const auto* uc = static_cast<const ucontext_t*>(ctx);
  const bool write = (uc->uc_mcontext.gregs[REG_ERR] & 2) != 0;
  if (!op) {
    char msg[512];
    std::snprintf(msg, sizeof msg,
                  "meshrun CUDA emulator: host code %s device memory at %p (allocation #%d of %zu bytes, offset "
                  "%lld) outside any CUDA call: copy it with cudaMemcpy instead\n",
                  write ? "wrote" : "read", static_cast<void*>(addr), a->id, a->bytes,
                  static_cast<long long>(addr - a->base));
    write_str(msg);
    signal(SIGABRT, SIG_DFL);
    abort();
  }
  if (a->freed) device_fault(cudaErrorIllegalAddress, std::string(op->what) + " " + (write ? "wrote" : "read") +
                                                          " freed memory: " + describe_alloc(*a) + " after cudaFree");
  if (addr < a->base || addr >= a->open_hi) {
    const long long off = static_cast<long long>(addr - a->base);
    device_fault(cudaErrorIllegalAddress,
                 std::string(op->what) + " " + (write ? "wrote" : "read") + " out of bounds: offset " +
                     std::to_string(off) + " of " + describe_alloc(*a));
  }
  if (a->device != op->device)
    device_fault(cudaErrorIllegalAddress, std::string(op->what) + " on device " + std::to_string(op->device) +
                                              " touched " + describe_alloc(*a) + " (peer access is not emulated)");
  if (a->op_epoch != op->epoch) {
    a->op_epoch = op->epoch;
    a->op_read = a->op_write = false;
    a->before.clear();
    op->touched.push_back(a);
  }
  if (write) {
    protect(*a, PROT_READ | PROT_WRITE);
    if (op->capture_before && !a->op_write) a->before.assign(a->open_lo, a->open_hi);
    a->op_write = true;
  } else {
    protect(*a, a->op_write ? PROT_READ | PROT_WRITE : PROT_READ);
    a->op_read = true;
  }
}

// Installed again whenever another handler took SIGSEGV since (Open MPI and test frameworks install their own
// at start-up): that one becomes the handler for faults that are not the emulator's.
void install_handler() {
  struct sigaction cur{};
  sigaction(SIGSEGV, nullptr, &cur);
  if ((cur.sa_flags & SA_SIGINFO) && cur.sa_sigaction == segv) return;
  struct sigaction sa{};
  sa.sa_sigaction = segv;
  sa.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_NODEFER;   // NODEFER: the handler leaves by siglongjmp
  sigemptyset(&sa.sa_mask);
  sigaction(SIGSEGV, &sa, &previous_segv);
}
// The handler runs on an alternate stack (a fiber's stack overflow must still be reported).
void ensure_altstack() {
  thread_local bool have = false;
  if (have) return;
  have = true;
  stack_t cur{};
  if (sigaltstack(nullptr, &cur) == 0 && !(cur.ss_flags & SS_DISABLE) && cur.ss_size >= 65536) return;
  static thread_local std::vector<char> mem(256 * 1024);
  stack_t ss{};
  ss.ss_sp = mem.data();
  ss.ss_size = mem.size();
  sigaltstack(&ss, nullptr);
}

bool device_ok(int& dev, const char* call) {
  init();
  if (st().sticky != cudaSuccess) {
    tl_last = st().sticky;
    return false;
  }
  if (st().devices == 0) {
    set_last(cudaErrorNoDevice, std::string(call) + ": no device (CUDA_VISIBLE_DEVICES or MESHRUN_EMULATED_DEVICES)");
    return false;
  }
  dev = tl_device;
  return true;
}

Stream* stream_of(int id) { return st().streams[id].get(); }

Event* event_of(cudaEvent_t e, const char* call) {
  State& s = st();
  if (!e || e->id < 0 || static_cast<std::size_t>(e->id) >= s.events.size() || s.events[e->id]->destroyed) {
    set_last(cudaErrorInvalidResourceHandle, std::string(call) + ": not a live event");
    return nullptr;
  }
  return s.events[e->id].get();
}

// Orders an operation about to run on stream `id` after what it must follow; returns its sequence number.
std::uint64_t enqueue(Stream& q) {
  State& s = st();
  join(q.clock, s.host);
  if (q.legacy) {
    for (auto& o : s.streams)
      if (o->device == q.device && o->blocking && !o->legacy && !o->destroyed) {
        join(q.clock, o->clock);
        q.time_ms = std::max(q.time_ms, o->time_ms);
      }
  } else if (q.blocking) {
    Stream& l = *s.streams[s.legacy[q.device]];
    join(q.clock, l.clock);
    q.time_ms = std::max(q.time_ms, l.time_ms);
  }
  if (q.clock.size() <= static_cast<std::size_t>(q.id)) q.clock.resize(q.id + 1, 0);
  return ++q.clock[q.id];
}

// A conflict between this operation's access and an earlier one it is not ordered after.
bool unordered(const Access& prev, const Clock& c, int stream) {
  return prev.stream >= 0 && prev.stream != stream && at(c, prev.stream) < prev.seq;
}

}  // namespace

std::string stream_name(int id) {
  const Stream& q = *st().streams[id];
  if (q.legacy) return "the NULL stream of device " + std::to_string(q.device);
  return "stream " + std::to_string(id) + " (device " + std::to_string(q.device) + ")";
}

std::string describe_alloc(const Alloc& a) {
  char at[32];
  std::snprintf(at, sizeof at, "%p", static_cast<void*>(a.base));
  return "allocation #" + std::to_string(a.id) + " (" + std::to_string(a.bytes) + " bytes at " + at + ", device " +
         std::to_string(a.device) + ")";
}

Alloc* find_alloc(const void* p) {
  auto& m = st().allocs;
  auto it = m.upper_bound(const_cast<char*>(static_cast<const char*>(p)));
  if (it == m.begin()) return nullptr;
  --it;
  Alloc* a = it->second.get();
  return static_cast<const char*>(p) < a->map + a->map_bytes ? a : nullptr;
}

void set_sticky(cudaError_t code, const std::string& message) {
  State& s = st();
  note(code, message);
  if (s.sticky == cudaSuccess) {
    s.sticky = code;
    s.sticky_message = message;
  }
  tl_last = code;
}
cudaError_t sticky() {
  init();
  return st().sticky;
}
cudaError_t set_last(cudaError_t code, const std::string& message) {
  note(code, message);
  tl_last = code;
  return code;
}
void fatal(const std::string& message) {
  std::fprintf(stderr, "meshrun CUDA emulator: %s\n", message.c_str());
  std::fflush(stderr);
  std::abort();
}
void device_fault(cudaError_t code, const std::string& message) {
  Op* op = current_op;
  if (!op || !fault_jump) fatal("device fault outside an operation: " + message);
  if (op->fault.empty()) {
    op->fault = message;
    op->fault_code = code;
  }
  siglongjmp(*fault_jump, 1);
}

int current_device_checked(const char* call) {
  int d = 0;
  return device_ok(d, call) ? d : -1;
}

int stream_id(cudaStream_t s, const char* call) {
  int dev = 0;
  if (!device_ok(dev, call)) return -1;
  State& st_ = st();
  if (!s) return st_.legacy[dev];
  if (s->id < 0 || static_cast<std::size_t>(s->id) >= st_.streams.size() || st_.streams[s->id]->destroyed) {
    set_last(cudaErrorInvalidResourceHandle, std::string(call) + ": not a live stream");
    return -1;
  }
  if (st_.streams[s->id]->device != dev) {
    set_last(cudaErrorInvalidResourceHandle, std::string(call) + ": " + stream_name(s->id) +
                                                 " belongs to another device than the current one (" +
                                                 std::to_string(dev) + ")");
    return -1;
  }
  return s->id;
}

bool run_op(int stream, const char* what, const std::function<void(Op&)>& body) {
  State& s = st();
  install_handler();
  ensure_altstack();
  Stream& q = *s.streams[stream];
  const std::uint64_t seq = enqueue(q);
  Op op;
  op.what = what;
  op.stream = stream;
  op.device = q.device;
  op.epoch = ++s.epoch;
  op.capture_before = false;
  Op* outer_op = current_op;
  sigjmp_buf* outer_jump = fault_jump;
  sigjmp_buf jb;
  const auto t0 = std::chrono::steady_clock::now();
  current_op = &op;
  fault_jump = &jb;
  if (sigsetjmp(jb, 0) == 0) body(op);
  current_op = outer_op;
  fault_jump = outer_jump;
  q.time_ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  std::string race;
  for (Alloc* a : op.touched) {
    // Writes past the end of the user's bytes, inside the slack before the guard page.
    if (a->op_write && op.fault.empty()) {
      auto spoiled = [&](char* lo, char* hi) {
        for (char* p = lo; p < hi; ++p)
          if (static_cast<unsigned char>(*p) != kCanary) {
            op.fault = std::string(what) + " wrote out of bounds: offset " + std::to_string(p - a->base) + " of " +
                       describe_alloc(*a);
            op.fault_code = cudaErrorIllegalAddress;
            return true;
          }
        return false;
      };
      if (!spoiled(a->open_lo, a->base)) spoiled(a->base + a->bytes, a->open_hi);
    }
    if (race.empty()) {
      const Access& w = a->last_write;
      if (unordered(w, q.clock, stream))
        race = std::string(what) + " on " + stream_name(stream) + " " + (a->op_write ? "wrote" : "read") + " " +
               describe_alloc(*a) + ", which " + w.op + " on " + stream_name(w.stream) +
               " wrote with no event or synchronisation between them (cudaEventRecord on the writer's stream, "
               "cudaStreamWaitEvent on the reader's)";
      if (a->op_write)
        for (const Access& r : a->reads)
          if (race.empty() && unordered(r, q.clock, stream))
            race = std::string(what) + " on " + stream_name(stream) + " wrote " + describe_alloc(*a) + ", which " +
                   r.op + " on " + stream_name(r.stream) + " reads with no event or synchronisation between them";
    }
    if (a->op_write) {
      a->last_write = {stream, seq, what};
      a->reads.clear();
    } else if (a->op_read) {
      auto it = std::find_if(a->reads.begin(), a->reads.end(), [&](const Access& r) { return r.stream == stream; });
      if (it != a->reads.end())
        *it = {stream, seq, what};
      else
        a->reads.push_back({stream, seq, what});
    }
  }
  for (Alloc* a : op.touched) {
      protect(*a, PROT_NONE);
      a->op_epoch = 0;
    }
  if (!op.fault.empty()) {
    set_sticky(op.fault_code, op.fault);
    return false;
  }
  if (!race.empty()) {
    set_sticky(cudaErrorLaunchFailure, "race: " + race);
    return false;
  }
  return true;
}

void restore_before(Op& op) {
  for (Alloc* a : op.touched)
    if (a->op_write && !a->before.empty()) std::memcpy(a->open_lo, a->before.data(), a->before.size());
}

}  // namespace detail

using namespace detail;

bool run_on_stream(cudaStream_t stream, const char* what, const std::function<void()>& body) {
  std::lock_guard<std::recursive_mutex> lock(mu);
  const int id = stream_id(stream, what);
  if (id < 0) return false;
  return run_op(id, what, [&](Op&) { body(); });
}

std::size_t bytes_in_use() {
  std::lock_guard<std::recursive_mutex> lock(mu);
  init();
  return tl_device < st().devices ? st().in_use[tl_device] : 0;
}
std::size_t peak_bytes() {
  std::lock_guard<std::recursive_mutex> lock(mu);
  init();
  return tl_device < st().devices ? st().peak[tl_device] : 0;
}
void reset_peak_bytes() {
  std::lock_guard<std::recursive_mutex> lock(mu);
  init();
  if (tl_device < st().devices) st().peak[tl_device] = st().in_use[tl_device];
}
std::string last_error_message() {
  std::lock_guard<std::recursive_mutex> lock(mu);
  init();
  if (st().sticky != cudaSuccess) return st().sticky_message;
  if (tl_last == cudaSuccess) return "";
  return st().messages[int(tl_last)];
}
void reset_errors() {
  std::lock_guard<std::recursive_mutex> lock(mu);
  init();
  st().sticky = cudaSuccess;
  st().sticky_message.clear();
  tl_last = cudaSuccess;
}

}  // namespace meshrun::emu

using namespace meshrun::emu;
using namespace meshrun::emu::detail;

namespace {
using Lock = std::lock_guard<std::recursive_mutex>;
}

cudaError_t cudaGetLastError() {
  Lock l(mu);
  init();
  if (st().sticky != cudaSuccess) return st().sticky;
  const cudaError_t e = tl_last;
  tl_last = cudaSuccess;
  return e;
}
cudaError_t cudaPeekAtLastError() {
  Lock l(mu);
  init();
  return st().sticky != cudaSuccess ? st().sticky : tl_last;
}
const char* cudaGetErrorString(cudaError_t e) {
  Lock l(mu);
  auto it = st().messages.find(int(e));
  return it != st().messages.end() ? it->second.c_str() : code_text(e);
}
const char* cudaGetErrorName(cudaError_t e) { return code_name(e); }

cudaError_t cudaGetDeviceCount(int* count) {
  Lock l(mu);
  init();
  if (!count) return set_last(cudaErrorInvalidValue, "cudaGetDeviceCount: null count");
  *count = st().devices;
  if (st().devices == 0) return set_last(cudaErrorNoDevice, "cudaGetDeviceCount: no device is visible");
  return cudaSuccess;
}
cudaError_t cudaSetDevice(int device) {
  Lock l(mu);
  init();
  if (st().sticky != cudaSuccess) return st().sticky;
  if (st().devices == 0) return set_last(cudaErrorNoDevice, "cudaSetDevice: no device is visible");
  if (device < 0 || device >= st().devices)
    return set_last(cudaErrorInvalidDevice, "cudaSetDevice(" + std::to_string(device) + "): " +
                                                std::to_string(st().devices) + " devices are visible");
  tl_device = device;
  return cudaSuccess;
}
cudaError_t cudaGetDevice(int* device) {
  Lock l(mu);
  int d = 0;
  if (!device_ok(d, "cudaGetDevice")) return tl_last;
  if (!device) return set_last(cudaErrorInvalidValue, "cudaGetDevice: null pointer");
  *device = d;
  return cudaSuccess;
}
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
  Lock l(mu);
  init();
  if (!prop) return set_last(cudaErrorInvalidValue, "cudaGetDeviceProperties: null pointer");
  if (device < 0 || device >= st().devices)
    return set_last(cudaErrorInvalidDevice, "cudaGetDeviceProperties(" + std::to_string(device) + ")");
  std::memset(prop, 0, sizeof *prop);
  std::snprintf(prop->name, sizeof prop->name, "meshrun emulated CUDA device (host CPU)");
  prop->totalGlobalMem = kTotalMemory;
  prop->sharedMemPerBlock = 48 * 1024;
  prop->regsPerBlock = 65536;
  prop->warpSize = 32;
  prop->maxThreadsPerBlock = 1024;
  prop->maxThreadsDim[0] = 1024;
  prop->maxThreadsDim[1] = 1024;
  prop->maxThreadsDim[2] = 64;
  prop->maxGridSize[0] = 2147483647;
  prop->maxGridSize[1] = 65535;
  prop->maxGridSize[2] = 65535;
  prop->multiProcessorCount = 1;
  prop->major = 9;
  prop->minor = 0;
  return cudaSuccess;
}
cudaError_t cudaDeviceSynchronize() {
  Lock l(mu);
  install_handler();
  int d = 0;
  if (!device_ok(d, "cudaDeviceSynchronize")) return tl_last;
  for (auto& q : st().streams)
    if (q->device == d) join(st().host, q->clock);
  return cudaSuccess;
}
cudaError_t cudaMemGetInfo(std::size_t* free, std::size_t* total) {
  Lock l(mu);
  int d = 0;
  if (!device_ok(d, "cudaMemGetInfo")) return tl_last;
  if (!free || !total) return set_last(cudaErrorInvalidValue, "cudaMemGetInfo: null pointer");
  *total = kTotalMemory;
  *free = kTotalMemory - st().in_use[d];
  return cudaSuccess;
}

cudaError_t cudaMalloc(void** p, std::size_t bytes) {
  Lock l(mu);
  int d = 0;
  if (!device_ok(d, "cudaMalloc")) return tl_last;
  if (!p) return set_last(cudaErrorInvalidValue, "cudaMalloc: null pointer");
  *p = nullptr;
  if (bytes == 0) return cudaSuccess;
  State& s = st();
  if (bytes > kTotalMemory - s.in_use[d])
    return set_last(cudaErrorMemoryAllocation, "cudaMalloc of " + std::to_string(bytes) + " bytes with " +
                                                   std::to_string(kTotalMemory - s.in_use[d]) + " free");
  install_handler();
  const std::size_t user = (bytes + 255) / 256 * 256;
  const std::size_t open = (user + kPage - 1) / kPage * kPage;
  const std::size_t map_bytes = open + 2 * kPage;
  void* m = mmap(nullptr, map_bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (m == MAP_FAILED)
    return set_last(cudaErrorMemoryAllocation, "cudaMalloc of " + std::to_string(bytes) + " bytes: mmap failed");
  auto a = std::make_unique<Alloc>();
  a->id = s.next_alloc++;
  a->device = d;
  a->map = static_cast<char*>(m);
  a->map_bytes = map_bytes;
  a->open_lo = a->map + kPage;
  a->open_hi = a->open_lo + open;
  a->base = a->open_hi - user;
  a->bytes = bytes;
  // Fresh device memory is not zero on a GPU: 0xFF (NaN, -1) makes reading it before writing visible.
  protect(*a, PROT_READ | PROT_WRITE);
  std::memset(a->open_lo, 0xFF, open);
  std::memset(a->open_lo, kCanary, static_cast<std::size_t>(a->base - a->open_lo));
  std::memset(a->base + bytes, kCanary, static_cast<std::size_t>(a->open_hi - (a->base + bytes)));
  protect(*a, PROT_NONE);
  *p = a->base;
  s.in_use[d] += bytes;
  s.peak[d] = std::max(s.peak[d], s.in_use[d]);
  s.allocs.emplace(a->map, std::move(a));
  return cudaSuccess;
}
cudaError_t cudaPointerGetAttributes(cudaPointerAttributes* attr, const void* p) {
  Lock l(mu);
  int d = 0;
  if (!device_ok(d, "cudaPointerGetAttributes")) return tl_last;
  if (!attr) return set_last(cudaErrorInvalidValue, "cudaPointerGetAttributes: null attributes");
  *attr = {cudaMemoryTypeUnregistered, -2, nullptr, nullptr};
  const Alloc* a = find_alloc(p);
  const char* c = static_cast<const char*>(p);
  if (a && !a->freed && c >= a->base && c < a->base + a->bytes) *attr = {cudaMemoryTypeDevice, a->device, const_cast<void*>(p), nullptr};
  return cudaSuccess;
}

cudaError_t cudaFree(void* p) {
  Lock l(mu);
  int d = 0;
  if (!device_ok(d, "cudaFree")) return tl_last;
  if (!p) return cudaSuccess;
  Alloc* a = find_alloc(p);
  if (!a || a->freed || p != a->base)
    return set_last(cudaErrorInvalidValue, "cudaFree of a pointer cudaMalloc did not return (or freed twice)");
  // cudaFree waits for the device (CUDA Runtime API: "implicitly synchronizes").
  for (auto& q : st().streams)
    if (q->device == a->device) join(st().host, q->clock);
  a->freed = true;
  st().in_use[a->device] -= a->bytes;
  // The range stays reserved (a later access is reported as use after free) but its pages are dropped.
  mmap(a->open_lo, static_cast<std::size_t>(a->open_hi - a->open_lo), PROT_NONE,
       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
  return cudaSuccess;
}

namespace {
// Whether [p, p + n) lies in one live allocation (true), in host memory (false); -1 and an error otherwise.
int classify(const void* p, std::size_t n, const char* call, const char* which) {
  Alloc* a = find_alloc(p);
  if (!a) return 0;
  const char* c = static_cast<const char*>(p);
  if (a->freed) {
    set_last(cudaErrorInvalidValue, std::string(call) + ": " + which + " is in freed " + describe_alloc(*a));
    return -1;
  }
  if (c < a->base || c + n > a->base + a->bytes) {
    set_last(cudaErrorInvalidValue, std::string(call) + ": " + which + " [offset " + std::to_string(c - a->base) +
                                        ", +" + std::to_string(n) + ") is outside " + describe_alloc(*a));
    return -1;
  }
  return 1;
}
bool check_copy(void* dst, const void* src, std::size_t n, cudaMemcpyKind kind, const char* call) {
  const int dd = classify(dst, n, call, "the destination"), sd = classify(src, n, call, "the source");
  if (dd < 0 || sd < 0) return false;
  bool want_d = false, want_s = false;
  switch (kind) {
    case cudaMemcpyHostToHost: break;
    case cudaMemcpyHostToDevice: want_d = true; break;
    case cudaMemcpyDeviceToHost: want_s = true; break;
    case cudaMemcpyDeviceToDevice: want_d = want_s = true; break;
    case cudaMemcpyDefault: return true;
    default: set_last(cudaErrorInvalidMemcpyDirection, std::string(call) + ": kind " + std::to_string(int(kind))); return false;
  }
  if ((dd == 1) != want_d || (sd == 1) != want_s) {
    set_last(cudaErrorInvalidValue, std::string(call) + ": the kind says " + (want_s ? "device" : "host") + " to " +
                                        (want_d ? "device" : "host") + ", the pointers are " +
                                        (sd ? "device" : "host") + " to " + (dd ? "device" : "host"));
    return false;
  }
  return true;
}
}  // namespace

cudaError_t cudaMemcpyAsync(void* dst, const void* src, std::size_t n, cudaMemcpyKind kind, cudaStream_t s) {
  Lock l(mu);
  const int id = stream_id(s, "cudaMemcpyAsync");
  if (id < 0) return tl_last;
  if (!check_copy(dst, src, n, kind, "cudaMemcpyAsync")) return tl_last;
  if (n == 0) return cudaSuccess;
  return run_op(id, "cudaMemcpyAsync", [&](Op&) { std::memmove(dst, src, n); }) ? cudaSuccess : st().sticky;
}
cudaError_t cudaMemcpy(void* dst, const void* src, std::size_t n, cudaMemcpyKind kind) {
  Lock l(mu);
  const cudaError_t e = cudaMemcpyAsync(dst, src, n, kind, nullptr);
  if (e != cudaSuccess) return e;
  join(st().host, stream_of(st().legacy[tl_device])->clock);   // synchronous with the host
  return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void* p, int value, std::size_t n, cudaStream_t s) {
  Lock l(mu);
  const int id = stream_id(s, "cudaMemsetAsync");
  if (id < 0) return tl_last;
  if (classify(p, n, "cudaMemsetAsync", "the destination") != 1) {
    if (tl_last == cudaSuccess) set_last(cudaErrorInvalidValue, "cudaMemsetAsync of host memory");
    return tl_last;
  }
  if (n == 0) return cudaSuccess;
  return run_op(id, "cudaMemsetAsync", [&](Op&) { std::memset(p, value, n); }) ? cudaSuccess : st().sticky;
}
cudaError_t cudaMemset(void* p, int value, std::size_t n) {
  Lock l(mu);
  const cudaError_t e = cudaMemsetAsync(p, value, n, nullptr);
  if (e != cudaSuccess) return e;
  join(st().host, stream_of(st().legacy[tl_device])->clock);
  return cudaSuccess;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned flags) {
  Lock l(mu);
  int d = 0;
  if (!device_ok(d, "cudaStreamCreate")) return tl_last;
  if (!s || (flags & ~1u)) return set_last(cudaErrorInvalidValue, "cudaStreamCreateWithFlags: bad pointer or flags");
  auto q = std::make_unique<Stream>();
  q->id = static_cast<int>(st().streams.size());
  q->device = d;
  q->blocking = !(flags & cudaStreamNonBlocking);
  q->clock = st().host;   // work enqueued later follows what the host has seen
  q->handle = std::make_unique<CUstream_st>(CUstream_st{q->id});
  *s = q->handle.get();
  st().streams.push_back(std::move(q));
  return cudaSuccess;
}
cudaError_t cudaStreamCreate(cudaStream_t* s) { return cudaStreamCreateWithFlags(s, cudaStreamDefault); }
cudaError_t cudaStreamDestroy(cudaStream_t s) {
  Lock l(mu);
  if (!s) return set_last(cudaErrorInvalidResourceHandle, "cudaStreamDestroy of the NULL stream");
  const int id = stream_id(s, "cudaStreamDestroy");
  if (id < 0) return tl_last;
  stream_of(id)->destroyed = true;   // its work is done (everything ran at enqueue); the handle is invalid now
  return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t s) {
  Lock l(mu);
  install_handler();
  const int id = stream_id(s, "cudaStreamSynchronize");
  if (id < 0) return tl_last;
  join(st().host, stream_of(id)->clock);
  return cudaSuccess;
}
cudaError_t cudaStreamQuery(cudaStream_t s) {
  Lock l(mu);
  const int id = stream_id(s, "cudaStreamQuery");
  if (id < 0) return tl_last;
  // cudaSuccess says the work is complete, so the host may rely on it as on a synchronisation.
  join(st().host, stream_of(id)->clock);
  return cudaSuccess;
}
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned flags) {
  Lock l(mu);
  const int id = stream_id(s, "cudaStreamWaitEvent");
  if (id < 0) return tl_last;
  Event* ev = event_of(e, "cudaStreamWaitEvent");
  if (!ev) return tl_last;
  if (flags != 0) return set_last(cudaErrorInvalidValue, "cudaStreamWaitEvent: flags must be 0");
  if (!ev->recorded) return cudaSuccess;   // waiting on a never-recorded event is a no-op
  Stream& q = *stream_of(id);
  join(q.clock, ev->clock);
  q.time_ms = std::max(q.time_ms, ev->time_ms);
  return cudaSuccess;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned flags) {
  Lock l(mu);
  int d = 0;
  if (!device_ok(d, "cudaEventCreate")) return tl_last;
  if (!e || (flags & ~3u)) return set_last(cudaErrorInvalidValue, "cudaEventCreateWithFlags: bad pointer or flags");
  auto ev = std::make_unique<Event>();
  ev->timing = !(flags & cudaEventDisableTiming);
  ev->handle = std::make_unique<CUevent_st>(CUevent_st{static_cast<int>(st().events.size())});
  *e = ev->handle.get();
  st().events.push_back(std::move(ev));
  return cudaSuccess;
}
cudaError_t cudaEventCreate(cudaEvent_t* e) { return cudaEventCreateWithFlags(e, cudaEventDefault); }
cudaError_t cudaEventDestroy(cudaEvent_t e) {
  Lock l(mu);
  Event* ev = event_of(e, "cudaEventDestroy");
  if (!ev) return tl_last;
  ev->destroyed = true;
  return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
  Lock l(mu);
  const int id = stream_id(s, "cudaEventRecord");
  if (id < 0) return tl_last;
  Event* ev = event_of(e, "cudaEventRecord");
  if (!ev) return tl_last;
  Stream& q = *stream_of(id);
  enqueue(q);   // a record is ordered like any operation of its stream (legacy-stream rules included)
  ev->recorded = true;
  ev->stream = id;
  ev->clock = q.clock;
  ev->time_ms = q.time_ms;
  return cudaSuccess;
}
cudaError_t cudaEventSynchronize(cudaEvent_t e) {
  Lock l(mu);
  if (sticky() != cudaSuccess) return sticky();
  Event* ev = event_of(e, "cudaEventSynchronize");
  if (!ev) return tl_last;
  if (ev->recorded) join(st().host, ev->clock);
  return cudaSuccess;
}
cudaError_t cudaEventQuery(cudaEvent_t e) {
  Lock l(mu);
  if (sticky() != cudaSuccess) return sticky();
  Event* ev = event_of(e, "cudaEventQuery");
  if (!ev) return tl_last;
  if (ev->recorded) join(st().host, ev->clock);
  return cudaSuccess;
}
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  Lock l(mu);
  if (sticky() != cudaSuccess) return sticky();
  Event* a = event_of(start, "cudaEventElapsedTime");
  if (!a) return tl_last;
  Event* b = event_of(end, "cudaEventElapsedTime");
  if (!b) return tl_last;
  if (!ms) return set_last(cudaErrorInvalidValue, "cudaEventElapsedTime: null pointer");
  if (!a->recorded || !b->recorded || !a->timing || !b->timing)
    return set_last(cudaErrorInvalidResourceHandle,
                    "cudaEventElapsedTime: an event was never recorded or was created with cudaEventDisableTiming");
  *ms = static_cast<float>(b->time_ms - a->time_ms);
  return cudaSuccess;
}
