// Communication: one interface over the collectives the five axes need, on backend buffers (Buf), with
// an MPI backend over host memory (mpi.cpp), a size-1 backend (LocalComm), and NCCL for a CUDA backend's
// device buffers (NcclComm, nccl.hpp / nccl_comm.cpp, the groups nccl_groups.hpp: stream-ordered, Requests that order the compute stream;
// docs/gpu.md, "NCCL").
//
// The contract every implementation keeps, and the trainer relies on:
// - Every rank of a group gets identical bits from a reduction (NCCL's too). The MPI implementation goes further and
//   sums in a fixed order, ((x_0 + x_1) + x_2) + ... over group ranks whatever the chunking, so
//   all_reduce == reduce_scatter + all_gather bit for bit and ZeRO stages that only move the reduction
//   point compute identical numbers; that is a property of MpiComm (and why CPU runs are bit-exact across
//   layouts), not of the interface.
// - Point-to-point is matched per peer in posting order: the k-th send to a peer meets that peer's k-th
//   receive from this rank. Tags are an MPI-only check (NCCL has none); callers must post sends and
//   receives to each peer in the same order on both sides (the pipeline's schedule validator checks it).
// - A non-blocking operation owns its buffers until its Request completes; recv is written only then.
//   A peer may read or write them at any time before that, from its own process (MPI's single-copy
//   shared-memory path) or its own device engine (NCCL), not only inside this rank's calls.
//
// Point-to-point is non-blocking: isend/irecv return a Request to wait on, so a pipeline's steady state
// (send one way while receiving the other) and a ring cannot deadlock above MPI's eager limit. Blocking
// send/recv and the combined sendrecv are built on them. Peers are ranks of this communicator; which
// peer is a neighbour comes from mesh (RankGrid::ring_peers), not from the trainer.
//
// The two ZeRO collectives also come non-blocking (ireduce_scatter, iall_gather), returning the same
// Request, so data-parallel traffic can run under compute. Same semantics and bits as the blocking forms.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>

#include "meshrun/device/buffer.hpp"

namespace meshrun::device {
class Backend;
}

namespace meshrun::comm {

using device::Buf;
using device::DType;
using device::dtype_of;
using device::dtype_size;
using device::host_buf;
enum class ReduceOp { sum, max };

// out = op(blocks[0], blocks[1], ...) element-wise, in block order. blocks: [count, n] contiguous.
void reduce_blocks(void* out, const void* blocks, int count, std::int64_t n, DType t, ReduceOp op);

// A pending non-blocking operation. Move-only; wait() completes it (idempotent); the destructor waits
// too, so no buffer is ever left in flight behind the caller's back.
class Request {
 public:
  struct Pending {
    virtual ~Pending() = default;
    virtual void wait() = 0;
    // Lets the operation progress (MPI moves non-blocking collectives only inside MPI calls); true once
    // it has completed, so that wait() returns at once.
    virtual bool test() { return false; }
  };
  Request() = default;
  explicit Request(std::unique_ptr<Pending> op) : op_(std::move(op)) {}
  Request(Request&&) noexcept = default;
  Request& operator=(Request&& other) noexcept;
  ~Request();
  void wait();
  bool test();  // true (and completed) when done; an empty Request is done
  bool pending() const { return op_ != nullptr; }

