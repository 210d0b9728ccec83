// Model arithmetic: parameter counts, activation bytes, FLOPs (llama3-405b.md §2, §4, §7).
#include <catch2/catch.hpp>

#include "meshrun/planner_model.hpp"
#include "reference_models.hpp"

using namespace meshrun::planner;
using meshrun::ModelSpec;

TEST_CASE("Llama 3 405B has 405,853,388,800 parameters with the 128,256 vocabulary", "[planner][params]") {
  ModelSpec m = testing::llama3_405b();
  ParamCount p = count_params(m);
  CHECK(p.attention == 570425344);
  CHECK(p.mlp == 2617245696);
  CHECK(p.norms == 32768);
  CHECK(p.per_layer() == 3187703808);
  CHECK(p.embedding + p.head == 4202692608);
  CHECK(p.total(m.layers) == 405853388800);

  m.vocab = 128000;  // the paper's rounded vocabulary gives a different count
  CHECK(count_params(m).total(m.layers) != 405853388800);
  m = testing::llama3_405b();
  m.tied_embeddings = true;  // one V·h matrix fewer
  CHECK(count_params(m).total(m.layers) == 405853388800 - int64_t(128256) * 16384);
}

TEST_CASE("MoE parameters: all experts stored, top_k active", "[planner][params]") {
  ModelSpec m = testing::mixtral_8x7b();
  ParamCount p = count_params(m);
  CHECK(p.expert == 3 * int64_t(4096) * 14336);
  CHECK(p.mlp == 8 * p.expert);
  CHECK(p.router == 4096 * 8);
  // Mixtral 8x7B: 46.7e9 parameters in total, about 12.9e9 active per token.
  CHECK(p.total(m.layers) == Approx(46.70e9).epsilon(0.01));
  const double active = double(active_matmul_params_per_layer(m)) * m.layers + double(p.embedding + p.head);
  CHECK(active == Approx(12.9e9).epsilon(0.02));
}

TEST_CASE("one layer's input for a 131,072-token sequence of 405B is 4.29 GB, 541 GB over 126 layers",
          "[planner][activations]") {
  const ModelSpec m = testing::llama3_405b();
  const double one = layer_input_bytes(131072, m.hidden, dtype_bytes("bf16"));
  CHECK(one == 4294967296.0);  // exactly 4 GiB
  CHECK(one / 1e9 == Approx(4.29).margin(0.005));
  CHECK(one * m.layers / 1e9 == Approx(541.17).margin(0.01));

  // Full recomputation keeps exactly that input per layer; CP divides it, SP shards it over TP.
  ActivationShape s{131072, 1, 1, false, 1, Recompute::full, 2};
  CHECK(activation_bytes_per_layer(m, s) == one);
  s.cp = 16;
  CHECK(activation_bytes_per_layer(m, s) == one / 16);
  s.tp = 8;
  CHECK(activation_bytes_per_layer(m, s) == one / 16);  // without SP the input is replicated over TP
  s.sequence_parallel = true;
  CHECK(activation_bytes_per_layer(m, s) == one / 128);
}

TEST_CASE("GPT-style block reproduces Korthikanti et al. Table 2 without dropout", "[planner][activations]") {
  // MHA, GeLU MLP of 4h. Korthikanti: sbh(34 + 5as/h) with 16-bit activations and 1-byte dropout masks.
  // With fused attention and no dropout: the two sbh dropout masks go, and the 5as²b score term becomes the
  // fp32 log-sum-exp (4·a bytes per token).
  ModelSpec m;
  m.hidden = 1024, m.heads = 16, m.kv_heads = 16, m.ffn_hidden = 4096, m.mlp = "gelu", m.layers = 1, m.vocab = 1000;
  const double s = 2048, b = 2, h = 1024, a = 16;
  ActivationShape shape{2048, 2, 1, false, 1, Recompute::none, 2};
  CHECK(activation_bytes_per_layer(m, shape) == s * b * h * (34 - 2) + 4 * a * s * b);

  for (int t : {2, 4, 8}) {
    shape.tp = t;
    shape.sequence_parallel = false;  // Table 2 "tensor parallel": sbh(10 + 24/t), minus the 2 masks
    CHECK(activation_bytes_per_layer(m, shape) == Approx(s * b * h * (10 - 2 + 24.0 / t) + 4 * a * s * b / t));
    shape.sequence_parallel = true;   // "tensor + sequence parallel": everything divided by t
    CHECK(activation_bytes_per_layer(m, shape) == Approx((s * b * h * 32 + 4 * a * s * b) / t));
  }
}

TEST_CASE("recomputation and parallelism only shrink activations", "[planner][activations]") {
  const ModelSpec m = testing::llama3_405b();
  ActivationShape s{8192, 1, 8, true, 1, Recompute::none, 2};
  const double none = activation_bytes_per_layer(m, s);
  s.recompute = Recompute::selective;
  const double selective = activation_bytes_per_layer(m, s);
  s.recompute = Recompute::full;
  const double full = activation_bytes_per_layer(m, s);
  CHECK(full < selective);
  CHECK(selective < none);
  // Llama 3 block, per token and layer: 12h + 4·kv_dim + 6F bytes + 4 bytes per head, sharded over tp (SP on).
  CHECK(none == Approx(8192.0 * (12.0 * 16384 + 4.0 * 1024 + 6.0 * 53248 + 4.0 * 128) / 8));
  s.recompute = Recompute::none;
  s.micro_batch = 2;
  CHECK(activation_bytes_per_layer(m, s) == Approx(2 * none));
}

TEST_CASE("FLOPs per token: 6N for the matmuls plus causal attention", "[planner][flops]") {
  const ModelSpec m = testing::llama3_405b();
  const ParamCount p = count_params(m);
  const double matmul = 6.0 * (double(p.per_layer() - p.norms) * m.layers + double(p.head));
  const double attention = 6.0 * 8192 * 16384 * m.layers;  // 3 × 2 × (QKᵀ + AV) × s/2 average keys
  CHECK(model_flops_per_token(m, 8192) == Approx(matmul + attention));
  CHECK(model_flops_per_token(m, 131072) > model_flops_per_token(m, 8192));
}

TEST_CASE("names: dtypes and recompute modes", "[planner][names]") {
  CHECK(dtype_bytes("bf16") == 2);
  CHECK(dtype_bytes("fp32") == 4);
  CHECK(dtype_bytes("fp8") == 1);
  CHECK(dtype_bytes("int4") == 0);
  CHECK(parse_recompute("selective") == Recompute::selective);
  CHECK_FALSE(parse_recompute("partial").has_value());
  CHECK(std::string(recompute_name(Recompute::full)) == "full");
}
