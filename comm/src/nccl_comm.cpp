// NcclComm: the Comm of one group kind on the CUDA backend (docs/gpu.md, "NCCL"). Device buffers go to NCCL on the
// backend's comm stream, host buffers to the group's MPI communicator; a mixed pair is refused.
//
// Ordering, as a stream-ordered communicator needs it: before each NCCL launch the comm stream waits for what the
// compute stream has been given (the operation's inputs); a blocking call then makes the compute stream wait for
// the operation, and a non-blocking one returns a Request whose wait() does (the host never blocks on the device
// here). Point-to-point operations are queued and launched together, as one ncclGroupStart/ncclGroupEnd, when one
// of their Requests is waited on or before the next collective: NCCL's sends wait for their receives, so a ring's
// or a pipeline's send and receive must be in one group or the two ranks deadlock. Queuing keeps each peer's
// posting order, which NCCL matches in (there are no tags).
#include <nccl.h>

#include <algorithm>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "meshrun/comm/nccl.hpp"
#include "nccl_internal.hpp"
#include "meshrun/comm/wait_state.hpp"
#include "meshrun/device/backend.hpp"

namespace meshrun::comm {

namespace {

using device::Backend;
using Stream = Backend::Stream;

std::mutex registry_mu;
bool aborted = false;   // under registry_mu
struct Registered {
  ncclComm_t comm;
  const char* label;
};
std::vector<Registered>& registry() {
  static std::vector<Registered> comms;
  return comms;
}

}  // namespace

void check(ncclResult_t r, const std::string& what, ncclComm_t c) {
  if (r == ncclSuccess) return;
  const char* last = ncclGetLastError(c);
  throw std::runtime_error(what + " failed: " + ncclGetErrorString(r) + (last && *last ? std::string(" (") + last + ")" : ""));
}

namespace {

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::f32: return ncclFloat32;
    case DType::f64: return ncclFloat64;
    case DType::bf16: return ncclBfloat16;
    case DType::i32: return ncclInt32;
    case DType::i64: return ncclInt64;
  }
  return ncclUint8;
}
ncclRedOp_t nccl_op(ReduceOp op) { return op == ReduceOp::max ? ncclMax : ncclSum; }

// An event shared by the Requests of one launch; released with the last of them.
struct SharedEvent {
  SharedEvent(Backend* b, Backend::Event ev) : be(b), e(ev) {}
  SharedEvent(const SharedEvent&) = delete;
  SharedEvent& operator=(const SharedEvent&) = delete;
  ~SharedEvent() { be->release(e); }
  Backend* be;
  Backend::Event e;
};

// The compute stream waits for a launch (no host block).
struct StreamPending final : Request::Pending {
  std::shared_ptr<SharedEvent> done;
  void wait() override {
    if (done) done->be->wait(Stream::compute, done->e);
    done.reset();
  }
};

}  // namespace

class NcclComm final : public Comm {
 public:
  using Comm::all_gather;
  using Comm::all_reduce;
  using Comm::reduce_scatter;
  using Comm::ireduce_scatter;
  using Comm::iall_gather;
  NcclComm(ncclComm_t nc, std::unique_ptr<Comm> host, Backend& be, const char* label)
      : nc_(nc), host_(std::move(host)), be_(be), label_(label) {}
  ~NcclComm() override {
    try {
      flush();
    } catch (...) {   // a destructor: the job is ending with the error that got here
    }
    std::lock_guard<std::mutex> l(registry_mu);
    auto& r = registry();
    r.erase(std::remove_if(r.begin(), r.end(), [&](const Registered& x) { return x.comm == nc_; }), r.end());
    if (!aborted) ncclCommDestroy(nc_);   // an aborted communicator is gone already
  }
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;

  int size() const override { return host_->size(); }
  int rank() const override { return host_->rank(); }

