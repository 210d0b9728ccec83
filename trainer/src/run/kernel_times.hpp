// Per-step kernel times for the metrics (issue 30: what `meshrun plan --calibrate` fits against): the
// backend's time per kernel kind (CPU: steady clock around each call; CUDA: CUDA events), taken per step
// and reduced over the ranks to the most any one rank spent in each kind.
#pragma once
#include <mpi.h>

#include <string>
#include <utility>
#include <vector>

#include "heartbeat.hpp"
#include "meshrun/device/backend.hpp"

namespace meshrun::train::cli {

// The kinds the backends time (device/cpu/backend_cpu.cpp, device/cuda/backend_cuda.cpp), in the metrics'
// order. A kind a backend does not report counts 0.
const std::vector<std::string>& kernel_kinds();

class KernelTimesPerStep {
 public:
  // on = false (no metrics file): nothing is gathered, after_step returns nothing and is not collective.
  KernelTimesPerStep(device::Backend& backend, MPI_Comm world, bool on);
  // Collective when on: the step's ms per kind, the maximum over ranks, valid on rank 0 (kernel_kinds()'s order).
  std::vector<double> after_step();
  // Not collective: work since after_step (an evaluation) is left out of the next step's times.
  void skip_since_last();

 private:
  std::vector<double> totals() const;
  device::Backend& backend_;
  MPI_Comm world_;
  bool on_;
  std::vector<double> before_;
};

// Collective: the CPUs the ranks on rank 0's node may run on together (the union of their affinity masks),
// valid on rank 0. With more ranks than that the ranks share cores, which the planner's CPU model charges.
int node_cpus(MPI_Comm world, const std::vector<RankPlace>& places);

}  // namespace meshrun::train::cli
