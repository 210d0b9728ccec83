#include "meshrun/train/run/trace.hpp"

#include <algorithm>
#include <cstdio>

#include "meshrun/comm/wait_state.hpp"
#include "meshrun/json.hpp"

namespace meshrun::train::trace {

namespace {
Recorder* g_active = nullptr;  // written and read by the training thread only

void observe_wait(void* ctx, const comm::WaitInfo& w, double end_s) {
  static_cast<Recorder*>(ctx)->wait(w.op ? w.op : "?", w.group, w.peer, w.since_s, end_s);
}

bool is_compute(ActionKind k) {
  return k == ActionKind::F || k == ActionKind::B || k == ActionKind::W || k == ActionKind::BW;
}
}  // namespace

const char* track_name(int track) {
  switch (track) {
    case kStepTrack: return "step";
    case kComputeTrack: return "compute";
    case kP2pTrack: return "p2p";
    case kWaitTrack: return "comm wait";
  }
  return "?";
}

Recorder* active() { return g_active; }

double now() { return comm::steady_seconds(); }

Recorder::Recorder(std::vector<int> pp_world, std::size_t max_events)
    : pp_world_(std::move(pp_world)), max_events_(max_events) {
  if (pp_world_.empty()) pp_world_.push_back(0);
  events_.reserve(std::min<std::size_t>(max_events_, 4096));
}

Recorder::~Recorder() {
  if (recording_) end_step();
}

void Recorder::begin_step(int step) {
  step_ = step;
  recording_ = true;
  g_active = this;
  comm::set_wait_observer(&observe_wait, this);
}

void Recorder::end_step() {
  comm::set_wait_observer(nullptr, nullptr);
  if (g_active == this) g_active = nullptr;
  recording_ = false;
}

void Recorder::add(const Event& e) {
  if (events_.size() >= max_events_) {
    ++dropped_;
    return;
  }
  events_.push_back(e);
}

void Recorder::phase(const char* name, double t0, double t1) {
  Event e;
  e.name = name;
  e.track = kStepTrack;
  e.step = step_;
  e.t0 = t0;
  e.t1 = t1;
  add(e);
}

void Recorder::action(const Action& a, double t0, double t1) {
  Event e;
  e.name = action_name(a.kind);
  e.track = is_compute(a.kind) ? kComputeTrack : kP2pTrack;
  e.step = step_;
  e.microbatch = a.microbatch;
  e.chunk = a.chunk;
  if (a.peer >= 0 && a.peer < static_cast<int>(pp_world_.size())) {
    e.peer_stage = a.peer;
    e.peer = pp_world_[static_cast<std::size_t>(a.peer)];
  }
  e.t0 = t0;
  e.t1 = t1;
  add(e);
}

void Recorder::wait(const char* op, const char* group, int peer, double t0, double t1) {
  Event e;
  e.name = op;
  e.group = group;
  e.track = kWaitTrack;
  e.step = step_;
  e.peer = peer;
  e.t0 = t0;
  e.t1 = t1;
  add(e);
}

std::string json_string(const std::string& s) {
  std::string o;
  JsonWriter(o).string_literal(s);
  return o;
}

std::string event_json(const Event& e, int pid, double origin_s, const ScheduleSpec& schedule) {
  // µs with ns resolution; a wait that began before the origin (none: recording starts after it) clamps to 0.
  const double ts = std::max(0.0, (e.t0 - origin_s) * 1e6);
  const double dur = std::max(0.0, (e.t1 - e.t0) * 1e6);
  const char* cat = e.track == kStepTrack ? "step" : e.track == kComputeTrack ? "compute"
                    : e.track == kP2pTrack ? "p2p" : "wait";
  char head[256];
  std::snprintf(head, sizeof head, "{\"name\":%s,\"cat\":\"%s\",\"ph\":\"X\",\"pid\":%d,\"tid\":%d,\"ts\":%.3f,\"dur\":%.3f,"
                "\"args\":{\"step\":%d", json_string(e.name).c_str(), cat, pid, e.track, ts, dur, e.step);
  std::string s = head;
  char buf[160];
  if (e.chunk >= 0 && e.track == kComputeTrack) {
    std::snprintf(buf, sizeof buf, ",\"microbatch\":%d,\"chunk\":%d,\"stage\":%d,\"virtual_stage\":%d", e.microbatch,
                  e.chunk, schedule.rank_of(e.chunk), chunk_virtual_stage(e.chunk, schedule.pp));
    s += buf;
  } else if (e.chunk >= 0) {  // a transfer: the chunk that produced the tensor (schedule.hpp)
    std::snprintf(buf, sizeof buf, ",\"microbatch\":%d,\"chunk\":%d", e.microbatch, e.chunk);
    s += buf;
  }
  if (e.peer_stage >= 0) {
    std::snprintf(buf, sizeof buf, ",\"peer_stage\":%d", e.peer_stage);
    s += buf;
  }
  if (e.peer >= 0) {
    std::snprintf(buf, sizeof buf, ",\"peer\":%d", e.peer);
    s += buf;
  }
  if (e.group) s += ",\"group\":" + json_string(e.group);
  s += "}}";
  return s;
}

}  // namespace meshrun::train::trace