  void all_reduce(Buf b, ReduceOp op) override {
    if (!on_device(b, b, "all_reduce")) return host_->all_reduce(b, op);
    if (b.n == 0) return;
    launch("all_reduce", [&](cudaStream_t s) {
      return ncclAllReduce(b.p, b.p, static_cast<std::size_t>(b.n), nccl_type(b.t), nccl_op(op), nc_, s);
    }).wait();
  }
  void reduce_scatter(Buf s, Buf r, ReduceOp op) override { ireduce_scatter(s, r, op).wait(); }
  void all_gather(Buf s, Buf r) override { iall_gather(s, r).wait(); }
  Request ireduce_scatter(Buf send, Buf recv, ReduceOp op) override {
    if (!on_device(send, recv, "reduce_scatter")) return host_->ireduce_scatter(send, recv, op);
    if (send.t != recv.t) throw std::logic_error("NcclComm::reduce_scatter: mixed dtypes");
    return launch("reduce_scatter", [&](cudaStream_t s) {
      return ncclReduceScatter(send.p, recv.p, static_cast<std::size_t>(recv.n), nccl_type(recv.t), nccl_op(op), nc_, s);
    });
  }
  Request iall_gather(Buf send, Buf recv) override {
    if (!on_device(send, recv, "all_gather")) return host_->iall_gather(send, recv);
    if (send.t != recv.t) throw std::logic_error("NcclComm::all_gather: mixed dtypes");
    return launch("all_gather", [&](cudaStream_t s) {
      return ncclAllGather(send.p, recv.p, static_cast<std::size_t>(send.n), nccl_type(send.t), nc_, s);
    });
  }
  void broadcast(Buf b, int root) override {
    if (!on_device(b, b, "broadcast")) return host_->broadcast(b, root);
    if (b.n == 0) return;
    launch("broadcast", [&](cudaStream_t s) {
      return ncclBroadcast(b.p, b.p, static_cast<std::size_t>(b.n), nccl_type(b.t), root, nc_, s);
    }).wait();
  }
  Request isend(Buf b, int peer, int tag) override { return queue(true, b, peer, tag); }
  Request irecv(Buf b, int peer, int tag) override { return queue(false, b, peer, tag); }
  int max_tag() const override { return host_->max_tag(); }
  void all_to_all(Buf send, const std::int64_t* sc, Buf recv, const std::int64_t* rc) override {
    if (!on_device(send, recv, "all_to_all")) return host_->all_to_all(send, sc, recv, rc);
    if (send.t != recv.t) throw std::logic_error("NcclComm::all_to_all: mixed dtypes");
    // NCCL has no all-to-all with counts: grouped sends and receives (zero counts skipped on both sides, as
    // this rank's send count to r is r's receive count from this rank).
    launch("all_to_all", [&](cudaStream_t s) {
      const ncclDataType_t t = nccl_type(send.t);
      std::int64_t so = 0, ro = 0;
      ncclResult_t r = ncclGroupStart();
      for (int p = 0; p < size() && r == ncclSuccess; ++p) {
        if (sc[p] > 0) r = ncclSend(send.at(so, sc[p]).p, static_cast<std::size_t>(sc[p]), t, p, nc_, s);
        if (r == ncclSuccess && rc[p] > 0) r = ncclRecv(recv.at(ro, rc[p]).p, static_cast<std::size_t>(rc[p]), t, p, nc_, s);
        so += sc[p];
        ro += rc[p];
      }
      const ncclResult_t end = ncclGroupEnd();
      return r != ncclSuccess ? r : end;
    }).wait();
  }
  void barrier() override { host_->barrier(); }

  // Launches the queued point-to-point operations as one group (no-op when none).
  void flush() {
    if (queued_.empty()) return;
    std::vector<Queued> ops;
    ops.swap(queued_);
    const std::shared_ptr<SharedEvent> done = launch_event("send/recv", [&](cudaStream_t s) {
      ncclResult_t res = ncclGroupStart();
      for (const Queued& q : ops) {
        if (res != ncclSuccess) break;
        const auto n = static_cast<std::size_t>(q.buf.n);
        res = q.send ? ncclSend(q.buf.p, n, nccl_type(q.buf.t), q.peer, nc_, s)
                     : ncclRecv(q.buf.p, n, nccl_type(q.buf.t), q.peer, nc_, s);
      }
      const ncclResult_t end = ncclGroupEnd();
      return res != ncclSuccess ? res : end;
    });
    for (Queued& q : ops) q.slot->done = done;
  }

 private:
  struct Slot {
    std::shared_ptr<SharedEvent> done;
  };
  struct Queued {
    bool send;
    Buf buf;
    int peer;
    std::shared_ptr<Slot> slot;
  };
  // A queued send/receive: waiting launches the group it is in, then orders the compute stream after it.
  struct P2pPending final : Request::Pending {
    NcclComm* comm;
    std::shared_ptr<Slot> slot;
    void wait() override {
      if (!slot) return;
      if (!slot->done) comm->flush();
      if (slot->done) slot->done->be->wait(Stream::compute, slot->done->e);
      slot.reset();
    }
  };

