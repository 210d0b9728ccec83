// meshrun-preflight: the measuring side of `meshrun preflight`, one MPI process per task of the job's geometry
// (srun --mpi=pmix, or mpirun). `meshrun preflight` execs it, so the meshrun CLI itself does not load MPI.
//
// Every task checks its CPU binding against the rank map; one task per node (its leader) checks the node's
// GPUs, NICs and CPUs; every task runs a GEMM probe with the trainer's CPU kernels; the leaders measure
// point-to-point bandwidth around a ring of nodes and an all-reduce. Probes of nodes that share a machine (the
// local cluster's four slurmd) run one node at a time, so they do not compete for its cores; nodes on separate
// machines run at once. Waiting tasks sleep between polls instead of spinning in MPI. Rank 0 judges
// (preflight_core.cpp) and prints. A watchdog ends a run that stops making progress, naming what it waited for.
#include <mpi.h>
#include <sched.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "config_flags.hpp"
#include "launch_common.hpp"
#include "meshrun/hostlist.hpp"
#include "meshrun/kernels/cpu.hpp"
#include "meshrun/site_policy.hpp"
#include "meshrun/task_env.hpp"
#include "meshrun/topology.hpp"
#include "meshrun/version.hpp"
#include "preflight_core.hpp"

extern char** environ;

namespace {

using namespace meshrun;
using preflight::Check;
using preflight::Status;
using Clock = std::chrono::steady_clock;

const char* kHelp =
    "usage: meshrun preflight [TEMPLATE.toml] [options]\n"
    "\n"
    "Checks the nodes of an allocation before a long job, as a step with the job's geometry (one task per GPU\n"
    "slot, as the rank map says): per node its GPUs, NICs and CPUs against the layout, each task's CPU binding\n"
    "against the rank map, a GEMM throughput probe per device (the trainer's CPU kernels), point-to-point\n"
    "bandwidth around a ring of nodes and an all-reduce over one task per node (MPI). Figures are judged against\n"
    "the site file's site.preflight_gemm_gflops / preflight_p2p_gbs / preflight_allreduce_gbs where set, else\n"
    "against the allocation's median. Prints a table, then 'failing nodes: HOSTLIST' (for srun --exclude) or\n"
    "'all N nodes passed', and the time taken.\n"
    "\n"
    "options:\n"
    "  --min-fraction F       a node fails below F × the reference (default 0.5; 0 < F ≤ 1)\n"
    "  --topology FILE.xml    the node topology the layout expects (default $MESHRUN_TOPOLOGY_XML; else the\n"
    "                         node type of [cluster]); the live node is read with hwloc\n"
    "  --timeout S            give up after S seconds, naming what did not answer (default 45)\n"
    "%s"
    "\n"
    "examples:\n"
    "  srun --mpi=pmix -N4 --ntasks-per-node=8 meshrun exec --template job.toml -- meshrun preflight job.toml\n"
    "  mpirun -np 2 meshrun exec --template t.toml -- meshrun preflight t.toml\n"
    "  meshrun sbatch job.toml --preflight      # the batch script runs it before the job step\n"
    "\n"
    "exit status: 0 every node passed; 1 a node failed (or did not answer); 2 bad input (one line on stderr)\n";

constexpr int kRounds = 3;              // each probe runs this many times per device/link; the best counts
constexpr double kWindow = 0.1;         // seconds per probe and round
constexpr int kGemm = 256;              // fp32 x[256,256] · W[256,256]ᵀ: 33.6 MFLOP per call
constexpr size_t kMessage = 4u << 20;   // bytes per point-to-point message and per all-reduce
constexpr int kTagArrive = 7101, kTagGo = 7102, kTagCount = 7103, kTagData = 7104;

struct Args {
  ConfigRequest req;
  double min_fraction = 0.5;
  std::string topology_xml;
  double timeout_s = 45;
};

// The rank this process has before MPI is up (for printing bad input once): -1 when not launched as a task.
int launcher_rank(const std::map<std::string, std::string>& env) {
  for (const char* name : {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "SLURM_PROCID"}) {
    auto it = env.find(name);
    if (it != env.end() && !it->second.empty()) return std::atoi(it->second.c_str());
  }
  return -1;
}

int bad_input(const std::string& msg, int rank) {
  if (rank <= 0) std::fputs(message_lines("meshrun preflight: ", msg).c_str(), stderr);
  return 2;
}

// ---- the watchdog: what the main thread waits for, printed if it waits too long ----
struct Watchdog {
  std::mutex m;
  std::condition_variable cv;
  std::string what = "MPI start-up (MPI_Init)";
  std::string who;
  std::string missing;  // the nodes rank 0 waits for at a barrier, as a hostlist; "" when unknown
  bool done = false;
  std::thread thread;

