// The fake NCCL (docs/gpu.md, "The fake NCCL"): the NCCL calls meshrun makes, run for real between processes over
// MPI on the emulator's device memory, with NCCL's rules checked where real NCCL would hang or corrupt instead:
// - every rank of a communicator launches the same collectives (and splits) in the same order with the same
//   count, type, operation and root (NVIDIA/nccl#195; NCCL's docs, "Collective operations"): each call first
//   exchanges a one-line description of itself, and a difference ends the job naming both calls;
// - a send completes only once its receive is posted (no eager buffering: MPI_Issend), so a send whose receive
//   comes after it on the peer's stream is a rendezvous deadlock, reported after a bounded wait;
// - ncclCommSplit is called by every rank of the parent (NCCL_SPLIT_NOCOLOR for those outside);
// - no use of a communicator after ncclCommDestroy or ncclCommAbort; only device memory is accepted; in-place
//   only in NCCL's forms (recvbuff == sendbuff, or the rank's own block for all-gather and reduce-scatter).
// What it does not do: run concurrently with the host (the emulator runs every stream operation when it is
// enqueued, so a collective returns once the peers have joined it), or sum in NCCL's order (it sums each block
// around the ring like NCCL's ring algorithm, identical bits on every rank, but NCCL picks among algorithms).
// Bootstrap: ncclCommInitRank is a collective of every process of MPI_COMM_WORLD (meshrun's world communicator
// is; the rest are split from it), so the unique id only has to agree.
#include "nccl.h"

#include <mpi.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "meshrun/cuda_emu/emu.hpp"

struct ncclComm {
  std::string name;
  int rank = 0, size = 1;
  MPI_Comm ctrl = MPI_COMM_NULL, data = MPI_COMM_NULL, p2p = MPI_COMM_NULL;
  std::uint64_t calls = 0;   // collectives and splits launched so far (the order check's sequence number)
  enum class State { live, destroyed, aborted } state = State::live;
  std::atomic<bool> abort_requested{false};   // ncclCommAbort from another thread
  std::atomic<int> async_error{0};            // ncclSuccess, or what MESHRUN_FAKE_NCCL_ASYNC_ERROR injected
  std::string last_error;
};

