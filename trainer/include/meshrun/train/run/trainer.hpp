// The step loop: one optimizer step = this rank's pipeline action list (meshrun/schedule.hpp) run over
// the stages it holds (gradient accumulation over the step's micro-batches), each unit's gradient
// reduction over its replica group at the ZeRO stage, the global gradient norm over every unit of every
// stage and clipping, and AdamW with linear warmup + cosine decay.
//
// Batch geometry (sequences per data-parallel rank, micro-batches, rows) comes from mesh's
// batch_geometry; the pipeline chunks from mesh's chunk_layers, chunk c on pipeline rank c mod pp.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <functional>
#include <memory>

#include "meshrun/geometry.hpp"
#include "meshrun/job.hpp"
#include "meshrun/layout.hpp"
#include "meshrun/rank_map.hpp"
#include "meshrun/schedule.hpp"
#include "meshrun/train/comm_names.hpp"
#include "meshrun/train/data/data.hpp"
#include "meshrun/train/model/layers.hpp"
#include "meshrun/train/model/params.hpp"
#include "meshrun/train/parallel/pipeline.hpp"
#include "meshrun/train/parallel/stage.hpp"
#include "meshrun/train/parallel/zero.hpp"

namespace meshrun::train {

struct StepStats {
  int step = 0;  // 1-based, as printed
  double loss = 0, grad_norm = 0, lr = 0, tokens_per_s = 0, ms = 0;
  double eval_loss = -1;  // the validation loss after this step (Trainer::evaluate), < 0 when not evaluated
  PipelineTiming pipeline;  // this rank's action list: time blocked in receives, in F/B/W
  double comm_exposed_ms = 0;  // blocked on data-parallel / ZeRO communication (ParamStore, zero.hpp)
  // Mixture of experts (zeros for a dense model): the load-balancing loss (already times
  // router_aux_loss_coef, averaged over the step's micro-batches; `loss` stays the language-model loss),
  // the assignments per (layer, expert) over the step (max and mean), and the token bytes this rank sent
  // to other EP ranks.
  double aux_loss = 0, expert_tokens_max = 0, expert_tokens_mean = 0;
  std::int64_t a2a_bytes = 0;
  std::vector<double> expert_tokens;  // [layers · E]: the step's assignments per (layer, expert), all ranks
  // The step's expert rows on the busiest EP rank over a balanced rank's, summed over layers (experts
  // r·local .. r·local + local − 1 on EP rank r): what the planner's planner.expert_imbalance charges.
  double expert_rank_imbalance = 0;
  // ms per kernel kind in this step, the most any rank spent (run/kernel_times.hpp's kinds and order); filled
  // by meshrun-train's loop on rank 0 when metrics are written, else empty.
  std::vector<double> kernel_ms;
};

// Σ over layers of the busiest EP rank's assignments ÷ Σ over layers of the mean rank's, from the per (layer,
// expert) counts; 1 when routing is balanced, 0 without counts.
double expert_rank_imbalance(const std::vector<double>& tokens, int experts, int local);

// Learning rate of 0-based step s: linear warmup over warmup_steps, then cosine decay to min_lr at step
// decay_horizon() (training.lr_decay_steps, or steps when unset), min_lr after it.
double lr_at(const TrainingSpec& t, int s);

// The one place the loss is normalized: by the global number of target tokens of a step (every
// position of every sequence has a target; none is ignored).
inline double loss_normalizer(const TrainingSpec& t) {
  return 1.0 / (static_cast<double>(t.global_batch_size) * static_cast<double>(t.seq_len));
}

// Every rule of a meshrun-train job (mesh check_rules, RuleSet::trainer) against the layout, on one node of
// layout.world() ranks: one "<problem>; <fix>" line, or "" if the job is valid.
std::string check_train_setup(const JobConfig& cfg, const Layout& layout);

// The pipeline schedule of a setup (pp = 1 runs the same table machinery with one stage).
ScheduleSpec schedule_spec(const JobConfig& cfg, const Layout& layout, const BatchGeometry& geometry);

// The backend of training.device (CUDA on MESHRUN_CUDA_DEVICE, else default_device; or the CPU backend of `dtype`,
// the strict one when MESHRUN_STRICT_BACKEND=1). Throws std::invalid_argument with one line when there is no device.
std::unique_ptr<device::Backend> make_backend(const TrainingSpec& t, const std::string& dtype, int default_device = 0);

template <class T>
class Trainer {
 public:
  // Faults the equivalence tests inject to show that they catch them (never set outside tests).
  struct TestFaults {
    std::function<void(std::vector<ChunkUnits>&)> edit_chunks;  // e.g. a stage that skips a layer
    bool contiguous_cp_tokens = false;  // CP rank r reads tokens [r·S/cp, …) but attends with zigzag positions
    bool moe_drop_token = false;        // EP: the first routed assignment of every micro-batch is dropped
    bool moe_wrong_rank = false;        // EP: one assignment is sent to the next EP rank's expert
    RouterLogitsObserver router_logits;  // MoE: sees every router's logits (the aux loss's independent check)
  };
  // rank: this process's rank in `grid`; groups: its communicators (make_mpi_groups, make_local_groups; for a
  // CUDA backend at world > 1 make_nccl_groups over that backend, passed here too).
  // backend: the kernels' (null: make_backend(cfg.training, ...)).
  Trainer(const JobConfig& cfg, const RankGrid& grid, int rank, const Groups& groups, const TestFaults& faults = {},
          std::unique_ptr<device::Backend> backend = nullptr);
  device::Backend& backend() const { return *backend_; }

