// Fixed-order reductions and the size-1 backend.
#include <algorithm>
#include <cstring>
#include <stdexcept>

#include "meshrun/comm/comm.hpp"

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
    case DType::bf16:  // gradients are reduced in fp32 (Precision::grad); a bf16 sum would lose the order's bits
      throw std::logic_error("reduce_blocks: bf16 reductions are not supported; reduce in fp32");
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

}  // namespace meshrun::comm
