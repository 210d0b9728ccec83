// The cost model behind estimate() and search(): memory and step time of one complete setting.
// Internal to the planner; docs/planner.md lists every equation.
#pragma once
#include <optional>

#include "meshrun/geometry.hpp"
#include "meshrun/planner.hpp"
#include "meshrun/planner_calibration.hpp"
#include "pipeline.hpp"

namespace meshrun::planner::detail {

// A complete setting: the layout (mesh shape, virtual stages, ZeRO stage; sequence parallelism on only with
// tp > 1), the step's batch cut over it (mesh's BatchGeometry: micro-batch size and count, rows per rank),
// the pipeline schedule and the recomputation the search varies.
struct Setting {
  Layout layout;
  BatchGeometry batch;
  PipelineSchedule schedule = PipelineSchedule::one_f_one_b;
  Recompute recompute = Recompute::none;
};
// The batch geometry of `training` over `layout`; throws ConfigError with mesh's first problem when the batch
// does not cut over it.
BatchGeometry setting_batch(const TrainingSpec& training, const Layout& layout);

// Layers held by the first, the last and the most loaded pipeline rank (chunks r, r+pp, ... on rank r).
struct StageLayers {
  int first = 0, last = 0, max = 0;
};
// Layers per pipeline rank: first = rank 0's, last = rank pp−1's, max = the most on any rank. In a V
// (zbv, dualpipev) rank r holds chunks r and 2pp−1−r, so rank 0 holds both ends of the model.
std::optional<StageLayers> stage_layers(int layers, int pp, int virtual_stages, ChunkPlacement placement);

// Slowest link of every axis's group for a layout placed on a cluster (Slurm block placement).
// cp_group: context parallelism's all-to-all group (mesh's cp_alltoall_group; 1 without all-to-all).
AxisLinks axis_links(const Layout& layout, const Cluster& cluster, int cp_group = 1);

// One layer and one micro-batch on one GPU: compute per direction, communication per direction (the
// backward moves the same volume as the forward).
struct LayerCost {
  double fwd = 0;        // matmuls, attention and elementwise kernels
  double bwd = 0;        // their input and weight gradients
  double bwd_weight = 0; // the weight-gradient GEMMs of bwd (what zb defers as W)
  ComputeParts parts;    // fwd + bwd by kernel group
  double selective = 0;  // extra work of selective recomputation (per layer, in the backward pass; time()
                         // charges it only when the setting recomputes selectively)
  double tp = 0, cp = 0, ep = 0;  // exposed collectives, latency included (cp: one K/V all-gather)
  double cp_fwd = 0, cp_bwd = 0;  // exposed CP communication per direction for the configured cp_comm
  double head_fwd = 0, head_bwd = 0;  // output projection (last stage)
  double head_bwd_weight = 0;         // its weight-gradient GEMM (part of head_bwd)
  double p2p = 0;        // one pipeline transfer of this micro-batch's activations
};

struct Cost {
  MemoryParts memory;
  bool last_stage = false;  // the memory above is the last stage's
  TimeParts time;
};

// A run on GPUs: training.device = "cuda", a cluster of a GPU node type (h100, gb200, …: the template plans
// for those GPUs even when another trainer runs it), or cluster.gpu / gpu_bf16_tflops set. Else the CPU
// trainer on "generic" nodes, which needs a calibration file (calibration.cpp).
bool gpu_run(const JobConfig& cfg);
// Bytes per activation and per row statistic of the run, as meshrun-train allocates them (device/src/
// precision.cpp): on GPUs param_dtype and fp32; on CPU training.dtype (bf16 is mixed: fp32 statistics).
// Throws ConfigError on a dtype meshrun-train does not run.
int activation_dtype_bytes(const JobConfig& cfg);
int statistics_dtype_bytes(const JobConfig& cfg);

// Everything fixed for one config: model arithmetic, hardware, dtypes, batch.
class CostModel {
 public:
  CostModel(const JobConfig& cfg, const Hardware& hw);  // throws ConfigError on an unknown dtype
  double capacity_bytes() const { return capacity_; }
  int64_t params_total() const { return params_total_; }
  const PipelineSims& pipeline() const { return pipeline_; }
  // Live activation slots from the simulated schedule tables instead of their closed form (the exhaustive
  // search, which tests compare the search with).
  void use_simulated_live_slots(bool on) { simulated_live_ = on; }
  double model_flops_per_step() const { return model_flops_step_; }
  double expert_imbalance() const { return imbalance_; }
  // Memory of the worse of the first and last stage.
  void memory(const Setting& s, const StageLayers& l, Cost* out) const;
  void time(const Setting& s, const StageLayers& l, const AxisLinks& links, Cost* out) const;
  // time() in two steps, for the search's pruning: every part but the simulated pipeline idle (so a lower
  // bound of the step), returning the costs the simulation needs; then that idle added to pp_bubble.
  PipelineCosts time_before_bubble(const Setting& s, const StageLayers& l, const AxisLinks& links, Cost* out) const;
  // The same with the layer's costs given: layer_cost(s, links) depends only on tp, cp, ep, sp, the
  // micro-batch size and the links, so the search computes it once for every pipeline, ZeRO and
  // recomputation choice that shares them.
  PipelineCosts time_before_bubble(const Setting& s, const StageLayers& l, const AxisLinks& links, const LayerCost& c,
                                   Cost* out) const;
  LayerCost layer_cost(const Setting& s, const AxisLinks& links) const;
  void add_bubble(const Setting& s, const PipelineCosts& costs, Cost* out) const;
  // A lower bound of what add_bubble adds, without simulating (PipelineSims::idle_lower_bound).
  double bubble_lower_bound(const Setting& s, const PipelineCosts& costs) const;

