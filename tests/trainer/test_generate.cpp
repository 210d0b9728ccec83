// Sampling through the trainer's layers with a KV cache (generate.hpp): greedy decoding equals the argmax of
// a full forward recomputed at every position (dense and MoE), the cached logits equal the recomputed ones,
// seeds reproduce, top-p cuts the distribution where it should, and bad options are refused in one line.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <map>

#include "meshrun/train/model/params.hpp"
#include "meshrun/train/run/generate.hpp"

using namespace meshrun;
using namespace meshrun::train;

namespace {

ModelSpec small_model(int experts) {
  ModelSpec m;
  m.layers = 2;
  m.hidden = 32;
  m.heads = 8;
  m.kv_heads = 4;
  m.ffn_hidden = 48;
  m.vocab = 64;
  m.experts = experts;
  m.top_k = 2;
  m.moe_ffn_hidden = experts > 0 ? 16 : 0;
  return m;
}

// Deterministic weights, 30x initialization's scale so that the logits are peaked (an argmax that a rounding
// difference could flip would make the equality test meaningless).
TensorSource weights(const ModelSpec& m) {
  return [m](const std::string& name, const std::vector<std::int64_t>& shape) {
    const TensorInit ti = tensor_init(11, name, m.layers);
    std::int64_t n = 1;
    for (std::int64_t d : shape) n *= d;
    std::vector<float> v(static_cast<std::size_t>(n));
    for (std::int64_t i = 0; i < n; ++i) v[static_cast<std::size_t>(i)] = static_cast<float>(ti.ones ? 1.0 : 30.0 * init_value(ti, i));
    return v;
  };
}

std::int32_t argmax(const std::vector<float>& row) {
  return static_cast<std::int32_t>(std::max_element(row.begin(), row.end()) - row.begin());
}

std::vector<float> last_row(const std::vector<float>& logits, std::int64_t vocab) {
  return std::vector<float>(logits.end() - vocab, logits.end());
}

// Greedy with the cache, then at every position a full forward of the whole prefix from an empty cache.
void check_greedy_equals_full_forward(int experts) {
  const ModelSpec m = small_model(experts);
  const std::vector<std::int32_t> prompt = {5, 17, 42, 3};
  SampleOptions o;
  o.temperature = 0;
  o.max_new_tokens = 24;
  Generator cached(m, 64, weights(m), device::make_cpu_backend("fp32"));
  const std::vector<std::int32_t> out = cached.generate(prompt, o);
  REQUIRE(out.size() == 24);
  Generator full(m, 64, weights(m), device::make_cpu_backend("fp32"));
  // The cached path's logits, step by step, to compare with the recomputed ones.
  cached.reset();
  std::vector<float> step = last_row(cached.append(prompt), m.vocab);
  std::vector<std::int32_t> seq = prompt;
  double worst = 0;
  std::map<std::int32_t, int> distinct;
  for (std::size_t i = 0; i < out.size(); ++i) {
    full.reset();
    const std::vector<float> recomputed = last_row(full.append(seq), m.vocab);
    INFO("new token " << i << " after " << seq.size() << " tokens");
    CHECK(out[i] == argmax(recomputed));
    CHECK(out[i] == argmax(step));
    for (std::size_t k = 0; k < recomputed.size(); ++k)
      worst = std::max(worst, std::fabs(static_cast<double>(recomputed[k]) - step[k]) / (1.0 + std::fabs(recomputed[k])));
    ++distinct[out[i]];
    seq.push_back(out[i]);
    step = last_row(cached.append({out[i]}), m.vocab);
  }
  INFO("largest relative difference between cached and recomputed logits " << worst);
  CHECK(worst < 1e-5);
  CHECK(distinct.size() > 1);  // not a degenerate constant output
  // The check can fail: the full forward of another prefix (the first token dropped) disagrees somewhere.
  int differs = 0;
  std::vector<std::int32_t> shifted(prompt.begin() + 1, prompt.end());
  for (std::size_t i = 0; i < out.size(); ++i) {
    full.reset();
    differs += argmax(last_row(full.append(shifted), m.vocab)) != out[i];
    shifted.push_back(out[i]);
  }
  CHECK(differs > 0);
}

}  // namespace

