// The trainer at world 1 on any backend: one process, local (size-1) groups, no MPI. meshrun-gpu-check
// trains its tiny model (against the CPU twin) and its throughput model through this, so the CUDA
// backend runs exactly the layers, stage, store and optimizer that meshrun-train runs.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "meshrun/device/backend.hpp"
#include "meshrun/device/model_config.hpp"
#include "meshrun/job.hpp"
#include "meshrun/train/run/trainer.hpp"

namespace meshrun::train {

// A model of the device check as a job: one rank, one micro-batch of `batch` sequences per step, AdamW
// (lr constant, weight decay 0.1, clip 1), no warm-up.
JobConfig single_device_config(const device::ModelConfig& c, int steps, double lr, std::uint64_t seed);

// One process training `cfg` on `backend` over a token file this object writes (a noisy affine
// recurrence, learnable: next = (5·cur + 17) mod vocab, a random id 10% of the time) and removes again.
class SingleDeviceRun {
 public:
  SingleDeviceRun(const JobConfig& cfg, std::unique_ptr<device::Backend> backend);
  ~SingleDeviceRun();
  SingleDeviceRun(const SingleDeviceRun&) = delete;
  SingleDeviceRun& operator=(const SingleDeviceRun&) = delete;
  StepStats step(int s) { return trainer_->step(s, *schedule_); }
  Trainer<float>& trainer() { return *trainer_; }

 private:
  std::string token_path_;
  Groups groups_;
  std::unique_ptr<RankGrid> grid_;
  std::unique_ptr<TokenFile> file_;
  std::unique_ptr<BatchSchedule> schedule_;
  std::unique_ptr<Trainer<float>> trainer_;
};

// The losses of `steps` steps of model `c` on `backend` from `seed` (lr 1e-3).
std::vector<double> train_losses(std::unique_ptr<device::Backend> backend, const device::ModelConfig& c, int steps,
                                 std::uint64_t seed = 1);

}  // namespace meshrun::train
