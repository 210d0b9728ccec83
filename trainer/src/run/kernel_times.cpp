#include "kernel_times.hpp"

#include <sched.h>

#include <algorithm>
#include <cstring>

namespace meshrun::train::cli {

const std::vector<std::string>& kernel_kinds() {
  static const std::vector<std::string> kinds = {
      "linear_forward", "linear_backward_input", "linear_backward_weight", "attention_forward", "attention_backward",
      "rmsnorm",        "rope",                  "swiglu",                 "elementwise",       "embedding",
      "gather_rows",    "moe",                   "cross_entropy",          "adamw",             "sum_squares"};
  return kinds;
}

KernelTimesPerStep::KernelTimesPerStep(device::Backend& backend, MPI_Comm world, bool on)
    : backend_(backend), world_(world), on_(on) {
  if (on_) before_ = totals();
}

std::vector<double> KernelTimesPerStep::totals() const {
  const auto& kinds = kernel_kinds();
  std::vector<double> v(kinds.size(), 0.0);
  for (const auto& [kind, ms] : backend_.kernel_times()) {
    const auto it = std::find(kinds.begin(), kinds.end(), kind);
    if (it != kinds.end()) v[static_cast<std::size_t>(it - kinds.begin())] = ms;
  }
  return v;
}

void KernelTimesPerStep::skip_since_last() {
  if (on_) before_ = totals();
}

std::vector<double> KernelTimesPerStep::after_step() {
  if (!on_) return {};
  std::vector<double> now = totals(), step(now.size()), most(now.size());
  for (std::size_t i = 0; i < now.size(); ++i) step[i] = now[i] - before_[i];
  before_ = std::move(now);
  MPI_Reduce(step.data(), most.data(), static_cast<int>(step.size()), MPI_DOUBLE, MPI_MAX, 0, world_);
  return most;
}

int node_cpus(MPI_Comm world, const std::vector<RankPlace>& places) {
  cpu_set_t mine;
  CPU_ZERO(&mine);
  if (sched_getaffinity(0, sizeof mine, &mine) != 0) CPU_SET(0, &mine);  // unknown: count one CPU
  int rank = 0, size = 1;
  MPI_Comm_rank(world, &rank);
  MPI_Comm_size(world, &size);
  std::vector<cpu_set_t> all(rank == 0 ? static_cast<std::size_t>(size) : 0);
  MPI_Gather(&mine, sizeof mine, MPI_BYTE, all.data(), sizeof mine, MPI_BYTE, 0, world);
  if (rank != 0) return 0;
  cpu_set_t node;
  CPU_ZERO(&node);
  for (int r = 0; r < size; ++r)
    if (places[static_cast<std::size_t>(r)].node == places[0].node) CPU_OR(&node, &node, &all[static_cast<std::size_t>(r)]);
  return CPU_COUNT(&node);
}

}  // namespace meshrun::train::cli