 private:
  std::unique_ptr<Pending> op_;
};

class Comm {
 public:
  virtual ~Comm() = default;
  virtual int size() const = 0;
  virtual int rank() const = 0;
  // buf := op over ranks; identical bits on every rank.
  virtual void all_reduce(Buf buf, ReduceOp op) = 0;
  // send holds size() blocks of recv.n elements; recv := op over ranks of block rank(). recv may alias
  // send's own block (in place).
  virtual void reduce_scatter(Buf send, Buf recv, ReduceOp op) = 0;
  // send (send.n elements) -> recv (size()·send.n), block r from rank r. send may alias recv's own block.
  virtual void all_gather(Buf send, Buf recv) = 0;
  virtual void broadcast(Buf buf, int root) = 0;
  // Non-blocking reduce_scatter and all_gather: the buffers belong to the operation until its Request
  // completes; recv is written only then. This default runs the blocking call and returns a completed
  // Request: LocalComm and decorators (which so see every collective through the blocking calls) use
  // it, MpiComm overlaps.
  virtual Request ireduce_scatter(Buf send, Buf recv, ReduceOp op) {
    reduce_scatter(send, recv, op);
    return Request();
  }
  virtual Request iall_gather(Buf send, Buf recv) {
    all_gather(send, recv);
    return Request();
  }
  // Non-blocking point-to-point, matched per peer in posting order; tag in [0, max_tag()] (checked by
  // MPI only).
  virtual Request isend(Buf buf, int peer, int tag) = 0;
  virtual Request irecv(Buf buf, int peer, int tag) = 0;
  virtual int max_tag() const = 0;
  // Variable-count all-to-all: send_counts[r] elements go to rank r (blocks back to back), recv_counts[r]
  // come from rank r. The counts are host arrays (NCCL, too, takes counts from the host).
  virtual void all_to_all(Buf send, const std::int64_t* send_counts, Buf recv, const std::int64_t* recv_counts) = 0;
  virtual void barrier() = 0;

  // Blocking forms and the combined exchange (both posted before either is waited on).
  void send(Buf buf, int peer, int tag) { isend(buf, peer, tag).wait(); }
  void recv(Buf buf, int peer, int tag) { irecv(buf, peer, tag).wait(); }
  void sendrecv(Buf send_buf, int dest, Buf recv_buf, int source, int tag) {
    Request r = irecv(recv_buf, source, tag);
    Request s = isend(send_buf, dest, tag);
    s.wait();
    r.wait();
  }

  // Host-memory conveniences (the CPU backend's buffers are host memory).
  template <class T> void all_reduce(T* buf, std::int64_t n, ReduceOp op = ReduceOp::sum) {
    all_reduce(host_buf(buf, n), op);
  }
  template <class T> void reduce_scatter(const T* send, T* recv, std::int64_t n, ReduceOp op = ReduceOp::sum) {
    reduce_scatter(host_buf(send, n * size()), host_buf(recv, n), op);
  }
  template <class T> void all_gather(const T* send, T* recv, std::int64_t n) {
    all_gather(host_buf(send, n), host_buf(recv, n * size()));
  }
  template <class T> Request ireduce_scatter(const T* send, T* recv, std::int64_t n, ReduceOp op = ReduceOp::sum) {
    return ireduce_scatter(host_buf(send, n * size()), host_buf(recv, n), op);
  }
  template <class T> Request iall_gather(const T* send, T* recv, std::int64_t n) {
    return iall_gather(host_buf(send, n), host_buf(recv, n * size()));
  }
};

// The group of one process: every collective is a copy or nothing.
class LocalComm final : public Comm {
 public:
  using Comm::all_gather;  // keep the host conveniences visible
  using Comm::all_reduce;
  using Comm::reduce_scatter;
  int size() const override { return 1; }
  int rank() const override { return 0; }
  void all_reduce(Buf, ReduceOp) override {}
  void reduce_scatter(Buf send, Buf recv, ReduceOp op) override;
  void all_gather(Buf send, Buf recv) override;
  void broadcast(Buf, int) override {}
  Request isend(Buf, int, int) override;  // throws: no peer
  Request irecv(Buf, int, int) override;
  int max_tag() const override { return 0; }
  void all_to_all(Buf send, const std::int64_t* send_counts, Buf recv, const std::int64_t* recv_counts) override;
  void barrier() override {}
};

// Forwards every call to another communicator: the base of decorators (the tests' fault injection), which
// override only what they change and so stay in step with the interface for free.
class ForwardingComm : public Comm {
 public:
  using Comm::all_gather;
  using Comm::all_reduce;
  using Comm::reduce_scatter;
  explicit ForwardingComm(std::unique_ptr<Comm> inner) : inner_(std::move(inner)) {}
  int size() const override { return inner_->size(); }
  int rank() const override { return inner_->rank(); }
  void all_reduce(Buf b, ReduceOp op) override { inner_->all_reduce(b, op); }
  void reduce_scatter(Buf s, Buf r, ReduceOp op) override { inner_->reduce_scatter(s, r, op); }
  void all_gather(Buf s, Buf r) override { inner_->all_gather(s, r); }
  void broadcast(Buf b, int root) override { inner_->broadcast(b, root); }
  Request isend(Buf b, int peer, int tag) override { return inner_->isend(b, peer, tag); }
  Request irecv(Buf b, int peer, int tag) override { return inner_->irecv(b, peer, tag); }
  int max_tag() const override { return inner_->max_tag(); }
  void all_to_all(Buf s, const std::int64_t* sc, Buf r, const std::int64_t* rc) override {
    inner_->all_to_all(s, sc, r, rc);
  }
  void barrier() override { inner_->barrier(); }

