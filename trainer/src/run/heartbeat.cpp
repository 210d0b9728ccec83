#include "heartbeat.hpp"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <random>
#include <thread>

#include "meshrun/comm/wait_state.hpp"

namespace meshrun::train::cli {

namespace {

using comm::steady_seconds;

constexpr std::uint32_t kMagic = 0x4d524842;  // "MRHB"
constexpr double kInterval = 1.0;             // seconds between beats
constexpr int kNameLen = 64;

enum : std::int32_t { kBeat = 0, kHello = 1, kBye = 2 };

// One datagram; both ends are this program, so a fixed layout in host order is enough (checked by
// magic, size and the job token).
struct Beat {
  std::uint32_t magic = kMagic;
  std::uint32_t job = 0;  // rank 0's random token: strays from other jobs are ignored
  std::int32_t kind = kBeat;
  std::int32_t rank = 0;
  std::int32_t step = 0;
  std::int32_t peer = -1;
  float wait_s = -1;  // < 0: not in a communication wait
  char op[16] = {};
  char group[8] = {};
};

void copy_name(char* dst, std::size_t n, const char* src) {
  std::snprintf(dst, n, "%s", src ? src : "");
}

std::string host_name() {
  char h[256] = "?";
  ::gethostname(h, sizeof h - 1);
  return h;
}

std::string seconds_text(double s) {
  char b[32];
  std::snprintf(b, sizeof b, "%.0f s", s);
  return b;
}

// "waits in recv from rank 3 (pp) for 29 s at step 57" / "at step 57, not in a communication wait"
std::string state_text(const Beat& b) {
  std::string s;
  if (b.wait_s >= 0) {
    s = std::string("waits in ") + b.op + (b.peer >= 0 ? " " + std::string(std::strcmp(b.op, "send") ? "from" : "to") +
                                                             " rank " + std::to_string(b.peer)
                                                       : std::string()) +
        " (" + b.group + ") for " + seconds_text(b.wait_s);
  } else {
    s = "not in a communication wait";
  }
  return s + (b.step > 0 ? " at step " + std::to_string(b.step) : std::string(" in set-up"));
}

std::atomic<Heartbeat::Impl*> g_monitor{nullptr};  // rank 0's, for the step watchdog's picture

}  // namespace

std::string node_name() {
  const char* n = std::getenv("SLURMD_NODENAME");
  return n && *n ? n : host_name();
}

std::string describe_rank(int rank, const RankPlace& p) {
  return "rank " + std::to_string(rank) + " on node " + p.node + " (" + (p.host != p.node ? "host " + p.host + ", " : "") +
         "pp " + std::to_string(p.coord.pp) + " dp " + std::to_string(p.coord.dp) + " tp " + std::to_string(p.coord.tp) +
         " cp " + std::to_string(p.coord.cp) + ")";
}

std::vector<RankPlace> gather_places(MPI_Comm world, const RankGrid& grid) {
  int size = 1;
  MPI_Comm_size(world, &size);
  char mine[2 * kNameLen] = {};
  copy_name(mine, kNameLen, node_name().c_str());
  copy_name(mine + kNameLen, kNameLen, host_name().c_str());
  std::vector<char> all(static_cast<std::size_t>(size) * 2 * kNameLen);
  MPI_Allgather(mine, 2 * kNameLen, MPI_CHAR, all.data(), 2 * kNameLen, MPI_CHAR, world);
  std::vector<RankPlace> places(static_cast<std::size_t>(size));
  for (int r = 0; r < size; ++r) {
    const char* p = all.data() + static_cast<std::size_t>(r) * 2 * kNameLen;
    places[r] = {std::string(p, strnlen(p, kNameLen)), std::string(p + kNameLen, strnlen(p + kNameLen, kNameLen)),
                 grid.coords(r)};
  }
  return places;
}

struct Heartbeat::Impl {
  int rank = 0, size = 1;
  std::vector<RankPlace> places;
  double timeout = 0;
  std::uint32_t job = 0;
  int fd = -1;
  sockaddr_in monitor{};                  // rank 0's address (other ranks)
  std::vector<sockaddr_in> peers;         // every rank's address (rank 0)
  std::vector<char> known;                // rank 0: a beat came from it
  std::vector<char> gone;                 // said goodbye
  std::vector<double> last_heard;         // steady seconds
  std::vector<Beat> last_beat;
  std::mutex mu;                          // last_* and gone, read by the step watchdog's picture()
  std::atomic<int> step{0};
  std::atomic<bool> stop{false};
  std::thread thread;
  std::function<std::string()> check;   // watch(), under mu
  std::function<void()> before_exit;
  std::string status;
  bool on = false;

