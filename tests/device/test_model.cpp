// The single-device model over the CPU backend: whole-model gradient check in fp64, fp32 vs fp64, and
// training that lowers the loss. These are the twin runs the CUDA backend is compared with.
#include <catch2/catch.hpp>
#include <cmath>
#include <vector>

#include "gradcheck.hpp"
#include "meshrun/device/check.hpp"
#include "meshrun/device/model.hpp"

using namespace meshrun::device;
using meshrun::kernels::test::random_vec;
using meshrun::kernels::test::rel_error;

namespace {
// Small enough for central differences over every parameter; GQA (4 query heads on 2 KV heads).
ModelConfig micro() { return ModelConfig{11, 8, 2, 4, 2, 12, 5, 2}; }

// ∂loss/∂p for every parameter by central differences (h = 1e-6, fp64).
std::vector<double> numeric_grads(Model& m, const std::vector<std::int32_t>& tok, std::vector<double> p) {
  std::vector<double> g(p.size());
  const double h = 1e-6;
  for (std::size_t i = 0; i < p.size(); ++i) {
    const double x = p[i];
    p[i] = x + h;
    m.set_params(p);
    const double up = m.forward(tok.data());
    p[i] = x - h;
    m.set_params(p);
    const double down = m.forward(tok.data());
    p[i] = x;
    g[i] = (up - down) / (2 * h);
  }
  m.set_params(p);
  return g;
}
}  // namespace

TEST_CASE("model: sizes and the FLOP formula", "[model]") {
  const ModelConfig t = tiny_model();   // worked by hand in docs/gpu.md
  CHECK(matmul_param_count(t) == 770048);
  CHECK(param_count(t) == 803968);
  CHECK(train_flops_per_step(t) == 6.0 * 770048 * 256 + 6.0 * 4 * 4 * 64 * 64 * 4 * 32);
  const ModelConfig big = CheckOptions{}.perf_model;
  CHECK(param_count(big) > 1'000'000'000);
  CHECK(param_count(big) < 1'200'000'000);
  CHECK(ModelConfig{11, 8, 2, 3, 1, 12, 5, 2}.problem() == "hidden must be a multiple of heads");
  CHECK(ModelConfig{11, 8, 2, 4, 3, 12, 5, 2}.problem() == "heads must be a multiple of kv_heads");
  CHECK(ModelConfig{11, 12, 2, 4, 2, 12, 5, 2}.problem().find("even") != std::string::npos);
  auto be = make_cpu_backend("fp32");
  CHECK_THROWS_WITH(Model(*be, ModelConfig{11, 8, 0, 4, 2, 12, 5, 2}, 1), Catch::Contains("positive"));
}

TEST_CASE("model: whole-model gradients equal central differences (fp64)", "[model]") {
  auto be = make_cpu_backend("fp64");
  const ModelConfig c = micro();
  Model m(*be, c, 5);
  std::vector<double> p = random_vec(static_cast<std::size_t>(m.size()), 9, -0.5, 0.5);
  m.set_params(p);
  const std::vector<std::int32_t> tok = synthetic_batch(c, 0, 3);
  m.forward_backward(tok.data());
  const std::vector<double> analytic = m.grads();
  const std::vector<double> numeric = numeric_grads(m, tok, p);
  CHECK(rel_error(analytic, numeric) <= 1e-6);

  // Negative: the same metric rejects a gradient with one element off by 0.1% of the gradient's norm.
  double norm = 0;
  for (double x : analytic) norm += x * x;
  std::vector<double> bad = analytic;
  bad[bad.size() / 2] += 1e-3 * std::sqrt(norm);
  CHECK(rel_error(bad, numeric) > 1e-6);
}

TEST_CASE("model: token ids outside the vocabulary are refused", "[model]") {
  auto be = make_cpu_backend("fp32");
  const ModelConfig c = micro();
  Model m(*be, c, 1);
  std::vector<std::int32_t> tok = synthetic_batch(c, 0, 1);
  tok[3] = static_cast<std::int32_t>(c.vocab);
  CHECK_THROWS_WITH(m.forward(tok.data()), Catch::Contains("outside the vocabulary"));
}

TEST_CASE("model: fp32 twin follows the fp64 run, and training lowers the loss", "[model]") {
  ModelConfig c = tiny_model();
  c.layers = 2;
  c.seq = 32;
  auto f32 = make_cpu_backend("fp32");
  auto f64 = make_cpu_backend("fp64");
  const std::vector<double> a = train_losses(*f32, c, 12), b = train_losses(*f64, c, 12);
  for (int s = 0; s < 3; ++s) CHECK(std::abs(a[s] - b[s]) <= 1e-5 * b[s]);
  CHECK(std::abs(a[0] - std::log(256.0)) < 0.1);   // near-uniform prediction at the start
  CHECK(a[11] < a[0] - 0.5);
  // The same run twice gives the same bits (the twin is deterministic).
  CHECK(train_losses(*f32, c, 2) == std::vector<double>(a.begin(), a.begin() + 2));
}
