// Parameter table, layout-independent initialization, learning-rate schedule, fixed-order reductions.
#include <catch2/catch.hpp>

#include <cmath>
#include <filesystem>
#include <stdexcept>
#include <vector>

#include "fixture.hpp"
#include "meshrun/device/bf16.hpp"
#include "meshrun/train/comm_names.hpp"
#include "meshrun/train/data/data.hpp"
#include "meshrun/train/model/params.hpp"
#include "meshrun/train/run/trainer.hpp"
#include "meshrun/train/parallel/zero.hpp"

using namespace meshrun;
using namespace meshrun::train;

TEST_CASE("parameter table uses Hugging Face Llama names and shapes", "[trainer]") {
  ModelSpec m;
  m.layers = 2; m.hidden = 16; m.heads = 4; m.kv_heads = 2; m.ffn_hidden = 24; m.vocab = 32;
  const ParamTable t = build_param_table(m, 1, 0);
  REQUIRE(t.units.size() == 4);
  CHECK(t.units[0].tensors[0].name == "model.embed_tokens.weight");
  CHECK(t.units[0].tensors[0].shape() == std::vector<std::int64_t>{32, 16});
  const auto& l1 = t.units[2].tensors;
  CHECK(l1[kK].name == "model.layers.1.self_attn.k_proj.weight");
  CHECK(l1[kK].shape() == std::vector<std::int64_t>{8, 16});  // kv_heads · head_dim
  CHECK(l1[kDown].shape() == std::vector<std::int64_t>{16, 24});
  CHECK(l1[kLn2].shape() == std::vector<std::int64_t>{16});
  CHECK(t.units[3].tensors[1].name == "lm_head.weight");
  // 2·(16·32) + 16 + 2·(2·16 + 16·16·2 + 8·16·2 + 3·24·16)
  CHECK(t.global_size() == 2 * 16 * 32 + 16 + 2 * (2 * 16 + 2 * 256 + 2 * 128 + 3 * 384));
}

TEST_CASE("a tensor-parallel shard initializes to exactly the serial values", "[trainer]") {
  ModelSpec m;
  m.layers = 1; m.hidden = 16; m.heads = 4; m.kv_heads = 2; m.ffn_hidden = 24; m.vocab = 32;
  const ParamTable full = build_param_table(m, 1, 0);
  for (int rank = 0; rank < 2; ++rank) {
    const ParamTable shard = build_param_table(m, 2, rank);
    for (std::size_t u = 0; u < full.units.size(); ++u) {
      std::vector<float> a(full.units[u].size), b(shard.units[u].size);
      init_unit(a.data(), full.units[u], 42, m.layers);
      init_unit(b.data(), shard.units[u], 42, m.layers);
      for (std::size_t k = 0; k < full.units[u].tensors.size(); ++k) {
        const TensorSlot& tf = full.units[u].tensors[k];
        const TensorSlot& ts = shard.units[u].tensors[k];
        for (std::int64_t i = 0; i < ts.numel(); ++i) {
          const std::int64_t g = ts.global_index(i);  // same as tf's index g: tf is unsplit
          REQUIRE(b[ts.offset + i] == a[tf.offset + g]);
          // init_unit's per-tensor loop gives init_value's definition of every element.
          REQUIRE(b[ts.offset + i] == static_cast<float>(init_value(42, ts.name, g, m.layers)));
        }
      }
    }
  }
  // And a different seed or name gives different values (the hash really is keyed by them).
  CHECK(init_value(1, "model.layers.0.mlp.up_proj.weight", 5, 1) != init_value(2, "model.layers.0.mlp.up_proj.weight", 5, 1));
  CHECK(init_value(1, "model.layers.0.mlp.up_proj.weight", 5, 1) != init_value(1, "model.layers.0.mlp.gate_proj.weight", 5, 1));
  CHECK(init_value(1, "model.norm.weight", 3, 1) == 1.0);
}

TEST_CASE("initial weights have the intended spread", "[trainer]") {
  double s = 0, s2 = 0;
  const int n = 20000;
  for (int i = 0; i < n; ++i) {
    const double v = init_value(9, "model.layers.0.mlp.up_proj.weight", i, 4);
    s += v;
    s2 += v * v;
  }
  CHECK(std::abs(s / n) < 0.001);
  CHECK(std::sqrt(s2 / n) == Approx(0.02).epsilon(0.03));
  double o2 = 0;
  for (int i = 0; i < n; ++i) o2 += std::pow(init_value(9, "model.layers.0.self_attn.o_proj.weight", i, 4), 2);
  CHECK(std::sqrt(o2 / n) == Approx(0.02 / std::sqrt(8.0)).epsilon(0.03));
}

TEST_CASE("tensor parallelism that does not divide the model is refused with a clear line", "[trainer]") {
  ModelSpec m;
  m.hidden = 16; m.heads = 4; m.kv_heads = 2; m.ffn_hidden = 24; m.vocab = 30;
  CHECK_THROWS_WITH(build_param_table(m, 4, 0), Catch::Contains("kv_heads"));
  m.kv_heads = 4;
  CHECK_THROWS_WITH(build_param_table(m, 4, 0), Catch::Contains("vocab"));
}

