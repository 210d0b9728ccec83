// Timeline tracing (meshrun-train --trace DIR, docs/trainer.md "Timelines"): while a traced step runs, the
// pipeline runtime records each action it executes (F, B, W, BW per micro-batch and chunk, each send and
// receive with its peer), the trainer the phases of the step (pipeline, gradient reduction, norm and loss,
// optimizer), and the communication layer every blocking wait (wait_state.hpp's observer: op, group, peer).
// The events stay in memory, in steady-clock seconds; cli's RunTracer aligns the ranks' clocks, writes each
// rank's Chrome trace-event file and merges them (trace_run.hpp).
//
// Off (no traced step running: active() is null), an action and a phase cost one branch each and a wait one
// branch in WaitScope. No MPI here: the recorder lives with the trainer's core.
#pragma once
#include <cstddef>
#include <string>
#include <vector>

#include "meshrun/schedule.hpp"

namespace meshrun::train::trace {

// The tracks (trace-event "tid") of every rank's process.
enum Track : int { kStepTrack = 1, kComputeTrack = 2, kP2pTrack = 3, kWaitTrack = 4 };
const char* track_name(int track);  // "step", "compute", "p2p", "comm wait"

struct Event {
  const char* name = "";     // static strings only: "F", "send_act", "all_gather", "pipeline", ...
  const char* group = nullptr;  // a wait's group ("dp", "pp", ...)
  int track = kStepTrack;
  int step = 0;              // 1-based, as printed
  int microbatch = -1, chunk = -1;  // actions
  int peer = -1;             // world rank of the other side (sends, receives, point-to-point waits)
  int peer_stage = -1;       // its pipeline rank (sends, receives)
  double t0 = 0, t1 = 0;     // steady-clock seconds
};

class Recorder {
 public:
  // pp_world[p]: the world rank of pipeline rank p in this rank's pipeline (the peers of sends and
  // receives; its size is pp). At most max_events are kept; later ones are counted as dropped.
  Recorder(std::vector<int> pp_world, std::size_t max_events);
  ~Recorder();
  Recorder(const Recorder&) = delete;
  Recorder& operator=(const Recorder&) = delete;

  // Makes this recorder active() for step `step` (1-based) and observes this thread's waits; end_step()
  // undoes both. Only the training thread calls them.
  void begin_step(int step);
  void end_step();
  bool recording() const { return recording_; }

  void phase(const char* name, double t0, double t1);      // a step phase (kStepTrack)
  void action(const Action& a, double t0, double t1);      // a pipeline action (compute or p2p)
  void wait(const char* op, const char* group, int peer, double t0, double t1);  // kWaitTrack

  const std::vector<Event>& events() const { return events_; }
  std::size_t dropped() const { return dropped_; }
  int pp() const { return static_cast<int>(pp_world_.size()); }

 private:
  void add(const Event& e);
  std::vector<int> pp_world_;
  std::size_t max_events_;
  std::vector<Event> events_;
  std::size_t dropped_ = 0;
  int step_ = 0;
  bool recording_ = false;
};

// The recorder of the traced step in progress, or null (the common case).
Recorder* active();

double now();  // steady-clock seconds (= comm::steady_seconds(), the clock of every event)

// A step phase from construction to end() (or destruction), recorded if a traced step is running.
class Span {
 public:
  explicit Span(const char* name) : r_(active()), name_(name), t0_(r_ ? now() : 0) {}
  ~Span() { end(); }
  void end() {
    if (r_) r_->phase(name_, t0_, now());
    r_ = nullptr;
  }
  Span(const Span&) = delete;
  Span& operator=(const Span&) = delete;

 private:
  Recorder* r_;
  const char* name_;
  double t0_;
};

// One event as a trace-event JSON object ("X", complete): pid, tid = its track, ts and dur in µs from
// origin_s (steady seconds), args (step, microbatch, chunk, stage, virtual_stage, peer, group, ...). schedule:
// the run's, for a chunk's stage (its pipeline rank, schedule.hpp's placement) and virtual stage.
std::string event_json(const Event& e, int pid, double origin_s, const ScheduleSpec& schedule);

// A string as a JSON string literal (quotes, backslashes and control bytes escaped).
std::string json_string(const std::string& s);

}  // namespace meshrun::train::trace