TEST_CASE("greedy sampling with the KV cache equals the argmax of a full forward at every position (dense)",
          "[trainer][generate]") {
  check_greedy_equals_full_forward(0);
}

TEST_CASE("greedy sampling with the KV cache equals the argmax of a full forward at every position (MoE)",
          "[trainer][generate]") {
  check_greedy_equals_full_forward(4);
}

TEST_CASE("sampling: a seed reproduces, another seed differs, top-p near 0 is greedy", "[trainer][generate]") {
  const ModelSpec m = small_model(0);
  Generator g(m, 64, weights(m), device::make_cpu_backend("fp32"));
  SampleOptions o;
  o.max_new_tokens = 40;
  o.temperature = 3.0;  // flat enough that draws matter
  o.seed = 5;
  const auto a = g.generate({1, 2, 3}, o), b = g.generate({1, 2, 3}, o);
  CHECK(a == b);
  o.seed = 6;
  CHECK(g.generate({1, 2, 3}, o) != a);
  o.top_p = 1e-9;  // the nucleus is the most likely token alone
  SampleOptions greedy = o;
  greedy.temperature = 0;
  CHECK(g.generate({1, 2, 3}, o) == g.generate({1, 2, 3}, greedy));
}

TEST_CASE("pick_token: frequencies follow softmax(logits / T), top-p keeps the nucleus only", "[trainer][generate]") {
  const std::vector<float> logits = {std::log(0.5f), std::log(0.3f), std::log(0.2f)};
  SampleOptions o;
  o.seed = 9;
  const int n = 20000;
  auto frequencies = [&] {
    std::vector<double> f(3, 0);
    for (int i = 0; i < n; ++i) f[static_cast<std::size_t>(pick_token(logits, o, static_cast<std::uint64_t>(i)))] += 1.0 / n;
    return f;
  };
  std::vector<double> f = frequencies();
  CHECK(std::fabs(f[0] - 0.5) < 0.015);
  CHECK(std::fabs(f[1] - 0.3) < 0.015);
  CHECK(std::fabs(f[2] - 0.2) < 0.015);
  o.top_p = 0.6;  // 0.5 < 0.6 <= 0.8: tokens 0 and 1, renormalised to 0.625 / 0.375
  f = frequencies();
  CHECK(f[2] == 0);
  CHECK(std::fabs(f[0] - 0.625) < 0.015);
  o.top_p = 1.0;
  o.temperature = 0;
  CHECK(pick_token(logits, o, 0) == 0);
}

TEST_CASE("sampling options out of range are refused in one line", "[trainer][generate]") {
  SampleOptions o;
  CHECK(check_sample_options(o, 3).empty());
  CHECK_THAT(check_sample_options(o, 0), Catch::Contains("prompt is empty"));
  o.max_new_tokens = 0;
  CHECK_THAT(check_sample_options(o, 3), Catch::Contains("--max-new-tokens"));
  o = {};
  o.temperature = -1;
  CHECK_THAT(check_sample_options(o, 3), Catch::Contains("--temperature"));
  o = {};
  o.top_p = 0;
  CHECK_THAT(check_sample_options(o, 3), Catch::Contains("--top-p"));
  o.top_p = 1.5;
  CHECK_THAT(check_sample_options(o, 3), Catch::Contains("--top-p"));
  o = {};
  o.max_new_tokens = kMaxSampleContext;
  CHECK_THAT(check_sample_options(o, 3), Catch::Contains("exceed"));
  const ModelSpec m = small_model(0);
  Generator g(m, 8, weights(m), device::make_cpu_backend("fp32"));
  CHECK_THROWS_WITH(g.append({70}), Catch::Contains("outside the vocabulary"));
  CHECK_THROWS_WITH(g.append(std::vector<std::int32_t>(9, 1)), Catch::Contains("do not fit"));
}
