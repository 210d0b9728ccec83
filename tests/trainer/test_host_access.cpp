// HostAccessComm over the strict CPU backend: the buffers of an outstanding request stay addressable (a peer
// may read or write them from its own process) and nothing else does, and the pins go once the request
// completes. The inner communicator here holds its requests open until the test completes them.
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <csignal>
#include <memory>

#include "meshrun/comm/comm.hpp"
#include "meshrun/device/backend.hpp"

using namespace meshrun;
using comm::Request;
using device::Buf;
using device::DType;

namespace {
// Requests that complete when the test says so (a transfer a peer has not finished yet).
struct HeldRequests final : comm::ForwardingComm {
  struct Held final : Request::Pending {
    bool* done;
    explicit Held(bool* d) : done(d) {}
    void wait() override { *done = true; }
    bool test() override { return *done; }
  };
  HeldRequests() : ForwardingComm(std::make_unique<comm::LocalComm>()) {}
  bool done = false;
  Request isend(Buf, int, int) override { return Request(std::make_unique<Held>(&done)); }
  Request irecv(Buf, int, int) override { return Request(std::make_unique<Held>(&done)); }
  Request ireduce_scatter(Buf, Buf, comm::ReduceOp) override { return Request(std::make_unique<Held>(&done)); }
};

// The signal that ended f run in a child process (0: it returned).
template <class F>
int signal_of(F&& f) {
  const pid_t pid = fork();
  if (pid == 0) {
    std::signal(SIGSEGV, SIG_DFL);
    f();
    _exit(0);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFSIGNALED(status) ? WTERMSIG(status) : 0;
}
int read_of(Buf b) {
  return signal_of([&] {
    volatile float v = static_cast<float*>(b.p)[b.n - 1];
    (void)v;
  });
}
int write_of(Buf b) {
  return signal_of([&] { static_cast<float*>(b.p)[0] = 1.f; });
}
}  // namespace

TEST_CASE("host-access comm: an outstanding request's buffers stay addressable, no other", "[comm][strict]") {
  auto be = device::make_strict_cpu_backend("fp32");
  HeldRequests inner;
  comm::HostAccessComm c(inner, *be);
  Buf send = be->alloc(5000, DType::f32), recv = be->alloc(3000, DType::f32), other = be->alloc(64, DType::f32);
  be->zero(send);
  be->zero(recv);
  be->zero(other);
  REQUIRE(read_of(send) == SIGSEGV);  // the strict backend as it is between calls

  Request s = c.isend(send, 1, 0);
  Request r = c.irecv(recv, 1, 0);
  CHECK(read_of(send) == 0);  // a peer reading the send buffer meets addressable pages
  CHECK(write_of(recv) == 0);
  CHECK(read_of(other) == SIGSEGV);  // the instrument keeps its teeth
  CHECK(write_of(other) == SIGSEGV);
  // Backend calls and host-access windows in between leave the pins in place.
  be->add(other, other);
  be->begin_host_access();
  be->end_host_access();
  be->add(send, send);  // a call on the pinned buffer itself: its end must not close it
  CHECK(read_of(send) == 0);
  CHECK(read_of(other) == SIGSEGV);
  CHECK_FALSE(s.test());  // still in flight: still pinned
  CHECK(read_of(send) == 0);

  inner.done = true;  // the transfers complete
  CHECK(s.test());
  r.wait();
  CHECK(read_of(send) == SIGSEGV);
  CHECK(write_of(recv) == SIGSEGV);
  be->release(send);
  be->release(recv);
  be->release(other);
}

TEST_CASE("host-access comm: collective pins nest over a shared buffer and all go at completion", "[comm][strict]") {
  auto be = device::make_strict_cpu_backend("fp32");
  HeldRequests inner;
  comm::HostAccessComm c(inner, *be);
  Buf grads = be->alloc(8192, DType::f32);
  be->zero(grads);
  // In place: recv is send's own block, so two pins cover the same pages; the request and a second
  // send of part of it overlap as well.
  Request rs = c.ireduce_scatter(grads, grads.at(0, 4096), comm::ReduceOp::sum);
  Request s = c.isend(grads.at(4096, 4096), 1, 0);
  CHECK(read_of(grads) == 0);
  inner.done = true;
  s.wait();
  CHECK(read_of(grads) == 0);  // still the reduce-scatter's
  rs.wait();
  CHECK(read_of(grads) == SIGSEGV);
  // A request already complete when it is started pins nothing (LocalComm's blocking default).
  comm::LocalComm local;
  comm::HostAccessComm lc(local, *be);
  Request done = lc.iall_gather(grads, grads);
  CHECK_FALSE(done.pending());
  CHECK(read_of(grads) == SIGSEGV);
  be->release(grads);
}
