// Stragglers named (issue 29): every training.straggler_interval steps the ranks gather their compute time
// (each step's wall time minus its communication waits, comm/wait_state.hpp) and their waits at rank 0; a
// rank whose compute per step is more than training.straggler_margin above the median rank's is named with
// its node, host and coordinates. A slow rank computes longer while the others wait for it longer, so
// compute, not step time, tells it apart (every rank's step time is the slowest one's).
#pragma once
#include <mpi.h>

#include <string>
#include <vector>

#include "heartbeat.hpp"

namespace meshrun::train::cli {

struct Straggler {
  int rank = 0;
  double compute_ms = 0, wait_ms = 0;  // per step, over the window
};
struct StragglerReport {
  int first_step = 0, last_step = 0;   // the window, 1-based, inclusive
  double median_compute_ms = 0, median_wait_ms = 0;
  std::vector<Straggler> slow;         // slowest first; empty when no rank is past the margin
};

// The pure verdict: per-rank compute and wait totals over `steps` steps.
StragglerReport judge_stragglers(const std::vector<double>& compute_s, const std::vector<double>& wait_s, int steps,
                                 double margin);

class StragglerWatch {
 public:
  StragglerWatch(MPI_Comm world, int interval, double margin) : world_(world), interval_(interval), margin_(margin) {}
  // After step `step` (1-based) of step_s seconds, wait_s of them in communication waits. Collective every
  // `interval` steps of this run; true on rank 0 when the window closed (then `*out` holds it).
  bool after_step(int step, double step_s, double wait_s, StragglerReport* out);

 private:
  MPI_Comm world_;
  int interval_;
  double margin_;
  int steps_ = 0, first_ = 0;
  double compute_ = 0, wait_ = 0;
};

// "meshrun-train: straggler at steps 41-50: rank 3 on node n3 (...) computes 61.2 ms per step, the median
// rank 30.1 ms (+103%, training.straggler_margin = 30%); it waits 4.1 ms per step in communication, the
// median rank 35.0 ms" — one line per slow rank.
std::string straggler_line(const StragglerReport& r, const Straggler& s, const std::vector<RankPlace>& places,
                           double margin);

}  // namespace meshrun::train::cli
