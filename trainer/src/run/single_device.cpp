#include "meshrun/train/run/single_device.hpp"

#include "meshrun/device/rng.hpp"

#include <unistd.h>

#include <cstdio>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <stdexcept>

namespace meshrun::train {

JobConfig single_device_config(const device::ModelConfig& c, int steps, double lr, std::uint64_t seed) {
  if (const std::string p = c.problem(); !p.empty()) throw std::invalid_argument("model: " + p);
  JobConfig cfg;
  cfg.model.name = "device-check";
  cfg.model.vocab = c.vocab;
  cfg.model.hidden = static_cast<int>(c.hidden);
  cfg.model.layers = static_cast<int>(c.layers);
  cfg.model.heads = static_cast<int>(c.heads);
  cfg.model.kv_heads = static_cast<int>(c.kv_heads);
  cfg.model.ffn_hidden = static_cast<int>(c.ffn);
  cfg.model.rope_theta = c.rope_theta;
  cfg.model.norm_eps = c.norm_eps;
  cfg.training.seq_len = static_cast<int>(c.seq);
  cfg.training.global_batch_size = static_cast<int>(c.batch);
  cfg.training.micro_batch_size = static_cast<int>(c.batch);
  cfg.training.steps = steps;
  cfg.training.lr = cfg.training.min_lr = lr;
  cfg.training.warmup_steps = 0;
  cfg.training.weight_decay = 0.1;
  cfg.training.grad_clip = 1.0;
  cfg.training.seed = seed;
  cfg.data.token_dtype = c.vocab <= 65536 ? "uint16" : "uint32";
  return cfg;
}

namespace {
using Rng = device::SplitMix64;

// Enough tokens for every step's batch (windows advance by seq), written little-endian in the width
// the config names.
std::string write_tokens(const JobConfig& cfg) {
  char path[] = "/tmp/meshrun-single-device-XXXXXX";
  const int fd = mkstemp(path);
  if (fd < 0) throw std::runtime_error(std::string("cannot create a token file in /tmp: ") + std::strerror(errno));
  const std::int64_t n = static_cast<std::int64_t>(cfg.training.steps + 1) * cfg.training.global_batch_size *
                             cfg.training.seq_len + 1;
  const bool wide = cfg.data.token_dtype == "uint32";
  std::vector<unsigned char> bytes(static_cast<std::size_t>(n) * (wide ? 4 : 2));
  Rng rng{cfg.training.seed * 1000003u + 11};
  std::int64_t cur = rng.below(cfg.model.vocab);
  for (std::int64_t i = 0; i < n; ++i) {
    for (int b = 0; b < (wide ? 4 : 2); ++b)
      bytes[static_cast<std::size_t>(i * (wide ? 4 : 2) + b)] = static_cast<unsigned char>(cur >> (8 * b));
    cur = rng.uniform() < 0.1 ? rng.below(cfg.model.vocab) : (5 * cur + 17) % cfg.model.vocab;
  }
  std::size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t w = write(fd, bytes.data() + done, bytes.size() - done);
    if (w <= 0) {
      close(fd);
      unlink(path);
      throw std::runtime_error(std::string("cannot write the token file ") + path);
    }
    done += static_cast<std::size_t>(w);
  }
  close(fd);
  return path;
}
}  // namespace

SingleDeviceRun::SingleDeviceRun(const JobConfig& cfg, std::unique_ptr<device::Backend> backend)
    : token_path_(write_tokens(cfg)), groups_(make_local_groups()) {
  try {
    grid_ = std::make_unique<RankGrid>(Layout{});
    file_ = std::make_unique<TokenFile>(token_path_, cfg.data.token_dtype, cfg.model.vocab, cfg.training.seq_len,
                                        cfg.training.global_batch_size);
    schedule_ = std::make_unique<BatchSchedule>(*file_, cfg.training.seq_len, cfg.training.global_batch_size, false,
                                                cfg.training.seed);
    if (const std::string why = check_train_setup(cfg, grid_->layout()); !why.empty()) throw std::invalid_argument(why);
    trainer_ = std::make_unique<Trainer<float>>(cfg, *grid_, 0, groups_, Trainer<float>::TestFaults{}, std::move(backend));
    trainer_->init_params();
  } catch (...) {
    unlink(token_path_.c_str());
    throw;
  }
}

SingleDeviceRun::~SingleDeviceRun() {
  trainer_.reset();
  schedule_.reset();
  file_.reset();
  unlink(token_path_.c_str());
}

std::vector<double> train_losses(std::unique_ptr<device::Backend> backend, const device::ModelConfig& c, int steps,
                                 std::uint64_t seed) {
  SingleDeviceRun run(single_device_config(c, steps, 1e-3, seed), std::move(backend));
  std::vector<double> losses;
  for (int s = 0; s < steps; ++s) losses.push_back(run.step(s).loss);
  return losses;
}

}  // namespace meshrun::train
