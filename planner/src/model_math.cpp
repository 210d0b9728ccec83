// Parameter counts, FLOPs and activation bytes (derivations in docs/planner.md, "Model arithmetic").
#include <string>

#include "meshrun/planner_model.hpp"

namespace meshrun::planner {

std::optional<Recompute> parse_recompute(std::string_view name) {
  if (name == "none") return Recompute::none;
  if (name == "selective") return Recompute::selective;
  if (name == "full") return Recompute::full;
  return std::nullopt;
}

const char* recompute_name(Recompute r) {
  switch (r) {
    case Recompute::none: return "none";
    case Recompute::selective: return "selective";
    case Recompute::full: return "full";
  }
  return "?";
}

int dtype_bytes(std::string_view name) {
  if (name == "bf16" || name == "fp16") return 2;
  if (name == "fp32") return 4;
  if (name == "fp8") return 1;
  if (name == "fp64") return 8;
  return 0;
}

double layer_input_bytes(int64_t tokens, int hidden, int bytes) { return double(tokens) * hidden * bytes; }

double activation_bytes_per_layer(const ModelSpec& m, const ActivationShape& s) {
  const double tokens = double(s.seq) / s.cp * s.micro_batch;
  const double b = s.bytes, h = m.hidden, t = s.tp;
  const double sp_div = s.sequence_parallel ? t : 1.0;  // sequence parallelism shards the "replicated" part
  if (s.recompute == Recompute::full) return tokens * h * b / sp_div;  // only the layer input

  // Per token, in bytes. Replicated across TP (sharded along the sequence with SP): the inputs of the two
  // norms (residual stream) and of the QKV and first MLP projections (norm outputs).
  double replicated = 4 * h * b;
  // Sharded across TP: what fused attention saves (Q, K, V, output, fp32 log-sum-exp per head) and the
  // MLP intermediates (SwiGLU: gate, up and their product; GeLU: its input and output).
  double attention = (2.0 * m.q_dim() + 2.0 * m.kv_dim()) * b + 4.0 * m.heads;
  double mlp;
  if (m.experts > 0) {
    const double f = double(m.expert_ffn()) * m.top_k;
    mlp = (m.gated() ? 3 : 2) * f * b;
    replicated += 2.0 * m.top_k * h * b;  // dispatched token copies and expert outputs for the combine
    replicated += 4.0 * m.experts;        // router logits, fp32
  } else {
    mlp = (m.gated() ? 3 : 2) * double(m.ffn_hidden) * b;
  }
  if (s.recompute == Recompute::selective) {
    // Recompute the elementwise work: both norm outputs and the activation function's output.
    replicated -= 2 * h * b;
    mlp -= (m.experts > 0 ? double(m.expert_ffn()) * m.top_k : double(m.ffn_hidden)) * b;
  }
  return tokens * (replicated / sp_div + (attention + mlp) / t);
}

}  // namespace meshrun::planner