TEST_CASE("learning rate: linear warmup then cosine to min_lr", "[trainer]") {
  TrainingSpec t;
  t.lr = 1.0; t.min_lr = 0.1; t.warmup_steps = 4; t.steps = 14;
  CHECK(lr_at(t, 0) == Approx(0.25));
  CHECK(lr_at(t, 3) == Approx(1.0));
  CHECK(lr_at(t, 4) == Approx(1.0));
  CHECK(lr_at(t, 13) == Approx(0.1));
  CHECK(lr_at(t, 9) < 1.0);
  CHECK(lr_at(t, 9) > 0.1);
  CHECK(lr_at(t, 8) > lr_at(t, 9));
}

TEST_CASE("learning rate: training.lr_decay_steps is the schedule's horizon, not steps", "[trainer]") {
  TrainingSpec planned, extended, longer;
  planned.lr = extended.lr = longer.lr = 1.0;
  planned.min_lr = extended.min_lr = longer.min_lr = 0.1;
  planned.warmup_steps = extended.warmup_steps = longer.warmup_steps = 4;
  planned.steps = 14;                                   // lr_decay_steps unset: the horizon is steps
  extended.steps = 40, extended.lr_decay_steps = 14;    // the same run extended to 40 steps
  longer.steps = 40;                                    // a 40-step schedule
  CHECK(planned.decay_horizon() == 14);
  CHECK(extended.decay_horizon() == 14);
  for (int s = 0; s < 14; ++s) CHECK(lr_at(extended, s) == lr_at(planned, s));  // bit for bit
  for (int s = 13; s < 40; ++s) CHECK(lr_at(extended, s) == 0.1);               // min_lr past the horizon
  CHECK(lr_at(longer, 9) != lr_at(planned, 9));  // control: another horizon is another schedule
}

TEST_CASE("grad_norm is reported unrounded (fp64: sqrt of the gradients' sum of squares) and clipping uses its fp32 rounding",
          "[trainer]") {
  const std::string dir = std::filesystem::temp_directory_path().string() + "/meshrun-test-gradnorm";
  JobConfig cfg = test::small_config(test::make_token_file(dir, 64));
  cfg.training.dtype = "fp64";
  const TokenFile file(cfg.data.path, cfg.data.token_dtype, cfg.model.vocab, cfg.training.seq_len, cfg.training.global_batch_size);
  const BatchSchedule sched(file, cfg.training.seq_len, cfg.training.global_batch_size, cfg.data.shuffle, cfg.training.seed);
  const RankGrid grid(Layout{});
  Groups g = make_local_groups();
  Trainer<double> t(cfg, grid, 0, g);
  t.init_params();
  for (int s = 0; s < 3; ++s) {
    const StepStats st = t.step(s, sched);
    double sumsq = 0;  // the reduced gradients, recomputed here tensor by tensor
    for (const auto& [name, v] : t.gather_grads())
      for (double x : v) sumsq += x * x;
    const double want = std::sqrt(sumsq), fp32_rounded = static_cast<float>(st.grad_norm);
    INFO("step " << s + 1 << ": grad_norm " << st.grad_norm << ", recomputed " << want);
    CHECK(std::abs(st.grad_norm - want) <= 1e-14 * want);  // summation order only
    // The old fp32-rounded report would fail the bound above (rounding to fp32 moves it by up to 6e-8).
    CHECK(st.grad_norm != fp32_rounded);
    CHECK(std::abs(fp32_rounded - want) > 1e-14 * want);
  }
  std::filesystem::remove(cfg.data.path);
}

TEST_CASE("loss is normalized by the global number of target tokens", "[trainer]") {
  TrainingSpec t;
  t.global_batch_size = 12; t.seq_len = 32;
  CHECK(loss_normalizer(t) == 1.0 / 384.0);
}

TEST_CASE("bf16 reductions sum in float in block order and round once", "[trainer][comm]") {
  using device::bf16_from_float;
  using device::float_from_bf16;
  // 1 + 2^-8 + 2^-8: in float 1.0078125, which bf16 holds exactly; rounding after each addition would
  // give 1 (1 + 2^-8 is a tie that rounds to even), so one rounding at the end is what this checks.
  const std::uint16_t blocks[3] = {bf16_from_float(1.0f), bf16_from_float(0.00390625f), bf16_from_float(0.00390625f)};
  std::uint16_t out = 0;
  reduce_blocks(&out, blocks, 3, 1, DType::bf16, ReduceOp::sum);
  CHECK(float_from_bf16(out) == 1.0078125f);
  const std::uint16_t mx[3] = {bf16_from_float(-3.0f), bf16_from_float(2.5f), bf16_from_float(1.0f)};
  reduce_blocks(&out, mx, 3, 1, DType::bf16, ReduceOp::max);
  CHECK(float_from_bf16(out) == 2.5f);
}

