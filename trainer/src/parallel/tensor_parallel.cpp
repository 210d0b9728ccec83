#include "meshrun/train/parallel/tensor_parallel.hpp"

namespace meshrun::train {

void TensorParallel::reduce_rows(Buf partial, Buf out) const {
  partial = partial.at(0, n * h);
  if (tp->size() == 1) {
    if (partial.p != out.p) be->copy(out.at(0, n * h), partial);
    return;
  }
  if (sp) return tp->reduce_scatter(partial, out.at(0, nl * h), ReduceOp::sum);
  tp->all_reduce(partial, ReduceOp::sum);
  if (partial.p != out.p) be->copy(out.at(0, n * h), partial);
}

void TensorParallel::gather_rows(Buf local, Buf full) const {
  local = local.at(0, nl * h);
  if (!gathers()) {
    if (local.p != full.p) be->copy(full.at(0, nl * h), local);
    return;
  }
  tp->all_gather(local, full.at(0, n * h));
}

Buf TensorParallel::full_rows(Buf local, Buf scratch) const {
  if (!gathers()) return local.at(0, n * h);
  tp->all_gather(local.at(0, nl * h), scratch.at(0, n * h));
  return scratch.at(0, n * h);
}

void TensorParallel::sum_replicated_grad(Buf v) const {
  if (gathers()) tp->all_reduce(v, ReduceOp::sum);
}

}  // namespace meshrun::train
