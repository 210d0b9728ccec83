// Host entry points of the hand-written CUDA kernels (kernels.cu), called by backend_cuda.cpp. Tensors
// are device pointers of storage type St (fp32, or bf16 as the bit patterns of bf16.hpp); per-row
// statistics (rstd, lse, cross-entropy pieces, logits) and weight gradients are fp32. Every kernel runs
// on the given stream, and every reduction has a fixed order (same inputs → same bits).
#pragma once
#include <cstdint>

#include <cuda_runtime_api.h>

namespace meshrun::device::cuda {

enum class St : std::uint8_t { f32, bf16 };

struct AdamDesc {             // one flat shard of the multi-tensor AdamW
  float *master, *m, *v;
  const float* grad;
  void* param;                // rounded copy of the new master (St), or null
  std::int64_t n;
};
struct AdamScalars {
  float decay, step_size, bc2_sqrt, b1, b2, one_b1, one_b2, eps, grad_scale;
};

void convert(void* dst, St dt, const void* src, St st, std::int64_t n, cudaStream_t s);
void add(void* y, const void* x, St t, std::int64_t n, cudaStream_t s);
void rmsnorm_forward(void* y, float* rstd, const void* x, const void* w, St t, std::int64_t rows, std::int64_t dim,
                     float eps, cudaStream_t s);
// dx (overwrite or accumulate) and dw += Σ_rows dy·x·rstd (fp32); `partial` holds rmsnorm_partial_rows(rows)·dim floats.
// A null dx skips the input half (w may then be null too), a null dw the weight half (partial unused):
// each half launches exactly the kernels it launches in the whole call, so its bits are the same.
void rmsnorm_backward(void* dx, float* dw, const void* dy, const void* x, const void* w, const float* rstd, St t,
                      std::int64_t rows, std::int64_t dim, bool accumulate, float* partial, cudaStream_t s);
std::int64_t rmsnorm_partial_rows(std::int64_t rows);
void rope(void* x, const std::int32_t* pos, St t, std::int64_t tokens, std::int64_t heads, std::int64_t head_dim,
          double theta, bool inverse, cudaStream_t s);
void swiglu_forward(void* h, const void* gate, const void* up, St t, std::int64_t n, cudaStream_t s);
void swiglu_backward(void* dgate, void* dup, const void* dh, const void* gate, const void* up, St t, std::int64_t n,
                     cudaStream_t s);
void embedding_forward(void* out, const void* table, const std::int32_t* ids, St t, std::int64_t n, std::int64_t dim,
                       std::int64_t v0, std::int64_t vl, cudaStream_t s);
void embedding_backward(float* dtable, const void* dout, const std::int32_t* ids, St t, std::int64_t n,
                        std::int64_t dim, std::int64_t v0, std::int64_t vl, cudaStream_t s);
void ce_row_max(float* m, const float* logits, std::int64_t rows, std::int64_t vl, cudaStream_t s);
void ce_row_sumexp(float* se, const float* logits, const float* m, std::int64_t rows, std::int64_t vl, cudaStream_t s);
void ce_target_logit(float* z, const float* logits, const std::int32_t* tg, std::int64_t rows, std::int64_t vl,
                     std::int64_t v0, cudaStream_t s);
void ce_row_loss(float* loss, const float* m, const float* se, const float* z, const std::int32_t* tg,
                 std::int64_t rows, cudaStream_t s);
void ce_backward(void* dl, St t, const float* logits, const float* m, const float* se, const std::int32_t* tg,
                 std::int64_t rows, std::int64_t vl, std::int64_t v0, float scale, cudaStream_t s);
// Fused causal GQA attention (kernels/cpu.hpp semantics): q, out [tq][hq][d], k, v [tk][hkv][d] in St; lse and
// D (= Σ dout⊙out per row, attn_rowdot) fp32 [tq][hq]; out and lse overwritten, dq, dk, dv accumulated. No
// score matrix is stored: the only memory is the caller's tensors. d ≤ kFlashMaxHeadDim.
constexpr std::int64_t kFlashMaxHeadDim = 256;
void flash_attention_forward(void* out, float* lse, const void* q, const void* k, const void* v,
                             const std::int32_t* qpos, const std::int32_t* kpos, St t, std::int64_t tq, std::int64_t tk,
                             std::int64_t hq, std::int64_t hkv, std::int64_t d, float scale, cudaStream_t s);
void flash_attention_backward(void* dq, void* dk, void* dv, const void* dout, const void* q, const void* k,
                              const void* v, const float* lse, const float* D, const std::int32_t* qpos,
                              const std::int32_t* kpos, St t, std::int64_t tq, std::int64_t tk, std::int64_t hq,
                              std::int64_t hkv, std::int64_t d, float scale, cudaStream_t s);
// D[r] = Σ_c dout[r, c]·out[r, c] (fp32), the attention backward's row term.
void attn_rowdot(float* D, const void* dout, const void* out, St t, std::int64_t rows, std::int64_t d, cudaStream_t s);
void attn_merge(void* out, float* lse, const void* out2, const float* lse2, St t, std::int64_t rows, std::int64_t d,
                cudaStream_t s);
// dst[i] = src[index[i]], rows of `width` elements of `elem_size` bytes (2, 4 or 8): a plain copy.
void gather_rows(void* dst, const void* src, const std::int32_t* index, int elem_size, std::int64_t rows,
                 std::int64_t width, cudaStream_t s);
// Mixture of experts (backend.hpp). P is the storage of probs/wts/dwts/aux_grad, T that of the
// activations (rows, y, dy, drows); arithmetic as on the CPU twin (softmax and dots in double, the rest in
// fp32). moe_route: one thread per row for softmax + top-k, then stat += per-expert counts and Σ probs by
// one block per expert in a fixed tree (deterministic, no atomics).
void moe_route(void* probs, St p, std::int32_t* sel, void* wts, double* stat, std::int64_t n, int experts, int top_k,
               cudaStream_t s);
void moe_combine(void* y, const void* rows, St t, const void* wts, St p, const std::int32_t* slot, std::int64_t n,
                 int top_k, std::int64_t h, cudaStream_t s);
void moe_combine_backward(void* drows, void* dwts, St p, const void* dy, const void* rows, St t, const void* wts,
                          const std::int32_t* slot, std::int64_t n, int top_k, std::int64_t h, cudaStream_t s);
void moe_router_backward(void* probs, St p, const std::int32_t* sel, const void* wts, const void* dwts,
                         const void* aux_grad, std::int64_t n, int experts, int top_k, cudaStream_t s);
void adamw(const AdamDesc* tensors, int count, St param_t, const AdamScalars& a, cudaStream_t s);
// Σ x² over fp32 tensors, in double, into *result (device); fixed grid, fixed order.
void sum_squares(double* result, double* partial, const float* const* xs, const std::int64_t* ns, int count,
                 cudaStream_t s);
constexpr int kSumSquaresBlocks = 1024;
constexpr int kAdamMaxTensors = 16;
constexpr int kSumSquaresMaxTensors = 16;

}  // namespace meshrun::device::cuda
