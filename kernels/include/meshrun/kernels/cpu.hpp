// meshrun::kernels::cpu — the CPU kernels of the bundled trainer.
//
// CHANGELOG: (signature changes after first publication are listed here, newest first)
//   - added MatmulIsa, matmul_isa, set_matmul_isa, matmul_isa_name (issue 20: the fma matmul); the
//     matmul's results changed from plain k-ordered sums to fma chains (same on every ISA).
//
// Contract (the CUDA backend, meshrun::device::Backend in gpu/, implements the same kernels on device
// buffers and is checked against these; see docs/kernels.md and docs/gpu.md):
//   * Plain functions templated on the element type T; instantiated for float (training) and double
//     (gradient checks). Calling them with another T fails at link time.
//   * All tensors are dense, row-major, contiguous, caller-allocated. Shapes are given in the comments as
//     [dim0, dim1, ...] with the last dimension fastest. Sizes are std::int64_t, token ids and positions
//     std::int32_t.
//   * Arithmetic is done in T (fp32 for float). Reductions use a fixed order that depends only on the
//     shapes, never on threads or timing: calling a kernel twice on the same inputs gives the same bits.
//     The library is built without FMA contraction; the matmul uses explicit fused multiply-adds in a
//     fixed order per output element (see matmul_isa below), so the bits do not depend on the vector
//     ISA either.
//     The kernels are single-threaded (one MPI rank per core is the parallelism).
//   * "overwrite" outputs are fully written (need not be initialized); "ACCUMULATE" outputs are added to
//     (the caller zeroes them once per step), which is what gradient accumulation over micro-batches and
//     ring attention over key blocks need.
//   * Input and output pointers must not alias unless a function says "in place".
//   * Preconditions (positive sizes, even head_dim, ...) are the caller's job; the trainer validates its
//     configuration once, with a clear error, before any kernel runs.
#pragma once

#include <cstdint>

