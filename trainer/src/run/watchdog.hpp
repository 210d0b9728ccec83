// meshrun-train's watchdogs (issue 16, fast named failure). A rank whose peers never reach MPI_Init (one
// exited before it or never started) would wait in MPI_Init's exchange until the time limit, and a rank
// whose peer stopped answering waits in a collective forever. A thread ends this process with one line
// naming the rank, the host and what it waited for; the launcher then ends the others (srun
// --kill-on-bad-exit, mpirun on a non-zero exit). MESHRUN_INIT_TIMEOUT_S (default 60) bounds MPI_Init;
// MESHRUN_STEP_TIMEOUT_S (default 60) is the least time without progress that counts as a hang: the limit
// is the larger of it, 10 × the slowest step and 3 × the slowest checkpoint save so far. 0 turns a watchdog
// off. Set-up (token file, checkpoint load) and checkpoint saves are file I/O of unknown length and are not
// bounded.
#pragma once

namespace meshrun::train::cli {

enum class WatchdogPhase { mpi_init, steps, done, file_io };  // file_io: unbounded

// Starts the thread (before MPI_Init; the phase starts at mpi_init).
void start_watchdog();
void set_watchdog_phase(WatchdogPhase phase);
void set_watchdog_rank(int rank);  // named in its line once MPI has given it

void progress();
// After a step or a save that took `seconds`: progress, and the hang limit grows with the slowest one.
void progress_after(double seconds, double factor);

// File I/O of unknown length (a checkpoint save) inside the steps: unbounded while it lasts.
struct UnboundedIo {
  UnboundedIo() { set_watchdog_phase(WatchdogPhase::file_io); }
  ~UnboundedIo() {
    progress();
    set_watchdog_phase(WatchdogPhase::steps);
  }
  UnboundedIo(const UnboundedIo&) = delete;
  UnboundedIo& operator=(const UnboundedIo&) = delete;
};

}  // namespace meshrun::train::cli