namespace {

using Clock = std::chrono::steady_clock;
thread_local std::string tl_last_error;

ncclResult_t fail(ncclResult_t r, ncclComm* c, const std::string& why) {
  tl_last_error = why;
  if (c) c->last_error = why;
  return r;
}

bool mpi_up() {
  int up = 0, down = 0;
  MPI_Initialized(&up);
  MPI_Finalized(&down);
  return up && !down;
}
int world_rank() {
  int r = 0;
  if (mpi_up()) MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

// A broken NCCL rule: the line, then the job ends (real NCCL would hang or corrupt; nothing can continue).
[[noreturn]] void rule(const std::string& why) {
  std::string line = "meshrun fake NCCL (world rank " + std::to_string(world_rank()) + "): " + why + "\n";
  std::fputs(line.c_str(), stderr);
  std::fflush(stderr);
  if (mpi_up()) MPI_Abort(MPI_COMM_WORLD, 3);
  std::abort();
}

std::string label(const ncclComm* c) { return "communicator '" + c->name + "' (" + std::to_string(c->size) + " ranks)"; }

bool usable(ncclComm* c, const char* call, ncclResult_t* r) {
  if (!c) {
    *r = fail(ncclInvalidArgument, nullptr, std::string(call) + ": null communicator");
    return false;
  }
  if (c->state != ncclComm::State::live)
    rule(std::string(call) + " on " + label(c) + " after " +
         (c->state == ncclComm::State::destroyed ? "ncclCommDestroy" : "ncclCommAbort") +
         ": a communicator cannot be used once destroyed or aborted");
  return true;
}

std::size_t type_size(ncclDataType_t t) {
  switch (t) {
    case ncclInt8: case ncclUint8: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    case ncclInt64: case ncclUint64: case ncclFloat64: return 8;
    default: return 0;
  }
}
const char* type_name(ncclDataType_t t) {
  switch (t) {
    case ncclInt8: return "int8";
    case ncclUint8: return "uint8";
    case ncclInt32: return "int32";
    case ncclUint32: return "uint32";
    case ncclInt64: return "int64";
    case ncclUint64: return "uint64";
    case ncclFloat16: return "fp16";
    case ncclFloat32: return "fp32";
    case ncclFloat64: return "fp64";
    case ncclBfloat16: return "bf16";
    default: return "?";
  }
}
const char* op_name(ncclRedOp_t op) {
  switch (op) {
    case ncclSum: return "sum";
    case ncclProd: return "prod";
    case ncclMax: return "max";
    case ncclMin: return "min";
    case ncclAvg: return "avg";
    default: return "?";
  }
}

// Device memory of the current device holding [p, p + bytes), or a refusal naming the call.
ncclResult_t device_range(const void* p, std::size_t bytes, const char* call, const char* which) {
  if (bytes == 0) return ncclSuccess;
  cudaPointerAttributes a{};
  int dev = -1;
  cudaGetDevice(&dev);
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess || a.type != cudaMemoryTypeDevice ||
      cudaPointerGetAttributes(&a, static_cast<const char*>(p) + bytes - 1) != cudaSuccess ||
      a.type != cudaMemoryTypeDevice)
    return fail(ncclInvalidArgument, nullptr,
                std::string(call) + ": " + which + " is not " + std::to_string(bytes) +
                    " bytes of device memory (NCCL reads and writes device buffers only)");
  if (a.device != dev)
    return fail(ncclInvalidArgument, nullptr,
                std::string(call) + ": " + which + " is on device " + std::to_string(a.device) +
                    ", the communicator's device is " + std::to_string(dev));
  return ncclSuccess;
}

double timeout_s() { return meshrun_fake_nccl_timeout_s(); }

// Waits for `reqs` until done, an abort of one of `comms`, or the deadline (then *pending: the first one not done).
enum class Waited { done, aborted, timed_out };
Waited wait_all(std::vector<MPI_Request>& reqs, const std::vector<ncclComm*>& comms, std::size_t* pending) {
  const auto deadline = Clock::now() + std::chrono::duration<double>(timeout_s());
  auto nap = std::chrono::microseconds(20);
  for (;;) {
    int all = 0;
    MPI_Testall(static_cast<int>(reqs.size()), reqs.data(), &all, MPI_STATUSES_IGNORE);
    if (all) return Waited::done;
    for (ncclComm* c : comms)
      if (c->abort_requested.load()) return Waited::aborted;
    if (Clock::now() > deadline) {
      for (std::size_t i = 0; i < reqs.size(); ++i)
        if (reqs[i] != MPI_REQUEST_NULL) {
          int done = 0;
          MPI_Test(&reqs[i], &done, MPI_STATUS_IGNORE);
          if (!done) {
            *pending = i;
            break;
          }
        }
      return Waited::timed_out;
    }
    std::this_thread::sleep_for(nap);   // two cores, four ranks: polling must leave the CPU to the peers
    nap = std::min(nap * 2, std::chrono::microseconds(1000));
  }
}

// MESHRUN_FAKE_NCCL_ASYNC_ERROR=R:N (a test's fault): world rank R's N-th collective (counted over all its
// communicators, from 1) never completes and its communicator reports ncclRemoteError through
// ncclCommGetAsyncError, as a lost network link does on real NCCL; it returns once the communicator is aborted.
bool inject_async_error(ncclComm* c) {
  static const std::pair<int, long> at = [] {
    const char* e = std::getenv("MESHRUN_FAKE_NCCL_ASYNC_ERROR");
    int r = -1;
    long n = -1;
    if (e && std::sscanf(e, "%d:%ld", &r, &n) != 2) {
      std::fprintf(stderr, "meshrun fake NCCL: MESHRUN_FAKE_NCCL_ASYNC_ERROR='%s' is not RANK:CALL\n", e);
      std::exit(2);
    }
    return std::pair<int, long>{r, n};
  }();
  static long calls = 0;
  if (at.first < 0 || world_rank() != at.first || ++calls != at.second) return false;
  c->async_error.store(ncclRemoteError);
  while (!c->abort_requested.load()) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  return true;
}

// Every rank of `c` states the call it is launching; all must be the same (NCCL's ordering rule).
ncclResult_t agree(ncclComm* c, const std::string& call) {
  if (inject_async_error(c)) return fail(ncclRemoteError, c, call + ": the communicator was aborted after an asynchronous error");
  if (c->size == 1) {   // a communicator of one rank (no MPI): nothing to agree on
    ++c->calls;
    return ncclSuccess;
  }
  constexpr int kWidth = 200;
  char mine[kWidth] = {};
  std::snprintf(mine, kWidth, "%s", call.c_str());
  std::vector<char> all(static_cast<std::size_t>(kWidth) * c->size);
  MPI_Request req = MPI_REQUEST_NULL;
  MPI_Iallgather(mine, kWidth, MPI_CHAR, all.data(), kWidth, MPI_CHAR, c->ctrl, &req);
  std::vector<MPI_Request> reqs{req};
  std::size_t pending = 0;
  const Waited w = wait_all(reqs, {c}, &pending);
  const std::uint64_t seq = c->calls++;
  if (w == Waited::aborted) return fail(ncclRemoteError, c, call + ": the communicator was aborted");
  if (w == Waited::timed_out)
    rule("rank " + std::to_string(c->rank) + " of " + label(c) + " launched " + call + " (call #" + std::to_string(seq) +
         ") and waited " + std::to_string(static_cast<int>(timeout_s())) +
         " s for the other ranks to launch theirs: every rank must launch the same collectives in the same "
         "order, or NCCL hangs (NVIDIA/nccl#195)");
  for (int r = 0; r < c->size; ++r) {
    const char* theirs = all.data() + static_cast<std::size_t>(r) * kWidth;
    if (std::strncmp(theirs, all.data(), kWidth) == 0) continue;
    // Reported once, by the lowest rank that differs from rank 0; the others wait for the abort.
    if (c->rank == r)
      rule(label(c) + ", call #" + std::to_string(seq) + ": rank 0 launched " + std::string(all.data()) + " but rank " +
           std::to_string(r) + " launched " + theirs +
           ": every rank of a communicator must launch the same collectives in the same order with the same count, "
           "type, operation and root (NVIDIA/nccl#195)");
    MPI_Barrier(MPI_COMM_WORLD);   // never completes: the reporting rank aborts the job
    std::abort();
  }
  return ncclSuccess;
}

// bf16 as NCCL's kernels round it: to nearest even.
float bf16_to_float(std::uint16_t b) {
  const std::uint32_t u = static_cast<std::uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
std::uint16_t float_to_bf16(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  if (std::isnan(f)) return static_cast<std::uint16_t>((u >> 16) | 0x40);
  u += 0x7fff + ((u >> 16) & 1);
  return static_cast<std::uint16_t>(u >> 16);
}

template <class T> T combine(T a, T b, ncclRedOp_t op) { return op == ncclMax ? std::max(a, b) : static_cast<T>(a + b); }

// out[i] for i in [lo, hi) := op over ranks, starting at rank `first` and going round the ring (each step one
// rounding in the element type, as a ring's partial sums are sent between ranks in that type).
void reduce_range(void* out, const char* all, std::size_t stride, int size, int first, std::size_t lo, std::size_t hi,
                  ncclDataType_t t, ncclRedOp_t op) {
  auto run = [&](auto tag) {
    using T = decltype(tag);
    T* o = static_cast<T*>(out);
    for (std::size_t i = lo; i < hi; ++i) {
      T acc = reinterpret_cast<const T*>(all + static_cast<std::size_t>(first) * stride)[i];
      for (int s = 1; s < size; ++s)
        acc = combine(acc, reinterpret_cast<const T*>(all + static_cast<std::size_t>((first + s) % size) * stride)[i], op);
      o[i - lo] = acc;
    }
  };
  switch (t) {
    case ncclFloat32: run(float{}); break;
    case ncclFloat64: run(double{}); break;
    case ncclInt32: run(std::int32_t{}); break;
    case ncclUint32: run(std::uint32_t{}); break;
    case ncclInt64: run(std::int64_t{}); break;
    case ncclUint64: run(std::uint64_t{}); break;
    case ncclInt8: run(std::int8_t{}); break;
    case ncclUint8: run(std::uint8_t{}); break;
    case ncclBfloat16: {
      auto* o = static_cast<std::uint16_t*>(out);
      for (std::size_t i = lo; i < hi; ++i) {
        std::uint16_t acc = reinterpret_cast<const std::uint16_t*>(all + static_cast<std::size_t>(first) * stride)[i];
        for (int s = 1; s < size; ++s) {
          const float x =
              bf16_to_float(reinterpret_cast<const std::uint16_t*>(all + static_cast<std::size_t>((first + s) % size) * stride)[i]);
          acc = float_to_bf16(op == ncclMax ? std::max(bf16_to_float(acc), x) : bf16_to_float(acc) + x);
        }
        o[i - lo] = acc;
      }
      break;
    }
    default: break;
  }
}

ncclResult_t check_reduce(ncclDataType_t t, ncclRedOp_t op, const char* call) {
  if (type_size(t) == 0 || t == ncclFloat16)
    return fail(ncclInvalidArgument, nullptr, std::string(call) + ": the fake NCCL reduces int, fp32, fp64 and bf16, not " + type_name(t));
  if (op != ncclSum && op != ncclMax)
    return fail(ncclInvalidArgument, nullptr, std::string(call) + ": the fake NCCL implements sum and max (what meshrun calls), not " + op_name(op));
  return ncclSuccess;
}

bool overlaps(const void* a, std::size_t an, const void* b, std::size_t bn) {
  const char* x = static_cast<const char*>(a);
  const char* y = static_cast<const char*>(b);
  return an && bn && x < y + bn && y < x + an;
}

// One stream operation copying between device memory and a host staging buffer (the emulator tracks and
// orders it like a kernel; a peer never touches this process's device pages).
ncclResult_t stage(cudaStream_t s, const char* call, void* dst, const void* src, std::size_t bytes) {
  if (bytes == 0) return ncclSuccess;
  if (!meshrun::emu::run_on_stream(s, call, [&] { std::memcpy(dst, src, bytes); }))
    return fail(ncclUnhandledCudaError, nullptr, std::string(call) + ": " + meshrun::emu::last_error_message());
  return ncclSuccess;
}

ncclResult_t wait_collective(ncclComm* c, MPI_Request req, const std::string& call);
// Every rank's `bytes` of `mine`, in rank order, into `all` (one rank: a copy, no MPI).
ncclResult_t gather_all(ncclComm* c, const std::vector<char>& mine, std::vector<char>& all, std::size_t bytes,
                        const std::string& call) {
  if (c->size == 1) {
    std::memcpy(all.data(), mine.data(), bytes);
    return ncclSuccess;
  }
  MPI_Request req = MPI_REQUEST_NULL;
  MPI_Iallgather(mine.data(), static_cast<int>(bytes), MPI_BYTE, all.data(), static_cast<int>(bytes), MPI_BYTE, c->data, &req);
  return wait_collective(c, req, call);
}

ncclResult_t wait_collective(ncclComm* c, MPI_Request req, const std::string& call) {
  std::vector<MPI_Request> reqs{req};
  std::size_t pending = 0;
  const Waited w = wait_all(reqs, {c}, &pending);
  if (w == Waited::aborted) return fail(ncclRemoteError, c, call + ": the communicator was aborted");
  if (w == Waited::timed_out)
    rule("rank " + std::to_string(c->rank) + " of " + label(c) + ": " + call + " did not complete within " +
         std::to_string(static_cast<int>(timeout_s())) + " s (a peer stopped taking part)");
  return ncclSuccess;
}

// Point-to-point operations queued by ncclGroupStart .. ncclGroupEnd (NCCL's groups are per thread).
struct P2p {
  bool send = false;
  const void* sbuf = nullptr;
  void* rbuf = nullptr;
  std::size_t count = 0;
  ncclDataType_t type = ncclFloat32;
  int peer = 0;
  ncclComm* comm = nullptr;
  cudaStream_t stream = nullptr;
};
struct Header {
  std::uint64_t count;
  std::int32_t type;
  std::int32_t pad;
};
thread_local int tl_group_depth = 0;
thread_local std::vector<P2p> tl_group;

std::string describe(const P2p& p) {
  return std::string(p.send ? "ncclSend of " : "ncclRecv of ") + std::to_string(p.count) + " " + type_name(p.type) +
         (p.send ? " to rank " : " from rank ") + std::to_string(p.peer) + " on " + label(p.comm);
}

// A group's operations on communicators of one rank: each receive takes the next send of the group on the same
// communicator (NCCL matches per peer in order; the only peer is the rank itself).
ncclResult_t run_local(std::vector<P2p>& ops) {
  std::vector<bool> used(ops.size(), false);
  for (std::size_t i = 0; i < ops.size(); ++i) {
    if (ops[i].send) continue;
    std::size_t j = 0;
    while (j < ops.size() && (used[j] || !ops[j].send || ops[j].comm != ops[i].comm)) ++j;
    if (j == ops.size())
      rule(describe(ops[i]) + " has no send inside its group: a rank's send to itself and its receive must be in "
           "one ncclGroupStart/ncclGroupEnd (a deadlock on real NCCL)");
    used[j] = true;
    const P2p& snd = ops[j];
    if (snd.count != ops[i].count || snd.type != ops[i].type)
      rule(describe(ops[i]) + " met " + describe(snd) + ": NCCL requires the same count and type on both sides");
    std::vector<char> staged(snd.count * type_size(snd.type));
    if (ncclResult_t r = stage(snd.stream, "ncclSend", staged.data(), snd.sbuf, staged.size()); r != ncclSuccess) return r;
    if (ncclResult_t r = stage(ops[i].stream, "ncclRecv", ops[i].rbuf, staged.data(), staged.size()); r != ncclSuccess) return r;
  }
  for (std::size_t j = 0; j < ops.size(); ++j)
    if (ops[j].send && !used[j])
      rule(describe(ops[j]) + " has no receive inside its group: a rank's send to itself and its receive must be in "
           "one ncclGroupStart/ncclGroupEnd (a deadlock on real NCCL)");
  return ncclSuccess;
}

ncclResult_t run_group(std::vector<P2p>& all_ops) {
  std::vector<P2p> local, ops;
  for (const P2p& p : all_ops) (p.comm->size == 1 ? local : ops).push_back(p);
  if (!local.empty())
    if (ncclResult_t r = run_local(local); r != ncclSuccess) return r;
  if (ops.empty()) return ncclSuccess;
  std::vector<std::vector<char>> buf(ops.size());
  std::vector<MPI_Request> reqs(ops.size(), MPI_REQUEST_NULL);
  std::vector<ncclComm*> comms;
  for (std::size_t i = 0; i < ops.size(); ++i) {
    const P2p& p = ops[i];
    const std::size_t bytes = p.count * type_size(p.type);
    buf[i].resize(sizeof(Header) + bytes);
    if (p.send) {
      const Header h{p.count, static_cast<std::int32_t>(p.type), 0};
      std::memcpy(buf[i].data(), &h, sizeof h);
      if (ncclResult_t r = stage(p.stream, "ncclSend", buf[i].data() + sizeof h, p.sbuf, bytes); r != ncclSuccess) return r;
    }
    comms.push_back(p.comm);
  }
  // Synchronous sends: each completes only once the peer has posted the matching receive, as NCCL's do.
  for (std::size_t i = 0; i < ops.size(); ++i) {
    const P2p& p = ops[i];
    const int n = static_cast<int>(buf[i].size());
    if (p.send)
      MPI_Issend(buf[i].data(), n, MPI_BYTE, p.peer, 0, p.comm->p2p, &reqs[i]);
    else
      MPI_Irecv(buf[i].data(), n, MPI_BYTE, p.peer, 0, p.comm->p2p, &reqs[i]);
  }
  std::size_t pending = 0;
  const Waited w = wait_all(reqs, comms, &pending);
  if (w == Waited::aborted) return fail(ncclRemoteError, nullptr, "ncclGroupEnd: a communicator was aborted");
  if (w == Waited::timed_out) {
    const P2p& p = ops[pending];
    rule("rank " + std::to_string(p.comm->rank) + ": " + describe(p) + " was not matched within " +
         std::to_string(static_cast<int>(timeout_s())) + " s: NCCL has no eager buffering, so a send waits for its "
         "receive (and a receive for its send); post both inside one ncclGroupStart/ncclGroupEnd, or in the same "
         "order on both ranks (a rendezvous deadlock on real NCCL)");
  }
  for (std::size_t i = 0; i < ops.size(); ++i) {
    const P2p& p = ops[i];
    if (p.send) continue;
    Header h{};
    std::memcpy(&h, buf[i].data(), sizeof h);
    if (h.count != p.count || h.type != static_cast<std::int32_t>(p.type))
      rule("rank " + std::to_string(p.comm->rank) + ": " + describe(p) + " met a send of " + std::to_string(h.count) + " " +
           type_name(static_cast<ncclDataType_t>(h.type)) + ": NCCL requires the same count and type on both sides");
    if (ncclResult_t r = stage(p.stream, "ncclRecv", p.rbuf, buf[i].data() + sizeof h, p.count * type_size(p.type));
        r != ncclSuccess)
      return r;
  }
  return ncclSuccess;
}

ncclResult_t enqueue_p2p(P2p p, const char* call) {
  ncclResult_t r = ncclSuccess;
  if (!usable(p.comm, call, &r)) return r;
  if (type_size(p.type) == 0) return fail(ncclInvalidArgument, p.comm, std::string(call) + ": unknown data type");
  if (p.peer < 0 || p.peer >= p.comm->size)
    return fail(ncclInvalidArgument, p.comm,
                std::string(call) + ": peer " + std::to_string(p.peer) + " is not a rank of " + label(p.comm));
  if (ncclResult_t d = device_range(p.send ? p.sbuf : p.rbuf, p.count * type_size(p.type), call, "the buffer"); d != ncclSuccess)
    return d;
  if (tl_group_depth > 0) {
    tl_group.push_back(p);
    return ncclSuccess;
  }
  std::vector<P2p> one{p};
  return run_group(one);
}

bool in_group(const char* call, ncclComm* c, ncclResult_t* r) {
  if (tl_group_depth == 0) return false;
  *r = fail(ncclInvalidUsage, c,
            std::string(call) + " inside ncclGroupStart/ncclGroupEnd: the fake NCCL groups sends and receives only "
            "(meshrun launches collectives one at a time)");
  return true;
}

ncclComm* make_comm(MPI_Comm ctrl, const std::string& name) {
  auto* c = new ncclComm;   // never deleted: a destroyed communicator stays as a tombstone, so use after destroy is caught
  c->name = name;
  if (ctrl == MPI_COMM_NULL) return c;   // one rank, no MPI (rank 0 of 1)
  c->ctrl = ctrl;
  MPI_Comm_set_errhandler(ctrl, MPI_ERRORS_RETURN);
  MPI_Comm_rank(ctrl, &c->rank);
  MPI_Comm_size(ctrl, &c->size);
  MPI_Comm_dup(ctrl, &c->data);
  MPI_Comm_dup(ctrl, &c->p2p);
  return c;
}

}  // namespace

double meshrun_fake_nccl_timeout_s() {
  static const double t = [] {
    const char* e = std::getenv("MESHRUN_FAKE_NCCL_TIMEOUT_S");
    if (!e || !*e) return 60.0;
    char* end = nullptr;
    const double v = std::strtod(e, &end);
    if (*end != '\0' || !(v > 0)) {
      std::fprintf(stderr, "meshrun fake NCCL: MESHRUN_FAKE_NCCL_TIMEOUT_S='%s' is not a positive number of seconds\n", e);
      std::exit(2);
    }
    return v;
  }();
  return t;
}

ncclResult_t ncclGetVersion(int* version) {
  if (!version) return ncclInvalidArgument;
  *version = NCCL_VERSION_CODE;
  return ncclSuccess;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  if (!id) return fail(ncclInvalidArgument, nullptr, "ncclGetUniqueId: null id");
  std::memset(id->internal, 0, sizeof id->internal);
  std::random_device rd;
  std::snprintf(id->internal, sizeof id->internal, "meshrun-fake-nccl %08x%08x", rd(), rd());
  return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank) {
  if (!comm) return fail(ncclInvalidArgument, nullptr, "ncclCommInitRank: null communicator pointer");
  if (std::strncmp(id.internal, "meshrun-fake-nccl ", 18) != 0)
    return fail(ncclInvalidArgument, nullptr, "ncclCommInitRank: the unique id does not come from ncclGetUniqueId");
  if (nranks == 1 && rank == 0) {   // a communicator of one rank needs no bootstrap
    *comm = make_comm(MPI_COMM_NULL, "world");
    return ncclSuccess;
  }
  if (!mpi_up()) return fail(ncclSystemError, nullptr, "ncclCommInitRank: the fake NCCL bootstraps more than one rank over MPI; call MPI_Init first");
  int world = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  if (nranks != world)
    return fail(ncclInvalidUsage, nullptr,
                "ncclCommInitRank: the fake NCCL initialises communicators of all " + std::to_string(world) +
                    " MPI processes only (nranks " + std::to_string(nranks) + "); split smaller ones with ncclCommSplit");
  if (rank < 0 || rank >= nranks)
    return fail(ncclInvalidArgument, nullptr, "ncclCommInitRank: rank " + std::to_string(rank) + " is not below nranks");
  MPI_Comm c = MPI_COMM_NULL;
  MPI_Comm_split(MPI_COMM_WORLD, 0, rank, &c);
  ncclComm* nc = make_comm(c, "world");
  std::vector<char> ids(sizeof id.internal * static_cast<std::size_t>(world));
  MPI_Allgather(id.internal, sizeof id.internal, MPI_CHAR, ids.data(), sizeof id.internal, MPI_CHAR, nc->ctrl);
  std::vector<int> ranks(static_cast<std::size_t>(world));
  MPI_Allgather(&rank, 1, MPI_INT, ranks.data(), 1, MPI_INT, nc->ctrl);
  for (int r = 0; r < world; ++r) {
    if (std::memcmp(ids.data() + r * sizeof id.internal, id.internal, sizeof id.internal) != 0)
      rule("ncclCommInitRank: MPI process " + std::to_string(r) + " passed another unique id than this one: broadcast "
           "the id of one ncclGetUniqueId to every rank");
    if (r != nc->rank && ranks[static_cast<std::size_t>(r)] == rank)
      rule("ncclCommInitRank: two processes passed rank " + std::to_string(rank));
  }
  *comm = nc;
  return ncclSuccess;
}

ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm, ncclConfig_t* config) {
  ncclResult_t r = ncclSuccess;
  if (!usable(comm, "ncclCommSplit", &r)) return r;
  if (!newcomm) return fail(ncclInvalidArgument, comm, "ncclCommSplit: null newcomm");
  if (color < 0 && color != NCCL_SPLIT_NOCOLOR)
    return fail(ncclInvalidArgument, comm, "ncclCommSplit: color " + std::to_string(color) + " is negative and not NCCL_SPLIT_NOCOLOR");
  // Every parent rank takes part (those outside with NCCL_SPLIT_NOCOLOR): checked like a collective's order.
  if (ncclResult_t a = agree(comm, "ncclCommSplit"); a != ncclSuccess) return a;
  const std::string name = config && config->commName ? config->commName : comm->name + "/" + std::to_string(color);
  if (comm->size == 1) {
    *newcomm = color == NCCL_SPLIT_NOCOLOR ? nullptr : make_comm(MPI_COMM_NULL, name);
    return ncclSuccess;
  }
  MPI_Comm sub = MPI_COMM_NULL;
  MPI_Comm_split(comm->ctrl, color == NCCL_SPLIT_NOCOLOR ? MPI_UNDEFINED : color, key, &sub);
  if (sub == MPI_COMM_NULL) {
    *newcomm = nullptr;
    return ncclSuccess;
  }
  *newcomm = make_comm(sub, name);
  return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  ncclResult_t r = ncclSuccess;
  if (!usable(comm, "ncclCommDestroy", &r)) return r;
  comm->state = ncclComm::State::destroyed;
  if (comm->ctrl != MPI_COMM_NULL && mpi_up()) {
    MPI_Comm_free(&comm->p2p);
    MPI_Comm_free(&comm->data);
    MPI_Comm_free(&comm->ctrl);
  }
  return ncclSuccess;
}