 protected:
  Comm& inner() { return *inner_; }

 private:
  std::unique_ptr<Comm> inner_;
};

// Gives a communicator host access to a backend whose memory is addressable only on request (the strict
// CPU backend of the tests): every operation, and every wait and test of its requests, runs inside
// Backend::begin/end_host_access, and the buffers of a non-blocking operation stay pinned (addressable)
// until its request completes. The pins are needed because MPI does not move data only inside this
// process's MPI calls: over shared memory, Open MPI's single-copy path has the *peer* read a send buffer
// (or write a receive buffer) with process_vm_readv/writev whenever the peer's progress gets to it, while
// this process may be computing outside MPI. Only those buffers stay open, so a host access to any other
// tensor between backend calls still faults.
class HostAccessComm final : public Comm {
 public:
  using Comm::all_gather;
  using Comm::all_reduce;
  using Comm::reduce_scatter;
  HostAccessComm(Comm& inner, device::Backend& backend) : inner_(inner), backend_(backend) {}
  int size() const override { return inner_.size(); }
  int rank() const override { return inner_.rank(); }
  void all_reduce(Buf b, ReduceOp op) override;
  void reduce_scatter(Buf s, Buf r, ReduceOp op) override;
  void all_gather(Buf s, Buf r) override;
  void broadcast(Buf b, int root) override;
  Request ireduce_scatter(Buf s, Buf r, ReduceOp op) override;
  Request iall_gather(Buf s, Buf r) override;
  Request isend(Buf b, int peer, int tag) override;
  Request irecv(Buf b, int peer, int tag) override;
  int max_tag() const override { return inner_.max_tag(); }
  void all_to_all(Buf s, const std::int64_t* sc, Buf r, const std::int64_t* rc) override;
  void barrier() override;

 private:
  template <class F> auto bracketed(F&& f);
  // Starts a non-blocking operation inside a host-access window and pins `bufs` before the window closes.
  template <class F> Request started(F&& start, std::initializer_list<Buf> bufs);
  Comm& inner_;
  device::Backend& backend_;
};

// The group of one process on a device backend (training.device = "cuda" at world 1): LocalComm's copies, made
// by the backend when the buffers are its device memory (a host memmove there would read device memory from
// the host), and by memmove when they are host memory (the host conveniences). A mixed pair is refused.
class DeviceLocalComm final : public Comm {
 public:
  using Comm::all_gather;
  using Comm::all_reduce;
  using Comm::reduce_scatter;
  explicit DeviceLocalComm(device::Backend& backend) : backend_(backend) {}
  int size() const override { return 1; }
  int rank() const override { return 0; }
  void all_reduce(Buf, ReduceOp) override {}
  void reduce_scatter(Buf send, Buf recv, ReduceOp) override { copy(recv, send, recv.n, "reduce_scatter"); }
  void all_gather(Buf send, Buf recv) override { copy(recv, send, send.n, "all_gather"); }
  void broadcast(Buf, int) override {}
  Request isend(Buf b, int p, int t) override { return host_.isend(b, p, t); }   // throws: no peer
  Request irecv(Buf b, int p, int t) override { return host_.irecv(b, p, t); }
  int max_tag() const override { return 0; }
  void all_to_all(Buf send, const std::int64_t* send_counts, Buf recv, const std::int64_t* recv_counts) override;
  void barrier() override {}

 private:
  void copy(Buf dst, Buf src, std::int64_t n, const char* what);
  device::Backend& backend_;
  LocalComm host_;
};

}  // namespace meshrun::comm
