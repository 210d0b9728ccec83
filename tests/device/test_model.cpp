// The model sizes of meshrun-gpu-check: parameter counts and the FLOP formula MFU is computed from. (Its
// training runs go through the trainer: tests/trainer/test_single_device.cpp.)
#include <catch2/catch.hpp>

#include "meshrun/device/check.hpp"
#include "meshrun/device/model_config.hpp"

using namespace meshrun::device;

TEST_CASE("model: sizes and the FLOP formula", "[model]") {
  const ModelConfig t = tiny_model();   // worked by hand in docs/gpu.md; templates/tiny.toml's model
  CHECK(matmul_param_count(t) == 770048);
  CHECK(param_count(t) == 803968);
  CHECK(train_flops_per_step(t) == 6.0 * 770048 * 256 + 6.0 * 4 * 4 * 64 * 64 * 4 * 32);
  const ModelConfig big = CheckOptions{}.perf_model;
  CHECK(param_count(big) > 1'000'000'000);
  CHECK(param_count(big) < 1'200'000'000);
  CHECK(ModelConfig{11, 8, 2, 3, 1, 12, 5, 2}.problem() == "hidden must be a multiple of heads");
  CHECK(ModelConfig{11, 8, 2, 4, 3, 12, 5, 2}.problem() == "heads must be a multiple of kv_heads");
  CHECK(ModelConfig{11, 12, 2, 4, 2, 12, 5, 2}.problem().find("even") != std::string::npos);
  CHECK(ModelConfig{11, 8, 0, 4, 2, 12, 5, 2}.problem().find("positive") != std::string::npos);
}