// From any thread: the rank's blocked operation on `comm` returns (ncclRemoteError); the MPI communicators stay
// (another thread may be inside them), as the job is ending.
ncclResult_t ncclCommAbort(ncclComm_t comm) {
  if (!comm) return ncclSuccess;
  comm->abort_requested.store(true);
  comm->state = ncclComm::State::aborted;
  return ncclSuccess;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* async) {
  if (!comm || !async) return ncclInvalidArgument;
  // Every rule the fake checks ends the job at once (rule()); what is left to report asynchronously is an
  // injected failure (MESHRUN_FAKE_NCCL_ASYNC_ERROR).
  *async = static_cast<ncclResult_t>(comm->async_error.load());
  return ncclSuccess;
}

ncclResult_t ncclCommCount(const ncclComm_t comm, int* count) {
  if (!comm || !count) return ncclInvalidArgument;
  *count = comm->size;
  return ncclSuccess;
}
ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank) {
  if (!comm || !rank) return ncclInvalidArgument;
  *rank = comm->rank;
  return ncclSuccess;
}

const char* ncclGetErrorString(ncclResult_t r) {
  switch (r) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError: return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError: return "internal error - please report this issue to the NCCL developers";
    case ncclInvalidArgument: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unknown result code";
  }
}
const char* ncclGetLastError(ncclComm_t comm) { return comm && !comm->last_error.empty() ? comm->last_error.c_str() : tl_last_error.c_str(); }

