// The step loop: one optimizer step = a schedule of micro-batches (gradient accumulation) through the
// model, the data-parallel gradient reduction of the ZeRO stage, the global gradient norm and clipping,
// and AdamW with linear warmup + cosine decay.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "meshrun/job.hpp"
#include "meshrun/layout.hpp"
#include "meshrun/rank_map.hpp"
#include "meshrun/train/comm_mpi.hpp"
#include "meshrun/train/data.hpp"
#include "meshrun/train/model.hpp"
#include "meshrun/train/params.hpp"
#include "meshrun/train/zero.hpp"

namespace meshrun::train {

struct StepStats {
  int step = 0;  // 1-based, as printed
  double loss = 0, grad_norm = 0, lr = 0, tokens_per_s = 0, ms = 0;
};

// Learning rate of 0-based step s: linear warmup over warmup_steps, then cosine decay to min_lr at
// the last step.
double lr_at(const TrainingSpec& t, int s);

// The one place the loss is normalized: by the global number of target tokens of a step (every
// position of every sequence has a target; none is ignored).
inline double loss_normalizer(const TrainingSpec& t) {
  return 1.0 / (static_cast<double>(t.global_batch_size) * static_cast<double>(t.seq_len));
}

// Checks the training setup against the layout; returns one "<problem>; <fix>" line or "" if usable.
std::string check_train_setup(const JobConfig& cfg, const Layout& layout);

template <class T>
class Trainer {
 public:
  // rank: this process's rank in `grid`; groups: its communicators (make_mpi_groups).
  Trainer(const JobConfig& cfg, const RankGrid& grid, int rank, const Groups& groups);

  void init_params();                       // layout-independent, from training.seed
  void load(const std::string& path);       // Hugging Face names and shapes; every rank reads the file
  void save(const std::string& path);       // collective; world rank 0 writes
  StepStats step(int s, const BatchSchedule& data);

  // Every tensor in its global shape, on every rank (collective). Order of the parameter table.
  std::vector<std::pair<std::string, std::vector<T>>> gather_params();
  // The reduced (unclipped) gradient of the last step in the same form (collective).
  std::vector<std::pair<std::string, std::vector<T>>> gather_grads();
  const ParamTable& table() const { return table_; }
  ParamStore<T>& store() { return store_; }
  MemoryReport memory() const { return store_.memory(); }
  Model<T>& model() { return model_; }

 private:
  // Per-unit flat local buffers -> every tensor in its global shape (collective over tp).
  std::vector<std::pair<std::string, std::vector<T>>> assemble(const std::vector<std::vector<T>>& units);
  JobConfig cfg_;
  Coord coord_;
  const Groups& groups_;
  Comm& tp_;
  Comm& dp_;
  ParamTable table_;
  ParamStore<T> store_;
  Model<T> model_;
  std::vector<std::int32_t> ids_, targets_;
};

}  // namespace meshrun::train
