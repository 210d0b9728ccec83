// Model arithmetic for the planner: activation bytes per layer (and, from model_flops.hpp, parameter
// counts and FLOPs per token).
// Pure functions of the model description; docs/planner.md derives every formula.
#pragma once
#include <cstdint>
#include <optional>
#include <string_view>

#include "meshrun/job.hpp"
#include "meshrun/model_flops.hpp"

namespace meshrun::planner {

enum class Recompute { none, selective, full };
std::optional<Recompute> parse_recompute(std::string_view name);
const char* recompute_name(Recompute r);

// Bytes per element of a dtype name (bf16, fp16, fp32, fp8, fp64); 0 when unknown.
int dtype_bytes(std::string_view name);

// Parameter counts and model FLOPs are meshrun's one formula (meshrun/model_flops.hpp), shared with
// meshrun-train's MFU and meshrun-gpu-check.
using meshrun::active_matmul_params_per_layer;
using meshrun::count_params;
using meshrun::fwd_attention_flops_per_token_layer;
using meshrun::fwd_head_flops_per_token;
using meshrun::fwd_matmul_flops_per_token_layer;
using meshrun::model_flops_per_token;
using meshrun::ParamCount;

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