ncclResult_t ncclAllReduce(const void* send, void* recv, std::size_t count, ncclDataType_t t, ncclRedOp_t op,
                           ncclComm_t comm, cudaStream_t s) {
  ncclResult_t r = ncclSuccess;
  const char* call = "ncclAllReduce";
  if (!usable(comm, call, &r) || in_group(call, comm, &r)) return r;
  if ((r = check_reduce(t, op, call)) != ncclSuccess) return r;
  const std::size_t bytes = count * type_size(t);
  if ((r = device_range(send, bytes, call, "sendbuff")) != ncclSuccess || (r = device_range(recv, bytes, call, "recvbuff")) != ncclSuccess)
    return r;
  if (send != recv && overlaps(send, bytes, recv, bytes))
    return fail(ncclInvalidArgument, comm, "ncclAllReduce: sendbuff and recvbuff overlap without being equal (in place is recvbuff == sendbuff)");
  const std::string what = std::string(call) + "(count " + std::to_string(count) + ", " + type_name(t) + ", " + op_name(op) + ")";
  if ((r = agree(comm, what)) != ncclSuccess) return r;
  std::vector<char> mine(bytes), all(bytes * static_cast<std::size_t>(comm->size)), out(bytes);
  if ((r = stage(s, call, mine.data(), send, bytes)) != ncclSuccess) return r;
  if ((r = gather_all(comm, mine, all, bytes, what)) != ncclSuccess) return r;
  // Block j (of size ranks) is summed starting at rank j + 1, as a ring reduce-scatter does.
  const std::size_t block = (count + comm->size - 1) / comm->size;
  for (int j = 0; j < comm->size; ++j) {
    const std::size_t lo = std::min(count, block * j), hi = std::min(count, block * (j + 1));
    if (lo < hi) reduce_range(out.data() + lo * type_size(t), all.data(), bytes, comm->size, (j + 1) % comm->size, lo, hi, t, op);
  }
  return stage(s, call, recv, out.data(), bytes);
}

