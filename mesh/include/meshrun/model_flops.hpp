// Parameter counts and model FLOPs of a ModelSpec: the one formula behind the planner's TFLOP/s and MFU,
// meshrun-train's MFU and meshrun-gpu-check's. Derivations in docs/planner.md ("Model arithmetic").
#pragma once
#include <cstdint>

#include "meshrun/job.hpp"

namespace meshrun {

// Parameters, untied embeddings unless the model ties them, RMSNorm weights only, no biases.
struct ParamCount {
  int64_t attention = 0;  // per layer: q, k, v, o projections
  int64_t mlp = 0;        // per layer: the dense MLP, or every expert of an MoE layer
  int64_t expert = 0;     // one expert (0 for dense models)
  int64_t router = 0;     // per layer (MoE)
  int64_t norms = 0;      // per layer
  int64_t embedding = 0;
  int64_t head = 0;       // 0 when tied to the embedding
  int64_t final_norm = 0;
  int64_t per_layer() const { return attention + mlp + router + norms; }
  int64_t total(int layers) const { return per_layer() * layers + embedding + head + final_norm; }
};
ParamCount count_params(const ModelSpec& m);

// Weights a token passes through in one layer's matmuls (attention projections, the dense MLP or its
// top_k experts, the router).
int64_t active_matmul_params_per_layer(const ModelSpec& m);

// Forward FLOPs per token. Causal attention: each query sees on average seq/2 keys, QKᵀ and AV each
// cost 2·(seq/2)·heads·head_dim.
double fwd_matmul_flops_per_token_layer(const ModelSpec& m);
double fwd_attention_flops_per_token_layer(const ModelSpec& m, int64_t seq);
double fwd_head_flops_per_token(const ModelSpec& m);  // output projection to the vocabulary
// Model FLOPs per trained token (forward + backward = 3× forward, no recomputation): the numerator of
// TFLOP/s and MFU. The FLOPs of a step are this × seq × global batch.
double model_flops_per_token(const ModelSpec& m, int64_t seq);
// The same formula in words, for the programs that print MFU.
extern const char* const kModelFlopFormula;

}  // namespace meshrun
