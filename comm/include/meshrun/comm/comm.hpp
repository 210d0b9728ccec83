// Communication for the trainer: one interface over the collectives the five axes need, with an MPI
// backend over CPU buffers (comm_mpi.cpp) and a size-1 backend (LocalComm). NCCL plugs in behind the
// same interface later.
//
// Point-to-point is non-blocking: isend/irecv return a Request to wait on, so a pipeline's steady state
// (send one way while receiving the other) and a ring cannot deadlock above MPI's eager limit. Blocking
// send/recv and the combined sendrecv are built on them. Peers are ranks of this communicator; which
// peer is a neighbour comes from mesh (RankGrid::ring_peers), not from the trainer.
//
// The two ZeRO collectives also come non-blocking (ireduce_scatter, iall_gather), returning the same
// Request, so data-parallel traffic can run under compute. Same semantics and bits as the blocking forms.
//
// Reductions are deterministic and fixed-order: every sum is ((x_0 + x_1) + x_2) + ... over group ranks,
// whatever the chunking. So all_reduce == reduce_scatter + all_gather bit for bit, every rank gets the
// same bits, and ZeRO stages that only move the reduction point compute identical numbers.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>

namespace meshrun::comm {

enum class DType { f32, f64, i32, i64 };
enum class ReduceOp { sum, max };
std::size_t dtype_size(DType t);

template <class T> constexpr DType dtype_of();
template <> constexpr DType dtype_of<float>() { return DType::f32; }
template <> constexpr DType dtype_of<double>() { return DType::f64; }
template <> constexpr DType dtype_of<std::int32_t>() { return DType::i32; }
template <> constexpr DType dtype_of<std::int64_t>() { return DType::i64; }

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
  // buf[n] := op over ranks; identical bits on every rank.
  virtual void all_reduce(void* buf, std::int64_t n, DType t, ReduceOp op) = 0;
  // send[size·n] holds one block per rank; recv[n] := op over ranks of block rank(). recv may alias
  // send's own block (in place).
  virtual void reduce_scatter(const void* send, void* recv, std::int64_t n, DType t, ReduceOp op) = 0;
  // send[n] -> recv[size·n], block r from rank r. send may alias recv's own block (in place).
  virtual void all_gather(const void* send, void* recv, std::int64_t n, DType t) = 0;
  virtual void broadcast(void* buf, std::int64_t n, DType t, int root) = 0;
  // Non-blocking reduce_scatter and all_gather: the buffers belong to the operation until its Request
  // completes; recv is written only then. This default runs the blocking call and returns a completed
  // Request: LocalComm and decorators (which so see every collective through the blocking calls) use
  // it, MpiComm overlaps.
  virtual Request ireduce_scatter(const void* send, void* recv, std::int64_t n, DType t, ReduceOp op) {
    reduce_scatter(send, recv, n, t, op);
    return Request();
  }
  virtual Request iall_gather(const void* send, void* recv, std::int64_t n, DType t) {
    all_gather(send, recv, n, t);
    return Request();
  }
  // Non-blocking point-to-point; tag in [0, max_tag()].
  virtual Request isend(const void* buf, std::int64_t n, DType t, int peer, int tag) = 0;
  virtual Request irecv(void* buf, std::int64_t n, DType t, int peer, int tag) = 0;
  virtual int max_tag() const = 0;
  // Variable-count all-to-all: send_counts[r] elements go to rank r (blocks back to back), recv_counts[r]
  // come from rank r.
  virtual void all_to_all(const void* send, const std::int64_t* send_counts, void* recv,
                          const std::int64_t* recv_counts, DType t) = 0;
  virtual void barrier() = 0;

