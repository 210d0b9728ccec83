// MFU's denominator on a CPU: the matmul throughput this job's ranks reach together, measured at start-up.
// Every rank runs the trainer's own matmul kernel (linear_forward, the product its linear layers use, in the
// run's compute type) at the same time for a fixed wall time; the job's peak is the sum of the ranks' rates.
// Ranks that share cores therefore share the peak, as they share the cores during training.
#pragma once
#include <mpi.h>

#include <string>

namespace meshrun::train::cli {

struct PeakFlops {
  double flops_per_s = 0;  // all ranks together
  std::string source;      // how it was found, for the banner and the metrics' run record
};

// Collective over `world`. `dtype` is training.dtype (fp64 measures double, fp32 and bf16 float: the CPU
// backends compute bf16 runs in float). About `seconds` of wall time.
PeakFlops measure_cpu_peak(MPI_Comm world, const std::string& dtype, double seconds = 0.1);

// MFU's denominator on GPUs: the data sheet's dense bf16 peak of each rank's current device
// (planner::gpu_for_device_name), summed over `world`; 0 with the reason in `source` when a device is not
// catalogued (the emulated device is not). Collective.
PeakFlops catalogue_gpu_peak(MPI_Comm world);

// One rank's rate (FLOP/s) of that probe, in float or double, over about `seconds`: also what
// meshrun-bench-device writes as the planner's gflops_per_cpu, so the two measure the same thing.
template <class T>
double probe_flops_per_s(double seconds);
inline constexpr const char* kProbeShape = "256x512x512";

}  // namespace meshrun::train::cli
