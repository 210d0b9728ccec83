// meshrun-train's heartbeat (issue 29): a thread per rank with its own channel, a UDP socket outside MPI,
// so a rank that stops (SIGSTOP, a debugger, a frozen node) is named by the others, not by itself when it
// wakes. Every second each rank tells rank 0 (the monitor) its step and what it waits in (comm's
// WaitScope: op, group, peer, since when); rank 0 answers each one. A rank silent for the limit is named by
// rank 0 with its node, host and coordinates and what every other rank waits in, and rank 0 ends (the
// launcher then ends the job: mpirun on a non-zero exit, srun --kill-on-bad-exit); a silent rank 0 is named
// by every other rank the same way. The step watchdog (watchdog.hpp) asks the monitor for the same
// per-rank picture when no rank makes progress although all are alive (a deadlock, a lost message).
// MESHRUN_HEARTBEAT_TIMEOUT_S (default 30, 0 = off) is the silence that counts as stopped.
#pragma once
#include <mpi.h>

#include <memory>
#include <functional>
#include <string>
#include <vector>

#include "meshrun/rank_map.hpp"

namespace meshrun::train::cli {

// Where a rank runs: for every line that names it.
struct RankPlace {
  std::string node;  // Slurm's node name (SLURMD_NODENAME; the local cluster's nodes share a host), else the host
  std::string host;
  Coord coord;
};
// "rank 3 on node n2 (host h, pp 1 dp 0 tp 1 cp 0)"
std::string describe_rank(int rank, const RankPlace& p);
std::string node_name();  // this process's

// Every rank's place, gathered from every rank (collective over `world`).
std::vector<RankPlace> gather_places(MPI_Comm world, const RankGrid& grid);

class Heartbeat {
 public:
  // Collective over `world` (its ranks are the grid's). With timeout_s <= 0, or when any rank cannot open
  // its socket or reach rank 0's address, the heartbeat is off on every rank and `status()` says why.
  Heartbeat(MPI_Comm world, std::vector<RankPlace> places, double timeout_s);
  ~Heartbeat();  // says goodbye (the monitor stops watching this rank) and joins the thread
  Heartbeat(const Heartbeat&) = delete;
  Heartbeat& operator=(const Heartbeat&) = delete;

  void set_step(int step);  // the step this rank is in (1-based), sent with each beat
  // Also polled by the heartbeat thread, about once a second: a non-empty answer (a problem the thread can see
  // but the training thread, blocked in it, cannot: NCCL's asynchronous errors) ends this rank with one line,
  // then `before_exit` (NCCL: abort the communicators). Nothing is polled while the heartbeat is off.
  void watch(std::function<std::string()> check, std::function<void()> before_exit);
  bool on() const;
  // One line for the banner: how it works here, or why it is off.
  const std::string& status() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

// Rank 0 with the heartbeat on: every rank's last word ("rank 1 waits in recv from rank 3 (pp) for 61 s at
// step 57 (heard 0 s ago); rank 3 not in a communication wait at step 57 …"); else "". For the step watchdog.
std::string heartbeat_picture();
// MESHRUN_HEARTBEAT_TIMEOUT_S, default 30 (0 or negative: off).
double heartbeat_timeout_from_env();

}  // namespace meshrun::train::cli
