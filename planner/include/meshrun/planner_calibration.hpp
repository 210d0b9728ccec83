// Calibration (issue 30): the planner's constants fitted to runs meshrun-train measured, and the CPU device
// model those runs need. A calibration file is TOML with one [planner] table:
//
//   [planner]
//   device = "cpu"              # "cpu" (meshrun-train's CPU backend) or a GPU catalogue key ("h100-sxm")
//   # the device's figures (CPU: measured by meshrun-bench-device; GPU entries keep the catalogue's)
//   node_cpus = 2               # CPUs of a node that ranks share
//   gflops_per_cpu = 80.0       # the trainer's fp32 matmul kernel, one rank per CPU (fp64: gflops_per_cpu_fp64)
//   memory_gbps_per_cpu = 9.0   # streaming copy, one rank per CPU
//   link_gbps = 6.0             # MPI point-to-point between two ranks of a node, per direction
//   collective_gbps = 1.6       # MPI_Allreduce's bus bandwidth between them (0 or absent: link_gbps)
//   memory_gib = 23.4           # the node's memory
//   # the cost model's constants (any subset; the rest keep the device's defaults)
//   matmul_efficiency = 0.61
//   ...
//   fitted_runs = 3             # written by --calibrate: how many runs the constants were fitted on
//
// docs/planner.md, "Calibration", lists every key and how --calibrate fits them.
#pragma once
#include <array>
#include <string>
#include <vector>

#include "meshrun/job.hpp"
#include "meshrun/planner_catalogue.hpp"

namespace meshrun::planner {

struct Calibration {
  std::string path;  // where it was read from ("" = none)
  std::string device;
  // CPU figures (0 = not given)
  int node_cpus = 0;
  double gflops_per_cpu = 0, gflops_per_cpu_fp64 = 0, memory_gbps_per_cpu = 0, link_gbps = 0, memory_gib = 0;
  double collective_gbps = 0;
  // The constants this file sets, by name (cost_constant_names()); the others keep the device's defaults.
  std::vector<std::pair<std::string, double>> constants;
  int fitted_runs = 0;
  bool empty() const { return device.empty(); }
};

// The names of CostConstants' members a calibration may set, and access to them by name.
const std::vector<std::string>& cost_constant_names();
double* cost_constant(CostConstants& c, const std::string& name);  // nullptr for an unknown name

// Reads a calibration file; throws ConfigError naming file:line:column and the fix.
Calibration load_calibration(const std::string& path);
// The file's text (what --calibrate writes).
std::string calibration_toml(const Calibration& c, const std::string& header_comment);

// The constants of a device (the catalogue's, or the CPU's starting point) with a calibration's on top.
CostConstants calibrated_constants(const CostConstants& base, const Calibration& c);

// One measured run: the config it ran (rebuilt from its metrics run record) and its medians over the
// steps after the first.
struct MeasuredRun {
  std::string path;
  JobConfig cfg;
  double step_ms = 0;
  // ms per step the busiest rank spent in each kernel group (matmul, attention, elementwise, loss, optimizer);
  // negative = not recorded
  double matmul_ms = -1, attention_ms = -1, elementwise_ms = -1, optimizer_ms = -1;
  // the step less those groups: communication and its waits, the pipeline bubble, host work; negative = not
  // recorded
  double outside_kernels_ms = -1;
  int steps = 0;             // steps the medians are over
  double step_ms_spread = 0; // (max − min) / median of those steps
};
// Reads a meshrun-train metrics file (JSON Lines, schema 1): its last run record and the steps after it. A
// MoE run's planner.expert_imbalance is its median expert_rank_imbalance.
// Throws ConfigError (one line) on a file that is not one, or has fewer than 3 steps.
MeasuredRun read_measured_run(const std::string& path);

struct CalibrationFit {
  Calibration calibration;                  // base figures + the fitted constants
  std::vector<double> before_ms, after_ms;  // the estimate of each run with the base and the fitted constants
  std::vector<std::string> fitted;          // names of the constants fitted
  std::vector<std::string> unconstrained;   // of those, the ones no run depends on: kept at their start
  // After the fit, each run's estimate over its measurement − 1 by part: matmul, attention, elementwise,
  // optimizer, outside the kernels (NaN where the run did not record it)
  std::vector<std::array<double, 5>> after_part_errors;
};
// Fits the device's constants to the runs (bounded least squares on the logarithm of step time and of each
// recorded kernel group). Every run must be of base.device; throws ConfigError otherwise.
CalibrationFit calibrate(const std::vector<MeasuredRun>& runs, const Calibration& base);

}  // namespace meshrun::planner
