// What this process is blocked on in communication, and how long it has waited in total. The MPI backend
// brackets every blocking call (a wait on a request, a broadcast, an all-to-all, a barrier) with a
// WaitScope; meshrun-train's heartbeat thread reads the current wait to say what a rank waits for when a
// job stops making progress, and its straggler report subtracts the total from the step time (compute =
// step − communication waits). Process-wide diagnostics, written by the training thread only; plain
// atomics, so any thread may read them at any time.
#pragma once

namespace meshrun::comm {

struct WaitInfo {
  const char* op = nullptr;     // "all_gather", "recv", ...; nullptr when not waiting
  const char* group = nullptr;  // "dp", "pp", "world", ...
  int peer = -1;                // the peer's world rank for point-to-point, else -1
  double since_s = 0;           // steady-clock seconds when the wait began
};

// The wait in progress (op == nullptr when none).
WaitInfo current_wait();
// Seconds spent in communication waits since the process started (monotonic).
double total_wait_seconds();

class WaitScope {
 public:
  WaitScope(const char* op, const char* group, int peer);
  ~WaitScope();
  WaitScope(const WaitScope&) = delete;
  WaitScope& operator=(const WaitScope&) = delete;

 private:
  double t0_;
  bool outer_;  // nested scopes (a wait inside a wait) count once
};

double steady_seconds();

// An observer of this thread's finished waits (meshrun-train's --trace, docs/trainer.md "Timelines"): called
// at the end of every outermost wait on the thread that set it, with what it waited in (w.since_s: when the
// wait began) and when it ended, both steady-clock seconds. Per thread, so the training thread's waits are
// traced and no other thread's; null (the default) costs one branch per wait. `ctx` is handed back.
using WaitObserver = void (*)(void* ctx, const WaitInfo& w, double end_s);
void set_wait_observer(WaitObserver observer, void* ctx);

}  // namespace meshrun::comm
