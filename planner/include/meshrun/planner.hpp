// meshrun's planner: memory and step-time estimates for a layout, and a search over layouts.
// Pure functions of a JobConfig; `meshrun plan --estimate / --search` print them (launcher/cmd_plan.cpp).
// The cost model and all its constants are documented in docs/planner.md.
#pragma once
#include <array>
#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

#include "meshrun/job.hpp"
#include "meshrun/layout.hpp"
#include "meshrun/planner_catalogue.hpp"
#include "meshrun/planner_model.hpp"
#include "meshrun/rank_map.hpp"
#include "meshrun/schedule.hpp"

namespace meshrun::planner {

// Pipeline schedules are mesh's (meshrun/schedule.hpp): PipelineSchedule, parse_pipeline_schedule and
// pipeline_schedule_name; the bubble and the live activations come from its generator and simulator.

// Bytes per GPU on the pipeline stage that needs the most.
struct MemoryParts {
  double params = 0;        // model weights held (param_dtype), after ZeRO-3 sharding
  double grads = 0;         // gradients (grad_dtype), after ZeRO-2 sharding
  double optimizer = 0;     // fp32 master weights + Adam m, v (optim_dtype), after ZeRO-1 sharding
  double activations = 0;   // saved for backward, all micro-batches in flight (the run's precision)
  double logits = 0;        // output-head logits of the micro-batches in flight (last stage)
  double workspace = 0;     // backward buffers, the layer workspace, CP K/V blocks (what meshrun-train allocates)
  double comm_buffers = 0;  // ZeRO-3's gathered layer weights
  double reserve = 0;       // CUDA context, NCCL, allocator fragmentation (constant)
  double total() const {
    return params + grads + optimizer + activations + logits + workspace + comm_buffers + reserve;
  }
};

// What `compute` is made of, by kernel group (what meshrun-train's metrics time per kernel kind, and what
// --calibrate fits each efficiency against): GEMMs (the output head's included), attention, memory-bound
// elementwise kernels. compute is their sum plus layer_overhead_s per layer and micro-batch.
struct ComputeParts {
  double matmul = 0, attention = 0, elementwise = 0;
};

// Seconds per optimizer step on the slowest pipeline stage; they add up to the step time.
struct TimeParts {
  double compute = 0;    // forward + backward matmuls and attention, all micro-batches
  double recompute = 0;  // extra forward work of full recomputation
  double tp_comm = 0;    // TP/SP collectives (on the critical path)
  double cp_comm = 0;    // CP K/V all-gather and gradient reduce-scatter (on the critical path)
  double ep_comm = 0;    // EP all-to-all dispatch and combine (on the critical path)
  double pp_bubble = 0;  // pipeline idle of the busiest rank (simulated schedule, P2P hops included)
  double dp_comm = 0;    // the part of DP/ZeRO traffic that backward/forward compute does not hide
  double optimizer = 0;  // optimizer step (HBM-bound)
  double host = 0;       // host passes over the parameters outside kernels (meshrun-train's CPU backend; 0 on GPUs)
  double shared_cores = 0;  // CPU ranks outnumbering the node's CPUs: the node's kernel work over its CPUs, beyond the rest
  ComputeParts compute_parts;  // compute by kernel group (not added again by step())
  double step() const {
    return compute + recompute + tp_comm + cp_comm + ep_comm + pp_bubble + dp_comm + optimizer + host + shared_cores;
  }
};

// Link each axis's groups use (slowest link inside one group).
struct AxisLinks {
  Link tp = Link::self, cp = Link::self, pp = Link::self;
  Link cp_group = Link::self;  // all-to-all CP: inside one all-to-all group (parallel.cp_comm; = cp under "alltoall")
  Link dp = Link::self;   // the dp·cp gradient-reduction group (CP ranks share weights)
  Link ep = Link::self;
  Link edp = Link::self;  // ranks holding the same experts (expert gradient reduction)
  // NVLink domains (nodes where there is none) that rank 0's group of each kind spans: a ring collective
  // takes (islands − 1) network steps and (size − islands) steps inside an island.
  int tp_islands = 1, cp_islands = 1, dp_islands = 1, ep_islands = 1, edp_islands = 1;
};

struct Estimate {
  Layout layout;                 // resolved sizes, order, virtual stages, ZeRO stage, sequence parallelism
  int micro_batch_size = 1;
  int micro_batches = 1;         // per step per data-parallel rank
  PipelineSchedule schedule = PipelineSchedule::one_f_one_b;
  Recompute recompute = Recompute::none;
  int seq_len = 0;
  int global_batch_size = 0;
  Hardware hardware;
  AxisLinks links;
  int first_stage_layers = 0, last_stage_layers = 0;
  int64_t params_total = 0;
  double expert_imbalance = 1;   // MoE routing imbalance charged (planner.expert_imbalance); 1 = balanced