  Beat make(std::int32_t kind) const {
    Beat b;
    b.job = job;
    b.kind = kind;
    b.rank = rank;
    b.step = step.load();
    const comm::WaitInfo w = comm::current_wait();
    if (w.op) {
      b.wait_s = static_cast<float>(steady_seconds() - w.since_s);
      b.peer = w.peer;
      copy_name(b.op, sizeof b.op, w.op);
      copy_name(b.group, sizeof b.group, w.group);
    }
    return b;
  }
  void send_to(const Beat& b, const sockaddr_in& a) const {
    (void)::sendto(fd, &b, sizeof b, MSG_DONTWAIT, reinterpret_cast<const sockaddr*>(&a), sizeof a);
  }
  void send_all(std::int32_t kind) {
    const Beat b = make(kind);
    if (rank != 0) {
      send_to(b, monitor);
      return;
    }
    for (int r = 1; r < size; ++r)
      if (known[r]) send_to(b, peers[r]);
  }
  // Reads every waiting datagram.
  void drain() {
    for (;;) {
      Beat b;
      sockaddr_in from{};
      socklen_t len = sizeof from;
      const ssize_t n = ::recvfrom(fd, &b, sizeof b, MSG_DONTWAIT, reinterpret_cast<sockaddr*>(&from), &len);
      if (n < 0) return;
      if (n != static_cast<ssize_t>(sizeof b) || b.magic != kMagic || b.job != job || b.rank < 0 || b.rank >= size) continue;
      b.op[sizeof b.op - 1] = b.group[sizeof b.group - 1] = 0;
      const std::lock_guard<std::mutex> lock(mu);
      const int r = rank == 0 ? b.rank : 0;
      if (rank == 0 && b.rank == 0) continue;
      if (rank != 0 && b.rank != 0) continue;
      if (rank == 0) {
        peers[r] = from;
        if (b.kind == kHello) send_to(make(kHello), from);  // the hand-shake's answer (each time: it may be lost)
        known[r] = 1;
      }
      last_heard[r] = steady_seconds();
      last_beat[r] = b;
      if (b.kind == kBye) gone[r] = 1;
    }
  }

  // Every rank's last word, as seen from rank 0 (its own state is current), except `skip`.
  std::string picture(int skip) {
    std::string s;
    const double now = steady_seconds();
    const std::lock_guard<std::mutex> lock(mu);
    for (int r = 0; r < size; ++r) {
      if (r == skip) continue;
      const Beat b = r == rank ? make(kBeat) : last_beat[r];
      if (!s.empty()) s += "; ";
      s += "rank " + std::to_string(r) + " " + (gone[r] ? std::string("finished") : state_text(b));
      if (r != rank && !gone[r]) s += " (heard " + seconds_text(now - last_heard[r]) + " ago)";
    }
    return s;
  }

