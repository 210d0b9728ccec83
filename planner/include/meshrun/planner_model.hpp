// Model arithmetic for the planner: parameter counts, FLOPs per token and activation bytes per layer.
// Pure functions of the model description; docs/planner.md derives every formula.
#pragma once
#include <cstdint>
#include <optional>
#include <string_view>

#include "meshrun/job.hpp"

namespace meshrun::planner {

enum class Recompute { none, selective, full };
std::optional<Recompute> parse_recompute(std::string_view name);
const char* recompute_name(Recompute r);

// Bytes per element of a dtype name (bf16, fp16, fp32, fp8, fp64); 0 when unknown.
int dtype_bytes(std::string_view name);

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
// TFLOP/s per GPU and MFU.
double model_flops_per_token(const ModelSpec& m, int64_t seq);

// One layer's input for `tokens` tokens: tokens · hidden · bytes (the seed check: 131,072 tokens of
// Llama 3 405B in bf16 = 4.29 GB).
double layer_input_bytes(int64_t tokens, int hidden, int bytes);

// Activations one layer keeps for its backward pass, for one micro-batch on one GPU.
struct ActivationShape {
  int64_t seq = 0;          // full sequence length
  int micro_batch = 1;
  int tp = 1;
  bool sequence_parallel = false;
  int cp = 1;               // the sequence is split over cp ranks
  Recompute recompute = Recompute::none;
  int bytes = 2;            // activation dtype (bf16)
};
double activation_bytes_per_layer(const ModelSpec& m, const ActivationShape& s);

}  // namespace meshrun::planner
