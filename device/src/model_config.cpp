// Sizes and the FLOP formula of a single-device model configuration (see model_config.hpp).
#include "meshrun/device/model_config.hpp"

namespace meshrun::device {

const char* const kFlopFormula =
    "6*N_matmul*tokens + 6*layers*batch*seq^2*heads*head_dim (causal attention), "
    "N_matmul = layers*(hidden*(heads+2*kv_heads)*head_dim + heads*head_dim*hidden + 3*hidden*ffn) + vocab*hidden";

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

std::int64_t matmul_param_count(const ModelConfig& c) {
  const std::int64_t h = c.hidden, dh = c.head_dim();
  return c.layers * (h * (c.heads + 2 * c.kv_heads) * dh + c.heads * dh * h + 3 * h * c.ffn) + c.vocab * h;
}

std::int64_t param_count(const ModelConfig& c) {
  return matmul_param_count(c) + c.vocab * c.hidden + (2 * c.layers + 1) * c.hidden;
}

double train_flops_per_step(const ModelConfig& c) {
  const double attn = 6.0 * static_cast<double>(c.layers) * c.batch * static_cast<double>(c.seq) * c.seq * c.heads *
                      c.head_dim();
  return 6.0 * static_cast<double>(matmul_param_count(c)) * static_cast<double>(c.tokens()) + attn;
}

}  // namespace meshrun::device
