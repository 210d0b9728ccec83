// A single-device Llama-style decoder written only against the Backend seam: the same code trains on the
// CPU backend (the fp32/fp64 twin) and on the CUDA backend (bf16 weights and activations, fp32 gradients,
// fp32 master weights and Adam moments). meshrun-gpu-check uses it to compare the two and to measure
// throughput; the MPI trainer (trainer/) keeps its own CPU layers.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "meshrun/device/backend.hpp"

namespace meshrun::device {

struct ModelConfig {
  std::int64_t vocab = 256, hidden = 64, layers = 2, heads = 4, kv_heads = 2, ffn = 176;
  std::int64_t seq = 32, batch = 2;   // tokens per sequence, sequences per step
  double rope_theta = 10000.0, norm_eps = 1e-5;
  std::int64_t head_dim() const { return hidden / heads; }
  std::int64_t tokens() const { return seq * batch; }
  // "" when usable, else one line naming the field and the fix.
  std::string problem() const;
};

// Parameters: all of them, and the ones that take part in matrix products (everything but the embedding
// table and the norm weights).
std::int64_t param_count(const ModelConfig& c);
std::int64_t matmul_param_count(const ModelConfig& c);
// Model FLOPs of one training step (forward + backward), the figure MFU is computed from:
//   6 · N_matmul · tokens + 6 · layers · batch · seq² · heads · head_dim
// (the second term: QKᵀ and P·V over the causal half of the score matrix, 2·2·seq²·heads·head_dim / 2 per
// layer and sequence forward, times 3 for forward + backward).
double train_flops_per_step(const ModelConfig& c);
extern const char* const kFlopFormula;

class Model {
 public:
  Model(Backend& be, const ModelConfig& c, std::uint64_t seed);
  ~Model();
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  // tokens: batch rows of seq + 1 ids (inputs and next-token targets). Mean cross-entropy over the batch.
  double forward(const std::int32_t* tokens);
  // forward, then the gradients of the mean loss (overwriting the previous ones); returns the loss.
  double forward_backward(const std::int32_t* tokens);
  // Global-norm clipping (clip > 0) and one AdamW step on the master weights; returns the gradient norm.
  double step(AdamW hp, double clip);

  std::int64_t size() const { return n_params_; }
  std::vector<double> params();   // the master weights
  std::vector<double> grads();
  void set_params(const std::vector<double>& p);

 private:
  struct Layer;
  void alloc_acts();
  void layer_forward(int l);
  void layer_backward(int l);
  Buf act(std::int64_t n);

  Backend& be_;
  ModelConfig c_;
  Precision pr_;
  std::int64_t n_params_ = 0;
  std::int64_t adam_step_ = 0;
  Buf master_, param_, grad_, m_, v_;
  std::vector<Layer> layers_;
  Buf embed_, embed_g_, fnorm_, fnorm_g_, lm_, lm_g_;   // views (param_ / grad_)
  std::vector<Buf> owned_;                             // activation buffers, released at the end
  Buf ids_, targets_, pos_, pos_seq_;
  std::vector<Buf> x_;                                 // residual stream at each layer's input, and the last
  Buf xf_, rstd_f_, logits_, dlogits_, ce_m_, ce_s_, ce_z_, ce_loss_;
  Buf ws_h_, ws_f_, dgate_, dup_, dxn_, datt_, dq_, dk_, dv_, dres_;
  std::vector<std::int32_t> host_ids_;
};

}  // namespace meshrun::device