  void set(const std::string& w, const std::string& nodes = "") {
    std::lock_guard<std::mutex> lock(m);
    what = w;
    missing = nodes;
  }
  void set_who(const std::string& w) {
    std::lock_guard<std::mutex> lock(m);
    who = w;
  }
  void start(double seconds) {
    thread = std::thread([this, seconds] {
      std::unique_lock<std::mutex> lock(m);
      if (cv.wait_for(lock, std::chrono::duration<double>(seconds), [this] { return done; })) return;
      std::fprintf(stderr, "meshrun preflight: %s: no result after %.0f s, waiting for %s; a node is stopped, hung or "
                   "very slow\n", who.c_str(), seconds, what.c_str());
      if (!missing.empty()) std::fprintf(stderr, "failing nodes: %s\n", missing.c_str());
      std::fflush(stderr);
      std::_Exit(1);
    });
  }
  void stop() {
    {
      std::lock_guard<std::mutex> lock(m);
      done = true;
    }
    cv.notify_all();
    if (thread.joinable()) thread.join();
  }
  ~Watchdog() { stop(); }
};
Watchdog g_watch;

void nap() {
  timespec ts{0, 200000};  // 0.2 ms: a waiting task polls MPI without taking a core from the probes
  nanosleep(&ts, nullptr);
}

struct World {
  int rank = 0, size = 1;
  std::vector<std::string> node_of_rank;  // node name per rank
  std::vector<std::string> host_of_rank;  // machine (gethostname) per rank
  std::vector<std::string> nodes;         // in order of their first rank
  std::vector<int> node_index;            // per rank
  std::vector<int> leader;                // first rank per node
  int my_node = 0;
  bool is_leader() const { return leader[static_cast<size_t>(my_node)] == rank; }
};

// ---- who is stuck: rank 0 asks the ranks it waits for, which answer while they wait themselves ----
// A rank that waits for a stopped peer looks as unresponsive as the stopped one from rank 0's barrier. So every
// wait polls: the other ranks answer rank 0's question "what are you waiting for?" (a peer's rank, or -1:
// nothing but the barrier or a collective), and rank 0, after kAskAfter of waiting, asks the ranks it waits
// for and follows their answers; a rank that does not answer within a second is the one named.
constexpr int kTagQuery = 7105, kTagReply = 7106;
constexpr double kAskAfter = 2.0;

struct Health {
  const World* w = nullptr;
  // the others: the posted receive for rank 0's question, and the answers sent
  MPI_Request query = MPI_REQUEST_NULL;
  int query_buf = 0;
  std::vector<std::pair<MPI_Request, std::unique_ptr<int>>> answers;
  // rank 0: the posted receive for answers, and the questions sent
  MPI_Request answer = MPI_REQUEST_NULL;
  int answer_buf = 0;
  MPI_Status answer_status{};
  std::vector<std::pair<MPI_Request, std::unique_ptr<int>>> questions;
  std::map<int, Clock::time_point> asked;   // rank -> when asked (this wait)
  std::map<int, int> said;                  // rank -> its answer (this wait)

