// meshrun-train's lines on stdout (rank 0 prints them): the run's banner, the step line with its first-step
// and MoE extras, and the commit of a checkpoint. Their text is what scripts and tests read.
#pragma once
#include <cstdint>
#include <limits>
#include <string>

#include "meshrun/job.hpp"
#include "meshrun/schedule.hpp"
#include "meshrun/train/checkpoint/checkpoint.hpp"
#include "meshrun/train/parallel/zero.hpp"
#include "meshrun/train/run/trainer.hpp"

namespace meshrun::train::cli {

std::string mib(std::int64_t bytes);  // "1.50 MiB"

// Model, parameters, dtype and layout (and the pipeline when pp > 1); flushed.
void print_run_banner(const JobConfig& cfg, const Layout& layout, std::int64_t params, PipelineSchedule schedule,
                      std::int64_t microbatches);

// Where the run is: wall time since its first step began, and its steps done and to go.
struct Progress {
  double elapsed_s = 0;
  int steps_done = 0;  // in this run (a resumed run counts from its first step)
  int steps_left = 0;
};
// Model FLOPs utilization: the model FLOPs of a step (meshrun's one formula, meshrun/model_flops.hpp: the
// planner's and meshrun-gpu-check's) per second over the peak of all ranks (peak_probe.hpp on a CPU).
struct Utilization {
  double flops_per_step = 0;  // all ranks
  double peak_flops = 0;      // per second, all ranks
  std::string peak_source;
  // NaN (JSON null, printed "n/a") when the peak is not known: a GPU outside the catalogue.
  double mfu(double seconds_per_step) const {
    if (peak_flops <= 0) return std::numeric_limits<double>::quiet_NaN();
    return seconds_per_step > 0 ? flops_per_step / seconds_per_step / peak_flops : 0;
  }
};
Utilization utilization(const JobConfig& cfg, double peak_flops, std::string peak_source);
// After the banner: what MFU counts and against which peak, and where the metrics go ("" = nowhere); flushed.
void print_utilization(const Utilization& u, const std::string& metrics_path, const std::string& metrics_why);

// "45 s", "3m 20s", "2h 05m".
std::string duration_text(double seconds);

// The step line (tok/s counts every rank's tokens, MFU is u's; then the elapsed time and, before the last
// step, the ETA: this run's mean step time × the steps to go); with experts, their load per layer on the
// first and last step. Not flushed.
void print_step(const StepStats& st, const JobConfig& cfg, bool first, const Progress& p, const Utilization& u);

// After the last step: steps, tokens, time, mean throughput and MFU of this run, the last loss, and what
// was saved (`checkpoint`: the latest committed checkpoint's name, or "" when checkpoint.dir is not set).
// Flushed.
void print_run_summary(const JobConfig& cfg, int first_step, const Progress& p, const Utilization& u,
                       double last_loss, const std::string& checkpoint);

// Memory per rank after the first step (its transient peak includes gathered units and scratch). Not flushed.
void print_memory(const MemoryReport& m, int zero_stage, std::int64_t activation_bytes);

// After the commit of `step`'s checkpoint (latest renamed), with a warning when the save outlasted
// checkpoint.signal_lead_s; flushed.
void print_checkpoint_committed(const SaveResult& r, int step, int signal_lead_s);

}  // namespace meshrun::train::cli