  // Blocking forms and the combined exchange (both posted before either is waited on).
  void send(const void* buf, std::int64_t n, DType t, int peer, int tag) { isend(buf, n, t, peer, tag).wait(); }
  void recv(void* buf, std::int64_t n, DType t, int peer, int tag) { irecv(buf, n, t, peer, tag).wait(); }
  void sendrecv(const void* send_buf, std::int64_t send_n, int dest, void* recv_buf, std::int64_t recv_n, int source,
                DType t, int tag) {
    Request r = irecv(recv_buf, recv_n, t, source, tag);
    Request s = isend(send_buf, send_n, t, dest, tag);
    s.wait();
    r.wait();
  }

  // Typed conveniences.
  template <class T> void all_reduce(T* buf, std::int64_t n, ReduceOp op = ReduceOp::sum) {
    all_reduce(static_cast<void*>(buf), n, dtype_of<T>(), op);
  }
  template <class T> void reduce_scatter(const T* send, T* recv, std::int64_t n, ReduceOp op = ReduceOp::sum) {
    reduce_scatter(static_cast<const void*>(send), static_cast<void*>(recv), n, dtype_of<T>(), op);
  }
  template <class T> void all_gather(const T* send, T* recv, std::int64_t n) {
    all_gather(static_cast<const void*>(send), static_cast<void*>(recv), n, dtype_of<T>());
  }
  template <class T> Request ireduce_scatter(const T* send, T* recv, std::int64_t n, ReduceOp op = ReduceOp::sum) {
    return ireduce_scatter(static_cast<const void*>(send), static_cast<void*>(recv), n, dtype_of<T>(), op);
  }
  template <class T> Request iall_gather(const T* send, T* recv, std::int64_t n) {
    return iall_gather(static_cast<const void*>(send), static_cast<void*>(recv), n, dtype_of<T>());
  }
};

// The group of one process: every collective is a copy or nothing.
class LocalComm final : public Comm {
 public:
  using Comm::all_gather;  // keep the typed conveniences visible
  using Comm::all_reduce;
  using Comm::reduce_scatter;
  int size() const override { return 1; }
  int rank() const override { return 0; }
  void all_reduce(void*, std::int64_t, DType, ReduceOp) override {}
  void reduce_scatter(const void* send, void* recv, std::int64_t n, DType t, ReduceOp op) override;
  void all_gather(const void* send, void* recv, std::int64_t n, DType t) override;
  void broadcast(void*, std::int64_t, DType, int) override {}
  Request isend(const void*, std::int64_t, DType, int, int) override;  // throws: no peer
  Request irecv(void*, std::int64_t, DType, int, int) override;
  int max_tag() const override { return 0; }
  void all_to_all(const void* send, const std::int64_t* send_counts, void* recv,
                  const std::int64_t* recv_counts, DType t) override;
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
  void all_reduce(void* b, std::int64_t n, DType t, ReduceOp op) override { inner_->all_reduce(b, n, t, op); }
  void reduce_scatter(const void* s, void* r, std::int64_t n, DType t, ReduceOp op) override {
    inner_->reduce_scatter(s, r, n, t, op);
  }
  void all_gather(const void* s, void* r, std::int64_t n, DType t) override { inner_->all_gather(s, r, n, t); }
  void broadcast(void* b, std::int64_t n, DType t, int root) override { inner_->broadcast(b, n, t, root); }
  Request isend(const void* b, std::int64_t n, DType t, int peer, int tag) override {
    return inner_->isend(b, n, t, peer, tag);
  }
  Request irecv(void* b, std::int64_t n, DType t, int peer, int tag) override { return inner_->irecv(b, n, t, peer, tag); }
  int max_tag() const override { return inner_->max_tag(); }
  void all_to_all(const void* s, const std::int64_t* sc, void* r, const std::int64_t* rc, DType t) override {
    inner_->all_to_all(s, sc, r, rc, t);
  }
  void barrier() override { inner_->barrier(); }

 protected:
  Comm& inner() { return *inner_; }

 private:
  std::unique_ptr<Comm> inner_;
};

}  // namespace meshrun::comm
