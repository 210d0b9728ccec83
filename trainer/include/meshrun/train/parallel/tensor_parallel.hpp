// Tensor parallelism's communication for one micro-batch (parallelism.md §4), the module every layer
// calls and nothing else: column-parallel projections (q/k/v, gate/up, lm_head) need all rows of their
// input, row-parallel ones (o_proj, down_proj) produce partial sums over the tensor-parallel ranks.
//
// Without sequence parallelism every rank holds all n rows of the residual stream: partial sums are
// all-reduced. With it, each rank keeps its contiguous slice of nl = n / tp rows; partial sums are
// reduce-scattered to those slices and normed rows all-gathered before a column-parallel projection
// (Megatron-SP). Norm weights then see only the local rows, so their gradients are summed over tp.
#pragma once
#include <cstdint>

#include "meshrun/device/backend.hpp"
#include "meshrun/train/comm_names.hpp"

namespace meshrun::train {

struct TensorParallel {
  Comm* tp = nullptr;
  bool sp = false;
  std::int64_t n = 0;   // rows of the micro-batch
  std::int64_t nl = 0;  // rows this rank keeps (n / tp under sequence parallelism, else n)
  std::int64_t h = 0;   // hidden size
  device::Backend* be = nullptr;  // the copies

  int size() const { return tp->size(); }
  bool gathers() const { return sp && tp->size() > 1; }
  // Row-parallel partial sums [n, h] -> this rank's rows of the sum [nl, h]. `partial` is clobbered.
  void reduce_rows(Buf partial, Buf out) const;
  // This rank's rows [nl, h] -> all rows [n, h].
  void gather_rows(Buf local, Buf full) const;
  // The rows a column-parallel projection reads: `local` itself, or all rows gathered into `scratch`.
  Buf full_rows(Buf local, Buf scratch) const;
  // Gradient of a replicated vector (norm weight) that each rank computed over its rows only.
  void sum_replicated_grad(Buf v) const;
};

}  // namespace meshrun::train
