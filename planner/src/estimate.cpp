// estimate(): the configured layout, validated by mesh, costed by the planner's model.
#include <cmath>
#include <cstdio>
#include <string>

#include "cost.hpp"
#include "meshrun/config.hpp"

namespace meshrun::planner {

namespace detail {

Resolved resolve(const JobConfig& cfg) {
  return resolve(cfg, cfg.planner.calibration.empty() ? Calibration{} : load_calibration(cfg.planner.calibration));
}

Resolved resolve(const JobConfig& cfg, const Calibration& calibration) {
  std::vector<Problem> problems;
  Resolved r{resolve_cluster(cfg.cluster, &problems), {}};
  if (!problems.empty()) throw ConfigError(problems.front().message);
  if (gpu_run(cfg) || calibration.empty()) {
    try {
      r.hardware = resolve_hardware(cfg.cluster, r.cluster.gpus_per_node, r.cluster.nvlink_domain_gpus,
                                    r.cluster.type.gpu, r.cluster.type.nics_per_node);
    } catch (const ConfigError& e) {
      if (gpu_run(cfg)) throw;
      throw ConfigError(std::string(e.what()) + "; for meshrun-train on this machine's CPUs, measure them with `mpirun "
                        "-np 2 meshrun-bench-device > cpu.toml` and pass --calibration cpu.toml");
    }
  }
  apply_calibration(cfg, r.cluster.gpus_per_node, calibration, &r.hardware);
  if (!parse_recompute(cfg.training.recompute))
    throw ConfigError("training.recompute = \"" + cfg.training.recompute +
                      "\" is not known; use \"none\", \"selective\" or \"full\"");
  if (!parse_pipeline_schedule(cfg.parallel.pipeline_schedule))
    throw ConfigError("parallel.pipeline_schedule = \"" + cfg.parallel.pipeline_schedule +
                      "\" is not known; use \"gpipe\", \"1f1b\", \"interleaved\" or \"zb\"");
  return r;
}

namespace {
std::string gib(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f GiB", bytes / double(1 << 30));
  return buf;
}

std::string overflow_text(const MemoryParts& m, double capacity) {
  struct Part { const char* name; double bytes; const char* fix; };
  const Part parts[] = {
      {"parameters", m.params, "raise zero_stage to 3 or add pp/tp"},
      {"gradients", m.grads, "raise zero_stage to 2 or add pp/tp"},
      {"optimizer state", m.optimizer, "raise zero_stage (1 shards it over dp·cp) or add pp/tp"},
      {"activations", m.activations, "set training.recompute = \"selective\" or \"full\", lower micro_batch_size, "
                                     "or add tp/cp/pp"},
      {"logits", m.logits, "lower micro_batch_size or add tp"},
      {"workspaces", m.workspace, "lower micro_batch_size or add tp/cp"},
      {"ZeRO-3 gathered weights", m.comm_buffers, "lower zero_stage or add tp"},
  };
  const Part* big = &parts[0];
  for (const Part& p : parts)
    if (p.bytes > big->bytes) big = &p;
  return std::string(big->name) + " (" + gib(big->bytes) + ") push the total to " + gib(m.total()) + ", over the " +
         gib(capacity) + " of the GPU by " + gib(m.total() - capacity) + "; " + big->fix;
}
}  // namespace

Estimate make_estimate(const Setting& s, const Hardware& hw, const AxisLinks& links, const StageLayers& layers,
                       const Cost& cost, const CostModel& model) {
  Estimate e;
  e.layout = s.layout;
  e.micro_batch_size = int(s.batch.micro_batch_size);
  e.micro_batches = int(s.batch.microbatches);
  e.schedule = s.schedule;
  e.recompute = s.recompute;
  e.seq_len = int(s.batch.seq_len);
  e.global_batch_size = int(s.batch.global_batch);
  e.hardware = hw;
  e.links = links;
  e.first_stage_layers = layers.first;
  e.last_stage_layers = layers.last;
  e.params_total = model.params_total();
  e.expert_imbalance = model.expert_imbalance();

  e.memory = cost.memory;
  e.memory_stage = cost.last_stage ? "last" : "first";
  e.memory_capacity_gib = hw.memory_gib;
  e.fits = cost.memory.total() <= model.capacity_bytes();
  if (!e.fits) e.overflow = overflow_text(cost.memory, model.capacity_bytes());

  e.time = cost.time;
  e.step_time_s = cost.time.step();
  const double world = double(s.layout.world());
  const double tokens = double(s.batch.seq_len) * double(s.batch.global_batch);
  e.tokens_per_s_per_gpu = tokens / e.step_time_s / world;
  e.model_flops_per_step = model.model_flops_per_step();
  e.tflops_per_gpu = e.model_flops_per_step / e.step_time_s / world / 1e12;
  e.mfu = e.tflops_per_gpu / hw.bf16_tflops;
  return e;
}

BatchGeometry setting_batch(const TrainingSpec& training, const Layout& layout) {
  std::string why;
  auto g = batch_geometry(training, layout, &why);
  if (!g) throw ConfigError(why);
  return *g;
}

bool schedule_within_bound(int64_t global_batch, int64_t micro_batch, int dp, int pp, int v) {
  return pp == 1 || schedule_size(global_batch, micro_batch, dp, pp, v).fits();
}

}  // namespace detail

std::string schedule_problem(const JobConfig& cfg, const Layout& layout) {
  const TrainingSpec& t = cfg.training;
  if (detail::schedule_within_bound(t.global_batch_size, t.micro_batch_size, layout.dp, layout.pp,
                                    layout.virtual_stages))
    return "";
  return schedule_size_problem(t.global_batch_size, t.micro_batch_size, layout.dp, layout.pp, layout.virtual_stages,
                               "the planner simulates") +
         " to estimate the step (the plan without --estimate has no such limit; --search skips such settings)";
}

Estimate estimate(const JobConfig& cfg) {
  return estimate(cfg, cfg.planner.calibration.empty() ? Calibration{} : load_calibration(cfg.planner.calibration));
}

Estimate estimate(const JobConfig& cfg, const Calibration& calibration) {
  using namespace detail;
  Resolved r = resolve(cfg, calibration);
  std::vector<Problem> problems;
  auto layout = resolve_layout(cfg.parallel, r.cluster.gpus(), &problems);
  if (!layout) throw ConfigError(problems.front().message);
  problems = validate(cfg, *layout, r.cluster);
  if (!problems.empty()) throw ConfigError(problems.front().message);
  // The simulation's size, before anything is generated (meshrun plan checks it first, with the origin).
  if (std::string why = schedule_problem(cfg, *layout); !why.empty()) throw ConfigError(why);

  Setting s;
  s.layout = *layout;
  s.layout.sequence_parallel = layout->sequence_parallel && layout->tp > 1;
  s.batch = setting_batch(cfg.training, s.layout);
  s.schedule = *parse_pipeline_schedule(cfg.parallel.pipeline_schedule);  // validate() applied the schedule rule
  s.recompute = *parse_recompute(cfg.training.recompute);

  CostModel model(cfg, r.hardware);
  StageLayers layers = *stage_layers(cfg.model.layers, s.layout.pp, s.layout.virtual_stages, chunk_placement(s.schedule));  // validate() checked the split
  AxisLinks links = axis_links(*layout, r.cluster, cp_alltoall_group(cfg.parallel, layout->cp));
  Cost cost;
  model.memory(s, layers, &cost);
  model.time(s, layers, links, &cost);
  return make_estimate(s, r.hardware, links, layers, cost, model);
}

}  // namespace meshrun::planner
