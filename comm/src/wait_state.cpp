#include "meshrun/comm/wait_state.hpp"

#include <atomic>
#include <chrono>

namespace meshrun::comm {

namespace {
std::atomic<const char*> g_op{nullptr};
std::atomic<const char*> g_group{nullptr};
std::atomic<int> g_peer{-1};
std::atomic<double> g_since{0};
std::atomic<double> g_total{0};
thread_local WaitObserver t_observer = nullptr;
thread_local void* t_observer_ctx = nullptr;
}  // namespace

void set_wait_observer(WaitObserver observer, void* ctx) {
  t_observer_ctx = ctx;
  t_observer = observer;
}

double steady_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

WaitInfo current_wait() {
  WaitInfo w;
  w.op = g_op.load();
  w.group = g_group.load();
  w.peer = g_peer.load();
  w.since_s = g_since.load();
  return w;
}

double total_wait_seconds() { return g_total.load(); }

WaitScope::WaitScope(const char* op, const char* group, int peer) : t0_(steady_seconds()), outer_(g_op.load() == nullptr) {
  if (!outer_) return;
  g_group = group;
  g_peer = peer;
  g_since = t0_;
  g_op = op;  // last: a reader that sees the op sees the rest of this wait
}

WaitScope::~WaitScope() {
  if (!outer_) return;
  const double end = steady_seconds();
  if (t_observer) [[unlikely]]
    t_observer(t_observer_ctx, WaitInfo{g_op.load(), g_group.load(), g_peer.load(), t0_}, end);
  g_op = nullptr;
  g_total = g_total.load() + (end - t0_);
}

}  // namespace meshrun::comm