  void init_params();                       // layout-independent, from training.seed
  void load(const std::string& path);       // Hugging Face names and shapes; every rank reads the file
  void save(const std::string& path);       // collective; world rank 0 writes
  StepStats step(int s, const SampleSource& data);
  // The validation loss (collective): the mean cross-entropy over `batches` global batches of `data`, batch b
  // being its samples [b·B, (b+1)·B) laid out as a training step's; forward only (no gradient, optimizer or
  // RNG state is touched), so training continues exactly as without it.
  double evaluate(const SampleSource& data, int batches);

  // Every tensor in its global shape, on every rank (collective). Order of the parameter table.
  std::vector<std::pair<std::string, std::vector<T>>> gather_params();
  // The reduced (unclipped) gradient of the last step in the same form (collective).
  std::vector<std::pair<std::string, std::vector<T>>> gather_grads();
  const ParamTable& table() const { return table_; }
  ParamStore& store() { return store_; }
  MemoryReport memory() const { return store_.memory(); }
  const BatchGeometry& geometry() const { return geometry_; }
  const ScheduleTable& schedule() const { return schedule_; }
  // Saved activations (every slot and backward buffer the stages allocated, i.e. their peak) and the
  // shared layer workspace.
  std::int64_t activation_bytes() const;
  // Of that, what the stages save between passes (activation slots and backward buffers).
  std::int64_t saved_activation_bytes() const;
  // Units this rank holds (its pipeline chunks').
  bool holds(int unit) const { return store_.holds(unit); }
  // Visible causal (query, key) pairs this rank's attention computed so far, as a share of its heads (the CP
  // load-balance counter).
  std::int64_t attention_pairs() const { return cpctx_.visible_pairs(); }
  double attention_seconds() const { return cpctx_.seconds; }
  // Mixture of experts: this rank's routing statistics of the last step (assignments per layer·E + expert).
  const MoeStats& moe_stats() const { return moe_stats_; }
  // For sharded checkpoints (checkpoint.hpp).
  const JobConfig& config() const { return cfg_; }
  const RankGrid& grid() const { return grid_; }
  const Coord& coord() const { return coord_; }
  Comm& world() const { return *groups_.world; }

 private:
  // Per-unit flat local buffers of the held units -> every tensor in its global shape, on every rank
  // (collective over tp and pp).
  std::vector<std::pair<std::string, std::vector<T>>> assemble(const std::vector<std::vector<T>>& units);
  std::vector<Comm*> unit_groups() const;
  // MoE statistics pooled per micro-batch (router_aux = "hf"), else none.
  int pooled_microbatches() const { return epctx_.pooled ? static_cast<int>(geometry_.microbatches) : 0; }

  JobConfig cfg_;
  RankGrid grid_;
  Coord coord_;
  std::unique_ptr<device::Backend> backend_;  // the kernels every layer calls (CPU: training.dtype)
  // The strict backend's (the caller's groups, each call bracketed with host access), or a device backend's
  // (one process: DeviceLocalComm); empty otherwise.
  Groups host_access_groups_;
  const Groups& groups_;
  Comm& tp_;
  Comm& dp_;  // dp·cp: the replica group of dense units
  Comm& pp_;
  BatchGeometry geometry_;
  ParamTable table_;
  std::vector<ChunkUnits> chunks_;
  std::vector<int> unit_owner_;  // pipeline rank holding each unit
  ParamStore store_;
  LayerDims dims_;
  TensorParallel tpctx_;
  MoeStats moe_stats_;
  ExpertParallel epctx_;
  LayerWorkspace ws_;
  ContextParallel cpctx_;
  device::DeviceBuffer pos_;             // global positions of a micro-batch's rows on this rank (int32)
  std::vector<std::int32_t> read_pos_;   // positions of one sequence this rank reads (= pos_'s unless a test fault)
  std::vector<std::int32_t> ids_host_, targets_host_;  // one micro-batch's tokens on their way to the stage
  std::vector<std::unique_ptr<Stage>> stages_;
  ScheduleTable schedule_;
  std::unique_ptr<PipelineRuntime> runtime_;
};

}  // namespace meshrun::train
