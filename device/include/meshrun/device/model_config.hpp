// The model sizes meshrun-gpu-check trains (the tiny loss check and the ~1B throughput model) through
// the trainer at world 1 (trainer/.../run/single_device.hpp), their parameter counts and the FLOP
// formula MFU is computed from.
#pragma once
#include <cstdint>
#include <string>

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

}  // namespace meshrun::device
