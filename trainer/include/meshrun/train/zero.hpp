// Parameter, gradient and optimizer-state storage of one rank, for ZeRO stages 0-3. A rank holds only
// the units of its pipeline stages; each unit is reduced and sharded over its own replica group (dense
// units: the dp_cp group, since context-parallel ranks share weights too; expert units will use the
// expert-data-parallel group).
//
// Every held unit's flat buffer is padded to a multiple of its group's size N; rank r owns elements
// [r·s, (r+1)·s), s = padded/N.
//   stage 0: full params, full grads, full Adam m/v; grads all-reduced.
//   stage 1: full params, full grads, m/v of the shard; grads reduce-scattered, shard updated, params
//            all-gathered.
//   stage 2: as 1, but gradients live only as shards: each micro-batch's unit gradient is
//            reduce-scattered as soon as the unit's backward is done (one unit-sized scratch).
//   stage 3: as 2, and parameters live only as shards: a unit is all-gathered for its forward and again
//            for its backward, and freed after use.
// With one micro-batch per rank all four stages compute identical bits (same fixed-order sums).
#pragma once
#include <cstdint>
#include <vector>

#include "meshrun/kernels/cpu.hpp"
#include "meshrun/train/comm.hpp"
#include "meshrun/train/params.hpp"

namespace meshrun::train {

struct MemoryReport {  // bytes held by this rank
  std::int64_t params = 0, grads = 0, optimizer = 0;
  std::int64_t transient_peak = 0;  // gradient scratch + gathered units (ZeRO-3), at their peak
  std::int64_t total() const { return params + grads + optimizer + transient_peak; }
};

template <class T>
class ParamStore {
 public:
  // groups[u]: the replica group of unit u, or nullptr where this rank does not hold the unit.
  ParamStore(const ParamTable& table, int zero_stage, std::vector<Comm*> groups);
  // Every unit, one group (a single pipeline stage).
  ParamStore(const ParamTable& table, int zero_stage, Comm& dp);

  int stage() const { return stage_; }
  bool holds(int u) const { return groups_[u] != nullptr; }
  Comm& group(int u) const { return *groups_[u]; }
  const ParamTable& table() const { return table_; }

  // Full local parameters of unit u for compute (ZeRO-3 gathers them; release frees them).
  const T* acquire(int u);
  void release(int u);

  // Gradients of one micro-batch: grad_begin returns a zeroed unit-sized buffer, grad_end folds it into
  // the accumulated gradient (stages 2-3: reduce-scatter first).
  T* grad_begin(int u);
  void grad_end(int u);

  void zero_grads();
  // After the last micro-batch: completes each held unit's reduction (stage 0 all-reduce, 1 reduce-scatter).
  void reduce_grads();
  // Σ g² over this rank's shard of unit u, tensors with include[t] only, in tensor order (double).
  double grad_sumsq(int u, const std::vector<bool>& include) const;
  // AdamW on this rank's shard (stage 0: everything); weight decay only on matrices. Then stages 1-2
  // all-gather the parameters.
  void adam_step(kernels::cpu::AdamW hp);

  // Whole-unit access for initialization, checkpoints and tests (collective over dp at stage 3).
  std::vector<T> read_unit(int u);
  void write_unit(int u, const T* full);
  // Reduced gradient of unit u's own shard region (index 0 = element r·s of the unit).
  const T* grad_shard(int u) const;
  std::int64_t shard_len(int u) const { return shard_[u]; }
  // Checkpoints: this rank's ZeRO shard region [shard_begin(u), shard_begin(u) + shard_len(u)) of unit u's
  // parameters and Adam moments (at stage 0 too, so every element is written once per TP block).
  const T* param_region(int u) const;
  const T* exp_avg_region(int u) const;
  const T* exp_avg_sq_region(int u) const;
  // Restores unit u from full local buffers (the unit's unpadded size): parameters as write_unit, the
  // moments as this rank holds them (stage 0 whole, else its shard). No communication.
  void write_state(int u, const T* params, const T* exp_avg, const T* exp_avg_sq);
  std::int64_t shard_begin(int u) const { return static_cast<std::int64_t>(groups_[u]->rank()) * shard_[u]; }

  MemoryReport memory() const;

 private:
  void track(std::int64_t delta_bytes);

  void require_held(int u) const;

  const ParamTable& table_;
  int stage_;
  std::vector<Comm*> groups_;
  std::vector<std::int64_t> padded_, shard_;
  std::vector<std::vector<T>> params_;      // per held unit: full (stage <3) or shard (stage 3); empty if not held
  std::vector<std::vector<T>> gathered_;    // stage 3: gathered units while acquired
  std::vector<std::vector<T>> grads_;       // per unit: full (stage <2) or shard (stage >=2)
  std::vector<std::vector<T>> m_, v_;       // Adam moments: full (stage 0) or shard
  std::vector<T> scratch_;                  // one micro-batch's gradient of one unit
  std::int64_t transient_ = 0, transient_peak_ = 0;
};

}  // namespace meshrun::train