TEST_CASE("reductions are fixed-order: ((x0 + x1) + x2)", "[trainer][comm]") {
  // In float, (1 + 1e8) − 1e8 = 0 but 1 + (1e8 − 1e8) = 1: the block order must be followed exactly.
  const float blocks[3] = {1.0f, 1e8f, -1e8f};
  float out = -1;
  reduce_blocks(&out, blocks, 3, 1, DType::f32, ReduceOp::sum);
  CHECK(out == 0.0f);
  const double mx[3] = {1.0, 5.0, -2.0};
  double m = 0;
  reduce_blocks(&m, mx, 3, 1, DType::f64, ReduceOp::max);
  CHECK(m == 5.0);
  LocalComm c;
  float x[2] = {1, 2}, y[2] = {0, 0};
  c.all_gather(x, y, 2);
  CHECK(y[1] == 2);
  CHECK_THROWS(c.send(host_buf(x, 1), 0, 0));
}

TEST_CASE("MoE parameter table uses the Hugging Face Mixtral names and shapes", "[trainer][moe]") {
  ModelSpec m;
  m.layers = 2; m.hidden = 16; m.heads = 4; m.kv_heads = 2; m.ffn_hidden = 24; m.vocab = 32;
  m.experts = 3; m.top_k = 2; m.moe_ffn_hidden = 20;
  const ParamTable t = build_param_table(m, 1, 0);
  // Every tensor of the file in table order: name and global shape, as a released Mixtral writes them.
  std::vector<std::string> got;
  for (const Unit& u : t.units)
    for (const TensorSlot& s : u.tensors) {
      std::string line = s.name + " [";
      for (std::size_t i = 0; i < s.shape().size(); ++i) line += (i ? ", " : "") + std::to_string(s.shape()[i]);
      got.push_back(line + "]");
    }
  std::vector<std::string> want{"model.embed_tokens.weight [32, 16]"};
  for (int l = 0; l < 2; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    for (const char* x : {"input_layernorm.weight [16]", "self_attn.q_proj.weight [16, 16]", "self_attn.k_proj.weight [8, 16]",
                          "self_attn.v_proj.weight [8, 16]", "self_attn.o_proj.weight [16, 16]",
                          "post_attention_layernorm.weight [16]", "block_sparse_moe.gate.weight [3, 16]"})
      want.push_back(p + x);
  }
  want.push_back("model.norm.weight [16]");
  want.push_back("lm_head.weight [32, 16]");
  for (int l = 0; l < 2; ++l)
    for (int j = 0; j < 3; ++j) {
      const std::string p = "model.layers." + std::to_string(l) + ".block_sparse_moe.experts." + std::to_string(j) + ".";
      want.push_back(p + "w1.weight [20, 16]");
      want.push_back(p + "w3.weight [20, 16]");
      want.push_back(p + "w2.weight [16, 20]");
    }
  CHECK(got == want);
  CHECK(t.expert_unit(1, 2) == static_cast<int>(t.units.size()) - 1);
  CHECK(t.is_expert_unit(t.expert_unit(0, 0)));
  CHECK(!t.is_expert_unit(t.head_unit()));
  CHECK(t.expert_layer(t.expert_unit(1, 0)) == 1);
  // ETP = TP: expert rows (w1, w3) and columns (w2) split like the dense MLP's.
  const ParamTable t2 = build_param_table(m, 2, 1);
  const auto& e = t2.units[t2.expert_unit(0, 1)].tensors;
  CHECK(e[kW1].local_rows == 10);
  CHECK(e[kW1].row0 == 10);
  CHECK(e[kW2].local_cols == 10);
  CHECK(e[kW2].col0 == 10);
  CHECK(t2.global_size() == t.global_size());
}

TEST_CASE("a unit's early gradient reduction refuses a micro-batch more than announced", "[trainer]") {
  ModelSpec m;
  m.layers = 1; m.hidden = 16; m.heads = 4; m.kv_heads = 2; m.ffn_hidden = 24; m.vocab = 32;
  const ParamTable t = build_param_table(m, 1, 0);
  LocalComm dp;
  const auto be = device::make_cpu_backend("fp32");
  for (int stage : {0, 1}) {
    ParamStore store(t, stage, dp, *be);
    store.zero_grads(2);  // two micro-batches: the reduction starts after the second
    const float one = 1.f;
    for (int mb = 0; mb < 2; ++mb) {
      be->upload(store.grad_begin(0).at(0, 1), &one);
      store.grad_end(0);
    }
    store.grad_begin(0);
    CHECK_THROWS_AS(store.grad_end(0), std::logic_error);
    store.reduce_grads();
    CHECK(store.read_grad_shard<float>(0)[0] == 2.f);  // both micro-batches, once each
    store.zero_grads(2);  // a new step accepts them again
    store.grad_begin(0);
    CHECK_NOTHROW(store.grad_end(0));
  }
}