  void begin(const World& world) {
    w = &world;
    if (w->size == 1) return;
    if (w->rank == 0) MPI_Irecv(&answer_buf, 1, MPI_INT, MPI_ANY_SOURCE, kTagReply, MPI_COMM_WORLD, &answer);
    else MPI_Irecv(&query_buf, 1, MPI_INT, 0, kTagQuery, MPI_COMM_WORLD, &query);
  }
  // Not rank 0: answers a question that arrived. `waiting_for` = the peer this rank waits for, -1 none.
  void serve(int waiting_for) {
    if (query == MPI_REQUEST_NULL) return;
    int done = 0;
    MPI_Test(&query, &done, MPI_STATUS_IGNORE);
    if (!done) return;
    answers.emplace_back(MPI_REQUEST_NULL, std::make_unique<int>(waiting_for));
    MPI_Isend(answers.back().second.get(), 1, MPI_INT, 0, kTagReply, MPI_COMM_WORLD, &answers.back().first);
    MPI_Irecv(&query_buf, 1, MPI_INT, 0, kTagQuery, MPI_COMM_WORLD, &query);
  }
  // Rank 0, waiting for `waiting_on` since `since`: asks, reads answers, and returns the ranks that do not answer
  // (followed through the answers: a rank waiting for another adds that one).
  std::vector<int> suspects(std::set<int> waiting_on, Clock::time_point since) {
    const auto now = Clock::now();
    std::vector<int> out;
    if (answer == MPI_REQUEST_NULL || std::chrono::duration<double>(now - since).count() < kAskAfter) return out;
    for (int done = 1; done;) {  // read every answer that came
      MPI_Test(&answer, &done, &answer_status);
      if (!done) break;
      said[answer_status.MPI_SOURCE] = answer_buf;
      MPI_Irecv(&answer_buf, 1, MPI_INT, MPI_ANY_SOURCE, kTagReply, MPI_COMM_WORLD, &answer);
    }
    for (bool grew = true; grew;) {  // ranks the waited-for ranks wait for
      grew = false;
      for (int r : std::set<int>(waiting_on))
        if (auto it = said.find(r); it != said.end() && it->second > 0 && !waiting_on.count(it->second))
          grew = waiting_on.insert(it->second).second || grew;
    }
    for (int r : waiting_on) {
      if (r <= 0 || r >= w->size) continue;
      auto it = asked.find(r);
      if (it == asked.end()) {  // ask once per wait
        asked[r] = now;
        questions.emplace_back(MPI_REQUEST_NULL, std::make_unique<int>(1));
        MPI_Isend(questions.back().second.get(), 1, MPI_INT, r, kTagQuery, MPI_COMM_WORLD, &questions.back().first);
      } else if (!said.count(r) && std::chrono::duration<double>(now - it->second).count() > 1.0) {
        out.push_back(r);  // asked more than a second ago, no answer
      }
    }
    return out;
  }
  void reset_wait() {
    asked.clear();
    said.clear();
  }
  void end() {
    for (MPI_Request* r : {&query, &answer})
      if (*r != MPI_REQUEST_NULL) {
        MPI_Cancel(r);
        MPI_Wait(r, MPI_STATUS_IGNORE);
      }
    for (auto* list : {&answers, &questions})
      for (auto& [req, buf] : *list) MPI_Wait(&req, MPI_STATUS_IGNORE);
  }
};
Health g_health;

// The watchdog's text when rank 0 knows whom it waits for and who does not answer.
void note_suspects(const World& w, const std::string& phase, const std::vector<int>& suspects) {
  if (suspects.empty()) return;
  std::set<std::string> where;
  for (int r : suspects) where.insert(w.node_of_rank[static_cast<size_t>(r)]);
  std::vector<std::string> names(where.begin(), where.end());
  const std::string hosts = compress_hostlist(names);
  g_watch.set(phase + ": no answer from rank(s) " + preflight::rank_list(suspects) + " on " + hosts, hosts);
}

// Waits for `reqs`, answering rank 0 (the others) or asking the ranks in `waiting_on` (rank 0). Spins for the
// first 50 ms (the probes' own transfers), then sleeps between polls.
void wait_all(const World& w, std::vector<MPI_Request>& reqs, const std::set<int>& waiting_on, int waiting_for,
              const std::string& phase) {
  const auto since = Clock::now();
  g_health.reset_wait();
  for (;;) {
    int done = 0;
    MPI_Testall(static_cast<int>(reqs.size()), reqs.data(), &done, MPI_STATUSES_IGNORE);
    if (done) return;
    if (w.rank == 0) {
      note_suspects(w, phase, g_health.suspects(waiting_on, since));
    } else {
      g_health.serve(waiting_for);
    }
    if (Clock::now() - since > std::chrono::milliseconds(50)) nap();
  }
}

// A barrier through rank 0 that sleeps while it waits; rank 0 knows who has not arrived, asks them what they
// wait for, and the watchdog names the ranks that do not answer and their nodes.
void gate(const World& w, const std::string& phase) {
  if (w.size == 1) return;
  static int token = 1, release = 0;  // what a rank sends, and where it receives the release
  if (w.rank != 0) {
    g_watch.set(phase + " (the release from rank 0)");
    std::vector<MPI_Request> r(2);
    MPI_Isend(&token, 1, MPI_INT, 0, kTagArrive, MPI_COMM_WORLD, &r[0]);
    MPI_Irecv(&release, 1, MPI_INT, 0, kTagGo, MPI_COMM_WORLD, &r[1]);
    const auto since = Clock::now();
    for (;;) {
      int done = 0;
      MPI_Testall(2, r.data(), &done, MPI_STATUSES_IGNORE);
      if (done) return;
      g_health.serve(-1);
      if (Clock::now() - since > std::chrono::milliseconds(5)) nap();
    }
  }
  g_watch.set(phase);
  std::vector<MPI_Request> reqs(static_cast<size_t>(w.size - 1));
  std::vector<int> got(reqs.size());
  for (int r = 1; r < w.size; ++r)
    MPI_Irecv(&got[static_cast<size_t>(r - 1)], 1, MPI_INT, r, kTagArrive, MPI_COMM_WORLD, &reqs[static_cast<size_t>(r - 1)]);
  std::vector<bool> arrived(reqs.size(), false);
  size_t left = reqs.size();
  const auto since = Clock::now();
  auto last_note = since;
  g_health.reset_wait();
  std::vector<int> idx(reqs.size());
  while (left > 0) {
    int outcount = 0;
    MPI_Testsome(static_cast<int>(reqs.size()), reqs.data(), &outcount, idx.data(), MPI_STATUSES_IGNORE);
    if (outcount == MPI_UNDEFINED) break;
    for (int k = 0; k < outcount; ++k) {
      arrived[static_cast<size_t>(idx[static_cast<size_t>(k)])] = true;
      --left;
    }
    if (left == 0) break;
    if (Clock::now() - last_note > std::chrono::milliseconds(250)) {
      last_note = Clock::now();
      std::set<int> missing;
      for (size_t i = 0; i < arrived.size(); ++i)
        if (!arrived[i]) missing.insert(static_cast<int>(i) + 1);
      const std::vector<int> suspects = g_health.suspects(missing, since);
      if (suspects.empty()) {
        std::set<std::string> where;
        for (int r : missing) where.insert(w.node_of_rank[static_cast<size_t>(r)]);
        g_watch.set(phase + ": waiting for rank(s) " + preflight::rank_list({missing.begin(), missing.end()}) + " on " +
                    compress_hostlist({where.begin(), where.end()}));
      }
      note_suspects(w, phase, suspects);
    }
    if (Clock::now() - since > std::chrono::milliseconds(5)) nap();
  }
  std::vector<MPI_Request> sends(reqs.size());
  for (int r = 1; r < w.size; ++r)
    MPI_Isend(&token, 1, MPI_INT, r, kTagGo, MPI_COMM_WORLD, &sends[static_cast<size_t>(r - 1)]);
  MPI_Waitall(static_cast<int>(sends.size()), sends.data(), MPI_STATUSES_IGNORE);
}

// ---- local checks ----

// The CPUs the task's cgroup allows (cpuset; v2 then v1), empty when unknown (= the whole node).
CpuSet cgroup_cpus() {
  std::ifstream in("/proc/self/cgroup");
  std::string line;
  std::vector<std::string> candidates;
  while (std::getline(in, line)) {
    const size_t a = line.find(':'), b = line.find(':', a + 1);
    if (a == std::string::npos || b == std::string::npos) continue;
    const std::string controllers = line.substr(a + 1, b - a - 1), path = line.substr(b + 1);
    if (line.compare(0, a, "0") == 0 && controllers.empty()) {
      for (std::string p = path;; p = p.substr(0, p.rfind('/'))) {  // the nearest cgroup with a cpuset
        candidates.push_back("/sys/fs/cgroup" + (p == "/" ? std::string() : p) + "/cpuset.cpus.effective");
        if (p.empty() || p == "/") break;
      }
    } else if (("," + controllers + ",").find(",cpuset,") != std::string::npos) {
      candidates.insert(candidates.begin(), "/sys/fs/cgroup/cpuset" + (path == "/" ? std::string() : path) + "/cpuset.effective_cpus");
    }
  }
  for (const auto& file : candidates) {
    std::ifstream f(file);
    std::string text;
    if (f && std::getline(f, text) && !text.empty())
      if (auto set = parse_cpuset(text)) return *set;
  }
  return {};
}

CpuSet affinity() {
  CpuSet s;
  cpu_set_t mask;
  CPU_ZERO(&mask);
  if (sched_getaffinity(0, sizeof mask, &mask) == 0)
    for (int c = 0; c < CPU_SETSIZE; ++c)
      if (CPU_ISSET(c, &mask)) s.cpus.push_back(c);
  return s;
}

bool subset(const CpuSet& a, const CpuSet& b) {
  return std::includes(b.cpus.begin(), b.cpus.end(), a.cpus.begin(), a.cpus.end());
}

// This task's binding against the rank map's CPU list, computed the way `meshrun exec` computes it (mpirun's or
// Slurm's variables, the topology, the site policy), with the cgroup's CPUs as the allowed set. PASS when the
// task runs on CPUs the map gives it (and exactly those the launcher bound, MESHRUN_CPUS, where one did).
Check binding_check(const launch::Resolved& r, const RankMap& map, const std::map<std::string, std::string>& env,
                    const NodeTopology& topo, int rank) {
  Check c{"binding", "", Status::fail, ""};
  auto get = [&](const char* name) -> const std::string* {
    auto it = env.find(name);
    return it == env.end() || it->second.empty() ? nullptr : &it->second;
  };
  TaskEnv task;
  try {
    EnvInputs inputs = env_inputs(r.cfg);
    CpuSet allowed = cgroup_cpus();
    if (get("OMPI_COMM_WORLD_RANK")) {
      TaskContext ctx = launch::context_from_mpirun(env);
      ctx.allowed_cpus = allowed;
      ctx.master_addr = ctx.local_world == ctx.world ? "127.0.0.1"
                        : !r.cluster.hosts.empty() ? r.cluster.hosts.front() : std::string("localhost");
      task = compute_task_env(map, ctx, topo, gpu_allocation_from_slurm(env), inputs.policy, inputs.user_env);
    } else {
      task = task_env_from_slurm(map, env, topo, inputs.policy, inputs.user_env, allowed);
    }
  } catch (const std::exception& e) {
    c.figure = "rank " + std::to_string(rank);
    c.verdict = std::string("the map's environment cannot be computed here: ") + e.what();
    return c;
  }
  const CpuSet actual = affinity();
  c.figure = "rank " + std::to_string(rank) + ": CPUs " + actual.str();
  if (task.cpus.empty()) {
    c.status = Status::skipped;
    c.verdict = "skipped: the map binds rank " + std::to_string(rank) + " to no CPU set (site cpu_bind = none, or the "
                "launcher's choice stands)";
    return c;
  }
  const std::string* bound = get("MESHRUN_CPUS");
  std::optional<CpuSet> launcher = bound ? parse_cpuset(*bound) : std::nullopt;
  if (actual.empty() || !subset(actual, task.cpus)) {
    c.verdict = "rank " + std::to_string(rank) + " runs on CPUs " + actual.str() + ", the map says " + task.cpus.str() +
                (get("MESHRUN_LAYOUT") ? "" : " (not started through meshrun exec or the plugin, which bind it)");
    return c;
  }
  if (launcher && *launcher != actual) {
    c.verdict = "rank " + std::to_string(rank) + " runs on CPUs " + actual.str() + " but its launcher bound it to " +
                *bound + " (something rebound it)";
    return c;
  }
  c.status = Status::pass;
  return c;
}

std::string plural(int n, const char* word) { return std::to_string(n) + " " + word + (n == 1 ? "" : "s"); }

// The node's GPUs, NICs and CPUs (live, hwloc) against what the layout expects: the expected topology when one
// is named (--topology / $MESHRUN_TOPOLOGY_XML), else the node type, and one CPU per rank at least.
std::vector<Check> node_checks(const NodeTopology& live, const NodeTopology* expected, const Cluster& cluster,
                               int ranks_here) {
  std::vector<Check> out;
  {
    Check c{"gpus", "", Status::pass, ""};
    const int have = static_cast<int>(live.gpus.size());
    const int want = expected ? static_cast<int>(expected->gpus.size()) : ranks_here;
    if (have == 0) {
      c.status = Status::skipped;
      c.figure = "0 (the layout places " + plural(ranks_here, "rank") + " here)";
      c.verdict = "skipped: no GPU on this node";
    } else {
      c.figure = plural(have, "GPU") + (have ? " (" + live.gpus.front().model + ")" : "");
      if (have < ranks_here) {
        c.status = Status::fail;
        c.verdict = "the layout places " + plural(ranks_here, "rank") + " (one per GPU) here";
      } else if (expected && have != want) {
        c.status = Status::fail;
        c.verdict = "the expected topology has " + plural(want, "GPU");
      }
    }
    out.push_back(c);
  }
  {
    Check c{"nics", "", Status::pass, ""};
    const int have = static_cast<int>(live.nics.size());
    const int want = expected ? static_cast<int>(expected->nics.size()) : cluster.type.nics_per_node;
    if (have == 0) {
      c.status = Status::skipped;
      c.figure = want > 0 ? "0 (" + std::to_string(want) + " expected)" : "0";
      c.verdict = "skipped: no NIC on this node";
    } else {
      std::string down;
      for (const auto& n : live.nics)
        if (n.port_state >= 0 && n.port_state != 4) down += (down.empty() ? "" : ", ") + n.name + " (port state " + std::to_string(n.port_state) + ")";
      c.figure = plural(have, "RDMA NIC");
      if (have < want) {
        c.status = Status::fail;
        c.verdict = "expected " + std::to_string(want);
      } else if (!down.empty()) {
        c.status = Status::fail;
        c.verdict = "not active: " + down;
      }
    }
    out.push_back(c);
  }
  {
    Check c{"cpus", "", Status::pass, ""};
    const int cpus = live.machine_cpus.count();
    c.figure = plural(cpus, "CPU") + " in " + plural(std::max(live.numa_nodes, 1), "NUMA node") + ", " +
               plural(ranks_here, "rank");
    if (cpus < ranks_here) {
      c.status = Status::fail;
      c.verdict = "fewer CPUs than ranks (each rank needs a core)";
    } else if (expected && (cpus != expected->machine_cpus.count() || live.numa_nodes != expected->numa_nodes)) {
      c.status = Status::fail;
      c.verdict = "the expected topology has " + plural(expected->machine_cpus.count(), "CPU") + " in " +
                  plural(expected->numa_nodes, "NUMA node");
    }
    out.push_back(c);
  }
  return out;
}

// ---- probes ----

double gemm_window() {
  using namespace meshrun::kernels::cpu;
  static std::vector<float> x(kGemm * kGemm), w(kGemm * kGemm), y(kGemm * kGemm);
  static bool init = false;
  if (!init) {
    for (size_t i = 0; i < x.size(); ++i) {
      x[i] = static_cast<float>((i * 7 % 13) - 6) / 8.0f;
      w[i] = static_cast<float>((i * 5 % 11) - 5) / 16.0f;
    }
    linear_forward<float>(y.data(), x.data(), w.data(), kGemm, kGemm, kGemm);  // warm caches and pages
    init = true;
  }
  const auto t0 = Clock::now();
  long calls = 0;
  double elapsed = 0;
  do {
    linear_forward<float>(y.data(), x.data(), w.data(), kGemm, kGemm, kGemm);
    ++calls;
    elapsed = std::chrono::duration<double>(Clock::now() - t0).count();
  } while (elapsed < kWindow);
  return 2.0 * kGemm * kGemm * kGemm * static_cast<double>(calls) / elapsed / 1e9;
}

// Leaders `a` (measures, decides the count) and `b` exchange kMessage-byte messages both ways for about one
// window. Returns GB/s each way on `a`, 0 on `b`.
double exchange(const World& w, int a, int b, std::vector<char>& out, std::vector<char>& in, const std::string& phase) {
  const int peer = w.rank == a ? b : a;
  const int n = static_cast<int>(kMessage);
  std::vector<MPI_Request> reqs(2);
  auto once = [&] {
    MPI_Irecv(in.data(), n, MPI_BYTE, peer, kTagData, MPI_COMM_WORLD, &reqs[0]);
    MPI_Isend(out.data(), n, MPI_BYTE, peer, kTagData, MPI_COMM_WORLD, &reqs[1]);
    wait_all(w, reqs, {peer}, peer, phase);
  };
  const auto t0 = Clock::now();
  once();  // also connects the pair
  once();
  const double one = std::chrono::duration<double>(Clock::now() - t0).count() / 2;
  static int count = 0;
  std::vector<MPI_Request> c(1);
  if (w.rank == a) {
    count = static_cast<int>(std::clamp(kWindow / std::max(one, 1e-6), 2.0, 4096.0));
    MPI_Isend(&count, 1, MPI_INT, b, kTagCount, MPI_COMM_WORLD, &c[0]);
  } else {
    MPI_Irecv(&count, 1, MPI_INT, a, kTagCount, MPI_COMM_WORLD, &c[0]);
  }
  wait_all(w, c, {peer}, peer, phase);
  const auto t1 = Clock::now();
  for (int i = 0; i < count; ++i) once();
  const double t = std::chrono::duration<double>(Clock::now() - t1).count();
  return w.rank == a ? static_cast<double>(kMessage) * count / t / 1e9 : 0;
}

// All-reduce bus bandwidth (2(n-1)/n · bytes / time, as nccl-tests reports it) over the leaders' communicator.
// Non-blocking collectives, so that waiting leaders still answer rank 0 (which asks the other leaders).
double allreduce_window(const World& w, MPI_Comm leaders, const std::string& phase) {
  int n = 1, me = 0;
  MPI_Comm_size(leaders, &n);
  MPI_Comm_rank(leaders, &me);
  std::set<int> others;
  for (int l : w.leader)
    if (l != w.rank) others.insert(l);
  static std::vector<float> send(kMessage / sizeof(float), 1.0f), recv(kMessage / sizeof(float));
  const int len = static_cast<int>(send.size());
  std::vector<MPI_Request> r(1);
  auto wait = [&] { wait_all(w, r, others, -1, phase); };
  auto allreduce = [&] {
    MPI_Iallreduce(send.data(), recv.data(), len, MPI_FLOAT, MPI_SUM, leaders, &r[0]);
    wait();
  };
  const auto t0 = Clock::now();
  allreduce();
  double one = std::chrono::duration<double>(Clock::now() - t0).count();
  MPI_Iallreduce(MPI_IN_PLACE, &one, 1, MPI_DOUBLE, MPI_MAX, leaders, &r[0]);
  wait();
  int count = static_cast<int>(std::clamp(kWindow / std::max(one, 1e-6), 2.0, 4096.0));
  MPI_Ibcast(&count, 1, MPI_INT, 0, leaders, &r[0]);
  wait();
  MPI_Ibarrier(leaders, &r[0]);
  wait();
  const auto t1 = Clock::now();
  for (int i = 0; i < count; ++i) allreduce();
  double t = std::chrono::duration<double>(Clock::now() - t1).count();
  MPI_Iallreduce(MPI_IN_PLACE, &t, 1, MPI_DOUBLE, MPI_MAX, leaders, &r[0]);
  wait();
  return 2.0 * (n - 1) / n * static_cast<double>(kMessage) * count / t / 1e9;
}

// ---- results to rank 0 ----
// Fields separated by \x1f; a process's record is its binding check, its GEMM figure and, on a leader, its
// node's checks and the links it measured.
struct Record {
  std::vector<std::string> f;
  size_t at = 0;
  void put(const std::string& s) { f.push_back(s); }
  void put(double v) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.17g", v);
    f.push_back(buf);
  }
  void put(const Check& c) {
    put(c.name);
    put(c.figure);
    put(std::to_string(static_cast<int>(c.status)));
    put(c.verdict);
  }
  std::string text() const {
    std::string out;
    for (const auto& s : f) out += s + '\x1f';
    return out;
  }
  static Record parse(const std::string& text) {
    Record r;
    std::string cur;
    for (char ch : text) {
      if (ch == '\x1f') {
        r.f.push_back(cur);
        cur.clear();
      } else {
        cur += ch;
      }
    }
    return r;
  }
  std::string str() { return at < f.size() ? f[at++] : std::string(); }
  double num() { return std::atof(str().c_str()); }
  Check check() {
    Check c;
    c.name = str();
    c.figure = str();
    c.status = static_cast<Status>(std::atoi(str().c_str()));
    c.verdict = str();
    return c;
  }
};