 private:
  MemoryParts stage_memory(const Setting& s, int layers, int rank) const;
  double bandwidth(Link link) const;             // bytes/s a transfer achieves (point-to-point, all-to-all)
  double collective_bandwidth(Link link) const;  // bus bandwidth of an all-reduce, all-gather, reduce-scatter
  // Seconds of a forward GEMM (m×n outputs, depth k; `count` of them grouped) and of its backward pair
  // (input gradient m×k over n, weight gradient k×n over m).
  double gemm_fwd(double m, double n, double k, double count = 1) const;
  double gemm_bwd(double m, double n, double k, double count = 1) const;
  // Start-up latency of one ring all-gather or reduce-scatter over n ranks on `islands` NVLink domains or
  // nodes (NCCL's tuning model), and of one point-to-point transfer (or all-to-all) over `link`.
  double ring_latency(int n, int islands, Link link) const;
  double p2p_latency(Link link) const;

  const ModelSpec& m_;
  Hardware hw_;
  CostConstants k_;
  int64_t seq_;
  int global_batch_;
  LayoutSpec cp_spec_;      // parallel.cp_comm and cp_alltoall (mesh's cp_alltoall_group reads them)
  bool cp_ring_;            // K/V blocks travel a ring (ring, alltoall+ring; alltoall: a ring of one, no hops)
  int pb_, gb_, ob_;        // bytes: parameters, gradients, optimizer state
  int act_;                 // activation bytes: the run's precision (activation_dtype_bytes())
  int stat_;                // per-row statistics (norm rstd, log-sum-exp, logits): fp32, fp64 in an fp64 run
  double imbalance_;
  bool fused_head_;         // planner.fused_head: logits a chunk at a time (recomputed in B) or kept whole        // MoE: the busiest expert's tokens over the mean (planner.expert_imbalance, >= 1)
  ParamCount p_;
  int64_t params_total_;
  double capacity_;
  double model_flops_step_;
  mutable PipelineSims pipeline_;  // a cache: memory() and time() stay logically const
  bool simulated_live_ = false;
};

}  // namespace meshrun::planner::detail

namespace meshrun::planner::detail {

// The config resolved once: cluster, hardware (with the calibration applied), schedule and recompute names
// checked. The first form reads planner.calibration when it is set.
struct Resolved {
  Cluster cluster;
  Hardware hardware;
};
Resolved resolve(const JobConfig& cfg);  // throws ConfigError
Resolved resolve(const JobConfig& cfg, const Calibration& calibration);
// The CPU backend's constants before a calibration; the hardware of a CPU run from a calibration (refused
// without one), or a GPU run's constants with a calibration's on top (calibration.cpp).
CostConstants cpu_constants();
void apply_calibration(const JobConfig& cfg, int ranks_per_node, const Calibration& cal, Hardware* hw);
// Whether the planner may cost this setting: pp = 1 (nothing simulated) or a schedule of at most
// kMaxScheduleSlots slots (mesh's schedule_size()); schedule_problem() and the search's skip both ask it.
bool schedule_within_bound(int64_t global_batch, int64_t micro_batch, int dp, int pp, int v);

// search() by either path. pruned (what search() runs): every fitting setting gets a lower bound of its
// step without simulating, and only settings whose bound can still matter are simulated. exhaustive (for
// tests): every fitting setting costed in full with its simulated bubble, live slots from the simulated
// tables, each one checked by the validator. Both give the same ranked list (tests/planner/test_search.cpp).
enum class SearchPath { pruned, exhaustive };
SearchResult search(const JobConfig& cfg, int top_n, SearchPath path);

// Builds the public Estimate from a costed setting.
Estimate make_estimate(const Setting& s, const Hardware& hw,
                       const AxisLinks& links, const StageLayers& layers, const Cost& cost,
                       const CostModel& model);

}  // namespace meshrun::planner::detail
