// The Llama decoder, forward and backward by hand over the kernels in kernels/, for one micro-batch.
//
// Tensor parallelism (parallelism.md §4): q/k/v and gate/up are column-parallel (this rank's heads /
// ffn columns), o_proj and down_proj row-parallel (one all-reduce per block in forward, one per block in
// backward for the column-parallel input gradient), the embedding and lm_head vocab-parallel with the
// cross-entropy combined from per-shard pieces. With sequence parallelism each rank keeps only its
// contiguous slice of the micro-batch's rows for the residual stream and the norms, and the all-reduces
// become reduce-scatter + all-gather.
#pragma once
#include <cstdint>
#include <vector>

#include "meshrun/job.hpp"
#include "meshrun/train/comm.hpp"
#include "meshrun/train/params.hpp"
#include "meshrun/train/zero.hpp"

namespace meshrun::train {

struct ModelDims {
  std::int64_t layers, hidden, ffn, heads, kv_heads, head_dim, vocab;
  double rope_theta, norm_eps;
  static ModelDims from(const ModelSpec& m);
};

template <class T>
class Model {
 public:
  // tp: the tensor-parallel group. seq_len: tokens per sequence; mbs: sequences per micro-batch.
  Model(const ModelDims& dims, const ParamTable& table, Comm& tp, bool sequence_parallel, std::int64_t seq_len,
        std::int64_t mbs);

  // Forward and backward of one micro-batch: ids, targets [mbs·seq_len]. Gradients of every unit go
  // through store.grad_begin/grad_end; loss_scale multiplies dL/dlogits (1 / global target tokens).
  // Returns Σ of the rows' cross-entropy (unnormalized, double, rows in order).
  double forward_backward(ParamStore<T>& store, const std::int32_t* ids, const std::int32_t* targets,
                          double loss_scale);
  // Forward only (same numbers as forward_backward's forward).
  double forward(ParamStore<T>& store, const std::int32_t* ids, const std::int32_t* targets);
  // Bytes of saved activations and work buffers of one micro-batch.
  std::int64_t activation_bytes() const;

 private:
  struct LayerActs {
    std::vector<T> x_in, rstd1, xn1, q, k, v, att, lse, x2, rstd2, xn2, gate, up, hact;
  };
  double forward_impl(ParamStore<T>& store, const std::int32_t* ids, const std::int32_t* targets, bool keep_head);
  void layer_forward(const T* w, LayerActs& a, const T* x, T* y);
  void layer_backward(const T* w, T* dw, LayerActs& a, T* dy_to_dx);
  double head_forward(const T* w, const std::int32_t* targets);
  void head_backward(const T* w, T* dw, const std::int32_t* targets, double loss_scale, T* dx);
  // Row-parallel output [n, h] partial sums -> this rank's rows of the sum.
  void reduce_rows(T* partial, T* out);
  // This rank's rows [nl, h] -> all rows [n, h].
  void gather_rows(const T* local, T* full);
  void tp_sum_vector(T* v, std::int64_t n);  // norm-weight grads under sequence parallelism
  // Rows of a normed activation for a column-parallel projection: this rank's rows, or (sequence
  // parallel) all rows gathered into xn_full_. Only the local rows are saved for backward.
  const T* full_rows(const T* local);

  ModelDims d_;
  const ParamTable& table_;
  Comm& tp_;
  bool sp_;
  std::int64_t seq_, mbs_, n_, nl_;
  std::int64_t hq_, hkv_, ffn_, vl_, v0_;  // local sizes
  std::vector<std::int32_t> pos_;
  std::vector<LayerActs> acts_;
  std::vector<T> x_, emb_full_, xn_full_;   // residual stream [nl, h], embedding partials, gathered rows [n, h]
  std::vector<T> xf_in_, rstd_f_, xf_local_, xf_, logits_, ce_max_, ce_sum_, ce_tgt_, ce_loss_;
  std::vector<T> buf_nh_, buf_nh2_, buf_att_, buf_ff_, buf_ff2_, dq_, dk_, dv_;
};

}  // namespace meshrun::train