std::vector<std::string> gather_text(const std::string& mine, int rank, int size) {
  int len = static_cast<int>(mine.size());
  std::vector<int> lens(static_cast<size_t>(size)), offs(static_cast<size_t>(size));
  MPI_Gather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, 0, MPI_COMM_WORLD);
  std::string all;
  if (rank == 0) {
    int total = 0;
    for (int i = 0; i < size; ++i) {
      offs[static_cast<size_t>(i)] = total;
      total += lens[static_cast<size_t>(i)];
    }
    all.resize(static_cast<size_t>(total));
  }
  MPI_Gatherv(mine.data(), len, MPI_CHAR, all.data(), lens.data(), offs.data(), MPI_CHAR, 0, MPI_COMM_WORLD);
  std::vector<std::string> out;
  if (rank == 0)
    for (int i = 0; i < size; ++i)
      out.push_back(all.substr(static_cast<size_t>(offs[static_cast<size_t>(i)]), static_cast<size_t>(lens[static_cast<size_t>(i)])));
  return out;
}

std::vector<std::string> allgather_names(const std::string& mine, int size) {
  constexpr int kLen = 256;
  char buf[kLen] = {};
  std::snprintf(buf, kLen, "%s", mine.c_str());
  std::vector<char> all(static_cast<size_t>(kLen) * static_cast<size_t>(size));
  MPI_Allgather(buf, kLen, MPI_CHAR, all.data(), kLen, MPI_CHAR, MPI_COMM_WORLD);
  std::vector<std::string> out;
  for (int i = 0; i < size; ++i) out.emplace_back(all.data() + static_cast<size_t>(i) * kLen);
  return out;
}

