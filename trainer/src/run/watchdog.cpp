#include "watchdog.hpp"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include "heartbeat.hpp"
#include "meshrun/comm/wait_state.hpp"

namespace meshrun::train::cli {

namespace {

std::atomic<WatchdogPhase> g_wd_phase{WatchdogPhase::mpi_init};
std::atomic<double> g_wd_last{0};          // steady seconds of the last progress
std::atomic<double> g_wd_limit{60};        // seconds without progress that count as a hang
std::atomic<int> g_wd_rank{-1};

double steady_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
double env_seconds(const char* name, double fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::atof(v) : fallback;
}
std::string rank_from_env() {
  for (const char* n : {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "SLURM_PROCID", "RANK"})
    if (const char* v = std::getenv(n)) return v;
  return "?";
}

}  // namespace

void set_watchdog_phase(WatchdogPhase phase) { g_wd_phase = phase; }
void set_watchdog_rank(int rank) { g_wd_rank = rank; }

void progress() { g_wd_last = steady_s(); }

void start_watchdog() {
  const double init_limit = env_seconds("MESHRUN_INIT_TIMEOUT_S", 60), step_floor = env_seconds("MESHRUN_STEP_TIMEOUT_S", 60);
  g_wd_limit = step_floor;
  progress();
  // The launcher's rank, read here and not in the thread: MPI_Init sets environment variables while the thread
  // runs, and getenv beside setenv may read a freed environ (a SIGSEGV in getenv seen on a loaded machine).
  const std::string env_rank = rank_from_env();
  std::thread([init_limit, step_floor, env_rank] {
    char host[256] = "?";
    ::gethostname(host, sizeof host - 1);
    const double t0 = steady_s();
    while (g_wd_phase != WatchdogPhase::done) {
      ::usleep(100 * 1000);
      const double now = steady_s();
      const int rank = g_wd_rank;
      const std::string who = rank >= 0 ? std::to_string(rank) : env_rank;
      if (g_wd_phase == WatchdogPhase::mpi_init && init_limit > 0 && now - t0 > init_limit) {
        std::fprintf(stderr, "meshrun-train: rank %s on %s: MPI_Init did not complete within %.0f s: another rank exited "
                     "before MPI_Init or never started (see its log); ending this rank\n", who.c_str(), host, init_limit);
        std::fflush(stderr);
        ::_exit(1);
      }
      if (g_wd_phase == WatchdogPhase::steps && step_floor > 0 && now - g_wd_last > g_wd_limit) {
        // What this rank waits in, and on rank 0 with the heartbeat on, every rank's last word (the ranks not
        // waiting in communication are where the job stopped).
        const comm::WaitInfo w = comm::current_wait();
        char waiting[160] = "not in a communication wait";
        if (w.op)
          std::snprintf(waiting, sizeof waiting, "waiting in %s%s%s (%s) for %.0f s", w.op, w.peer >= 0 ? " with rank " : "",
                        w.peer >= 0 ? std::to_string(w.peer).c_str() : "", w.group, now - w.since_s);
        const std::string all = heartbeat_picture();
        std::fprintf(stderr, "meshrun-train: rank %s on %s: no progress for %.0f s (limit %.0f s): a peer rank died or stopped "
                     "answering inside a collective (this rank: %s)%s%s; ending this rank\n", who.c_str(), host,
                     now - g_wd_last.load(), g_wd_limit.load(), waiting, all.empty() ? "" : "; every rank's last heartbeat: ",
                     all.c_str());
        std::fflush(stderr);
        ::_exit(1);
      }
    }
  }).detach();
}

void progress_after(double seconds, double factor) {
  progress();
  const double want = seconds * factor;
  if (want > g_wd_limit) g_wd_limit = want;
}

}  // namespace meshrun::train::cli