ncclResult_t ncclReduceScatter(const void* send, void* recv, std::size_t recvcount, ncclDataType_t t, ncclRedOp_t op,
                               ncclComm_t comm, cudaStream_t s) {
  ncclResult_t r = ncclSuccess;
  const char* call = "ncclReduceScatter";
  if (!usable(comm, call, &r) || in_group(call, comm, &r)) return r;
  if ((r = check_reduce(t, op, call)) != ncclSuccess) return r;
  const std::size_t rbytes = recvcount * type_size(t), sbytes = rbytes * static_cast<std::size_t>(comm->size);
  if ((r = device_range(send, sbytes, call, "sendbuff")) != ncclSuccess || (r = device_range(recv, rbytes, call, "recvbuff")) != ncclSuccess)
    return r;
  if (recv != static_cast<const char*>(send) + rbytes * comm->rank && overlaps(send, sbytes, recv, rbytes))
    return fail(ncclInvalidArgument, comm, "ncclReduceScatter: recvbuff overlaps sendbuff without being the rank's own block (NCCL's in-place form)");
  const std::string what = std::string(call) + "(recvcount " + std::to_string(recvcount) + ", " + type_name(t) + ", " + op_name(op) + ")";
  if ((r = agree(comm, what)) != ncclSuccess) return r;
  std::vector<char> mine(sbytes), all(sbytes * static_cast<std::size_t>(comm->size)), out(rbytes);
  if ((r = stage(s, call, mine.data(), send, sbytes)) != ncclSuccess) return r;
  if ((r = gather_all(comm, mine, all, sbytes, what)) != ncclSuccess) return r;
  const std::size_t lo = recvcount * comm->rank;
  reduce_range(out.data(), all.data(), sbytes, comm->size, (comm->rank + 1) % comm->size, lo, lo + recvcount, t, op);
  return stage(s, call, recv, out.data(), rbytes);
}

