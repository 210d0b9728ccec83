#include "signals.hpp"

#include <mpi.h>
#include <signal.h>

#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>

#include "agree.hpp"
#include "meshrun/train/checkpoint/checkpoint.hpp"

namespace meshrun::train::cli {

namespace {

volatile sig_atomic_t g_stop_bits = 0;  // 1: checkpoint.signal, 2: SIGTERM, 4: SIGINT (Ctrl-C; handled as SIGTERM)
int g_checkpoint_signal = SIGUSR1;
extern "C" void on_stop_signal(int sig) {
  g_stop_bits = g_stop_bits | (sig == g_checkpoint_signal ? 1 : sig == SIGINT ? 4 : 2);
}

// The exit status after a committed signal-driven save: 75 (EX_TEMPFAIL), or MESHRUN_STOP_EXIT_STATUS = 0, which
// `meshrun run` sets for the ranks it starts under mpirun (mpirun would otherwise abort the job and print its
// banner on the first non-zero exit; meshrun run itself exits 75 after reading DIR/status).
int saved_stop_exit_status() {
  const char* v = std::getenv("MESHRUN_STOP_EXIT_STATUS");
  return v && std::string(v) == "0" ? 0 : kPreemptedExitCode;
}

int signal_number(const std::string& name) {
  std::string s = name;
  for (auto& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  if (s.rfind("SIG", 0) == 0) s = s.substr(3);
  const std::pair<const char*, int> known[] = {{"USR1", SIGUSR1}, {"USR2", SIGUSR2}, {"TERM", SIGTERM},
                                               {"INT", SIGINT},   {"HUP", SIGHUP},   {"URG", SIGURG}};
  for (const auto& [n, v] : known)
    if (s == n) return v;
  throw InputError("checkpoint.signal = \"" + name + "\" is not a signal the trainer can catch; use USR1 (default), USR2 or TERM");
}

const char* signal_text(int sig) {
  switch (sig) {
    case SIGUSR1: return "USR1";
    case SIGUSR2: return "USR2";
    case SIGTERM: return "TERM";
    case SIGINT: return "INT";
    case SIGHUP: return "HUP";
    case SIGURG: return "URG";
    default: return "?";
  }
}

// Budget for a best-effort save on SIGTERM: Slurm sends SIGKILL KillWait (default 30 s) after it.
constexpr double kTermBudgetS = 20.0;

}  // namespace

void install_stop_handlers(const std::string& signal) {
  g_checkpoint_signal = signal_number(signal);
  struct sigaction sa{};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  ::sigaction(g_checkpoint_signal, &sa, nullptr);
  ::sigaction(SIGTERM, &sa, nullptr);
  if (g_checkpoint_signal != SIGINT) ::sigaction(SIGINT, &sa, nullptr);
}

int agreed_stop_bits() {
  int mine = g_stop_bits, all = 0;
  MPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_BOR, MPI_COMM_WORLD);
  return all;
}

int stop_after_step(int stop, int step, const std::string& dir, int rank, const SaveHistory& saves,
                    const std::function<bool(int, std::string*)>& save) {
  std::string why;
  const bool requested = stop & 1;
  const char* sig = requested ? signal_text(g_checkpoint_signal) : stop & 2 ? "TERM" : "INT";
  if (rank == 0) {
    std::printf("meshrun-train: SIG%s received; stopping after step %d\n", sig, step);
    std::fflush(stdout);
  }
  bool saved = saves.last_saved == step;
  if (!saved && !requested && saves.last_save_s >= 0 && saves.last_save_s + saves.last_step_s > kTermBudgetS) {
    char b[200];
    std::snprintf(b, sizeof b, "the last save took %.1f s, more than the %.0f s a SIGTERM leaves before SIGKILL",
                  saves.last_save_s, kTermBudgetS);
    why = b;
  } else if (!saved) {
    saved = save(step, &why);
  }
  if (rank == 0) {
    if (saved) {
      write_status_file(dir, "saved " + std::to_string(step) + " " + sig);
      std::printf("meshrun-train: stopped after step %d on SIG%s; checkpoint step-%d is committed; %s says so; every "
                  "rank exits %d%s\n", step, sig, step, status_file_path(dir).c_str(), saved_stop_exit_status(),
                  saved_stop_exit_status() == 0 ? " (MESHRUN_STOP_EXIT_STATUS: meshrun run reports 75)" : "");
    } else {
      write_status_file(dir, "not-saved " + std::to_string(step) + " " + sig + " " + why);
      std::printf("meshrun-train: stopped after step %d on SIG%s without saving: %s; latest checkpoint: %s\n", step,
                  sig, why.c_str(), saves.last_saved > 0 ? ("step-" + std::to_string(saves.last_saved)).c_str() : "none");
    }
    std::fflush(stdout);
  }
  MPI_Barrier(MPI_COMM_WORLD);  // no rank exits before the status file exists
  return saved ? saved_stop_exit_status() : 1;
}

}  // namespace meshrun::train::cli
