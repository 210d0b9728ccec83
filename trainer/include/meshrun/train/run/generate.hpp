// Sampling from a model through the trainer's own layers (layers.hpp: the embedding, decoder_forward_cached,
// the head) at world 1, on any backend, with a KV cache: the keys and values of every token seen stay in
// the cache, so each new token costs one row through every layer (meshrun-ckpt sample, docs/trainer.md).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "meshrun/device/backend.hpp"
#include "meshrun/job.hpp"

namespace meshrun::train {

struct SampleOptions {
  int max_new_tokens = 64;
  double temperature = 1.0;  // 0: greedy (the argmax, ties to the lower id)
  double top_p = 1.0;        // nucleus: only the most likely tokens whose probabilities reach top_p
  std::uint64_t seed = 0;    // draw i uses the uniform number keyed by (seed, i): reproducible anywhere
};
inline constexpr std::int64_t kMaxSampleContext = 1 << 16;  // prompt + new tokens: bounds the KV cache

// One line naming the bad option and the fix, or "" when the options can run.
std::string check_sample_options(const SampleOptions& o, std::size_t prompt_tokens);

// The next token from one position's logits: the argmax at temperature 0; else softmax(logits / T), cut to the
// top-p nucleus (tokens by falling probability until their sum reaches top_p; at least one), renormalised,
// and drawn with the uniform number of (seed, draw).
std::int32_t pick_token(const std::vector<float>& logits, const SampleOptions& o, std::uint64_t draw);

// A tensor of the model in its global shape (Hugging Face name), as float.
using TensorSource = std::function<std::vector<float>(const std::string& name, const std::vector<std::int64_t>& shape)>;

class Generator {
 public:
  // Every parameter of model m from `weights`, uploaded once; a KV cache for `context` tokens.
  Generator(const ModelSpec& m, std::int64_t context, const TensorSource& weights, std::unique_ptr<device::Backend> backend);
  ~Generator();
  Generator(const Generator&) = delete;
  Generator& operator=(const Generator&) = delete;

  const device::Backend& backend() const;
  std::int64_t length() const;  // tokens in the cache
  void reset();                 // an empty cache
  // Runs `tokens` at positions length(), length()+1, ... through every layer, adding their keys and values to
  // the cache; returns the logits of each of them ([tokens.size(), vocab], row-major).
  std::vector<float> append(const std::vector<std::int32_t>& tokens);
  // The prompt, then up to max_new_tokens tokens drawn with pick_token (draw i for new token i); returns the
  // new tokens. The cache starts empty. on_token (optional) sees each as it is drawn.
  std::vector<std::int32_t> generate(const std::vector<std::int32_t>& prompt, const SampleOptions& o,
                                     const std::function<void(std::int32_t)>& on_token = {});

 private:
  struct Impl;
  std::unique_ptr<Impl> s_;
};

}  // namespace meshrun::train
