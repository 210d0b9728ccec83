// Shared pieces of the trainer tests: a small model configuration and a token file made from text
// every Debian machine has.
#pragma once
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "meshrun/job.hpp"

namespace meshrun::train::test {

// Two layers, grouped-query attention (8 query heads over 4 KV heads, so tp = 4 still has whole heads),
// vocab 64. Sizes are tiny so that 50+ layouts × 10 steps run in seconds on 2 cores.
inline JobConfig small_config(const std::string& token_file) {
  JobConfig c;
  c.model.name = "test-llama";
  c.model.layers = 2;
  c.model.hidden = 32;
  c.model.heads = 8;
  c.model.kv_heads = 4;
  c.model.ffn_hidden = 48;
  c.model.vocab = 64;
  c.model.rope_theta = 10000.0;
  c.training.seq_len = 8;
  c.training.global_batch_size = 8;
  c.training.micro_batch_size = 1;
  c.training.steps = 10;
  c.training.lr = 3e-4;  // a realistic peak (the 405B template uses 8e-5)
  c.training.min_lr = 3e-5;
  c.training.warmup_steps = 2;
  c.training.weight_decay = 0.1;
  c.training.grad_clip = 0.5;  // active in the first steps, so clipping is part of what is compared
  c.training.seed = 7;
  c.data.path = token_file;
  c.data.token_dtype = "uint16";
  c.data.shuffle = true;
  return c;
}

// Token file of ids < vocab from a license text (bytes mod vocab), written once per process.
inline std::string make_token_file(const std::string& dir, std::int64_t vocab, std::size_t max_tokens = 20000) {
  std::filesystem::create_directories(dir);
  const std::string path = dir + "/tokens-" + std::to_string(::getpid()) + ".bin";
  std::ifstream is("/usr/share/common-licenses/GPL-3", std::ios::binary);
  std::vector<std::uint16_t> toks;
  char ch;
  while (toks.size() < max_tokens && is.get(ch)) toks.push_back(static_cast<std::uint16_t>(static_cast<unsigned char>(ch) % vocab));
  std::ofstream os(path, std::ios::binary | std::ios::trunc);
  os.write(reinterpret_cast<const char*>(toks.data()), static_cast<std::streamsize>(toks.size() * 2));
  return path;
}

}  // namespace meshrun::train::test