  [[noreturn]] void name_silent(int silent, double silence) {
    std::string line = "meshrun-train: " + describe_rank(silent, places[silent]) + " sent no heartbeat for " +
                       seconds_text(silence) + " (limit " + seconds_text(timeout) +
                       "): the process is stopped or frozen (SIGSTOP, a debugger, a hung node), not computing";
    if (rank == 0) {
      line += "; the others: " + picture(silent) + "; ending the job";
    } else {
      line += " (rank 0 is the heartbeat monitor); this rank, " + std::to_string(rank) + ", " +
              state_text(make(kBeat)) + "; ending this rank";
    }
    std::fprintf(stderr, "%s\n", line.c_str());
    std::fflush(stderr);
    ::_exit(1);
  }

  [[noreturn]] void name_problem(const std::string& what, const std::function<void()>& last) {
    const std::string line = "meshrun-train: " + describe_rank(rank, places[rank]) + ": " + what + " while it " +
                             state_text(make(kBeat)) + "; ending this rank";
    std::fprintf(stderr, "%s\n", line.c_str());
    std::fflush(stderr);
    if (last) last();
    ::_exit(1);
  }

  void run() {
    double last_sent = 0;
    while (!stop.load()) {
      pollfd p{fd, POLLIN, 0};
      (void)::poll(&p, 1, 100);
      drain();
      const double now = steady_seconds();
      if (now - last_sent >= kInterval) {
        send_all(kBeat);
        last_sent = now;
        std::function<std::string()> poll;
        std::function<void()> last;
        {
          const std::lock_guard<std::mutex> lock(mu);
          poll = check;
          last = before_exit;
        }
        if (poll)
          if (const std::string problem = poll(); !problem.empty()) name_problem(problem, last);
      }
      int silent = -1;
      double silence = 0;
      {
        const std::lock_guard<std::mutex> lock(mu);
        for (int r = 0; r < size; ++r) {
          if (r == rank || (rank != 0 && r != 0) || gone[r]) continue;
          if (now - last_heard[r] > timeout) {
            silent = r;
            silence = now - last_heard[r];
            break;
          }
        }
      }
      if (silent >= 0) name_silent(silent, silence);
    }
  }
};

Heartbeat::Heartbeat(MPI_Comm world, std::vector<RankPlace> places, double timeout_s) : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  MPI_Comm_rank(world, &m.rank);
  MPI_Comm_size(world, &m.size);
  m.places = std::move(places);
  m.timeout = timeout_s;
  m.peers.resize(m.size);
  m.known.assign(m.size, 0);
  m.gone.assign(m.size, 0);
  m.last_heard.assign(m.size, steady_seconds());
  m.last_beat.resize(m.size);
  if (timeout_s <= 0) {
    m.status = "heartbeat: off (MESHRUN_HEARTBEAT_TIMEOUT_S = 0)";
    return;
  }
  if (m.size == 1) {
    m.status = "heartbeat: off (one rank)";
    return;
  }
  // Rank 0's socket and port, and a job token, to everyone.
  std::string why;
  m.fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  sockaddr_in any{};
  any.sin_family = AF_INET;
  any.sin_addr.s_addr = htonl(INADDR_ANY);
  if (m.fd < 0 || ::bind(m.fd, reinterpret_cast<sockaddr*>(&any), sizeof any) != 0)
    why = "rank " + std::to_string(m.rank) + " cannot open a UDP socket (" + std::strerror(errno) + ")";
  std::uint32_t hdr[2] = {0, 0};  // port, job
  if (m.rank == 0 && why.empty()) {
    sockaddr_in me{};
    socklen_t len = sizeof me;
    ::getsockname(m.fd, reinterpret_cast<sockaddr*>(&me), &len);
    hdr[0] = ntohs(me.sin_port);
    hdr[1] = std::random_device{}() | 1u;
  }
  MPI_Bcast(hdr, 2, MPI_UINT32_T, 0, world);
  m.job = hdr[1];
  const std::string& monitor_host = m.places[0].host;
  if (m.rank != 0 && why.empty()) {
    addrinfo want{};
    want.ai_family = AF_INET;
    want.ai_socktype = SOCK_DGRAM;
    addrinfo* res = nullptr;
    if (hdr[0] == 0 || ::getaddrinfo(monitor_host.c_str(), nullptr, &want, &res) != 0 || !res) {
      why = "rank " + std::to_string(m.rank) + " cannot resolve rank 0's host " + monitor_host;
    } else {
      std::memcpy(&m.monitor, res->ai_addr, sizeof m.monitor);
      m.monitor.sin_port = htons(static_cast<std::uint16_t>(hdr[0]));
      ::freeaddrinfo(res);
    }
  }
  // Hand-shake: every rank says hello until rank 0 has answered it (3 s at most), so a blocked port is
  // found here, not as a false "stopped" later.
  int ok = why.empty() ? 1 : 0, all = 0;
  MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, world);
  if (all) {
    const double t0 = steady_seconds();
    bool answered = m.rank == 0;
    int heard = 0;
    while (steady_seconds() - t0 < 3.0) {
      if (m.rank != 0 && !answered) m.send_to(m.make(kHello), m.monitor);
      pollfd p{m.fd, POLLIN, 0};
      (void)::poll(&p, 1, 20);
      m.drain();
      if (m.rank == 0) {
        heard = 0;
        for (int r = 1; r < m.size; ++r) heard += m.known[r];
        if (heard == m.size - 1) break;
      } else if (m.last_beat[0].kind == kHello && m.last_beat[0].magic == kMagic && m.last_beat[0].job == m.job) {
        answered = true;
        break;
      }
    }
    if (!answered) why = "rank " + std::to_string(m.rank) + " got no answer from rank 0's UDP port " +
                         std::to_string(hdr[0]) + " on " + monitor_host + " within 3 s (a firewall?)";
    if (m.rank == 0 && heard < m.size - 1) why = "rank 0 heard " + std::to_string(heard) + " of " + std::to_string(m.size - 1) + " ranks within 3 s";
  } else if (why.empty()) {
    why = "another rank could not set it up";
  }
  ok = why.empty() ? 1 : 0;
  MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, world);
  if (!all) {
    if (why.empty()) why = "another rank could not set it up";
    m.status = "heartbeat: off (" + why + "); a stopped rank is found by the step watchdog only";
    if (m.fd >= 0) ::close(m.fd);
    m.fd = -1;
    return;
  }
  m.last_heard.assign(m.size, steady_seconds());
  m.on = true;
  char b[256];
  std::snprintf(b, sizeof b, "heartbeat: every %.0f s over UDP to rank 0 on %s port %u; a rank silent for %.0f s is "
                "named and ends the job (MESHRUN_HEARTBEAT_TIMEOUT_S)", kInterval, monitor_host.c_str(), hdr[0], timeout_s);
  m.status = b;
  if (m.rank == 0) g_monitor = impl_.get();
  m.thread = std::thread([&m] { m.run(); });
}

Heartbeat::~Heartbeat() {
  Impl& m = *impl_;
  if (g_monitor.load() == impl_.get()) g_monitor = nullptr;
  if (!m.on) return;
  m.stop = true;
  m.thread.join();
  for (int i = 0; i < 3; ++i) m.send_all(kBye);  // datagrams may be lost: three
  ::close(m.fd);
}

void Heartbeat::set_step(int step) { impl_->step = step; }
void Heartbeat::watch(std::function<std::string()> check, std::function<void()> before_exit) {
  const std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->check = std::move(check);
  impl_->before_exit = std::move(before_exit);
}
bool Heartbeat::on() const { return impl_->on; }
const std::string& Heartbeat::status() const { return impl_->status; }

double heartbeat_timeout_from_env() {
  const char* v = std::getenv("MESHRUN_HEARTBEAT_TIMEOUT_S");
  return v && *v ? std::atof(v) : 30.0;
}

std::string heartbeat_picture() {
  Heartbeat::Impl* m = g_monitor.load();
  return m ? m->picture(-1) : std::string();
}

}  // namespace meshrun::train::cli
