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

namespace {
bool gated(const ModelSpec& m) { return m.mlp != "gelu"; }  // swiglu: gate, up, down
int64_t q_dim(const ModelSpec& m) { return int64_t(m.heads) * m.head_dim(); }
int64_t kv_dim(const ModelSpec& m) { return int64_t(m.kv_heads) * m.head_dim(); }
int64_t moe_ffn(const ModelSpec& m) { return m.moe_ffn_hidden > 0 ? m.moe_ffn_hidden : m.ffn_hidden; }
int64_t mlp_params(const ModelSpec& m, int64_t ffn) { return (gated(m) ? 3 : 2) * int64_t(m.hidden) * ffn; }
}  // namespace

ParamCount count_params(const ModelSpec& m) {
  ParamCount p;
  const int64_t h = m.hidden;
  p.attention = 2 * h * q_dim(m) + 2 * h * kv_dim(m);
  if (m.experts > 0) {
    p.expert = mlp_params(m, moe_ffn(m));
    p.mlp = p.expert * m.experts;
    p.router = h * m.experts;
  } else {
    p.mlp = mlp_params(m, m.ffn_hidden);
  }
  p.norms = 2 * h;
  p.embedding = m.vocab * h;
  p.head = m.tied_embeddings ? 0 : m.vocab * h;
  p.final_norm = h;
  return p;
}

int64_t active_matmul_params_per_layer(const ModelSpec& m) {
  ParamCount p = count_params(m);
  if (m.experts > 0) return p.attention + p.expert * m.top_k + p.router;
  return p.attention + p.mlp;
}

double fwd_matmul_flops_per_token_layer(const ModelSpec& m) {
  return 2.0 * double(active_matmul_params_per_layer(m));
}

double fwd_attention_flops_per_token_layer(const ModelSpec& m, int64_t seq) {
  // QKᵀ and AV: 2 · 2 · (seq/2) · q_dim.
  return 2.0 * double(seq) * double(q_dim(m));
}

double fwd_head_flops_per_token(const ModelSpec& m) { return 2.0 * double(m.vocab) * m.hidden; }

double model_flops_per_token(const ModelSpec& m, int64_t seq) {
  double layer = fwd_matmul_flops_per_token_layer(m) + fwd_attention_flops_per_token_layer(m, seq);
  return 3.0 * (layer * m.layers + fwd_head_flops_per_token(m));
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
  double attention = (2.0 * q_dim(m) + 2.0 * kv_dim(m)) * b + 4.0 * m.heads;
  double mlp;
  if (m.experts > 0) {
    const double f = double(moe_ffn(m)) * m.top_k;
    mlp = (gated(m) ? 3 : 2) * f * b;
    replicated += 2.0 * m.top_k * h * b;  // dispatched token copies and expert outputs for the combine
    replicated += 4.0 * m.experts;        // router logits, fp32
  } else {
    mlp = (gated(m) ? 3 : 2) * double(m.ffn_hidden) * b;
  }
  if (s.recompute == Recompute::selective) {
    // Recompute the elementwise work: both norm outputs and the activation function's output.
    replicated -= 2 * h * b;
    mlp -= (m.experts > 0 ? double(moe_ffn(m)) * m.top_k : double(m.ffn_hidden)) * b;
  }
  return tokens * (replicated / sp_div + (attention + mlp) / t);
}

}  // namespace meshrun::planner
