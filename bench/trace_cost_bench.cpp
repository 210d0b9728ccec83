// The cost of --trace's instrumentation per call, off and on (docs/trainer.md, "Timelines"): what the pipeline
// runtime, the step phases and every communication wait pay, timed over millions of calls on one thread, so
// that the per-step cost follows from the counts of a real trace rather than from step times that vary by
// ±20 % on a shared machine (bench/trace_bench.sh measures those). Not a test.
//   off: trace::active() and its branch (per action and phase); a WaitScope without an observer (per wait:
//        the steady-clock reads it already made before tracing existed, plus the observer's branch)
//   on:  Recorder::action with the clock read; a WaitScope with the recorder observing; one event's JSON.
// usage: meshrun-bench-trace-cost [MILLIONS]   (default 5)
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "meshrun/comm/wait_state.hpp"
#include "meshrun/train/run/trace.hpp"

using namespace meshrun;
using Clock = std::chrono::steady_clock;

namespace {

template <class F>
double ns_per_call(long n, F&& f) {
  const auto t0 = Clock::now();
  for (long i = 0; i < n; ++i) f(i);
  return std::chrono::duration<double, std::nano>(Clock::now() - t0).count() / static_cast<double>(n);
}

volatile long sink = 0;

}  // namespace

int main(int argc, char** argv) {
  const long n = (argc > 1 ? std::atol(argv[1]) : 5) * 1000000L;
  if (n <= 0) {
    std::fprintf(stderr, "usage: meshrun-bench-trace-cost [MILLIONS]\n");
    return 2;
  }
  const Action act{ActionKind::F, 0, 0, -1};

  const double off_branch = ns_per_call(n, [&](long i) {
    if (train::trace::Recorder* r = train::trace::active()) r->action(act, 0, 0);
    sink = sink + i;
  });
  const double off_wait = ns_per_call(n, [&](long) { const comm::WaitScope w("recv", "pp", 1); });

  // On: a recorder large enough for every call (the real one keeps at most 200,000 events per rank).
  train::trace::Recorder rec({0, 1}, static_cast<std::size_t>(2 * n) + 16);
  rec.begin_step(1);
  const double on_action = ns_per_call(n, [&](long) {
    if (train::trace::Recorder* r = train::trace::active()) {
      const double t0 = train::trace::now();
      r->action(act, t0, train::trace::now());
    }
  });
  const double on_wait = ns_per_call(n, [&](long) { const comm::WaitScope w("recv", "pp", 1); });
  rec.end_step();
  const long m = std::min<long>(n, 1000000);
  std::size_t bytes = 0;
  const double json = ns_per_call(m, [&](long i) {
    bytes += train::trace::event_json(rec.events()[static_cast<std::size_t>(i)], 0, 0, ScheduleSpec{PipelineSchedule::one_f_one_b, 2, 1, 1}).size();
  });

  std::printf("meshrun-bench-trace-cost: %ld million calls each, one thread\n", n / 1000000);
  std::printf("off  action/phase check (trace::active() + branch)   %7.2f ns\n", off_branch);
  std::printf("off  WaitScope, no observer (2 clock reads + branch) %7.2f ns\n", off_wait);
  std::printf("on   action recorded (2 clock reads + push)          %7.2f ns\n", on_action);
  std::printf("on   WaitScope recorded by the observer              %7.2f ns\n", on_wait);
  std::printf("on   one event as JSON (written after the window)    %7.2f ns, %.0f bytes\n", json,
              static_cast<double>(bytes) / static_cast<double>(m));
  return 0;
}
