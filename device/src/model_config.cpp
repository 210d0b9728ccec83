// Sizes and the FLOP formula of a single-device model configuration (see model_config.hpp).
#include "meshrun/device/model_config.hpp"

#include "meshrun/model_flops.hpp"

namespace meshrun::device {

std::string ModelConfig::problem() const {
  auto pos = [](std::int64_t v) { return v > 0; };
  if (!pos(vocab) || !pos(hidden) || !pos(layers) || !pos(heads) || !pos(kv_heads) || !pos(ffn) || !pos(seq) ||
      !pos(batch))
    return "every model size (vocab, hidden, layers, heads, kv_heads, ffn, seq, batch) must be positive";
  if (hidden % heads != 0) return "hidden must be a multiple of heads";
  if (heads % kv_heads != 0) return "heads must be a multiple of kv_heads";
  if (head_dim() % 2 != 0) return "hidden / heads (the head dimension) must be even for RoPE";
  if (vocab > (std::int64_t{1} << 31) - 1) return "vocab must fit a 32-bit token id";
  return "";
}

ModelSpec model_spec(const ModelConfig& c) {
  ModelSpec m;
  m.name = "gpu-check";
  m.vocab = c.vocab;
  m.hidden = static_cast<int>(c.hidden);
  m.layers = static_cast<int>(c.layers);
  m.heads = static_cast<int>(c.heads);
  m.kv_heads = static_cast<int>(c.kv_heads);
  m.ffn_hidden = static_cast<int>(c.ffn);
  m.mlp = "swiglu";
  m.tied_embeddings = false;
  m.rope_theta = c.rope_theta;
  m.norm_eps = c.norm_eps;
  return m;
}

std::int64_t matmul_param_count(const ModelConfig& c) {
  const ModelSpec m = model_spec(c);
  return c.layers * active_matmul_params_per_layer(m) + count_params(m).head;
}

std::int64_t param_count(const ModelConfig& c) { return count_params(model_spec(c)).total(static_cast<int>(c.layers)); }

double train_flops_per_step(const ModelConfig& c) {
  return model_flops_per_token(model_spec(c), c.seq) * static_cast<double>(c.tokens());
}

}  // namespace meshrun::device