namespace meshrun::kernels::cpu {

// Whether an input-gradient output is overwritten or added to. Input gradients default to overwrite;
// `accumulate` lets a caller sum the gradient of one activation that feeds several consumers (q/k/v
// projections of the same normed input, a residual branch) without a temporary buffer.
enum class Store { overwrite, accumulate };

// ----------------------------------------------------------------------------------------------------
// Linear layer, weights in the PyTorch / Hugging Face layout W[out, in] (safetensors shapes match).
// n = rows (tokens), in = input features, out = output features. No bias (Llama has none).
// Each inner product is the chain c = fma(a_k, b_k, c), k increasing, from c = 0 (or the old value
// when accumulating).

// The matmul's micro-kernel (linear layers and attention products), chosen once from the CPU: AVX-512F,
// else AVX2 + FMA, else the portable std::fma twin. All three give the same bits; the choice only
// changes speed. set_matmul_isa (tests, benchmarks) returns false, changing nothing, if this CPU lacks
// the ISA.
enum class MatmulIsa { portable, avx2_fma, avx512 };
MatmulIsa matmul_isa();
bool set_matmul_isa(MatmulIsa isa);
const char* matmul_isa_name(MatmulIsa isa);

// y[n, out] = x[n, in] · Wᵀ                                     (overwrite y)
template <class T>
void linear_forward(T* y, const T* x, const T* w, std::int64_t n, std::int64_t in, std::int64_t out);

// dx[n, in] = dy[n, out] · W                                    (overwrite, or accumulate if asked)
template <class T>
void linear_backward_input(T* dx, const T* dy, const T* w, std::int64_t n, std::int64_t in,
                           std::int64_t out, Store store = Store::overwrite);

// dW[out, in] += dyᵀ[out, n] · x[n, in]                         (ACCUMULATE into dW)
// Separate from the input gradient so that zero-bubble pipeline schedules can delay it.
template <class T>
void linear_backward_weight(T* dw, const T* dy, const T* x, std::int64_t n, std::int64_t in,
                            std::int64_t out);

// ----------------------------------------------------------------------------------------------------
// RMSNorm over the last dimension (Hugging Face LlamaRMSNorm):
//   rstd[r]   = 1 / sqrt(mean_j x[r, j]² + eps)
//   y[r, j]   = (x[r, j] · rstd[r]) · w[j]
// x, y: [rows, dim]; w: [dim]; rstd: [rows] (saved for the backward pass).
template <class T>
void rmsnorm_forward(T* y, T* rstd, const T* x, const T* w, std::int64_t rows, std::int64_t dim,
                     double eps);

// With xhat = x·rstd and g = dy ⊙ w:
//   dx[r, :] = rstd[r] · (g − xhat · mean_j(g ⊙ xhat))            (overwrite, or accumulate if asked)
//   dw[j]   += Σ_r dy[r, j] · xhat[r, j]                          (ACCUMULATE into dw; rows in order)
template <class T>
void rmsnorm_backward(T* dx, T* dw, const T* dy, const T* x, const T* w, const T* rstd,
                      std::int64_t rows, std::int64_t dim, Store store = Store::overwrite);
// The two halves of rmsnorm_backward, for pipelines that defer weight gradients (B and W apart); each
// computes exactly what rmsnorm_backward computes for its output.
template <class T>
void rmsnorm_backward_input(T* dx, const T* dy, const T* x, const T* w, const T* rstd, std::int64_t rows,
                            std::int64_t dim, Store store = Store::overwrite);
template <class T>
void rmsnorm_backward_weight(T* dw, const T* dy, const T* x, const T* rstd, std::int64_t rows, std::int64_t dim);

// ----------------------------------------------------------------------------------------------------
// Rotary position embedding, Hugging Face Llama convention (rotate_half: element i pairs with i + d/2).
// x: [tokens, heads, head_dim] rotated IN PLACE; pos: [tokens] global positions (context-parallel chunks
// pass their own, non-contiguous positions). head_dim must be even. For i < d/2:
//   inv_freq_i = theta^(−2i/d),  a = pos[t] · inv_freq_i  (computed in double, cos/sin rounded to T)
//   x'_i       = x_i · cos a − x_{i+d/2} · sin a
//   x'_{i+d/2} = x_{i+d/2} · cos a + x_i · sin a
template <class T>
void rope_forward(T* x, const std::int32_t* pos, std::int64_t tokens, std::int64_t heads,
                  std::int64_t head_dim, double theta);

// Backward = the inverse rotation (angle −a) applied IN PLACE to the gradient dx (same shape as x).
template <class T>
void rope_backward(T* dx, const std::int32_t* pos, std::int64_t tokens, std::int64_t heads,
                   std::int64_t head_dim, double theta);

// ----------------------------------------------------------------------------------------------------
// Grouped-query causal attention with online softmax over key blocks (flash-attention style).
// One sequence (or one context-parallel piece of it) per call; a batch is handled by the caller looping
// over sequences.
//   q: [tq, hq, d]   k, v: [tk, hkv, d]   out: [tq, hq, d]   lse: [tq, hq]
//   qpos: [tq], kpos: [tk] global token positions; query i sees key j iff kpos[j] <= qpos[i].
//   Query head h uses key/value head h / (hq / hkv) (Hugging Face repeat_kv); hq % hkv == 0.
//   s_ij = scale · q_i·k_j (scale is usually 1/sqrt(d)),  lse_i = log Σ_{j visible} exp(s_ij),
//   out_i = Σ_j exp(s_ij − lse_i) · v_j.
// A (query, head) row that sees no key gets out = 0 and lse = −inf, so that merging it is a no-op.
struct AttentionDims {
  std::int64_t tq;   // query tokens
  std::int64_t tk;   // key/value tokens
  std::int64_t hq;   // query heads
  std::int64_t hkv;  // key/value heads (divides hq)
  std::int64_t d;    // head dimension
};

// out, lse: overwrite.
template <class T>
void attention_forward(T* out, T* lse, const T* q, const T* k, const T* v, const std::int32_t* qpos,
                       const std::int32_t* kpos, const AttentionDims& dims, double scale);

// Merge a second partial result (out2, lse2), computed over a disjoint set of keys, INTO (out, lse),
// in the numerically stable form (ring attention, reference parallelism.md §5):
//   lse = lse1 − log σ(lse1 − lse2)          (= log(e^lse1 + e^lse2))
//   out = out1 − σ(lse2 − lse1) · (out1 − out2)
// A side with lse = −inf contributes nothing. out: [rows, d], lse: [rows], rows = tq·hq.
template <class T>
void attention_merge(T* out, T* lse, const T* out2, const T* lse2, std::int64_t rows, std::int64_t d);

// Backward from the FINAL (merged) out and lse of the forward pass:
//   P_ij = exp(s_ij − lse_i), D_i = dout_i·out_i,
//   dv_j += Σ_i P_ij dout_i,  dS_ij = P_ij (dout_i·v_j − D_i),
//   dq_i += scale Σ_j dS_ij k_j,  dk_j += scale Σ_i dS_ij q_i
// dq, dk, dv: ACCUMULATE (ring attention adds the contribution of each key/value block; called with only
// a block of k/v/kpos, it yields exactly that block's share).
template <class T>
void attention_backward(T* dq, T* dk, T* dv, const T* dout, const T* out, const T* lse, const T* q,
                        const T* k, const T* v, const std::int32_t* qpos, const std::int32_t* kpos,
                        const AttentionDims& dims, double scale);

// ----------------------------------------------------------------------------------------------------
// MLP activations, elementwise over n values.
// SwiGLU: h = silu(gate) ⊙ up, silu(g) = g · σ(g).
template <class T>
void swiglu_forward(T* h, const T* gate, const T* up, std::int64_t n);

// dgate = dh ⊙ up ⊙ σ(g)(1 + g(1 − σ(g))),  dup = dh ⊙ silu(g)        (overwrite both)
template <class T>
void swiglu_backward(T* dgate, T* dup, const T* dh, const T* gate, const T* up, std::int64_t n);

// GeLU, tanh form: y = ½ x (1 + tanh(√(2/π) (x + 0.044715 x³)))       (overwrite y)
template <class T>
void gelu_tanh_forward(T* y, const T* x, std::int64_t n);

// dx = dy · dy/dx of the tanh form                                       (overwrite dx)
template <class T>
void gelu_tanh_backward(T* dx, const T* dy, const T* x, std::int64_t n);

// ----------------------------------------------------------------------------------------------------
// Softmax cross-entropy, vocab-parallel friendly. The logits of one shard are [rows, vl] and hold the
// global vocabulary columns [v0, v0 + vl). targets: [rows] global token ids; a negative target marks an
// ignored row (loss 0, gradient 0). The trainer combines the pieces across tensor-parallel ranks:
//   1. ce_row_max       → all-reduce MAX → m[r]
//   2. ce_row_sumexp(m) → all-reduce SUM → s[r]
//   3. ce_target_logit  → all-reduce SUM → z[r]   (only the shard holding the target adds a non-zero)
//   4. ce_row_loss(m, s, z) → loss[r] = log s[r] + m[r] − z[r]
//   5. ce_backward(m, s) per shard.
// The loss is NOT normalized here: the trainer divides by the global number of target tokens once.

// row_max[r] = max_j logits[r, j]                                         (overwrite)
template <class T>
void ce_row_max(T* row_max, const T* logits, std::int64_t rows, std::int64_t vl);

// sumexp[r] = Σ_j exp(logits[r, j] − row_max[r])                      (overwrite)
// (summed in 16 interleaved lanes, a fixed order that depends only on vl; exp is the kernels' own
// vectorized float exp, < 1 ulp — see docs/kernels.md)
template <class T>
void ce_row_sumexp(T* sumexp, const T* logits, const T* row_max, std::int64_t rows, std::int64_t vl);

// target_logit[r] = logits[r, targets[r] − v0] if v0 <= targets[r] < v0 + vl, else 0  (overwrite)
template <class T>
void ce_target_logit(T* target_logit, const T* logits, const std::int32_t* targets, std::int64_t rows,
                     std::int64_t vl, std::int64_t v0);

// loss[r] = log(sumexp[r]) + row_max[r] − target_logit[r], or 0 for an ignored row (overwrite)
template <class T>
void ce_row_loss(T* loss, const T* row_max, const T* sumexp, const T* target_logit,
                 const std::int32_t* targets, std::int64_t rows);

// dlogits[r, j] = (exp(logits[r, j] − row_max[r]) / sumexp[r] − [v0 + j == targets[r]]) · scale,
// 0 for an ignored row. (overwrite; dlogits may alias logits: "in place" is allowed here)
template <class T>
void ce_backward(T* dlogits, const T* logits, const T* row_max, const T* sumexp,
                 const std::int32_t* targets, std::int64_t rows, std::int64_t vl, std::int64_t v0,
                 double scale);

// Unsharded convenience built from the same pieces (v0 = 0, vl = vocab): fills loss[rows] and saves
// row_max[rows], sumexp[rows] for cross_entropy_backward. Returns Σ_r loss[r] in double, rows in order.
template <class T>
double cross_entropy_forward(T* loss, T* row_max, T* sumexp, const T* logits,
                             const std::int32_t* targets, std::int64_t rows, std::int64_t vocab);

template <class T>
void cross_entropy_backward(T* dlogits, const T* logits, const T* row_max, const T* sumexp,
                            const std::int32_t* targets, std::int64_t rows, std::int64_t vocab,
                            double scale);

// ----------------------------------------------------------------------------------------------------
// Token embedding, vocab-shard aware: this rank holds table rows for ids [v0, v0 + vl).
// table, dtable: [vl, dim]; ids: [n]; out, dout: [n, dim].
// out[i, :] = table[ids[i] − v0, :] if the id is in the shard, else 0   (overwrite; the trainer
// all-reduces over tensor-parallel ranks to complete the lookup)
template <class T>
void embedding_forward(T* out, const T* table, const std::int32_t* ids, std::int64_t n,
                       std::int64_t dim, std::int64_t v0, std::int64_t vl);

// dtable[ids[i] − v0, :] += dout[i, :] for ids in the shard, i in increasing order (ACCUMULATE)
template <class T>
void embedding_backward(T* dtable, const T* dout, const std::int32_t* ids, std::int64_t n,
                        std::int64_t dim, std::int64_t v0, std::int64_t vl);

// ----------------------------------------------------------------------------------------------------
// Optimizer. AdamW with decoupled weight decay, the update rule of torch.optim.AdamW:
//   g  = grad · grad_scale                     (grad_scale carries gradient clipping: min(1, c/‖g‖))
//   p ← p · (1 − lr·weight_decay)
//   m ← β1·m + (1 − β1)·g ;  v ← β2·v + (1 − β2)·g²
//   p ← p − (lr / (1 − β1^step)) · m / (sqrt(v) / sqrt(1 − β2^step) + eps)
// Elementwise, so a ZeRO shard update is bit-identical to the same elements of a full update.
struct AdamW {
  double lr;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.0;
  std::int64_t step = 1;   // 1 for the first update (bias correction)
  double grad_scale = 1.0;
};

// p, m, v: [n] updated in place; g: [n] read only.
template <class T>
void adamw_update(T* p, T* m, T* v, const T* g, std::int64_t n, const AdamW& hp);

// Σ x[i]² accumulated in double, i in increasing order (for the global gradient norm: each rank sums
// its shard, the trainer all-reduces, then sqrt).
template <class T>
double sum_squares(const T* x, std::int64_t n);

}  // namespace meshrun::kernels::cpu
