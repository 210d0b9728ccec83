// The model sizes meshrun-gpu-check trains (the tiny loss check and the ~1B throughput model) through
// the trainer at world 1 (trainer/.../run/single_device.hpp), their parameter counts and the FLOPs of a
// step (meshrun's one formula, meshrun/model_flops.hpp).
#pragma once
#include <cstdint>
#include <string>

#include "meshrun/job.hpp"

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

// The same model as a ModelSpec, for meshrun's one parameter and FLOP formula (meshrun/model_flops.hpp).
ModelSpec model_spec(const ModelConfig& c);
// Parameters: all of them, and the ones that take part in matrix products (everything but the embedding
// table and the norm weights).
std::int64_t param_count(const ModelConfig& c);
std::int64_t matmul_param_count(const ModelConfig& c);
// Model FLOPs of one training step (forward + backward), the figure MFU is computed from:
// model_flops_per_token × tokens, i.e. 6 · N_matmul · tokens + 6 · layers · batch · seq² · heads · head_dim.
double train_flops_per_step(const ModelConfig& c);

}  // namespace meshrun::device