  MemoryParts memory;            // of the stage named below
  std::string memory_stage;      // "first" or "last" pipeline stage
  double memory_capacity_gib = 0;
  bool fits = true;
  std::string overflow;          // empty when it fits; else the overflowing part and by how much

  TimeParts time;
  double step_time_s = 0;
  double tokens_per_s_per_gpu = 0;
  double tflops_per_gpu = 0;     // model FLOPs (no recomputation) per second per GPU
  double mfu = 0;                // tflops_per_gpu / bf16 peak
  double model_flops_per_step = 0;
};

// Estimate for the layout the config names. Throws meshrun::ConfigError (one line: problem; fix) when the
// layout is invalid (mesh validator), a dtype or recompute/schedule name is unknown, the GPU is unknown, or
// the schedule it would simulate is over kMaxScheduleSlots (schedule_problem(), checked first).
Estimate estimate(const JobConfig& cfg);
// The same with a calibration given instead of read from planner.calibration (what --calibrate evaluates).
struct Calibration;
Estimate estimate(const JobConfig& cfg, const Calibration& calibration);

// "" or the one line why the planner does not estimate this layout: with pp > 1 the bubble is simulated on
// the step's full schedule table, and micro-batches × pp·virtual_stages is over kMaxScheduleSlots (mesh's
// schedule_size_problem(), the bound of `meshrun plan --schedule`). At pp = 1 nothing is simulated (live
// slots come in closed form, pipeline.hpp), so any batch is estimated. The search skips such
// settings (Drop::schedule_size) instead of refusing.
std::string schedule_problem(const JobConfig& cfg, const Layout& layout);

// Why candidates were dropped. The first five are decided per mesh shape (tp, cp, pp, dp), the rest per
// setting. Virtual-stage counts that cannot split the layers are not enumerated.
enum class Drop {
  heads_tp,        // tp does not divide heads, kv_heads, ffn_hidden or vocab
  tp_nvlink,       // tp does not fit the NVLink domain / node
  seq_cp,          // seq_len not divisible by 2·cp
  cp_alltoall,     // cp_comm's all-to-all group does not divide cp, or the heads or kv heads per tp rank
  batch_dp,        // global batch not divisible by dp
  layers_pp,       // layers cannot be split over pp · virtual stages
  microbatches,    // fewer micro-batches than pipeline stages, or not a multiple of pp when interleaved
  schedule_size,   // micro-batches × pp·virtual_stages over kMaxScheduleSlots (schedule.hpp): not simulated
  memory,          // does not fit in GPU memory
  validator,       // rejected by mesh's validate() (should stay 0: the search mirrors its rules)
  count_
};
inline constexpr int kDropReasons = static_cast<int>(Drop::count_);
const char* drop_reason(Drop d);

struct SearchResult {
  std::vector<Estimate> top;      // fastest first; one entry per mesh shape (tp, cp, pp, dp, ep), its best setting
  int world = 0;
  int64_t meshes = 0;             // (tp, cp, pp, dp, ep) shapes that pass the shape rules
  int64_t settings = 0;           // full settings (shape × schedule/virtual stages × micro-batch × ZeRO × recompute)
  int64_t feasible = 0;           // settings that are valid and fit
  int64_t feasible_meshes = 0;    // shapes with at least one feasible setting
  std::array<int64_t, kDropReasons> dropped_meshes{};    // shapes dropped, by reason
  std::array<int64_t, kDropReasons> dropped_settings{};  // settings of enumerated shapes dropped, by reason
  // Where the config's own mesh shape (tp, cp, pp, dp, ep) ranks among the feasible shapes (1 = fastest;
  // 0 = not feasible or not a valid shape), and how much slower its best setting is than the best shape's
  // (0.05 = 5%), so that a near-tie is visible even when it falls outside the printed top.
  int64_t config_rank = 0;
  double config_gap = 0;
  double elapsed_s = 0;
  int64_t pipeline_tables = 0;       // schedule tables generated for simulated bubbles (live slots need none)
  int64_t pipeline_simulations = 0;  // simulations run (the rest came from the cache)
};

// Every valid (tp, cp, pp, dp, ep, virtual stages, micro-batch size, ZeRO stage, recomputation) for the
// config's model, cluster, sequence length and global batch; ranked by estimated step time.
// The config's own parallel section is ignored except for `order`. Throws ConfigError like estimate().
SearchResult search(const JobConfig& cfg, int top_n);

// Renderers: a human table and the JSON object text ("estimate" / "search" values).
void print_estimate_table(std::ostream& os, const Estimate& e);
std::string estimate_json(const Estimate& e);
void print_search_table(std::ostream& os, const SearchResult& r);
std::string search_json(const SearchResult& r);

}  // namespace meshrun::planner