std::string this_host() {
  char buf[256] = {};
  if (gethostname(buf, sizeof buf - 1) != 0) return "localhost";
  return buf;
}

// The node checks that need every rank's node: the ranks here are the ones the rank map puts on one node.
Check placement_check(const World& w, const RankMap& map, int node) {
  Check c{"ranks", "", Status::pass, ""};
  std::vector<int> here;
  for (int r = 0; r < w.size; ++r)
    if (w.node_index[static_cast<size_t>(r)] == node) here.push_back(r);
  const int map_node = map.placement(here.front()).node;
  std::vector<int> want;
  for (int r = 0; r < map.world(); ++r)
    if (map.placement(r).node == map_node) want.push_back(r);
  c.figure = preflight::rank_list(here);
  if (here != want) {
    c.status = Status::fail;
    c.verdict = "the rank map puts ranks " + preflight::rank_list(want) + " on its node " + std::to_string(map_node) +
                " (launch one task per rank in block order)";
  } else {
    c.verdict = "the map's node " + std::to_string(map_node);
  }
  return c;
}

int run(int argc, char** argv) {
  const auto start = Clock::now();
  auto env = environment_map(environ);
  const int pre_rank = launcher_rank(env);
  Args a;
  std::vector<std::string> args(argv + 1, argv + argc);
  try {
    for (size_t i = 0; i < args.size();) {
      const std::string& s = args[i];
      if (s == "--help" || s == "-h") {
        std::printf(kHelp, cli::config_flags_help());
        return 0;
      }
      if (s == "--version") {
        std::printf("meshrun preflight %s\n", kVersion);
        return 0;
      }
      if (cli::take_config_flag(args, i, a.req)) continue;
      std::string v;
      if (cli::take_value(args, i, "--min-fraction", &v)) {
        try {
          a.min_fraction = preflight::parse_fraction(v);
        } catch (const std::invalid_argument& e) {
          throw ConfigError(e.what());
        }
        continue;
      }
      if (cli::take_value(args, i, "--topology", &v)) { a.topology_xml = v; continue; }
      if (cli::take_value(args, i, "--template", &v)) { a.req.template_path = v; continue; }
      if (cli::take_value(args, i, "--timeout", &v)) {
        char* end = nullptr;
        a.timeout_s = std::strtod(v.c_str(), &end);
        if (end == v.c_str() || *end || !(a.timeout_s >= 1 && a.timeout_s <= 3600))
          throw ConfigError("--timeout " + v + ": expected seconds between 1 and 3600");
        continue;
      }
      if (!s.empty() && s[0] == '-') throw ConfigError("unknown option '" + s + "'; see 'meshrun preflight --help'");
      if (!a.req.template_path.empty())
        throw ConfigError("more than one template ('" + a.req.template_path + "' and '" + s + "'); give one");
      a.req.template_path = s;
      ++i;
    }
  } catch (const ConfigError& e) {
    return bad_input(e.what(), pre_rank);
  }
  if (pre_rank < 0)
    return bad_input("not started as a job step: run it inside an allocation as srun --mpi=pmix … meshrun preflight, "
                     "or under mpirun -np N (one task per GPU slot, as the rank map says)", pre_rank);

  a.req.environment = &env;
  launch::Resolved r;
  std::optional<RankMap> map;
  std::unique_ptr<NodeTopology> expected;
  std::string xml = a.topology_xml;
  if (xml.empty())
    if (auto it = env.find("MESHRUN_TOPOLOGY_XML"); it != env.end()) xml = it->second;
  try {
    r = launch::resolve(build_config(a.req));
    map.emplace(r.layout, r.cluster);
    if (!xml.empty()) {
      TopologyRequest treq;
      treq.xml_path = xml;
      treq.node_type = find_node_type(r.cfg.job.cluster.node_type);
      expected = std::make_unique<NodeTopology>(load_topology(treq));
    }
  } catch (const ConfigError& e) {
    return bad_input(e.what(), pre_rank);
  } catch (const TopologyError& e) {
    return bad_input(e.what(), pre_rank);
  }

  World w;
  g_watch.set_who("rank " + std::to_string(pre_rank));
  g_watch.start(pre_rank == 0 ? a.timeout_s : a.timeout_s + 5);  // rank 0 speaks first
  MPI_Init(&argc, &argv);
  const double mpi_start_s = std::chrono::duration<double>(Clock::now() - start).count();
  MPI_Comm_rank(MPI_COMM_WORLD, &w.rank);
  MPI_Comm_size(MPI_COMM_WORLD, &w.size);
  auto finish = [&](int code) {
    g_health.end();
    g_watch.set("MPI_Finalize");
    MPI_Finalize();
    g_watch.stop();
    return code;
  };
  // srun without --mpi=pmix starts N singletons of one rank each.
  if (auto it = env.find("SLURM_NTASKS"); it != env.end() && !env.count("OMPI_COMM_WORLD_RANK") &&
                                         std::atoi(it->second.c_str()) != w.size)
    return finish(bad_input("srun started " + it->second + " tasks but MPI sees " + std::to_string(w.size) +
                                ": launch it with srun --mpi=pmix",
                            pre_rank));
  if (w.size != map->world())
    return finish(bad_input("the layout has " + std::to_string(map->world()) + " ranks but this step has " +
                                std::to_string(w.size) + " tasks; start one task per rank (e.g. srun -N" +
                                std::to_string(r.cluster.nodes) + " --ntasks-per-node=" +
                                std::to_string(r.cluster.gpus_per_node) + ") or change the layout",
                            w.rank));

  // Who is where.
  g_watch.set("the exchange of node names (MPI_Allgather)");
  const std::string host = this_host();
  std::string node_name = host;
  if (auto it = env.find("SLURMD_NODENAME"); it != env.end() && !it->second.empty()) node_name = it->second;
  g_watch.set_who("rank " + std::to_string(w.rank) + " on " + node_name);
  w.node_of_rank = allgather_names(node_name, w.size);
  w.host_of_rank = allgather_names(host, w.size);
  std::map<std::string, int> index;
  for (int rk = 0; rk < w.size; ++rk) {
    const std::string& n = w.node_of_rank[static_cast<size_t>(rk)];
    auto [it, fresh] = index.emplace(n, static_cast<int>(w.nodes.size()));
    if (fresh) {
      w.nodes.push_back(n);
      w.leader.push_back(rk);
    }
    w.node_index.push_back(it->second);
  }
  w.my_node = w.node_index[static_cast<size_t>(w.rank)];
  const int nodes = static_cast<int>(w.nodes.size());
  g_health.begin(w);
  MPI_Comm leaders = MPI_COMM_NULL;  // one rank per node, for the all-reduce (made now, while nothing is slow)
  MPI_Comm_split(MPI_COMM_WORLD, w.is_leader() ? 0 : MPI_UNDEFINED, w.rank, &leaders);
  std::vector<std::vector<std::string>> node_hosts, link_hosts;
  for (int n = 0; n < nodes; ++n) node_hosts.push_back({w.host_of_rank[static_cast<size_t>(w.leader[static_cast<size_t>(n)])]});
  const auto links = preflight::ring_links(nodes);
  for (const auto& [x, y] : links) link_hosts.push_back({node_hosts[static_cast<size_t>(x)][0], node_hosts[static_cast<size_t>(y)][0]});
  const std::vector<int> node_phase = preflight::phases(node_hosts), link_phase = preflight::phases(link_hosts);
  const int node_phases = node_phase.empty() ? 0 : *std::max_element(node_phase.begin(), node_phase.end()) + 1;
  const int link_phases = link_phase.empty() ? 0 : *std::max_element(link_phase.begin(), link_phase.end()) + 1;

  // Local checks: this task's binding; the node's devices on its leader.
  Record rec;
  {
    g_watch.set("the local checks (hwloc topology, task environment)");
    Check bind{"binding", "", Status::fail, ""};
    std::vector<Check> devices;
    try {
      TopologyRequest treq;  // the live node
      treq.node_type = find_node_type(r.cfg.job.cluster.node_type);
      NodeTopology live = load_topology(treq);
      bind = binding_check(r, *map, env, expected ? *expected : live, w.rank);
      if (w.is_leader()) {
        int here = 0;
        for (int n : w.node_index) here += n == w.my_node;
        devices = node_checks(live, expected.get(), r.cluster, here);
      }
    } catch (const TopologyError& e) {
      bind.verdict = std::string("this node's topology: ") + e.what();
      if (w.is_leader()) devices.push_back(Check{"topology", "", Status::fail, e.what()});
    }
    rec.put(bind);
    rec.put(std::to_string(devices.size()));
    for (const auto& c : devices) rec.put(c);
  }

  // GEMM: a node's tasks at once, nodes sharing a machine one after the other; the best of the rounds.
  double gemm = 0;
  for (int round = 0; round < kRounds; ++round)
    for (int p = 0; p < node_phases; ++p) {
      gate(w, "the GEMM probes (round " + std::to_string(round + 1) + ")");
      if (node_phase[static_cast<size_t>(w.my_node)] == p) {
        g_watch.set("this node's GEMM probe");
        gemm = std::max(gemm, gemm_window());
      }
    }
  rec.put(gemm);

  // Point-to-point around the ring, leaders only; links that share a machine one after the other.
  std::vector<double> link_best(links.size(), 0);
  {
    std::vector<char> out(w.is_leader() ? kMessage : 0, 1), in(w.is_leader() ? kMessage : 0);
    for (int round = 0; round < kRounds; ++round)
      for (int p = 0; p < link_phases; ++p) {
        gate(w, "the point-to-point probes (round " + std::to_string(round + 1) + ")");
        for (size_t l = 0; l < links.size(); ++l) {
          if (link_phase[l] != p) continue;
          const int la = w.leader[static_cast<size_t>(links[l].first)], lb = w.leader[static_cast<size_t>(links[l].second)];
          if (w.rank != la && w.rank != lb) continue;
          g_watch.set("the point-to-point exchange between " + w.nodes[static_cast<size_t>(links[l].first)] + " and " +
                      w.nodes[static_cast<size_t>(links[l].second)]);
          link_best[l] = std::max(link_best[l], exchange(w, la, lb, out, in, "the point-to-point exchange between " +
                                                                         w.nodes[static_cast<size_t>(links[l].first)] + " and " +
                                                                         w.nodes[static_cast<size_t>(links[l].second)]));
        }
      }
  }
  int measured = 0;
  for (size_t l = 0; l < links.size(); ++l) measured += w.rank == w.leader[static_cast<size_t>(links[l].first)];
  rec.put(std::to_string(measured));
  for (size_t l = 0; l < links.size(); ++l)
    if (w.rank == w.leader[static_cast<size_t>(links[l].first)]) {
      rec.put(std::to_string(l));
      rec.put(link_best[l]);
    }

  // All-reduce over the leaders (every node at once: one figure for the allocation).
  double allreduce = -1;
  if (nodes > 1) {
    for (int round = 0; round < kRounds; ++round) {
      gate(w, "the all-reduce probe (round " + std::to_string(round + 1) + ")");
      if (leaders != MPI_COMM_NULL) {
        g_watch.set("the all-reduce over one rank per node");
        allreduce = std::max(allreduce, allreduce_window(w, leaders, "the all-reduce over one rank per node"));
      }
    }
  }
  if (leaders != MPI_COMM_NULL) MPI_Comm_free(&leaders);

  gate(w, "the collection of results");
  g_watch.set("the collection of results (MPI_Gatherv)");
  const auto texts = gather_text(rec.text(), w.rank, w.size);
  int code = 0;
  if (w.rank == 0) {
    preflight::Measurements m;
    for (int n = 0; n < nodes; ++n) m.nodes.push_back({w.nodes[static_cast<size_t>(n)], {}, {}, {}});
    std::vector<std::vector<Check>> bindings(static_cast<size_t>(nodes));
    std::vector<std::vector<Check>> devices(static_cast<size_t>(nodes));
    for (int rk = 0; rk < w.size; ++rk) {
      Record in = Record::parse(texts[static_cast<size_t>(rk)]);
      const size_t n = static_cast<size_t>(w.node_index[static_cast<size_t>(rk)]);
      m.nodes[n].ranks.push_back(rk);
      bindings[n].push_back(in.check());
      const int count = std::atoi(in.str().c_str());
      for (int k = 0; k < count; ++k) devices[n].push_back(in.check());
      m.nodes[n].devices.push_back({rk, in.num()});
      const int nl = std::atoi(in.str().c_str());
      for (int k = 0; k < nl; ++k) {
        const size_t l = static_cast<size_t>(std::atoi(in.str().c_str()));
        const double gbs = in.num();
        if (l < links.size()) m.links.push_back({links[l].first, links[l].second, gbs});
      }
    }
    for (int n = 0; n < nodes; ++n) {
      auto& node = m.nodes[static_cast<size_t>(n)];
      node.checks = devices[static_cast<size_t>(n)];
      node.checks.push_back(placement_check(w, *map, n));
      // The node's binding row: every task's.
      Check b{"binding", "", Status::pass, ""};
      std::string fails, figures;
      bool all_skipped = true;
      for (const auto& c : bindings[static_cast<size_t>(n)]) {
        figures += (figures.empty() ? "" : "; ") + c.figure;
        if (c.status == Status::fail) fails += (fails.empty() ? "" : "; ") + c.verdict;
        if (c.status != Status::skipped) all_skipped = false;
      }
      b.figure = figures;
      if (!fails.empty()) {
        b.status = Status::fail;
        b.verdict = fails;
      } else if (all_skipped) {
        b.status = Status::skipped;
        b.verdict = bindings[static_cast<size_t>(n)].front().verdict;
      } else {
        b.verdict = "as the rank map says";
      }
      node.checks.push_back(b);
    }
    std::sort(m.links.begin(), m.links.end(), [](const auto& x, const auto& y) { return std::pair(x.a, x.b) < std::pair(y.a, y.b); });
    m.allreduce_gbs = allreduce;

    preflight::Expected e;
    e.gemm_gflops = r.cfg.job.site.preflight_gemm_gflops;
    e.p2p_gbs = r.cfg.job.site.preflight_p2p_gbs;
    e.allreduce_gbs = r.cfg.job.site.preflight_allreduce_gbs;
    e.min_fraction = a.min_fraction;
    for (const char* key : {"site.preflight_gemm_gflops", "site.preflight_p2p_gbs", "site.preflight_allreduce_gbs"})
      if (const Origin o = r.cfg.origin_of(key); o.kind == SourceKind::site && e.site.empty())
        e.site = o.where.substr(0, o.where.find(':'));  // the file, without line:column
    const preflight::Report report = preflight::judge(m, e);
    const Layout& l = r.layout;
    const std::string layout_text = "tp=" + std::to_string(l.tp) + " cp=" + std::to_string(l.cp) + " pp=" +
                                    std::to_string(l.pp) + " dp=" + std::to_string(l.dp) + " ep=" + std::to_string(l.ep);
    const bool site = e.gemm_gflops > 0 || e.p2p_gbs > 0 || e.allreduce_gbs > 0;
    std::printf("meshrun preflight: %d node%s (%s), %d rank%s, layout %s; GEMM %dx%dx%d fp32 (%s), %d rounds of %.1f s "
                "per device; %zu MiB messages; %s; a node fails below %.2f of it\n",
                nodes, nodes == 1 ? "" : "s", compress_hostlist(w.nodes).c_str(), w.size, w.size == 1 ? "" : "s",
                layout_text.c_str(), kGemm, kGemm, kGemm,
                kernels::cpu::matmul_isa_name(kernels::cpu::matmul_isa()), kRounds, kWindow, kMessage >> 20,
                site ? "reference: the site's figures where set, else the allocation's median"
                     : "reference: the allocation's median (no site figures)",
                a.min_fraction);
    std::fputs(preflight::render(report).c_str(), stdout);
    code = preflight::exit_status(report);
    std::printf("time: %.1f s (MPI start-up %.1f s)\n", std::chrono::duration<double>(Clock::now() - start).count(),
                mpi_start_s);
    std::fflush(stdout);
  }
  MPI_Bcast(&code, 1, MPI_INT, 0, MPI_COMM_WORLD);
  return finish(code);
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "meshrun preflight: %s\n", cut_long_values(e.what()).c_str());
    return 2;
  }
}
