#include "stragglers.hpp"

#include <algorithm>
#include <cstdio>

namespace meshrun::train::cli {

namespace {
double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}
}  // namespace

StragglerReport judge_stragglers(const std::vector<double>& compute_s, const std::vector<double>& wait_s, int steps,
                                 double margin) {
  StragglerReport r;
  const double per_step_ms = steps > 0 ? 1000.0 / steps : 0;
  r.median_compute_ms = median(compute_s) * per_step_ms;
  r.median_wait_ms = median(wait_s) * per_step_ms;
  for (std::size_t i = 0; i < compute_s.size(); ++i) {
    const double c = compute_s[i] * per_step_ms;
    if (c > r.median_compute_ms * (1.0 + margin)) r.slow.push_back({static_cast<int>(i), c, wait_s[i] * per_step_ms});
  }
  std::sort(r.slow.begin(), r.slow.end(), [](const Straggler& a, const Straggler& b) { return a.compute_ms > b.compute_ms; });
  return r;
}

bool StragglerWatch::after_step(int step, double step_s, double wait_s, StragglerReport* out) {
  if (interval_ <= 0) return false;
  if (steps_ == 0) first_ = step;
  ++steps_;
  compute_ += std::max(0.0, step_s - wait_s);
  wait_ += wait_s;
  if (steps_ < interval_) return false;
  int rank = 0, size = 1;
  MPI_Comm_rank(world_, &rank);
  MPI_Comm_size(world_, &size);
  const double mine[2] = {compute_, wait_};
  std::vector<double> all(rank == 0 ? 2 * static_cast<std::size_t>(size) : 0);
  MPI_Gather(mine, 2, MPI_DOUBLE, all.data(), 2, MPI_DOUBLE, 0, world_);
  const int steps = steps_;
  steps_ = 0;
  compute_ = wait_ = 0;
  if (rank != 0) return false;
  std::vector<double> c(size), w(size);
  for (int r = 0; r < size; ++r) {
    c[r] = all[2 * r];
    w[r] = all[2 * r + 1];
  }
  *out = judge_stragglers(c, w, steps, margin_);
  out->first_step = first_;
  out->last_step = step;
  return true;
}

std::string straggler_line(const StragglerReport& r, const Straggler& s, const std::vector<RankPlace>& places,
                           double margin) {
  char b[512];
  std::snprintf(b, sizeof b,
                "meshrun-train: straggler at steps %d-%d: %s computes %.1f ms per step, the median rank %.1f ms (%+.0f%%, "
                "training.straggler_margin = %.0f%%); it waits %.1f ms per step in communication, the median rank %.1f ms",
                r.first_step, r.last_step, describe_rank(s.rank, places[static_cast<std::size_t>(s.rank)]).c_str(),
                s.compute_ms, r.median_compute_ms,
                r.median_compute_ms > 0 ? 100.0 * (s.compute_ms / r.median_compute_ms - 1.0) : 0.0, 100.0 * margin,
                s.wait_ms, r.median_wait_ms);
  return b;
}

}  // namespace meshrun::train::cli