ncclResult_t ncclAllGather(const void* send, void* recv, std::size_t sendcount, ncclDataType_t t, ncclComm_t comm,
                           cudaStream_t s) {
  ncclResult_t r = ncclSuccess;
  const char* call = "ncclAllGather";
  if (!usable(comm, call, &r) || in_group(call, comm, &r)) return r;
  if (type_size(t) == 0) return fail(ncclInvalidArgument, comm, "ncclAllGather: unknown data type");
  const std::size_t sbytes = sendcount * type_size(t), rbytes = sbytes * static_cast<std::size_t>(comm->size);
  if ((r = device_range(send, sbytes, call, "sendbuff")) != ncclSuccess || (r = device_range(recv, rbytes, call, "recvbuff")) != ncclSuccess)
    return r;
  if (send != static_cast<const char*>(recv) + sbytes * comm->rank && overlaps(send, sbytes, recv, rbytes))
    return fail(ncclInvalidArgument, comm, "ncclAllGather: sendbuff overlaps recvbuff without being the rank's own block (NCCL's in-place form)");
  const std::string what = std::string(call) + "(sendcount " + std::to_string(sendcount) + ", " + type_name(t) + ")";
  if ((r = agree(comm, what)) != ncclSuccess) return r;
  std::vector<char> mine(sbytes), all(rbytes);
  if ((r = stage(s, call, mine.data(), send, sbytes)) != ncclSuccess) return r;
  if ((r = gather_all(comm, mine, all, sbytes, what)) != ncclSuccess) return r;
  return stage(s, call, recv, all.data(), rbytes);
}