  bool on_device(Buf a, Buf b, const char* what) const {
    const bool da = a.n == 0 ? be_.is_device_memory(b.p) : be_.is_device_memory(a.p);
    const bool db = b.n == 0 ? da : be_.is_device_memory(b.p);
    if (da != db)
      throw std::logic_error(std::string("NcclComm::") + what + " on group " + label_ +
                             ": one buffer in device memory, the other on the host");
    return da;
  }

  Request queue(bool send, Buf b, int peer, int tag) {
    if (!be_.is_device_memory(b.p)) return send ? host_->isend(b, peer, tag) : host_->irecv(b, peer, tag);
    if (peer < 0 || peer >= size())
      throw std::invalid_argument(std::string("NcclComm::") + (send ? "isend" : "irecv") + " on group " + label_ +
                                  ": peer " + std::to_string(peer) + " is not a rank of the group");
    auto slot = std::make_shared<Slot>();
    queued_.push_back(Queued{send, b, peer, slot});
    auto p = std::make_unique<P2pPending>();
    p->comm = this;
    p->slot = slot;
    return Request(std::move(p));
  }

  // One NCCL launch on the comm stream after the compute stream's work so far (and after the queued
  // point-to-point operations, so that each peer's order is kept); its event marks the launch's end.
  template <class F>
  std::shared_ptr<SharedEvent> launch_event(const char* what, F&& call) {
    flush();
    Backend::Event ready = be_.record(Stream::compute);
    be_.wait(Stream::comm, ready);
    be_.release(ready);
    {
      // Real NCCL returns at once; the fake NCCL returns once the peers have joined: a wait the heartbeat can name.
      const WaitScope waiting(what, label_, -1);
      check(call(static_cast<cudaStream_t>(be_.native_stream(Stream::comm))), std::string("NCCL ") + what + " on group " + label_, nc_);
    }
    return std::make_shared<SharedEvent>(&be_, be_.record(Stream::comm));
  }
  // The same, as a Request that orders the compute stream after the launch.
  template <class F>
  Request launch(const char* what, F&& call) {
    auto p = std::make_unique<StreamPending>();
    p->done = launch_event(what, std::forward<F>(call));
    return Request(std::move(p));
  }

  ncclComm_t nc_;
  std::unique_ptr<Comm> host_;
  Backend& be_;
  const char* label_;
  std::vector<Queued> queued_;
};

std::unique_ptr<Comm> wrap_nccl(ncclComm_t nc, std::unique_ptr<Comm> host, Backend& backend, const char* label) {
  return std::make_unique<NcclComm>(nc, std::move(host), backend, label);
}

void register_nccl(ncclComm_t nc, const char* label) {
  std::lock_guard<std::mutex> l(registry_mu);
  registry().push_back({nc, label});
}

std::unique_ptr<Comm> make_nccl_self_comm(Backend& backend) {
  ncclUniqueId id{};
  check(ncclGetUniqueId(&id), "ncclGetUniqueId");
  ncclComm_t nc = nullptr;
  check(ncclCommInitRank(&nc, 1, id, 0), "ncclCommInitRank (one rank)");
  register_nccl(nc, "self");
  return wrap_nccl(nc, std::make_unique<LocalComm>(), backend, "self");
}

std::string nccl_version() {
  int v = 0;
  ncclGetVersion(&v);
  std::string s = std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." + std::to_string(v % 100);
#ifdef MESHRUN_CUDA_EMULATED
  s += " (meshrun fake NCCL)";
#endif
  return s;
}

void abort_nccl_communicators() {
  std::lock_guard<std::mutex> l(registry_mu);
  for (const Registered& c : registry()) ncclCommAbort(c.comm);
  aborted = true;
}

std::string nccl_async_error() {
  std::lock_guard<std::mutex> l(registry_mu);
  if (aborted) return "";
  for (const Registered& c : registry()) {
    ncclResult_t e = ncclSuccess;
    if (ncclCommGetAsyncError(c.comm, &e) != ncclSuccess) continue;
    if (e != ncclSuccess && e != ncclInProgress)
      return std::string("NCCL reports \"") + ncclGetErrorString(e) + "\" on the " + c.label + " communicator";
  }
  return "";
}

}  // namespace meshrun::comm
