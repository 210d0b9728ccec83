// Parameter counts and model FLOPs (model_flops.hpp; derivations in docs/planner.md, "Model arithmetic").
#include "meshrun/model_flops.hpp"

namespace meshrun {

namespace {
int64_t mlp_params(const ModelSpec& m, int64_t ffn) { return (m.gated() ? 3 : 2) * int64_t(m.hidden) * ffn; }
}  // namespace

const char* const kModelFlopFormula =
    "6*N_matmul*tokens + 6*layers*seq*heads*head_dim*tokens (forward + backward = 3x forward, no recomputation; "
    "N_matmul = the weights a token passes through: attention, the MLP or its top_k experts, the router, the LM "
    "head; causal attention: a query sees seq/2 keys on average)";

ParamCount count_params(const ModelSpec& m) {
  ParamCount p;
  const int64_t h = m.hidden;
  p.attention = 2 * h * m.q_dim() + 2 * h * m.kv_dim();
  if (m.experts > 0) {
    p.expert = mlp_params(m, m.expert_ffn());
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
  return 2.0 * double(seq) * double(m.q_dim());
}

double fwd_head_flops_per_token(const ModelSpec& m) { return 2.0 * double(m.vocab) * m.hidden; }

double model_flops_per_token(const ModelSpec& m, int64_t seq) {
  double layer = fwd_matmul_flops_per_token_layer(m) + fwd_attention_flops_per_token_layer(m, seq);
  return 3.0 * (layer * m.layers + fwd_head_flops_per_token(m));
}

}  // namespace meshrun
