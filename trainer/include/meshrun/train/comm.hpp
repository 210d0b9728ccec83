// Communication for the trainer: one interface over the collectives the five axes need, with an MPI
// backend over CPU buffers (comm_mpi.cpp) and a size-1 backend (LocalComm). NCCL plugs in behind the
// same interface later.
//
// Reductions are deterministic and fixed-order: every sum is ((x_0 + x_1) + x_2) + ... over group ranks,
// whatever the chunking. So all_reduce == reduce_scatter + all_gather bit for bit, every rank gets the
// same bits, and ZeRO stages that only move the reduction point compute identical numbers.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>

namespace meshrun::train {

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
  virtual void send(const void* buf, std::int64_t n, DType t, int peer, int tag) = 0;
  virtual void recv(void* buf, std::int64_t n, DType t, int peer, int tag) = 0;
  // Variable-count all-to-all: send_counts[r] elements go to rank r (blocks back to back), recv_counts[r]
  // come from rank r.
  virtual void all_to_all(const void* send, const std::int64_t* send_counts, void* recv,
                          const std::int64_t* recv_counts, DType t) = 0;
  virtual void barrier() = 0;

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
  void send(const void*, std::int64_t, DType, int, int) override;
  void recv(void*, std::int64_t, DType, int, int) override;
  void all_to_all(const void* send, const std::int64_t* send_counts, void* recv,
                  const std::int64_t* recv_counts, DType t) override;
  void barrier() override {}
};

}  // namespace meshrun::train