ncclResult_t ncclBroadcast(const void* send, void* recv, std::size_t count, ncclDataType_t t, int root, ncclComm_t comm,
                           cudaStream_t s) {
  ncclResult_t r = ncclSuccess;
  const char* call = "ncclBroadcast";
  if (!usable(comm, call, &r) || in_group(call, comm, &r)) return r;
  if (type_size(t) == 0) return fail(ncclInvalidArgument, comm, "ncclBroadcast: unknown data type");
  if (root < 0 || root >= comm->size)
    return fail(ncclInvalidArgument, comm, "ncclBroadcast: root " + std::to_string(root) + " is not a rank of " + label(comm));
  const std::size_t bytes = count * type_size(t);
  if ((comm->rank == root && (r = device_range(send, bytes, call, "sendbuff")) != ncclSuccess) ||
      (r = device_range(recv, bytes, call, "recvbuff")) != ncclSuccess)
    return r;
  const std::string what = std::string(call) + "(count " + std::to_string(count) + ", " + type_name(t) + ", root " + std::to_string(root) + ")";
  if ((r = agree(comm, what)) != ncclSuccess) return r;
  std::vector<char> data(bytes);
  if (comm->rank == root && (r = stage(s, call, data.data(), send, bytes)) != ncclSuccess) return r;
  if (comm->size > 1) {
    MPI_Request req = MPI_REQUEST_NULL;
    MPI_Ibcast(data.data(), static_cast<int>(bytes), MPI_BYTE, root, comm->data, &req);
    if ((r = wait_collective(comm, req, what)) != ncclSuccess) return r;
  }
  return stage(s, call, recv, data.data(), bytes);
}

ncclResult_t ncclSend(const void* send, std::size_t count, ncclDataType_t t, int peer, ncclComm_t comm, cudaStream_t s) {
  return enqueue_p2p(P2p{true, send, nullptr, count, t, peer, comm, s}, "ncclSend");
}
ncclResult_t ncclRecv(void* recv, std::size_t count, ncclDataType_t t, int peer, ncclComm_t comm, cudaStream_t s) {
  return enqueue_p2p(P2p{false, nullptr, recv, count, t, peer, comm, s}, "ncclRecv");
}

ncclResult_t ncclGroupStart() {
  ++tl_group_depth;
  return ncclSuccess;
}
ncclResult_t ncclGroupEnd() {
  if (tl_group_depth == 0) return fail(ncclInvalidUsage, nullptr, "ncclGroupEnd without ncclGroupStart");
  if (--tl_group_depth > 0) return ncclSuccess;
  std::vector<P2p> ops;
  ops.swap(tl_group);
  return run_group(ops);
}
