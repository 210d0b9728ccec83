// Fixed-order reductions and the size-1 backend.
#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "meshrun/comm/comm.hpp"
#include "meshrun/device/backend.hpp"
#include "meshrun/device/bf16.hpp"

namespace meshrun::comm {

namespace {
template <class T>
void reduce_typed(T* out, const T* blocks, int count, std::int64_t n, ReduceOp op) {
  // Block 0 first, then each further block in order: the one summation order every backend uses.
  std::memmove(out, blocks, static_cast<std::size_t>(n) * sizeof(T));
  for (int b = 1; b < count; ++b) {
    const T* x = blocks + static_cast<std::int64_t>(b) * n;
    if (op == ReduceOp::sum) {
      for (std::int64_t i = 0; i < n; ++i) out[i] += x[i];
    } else {
      for (std::int64_t i = 0; i < n; ++i) out[i] = std::max(out[i], x[i]);
    }
  }
}
}  // namespace

void reduce_blocks(void* out, const void* blocks, int count, std::int64_t n, DType t, ReduceOp op) {
  switch (t) {
    case DType::f32: reduce_typed(static_cast<float*>(out), static_cast<const float*>(blocks), count, n, op); break;
    case DType::f64: reduce_typed(static_cast<double*>(out), static_cast<const double*>(blocks), count, n, op); break;
    case DType::i32:
      reduce_typed(static_cast<std::int32_t*>(out), static_cast<const std::int32_t*>(blocks), count, n, op);
      break;
    case DType::i64:
      reduce_typed(static_cast<std::int64_t*>(out), static_cast<const std::int64_t*>(blocks), count, n, op);
      break;
    case DType::bf16: {
      // Activations' partial sums (tensor parallelism under bf16): summed in float in block order and
      // rounded to bf16 once, so all_reduce and reduce_scatter + all_gather still give the same bits.
      const auto* in = static_cast<const std::uint16_t*>(blocks);
      auto* o = static_cast<std::uint16_t*>(out);
      for (std::int64_t i = 0; i < n; ++i) {
        float acc = device::float_from_bf16(in[i]);
        for (int b = 1; b < count; ++b) {
          const float x = device::float_from_bf16(in[static_cast<std::int64_t>(b) * n + i]);
          acc = op == ReduceOp::sum ? acc + x : std::max(acc, x);
        }
        o[i] = device::bf16_from_float(acc);
      }
      break;
    }
  }
}

void LocalComm::reduce_scatter(Buf send, Buf recv, ReduceOp) {
  if (send.p != recv.p) std::memmove(recv.p, send.p, static_cast<std::size_t>(recv.bytes()));
}
void LocalComm::all_gather(Buf send, Buf recv) {
  if (send.p != recv.p) std::memmove(recv.p, send.p, static_cast<std::size_t>(send.bytes()));
}
Request LocalComm::isend(Buf, int, int) {
  throw std::logic_error("LocalComm::isend: a group of one process has no peer");
}
Request LocalComm::irecv(Buf, int, int) {
  throw std::logic_error("LocalComm::irecv: a group of one process has no peer");
}

Request& Request::operator=(Request&& other) noexcept {
  if (this != &other) {
    if (op_) op_->wait();
    op_ = std::move(other.op_);
  }
  return *this;
}
Request::~Request() {
  if (op_) op_->wait();
}
bool Request::test() {
  if (!op_) return true;
  if (!op_->test()) return false;
  wait();
  return true;
}
void Request::wait() {
  if (!op_) return;
  op_->wait();
  op_.reset();
}
void LocalComm::all_to_all(Buf send, const std::int64_t* send_counts, Buf recv, const std::int64_t* recv_counts) {
  if (send_counts[0] != recv_counts[0]) throw std::logic_error("LocalComm::all_to_all: counts differ");
  std::memmove(recv.p, send.p, static_cast<std::size_t>(send_counts[0]) * dtype_size(send.t));
}

void DeviceLocalComm::copy(Buf dst, Buf src, std::int64_t n, const char* what) {
  if (dst.p == src.p || n == 0) return;
  const bool d = backend_.is_device_memory(dst.p), s = backend_.is_device_memory(src.p);
  if (d != s)
    throw std::logic_error(std::string("DeviceLocalComm::") + what + ": one buffer in device memory, the other on the host");
  if (!d) {
    std::memmove(dst.p, src.p, static_cast<std::size_t>(n) * dtype_size(src.t));
    return;
  }
  if (dst.t != src.t) throw std::logic_error(std::string("DeviceLocalComm::") + what + ": mixed dtypes");
  backend_.copy(dst.at(0, n), src.at(0, n));
}
void DeviceLocalComm::all_to_all(Buf send, const std::int64_t* send_counts, Buf recv, const std::int64_t* recv_counts) {
  if (send_counts[0] != recv_counts[0]) throw std::logic_error("DeviceLocalComm::all_to_all: counts differ");
  copy(recv, send, send_counts[0], "all_to_all");
}

namespace {
struct HostAccessWindow {
  explicit HostAccessWindow(device::Backend& b) : be(b) { be.begin_host_access(); }
  ~HostAccessWindow() { be.end_host_access(); }
  device::Backend& be;
};
// A request whose buffers are pinned: waits and tests run in a host-access window, and the pins are
// dropped once the operation has completed (not before: a peer may still be reading them).
struct PinnedPending final : Request::Pending {
  Request inner;
  device::Backend* be = nullptr;
  std::vector<Buf> pinned;
  void wait() override {
    const HostAccessWindow w(*be);
    inner.wait();
    for (const Buf& b : pinned) be->unpin_host_access(b);
    pinned.clear();
  }
  bool test() override {
    const HostAccessWindow w(*be);
    return inner.test();
  }
};
}  // namespace

template <class F>
auto HostAccessComm::bracketed(F&& f) {
  const HostAccessWindow w(backend_);
  return f();
}

template <class F>
Request HostAccessComm::started(F&& start, std::initializer_list<Buf> bufs) {
  const HostAccessWindow w(backend_);
  Request r = start();
  if (!r.pending()) return r;
  auto p = std::make_unique<PinnedPending>();
  p->be = &backend_;
  for (const Buf& b : bufs) {
    backend_.pin_host_access(b);
    p->pinned.push_back(b);
  }
  p->inner = std::move(r);
  return Request(std::move(p));
}

void HostAccessComm::all_reduce(Buf b, ReduceOp op) { bracketed([&] { inner_.all_reduce(b, op); }); }
void HostAccessComm::reduce_scatter(Buf s, Buf r, ReduceOp op) { bracketed([&] { inner_.reduce_scatter(s, r, op); }); }
void HostAccessComm::all_gather(Buf s, Buf r) { bracketed([&] { inner_.all_gather(s, r); }); }
void HostAccessComm::broadcast(Buf b, int root) { bracketed([&] { inner_.broadcast(b, root); }); }
Request HostAccessComm::ireduce_scatter(Buf s, Buf r, ReduceOp op) {
  return started([&] { return inner_.ireduce_scatter(s, r, op); }, {s, r});
}
Request HostAccessComm::iall_gather(Buf s, Buf r) {
  return started([&] { return inner_.iall_gather(s, r); }, {s, r});
}
Request HostAccessComm::isend(Buf b, int peer, int tag) {
  return started([&] { return inner_.isend(b, peer, tag); }, {b});
}
Request HostAccessComm::irecv(Buf b, int peer, int tag) {
  return started([&] { return inner_.irecv(b, peer, tag); }, {b});
}
void HostAccessComm::all_to_all(Buf s, const std::int64_t* sc, Buf r, const std::int64_t* rc) {
  bracketed([&] { inner_.all_to_all(s, sc, r, rc); });
}
void HostAccessComm::barrier() { bracketed([&] { inner_.barrier(); }); }

}  // namespace meshrun::comm
