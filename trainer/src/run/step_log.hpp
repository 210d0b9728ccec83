// meshrun-train's lines on stdout (rank 0 prints them): the run's banner, the step line with its first-step
// and MoE extras, and the commit of a checkpoint. Their text is what scripts and tests read.
#pragma once
#include <cstdint>
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
// "45 s", "3m 20s", "2h 05m".
std::string duration_text(double seconds);

// The step line (tok/s counts every rank's tokens; then the elapsed time and, before the last step, the ETA:
// this run's mean step time × the steps to go); with experts, their load per layer on the first and last
// step. Not flushed.
void print_step(const StepStats& st, const JobConfig& cfg, bool first, const Progress& p);

// After the last step: steps, tokens, time and mean throughput of this run, the last loss, and what was
// saved (`checkpoint`: the latest committed checkpoint's name, or "" when checkpoint.dir is not set). Flushed.
void print_run_summary(const JobConfig& cfg, int first_step, const Progress& p, double last_loss,
                       const std::string& checkpoint);

// Memory per rank after the first step (its transient peak includes gathered units and scratch). Not flushed.
void print_memory(const MemoryReport& m, int zero_stage, std::int64_t activation_bytes);

// After the commit of `step`'s checkpoint (latest renamed), with a warning when the save outlasted
// checkpoint.signal_lead_s; flushed.
void print_checkpoint_committed(const SaveResult& r, int step, int signal_lead_s);

}  // namespace meshrun::train::cli
