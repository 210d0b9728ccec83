// `meshrun preflight`: the parts without MPI or hardware (launcher/preflight_main.cpp measures, this judges and
// prints). Unit-tested in tests/launcher/test_preflight.cpp.
//
// A node fails when one of its checks fails: its devices, NICs or CPUs do not match what the layout expects, a
// task is not bound to the CPUs the rank map gives it, its slowest device's GEMM or its best point-to-point link
// is below min_fraction of the reference. The reference is the site file's figure where it gives one
// (site.preflight_*), else the allocation's median (GEMM: over every device; point-to-point: over the nodes'
// best links, from 3 nodes up). A node is blamed for the network only when all its links are slow, so the
// neighbours of a slow node pass. The all-reduce is one figure for the whole allocation: judged only against a site figure
// and never blamed on a node.
#pragma once
#include <string>
#include <utility>
#include <vector>

namespace meshrun::preflight {

enum class Status { pass, fail, skipped, info };

struct Check {
  std::string name;    // "gpus", "nics", "cpus", "ranks", "binding", "gemm", "p2p", "all-reduce"
  std::string figure;  // what was measured or found
  Status status = Status::info;
  std::string verdict; // text after PASS/FAIL, or the whole cell for skipped/info ("skipped: no GPU on this node")
};

struct Device {
  int rank = 0;
  double gflops = 0;  // best of the rounds
};

struct NodeResult {
  std::string name;               // SLURMD_NODENAME, else the host name
  std::vector<int> ranks;
  std::vector<Check> checks;      // judged on the node itself (devices, CPUs, placement, binding)
  std::vector<Device> devices;    // GEMM per task
};

struct Link {
  int a = 0, b = 0;   // node indices
  double gbs = 0;     // GB/s each way, best of the rounds
};

struct Measurements {
  std::vector<NodeResult> nodes;
  std::vector<Link> links;
  double allreduce_gbs = -1;  // bus bandwidth; < 0 when not run (one node)
};

struct Expected {
  double gemm_gflops = 0, p2p_gbs = 0, allreduce_gbs = 0;  // site figures, 0 = none
  double min_fraction = 0.5;
  std::string site;  // the site file the figures came from (for the text)
};

struct Report {
  std::vector<NodeResult> nodes;  // with the gemm and p2p checks appended
  std::vector<Check> allocation;  // the all-reduce
  std::vector<std::string> failing;  // names of failing nodes, in node order
  bool allocation_failed = false;    // an allocation-wide check failed (not attributable to a node)
};

double median(std::vector<double> values);  // 0 for none

// Adds the GEMM and point-to-point checks to every node and the all-reduce check, and collects the failures.
Report judge(const Measurements& m, const Expected& e);

// The table (one row per node and check, then the allocation's rows) and the closing lines:
// "failing nodes: n[3-4]" (srun --exclude syntax) or "all 4 nodes passed".
std::string render(const Report& r);
// 0 when everything passed, 1 when a node or the allocation failed.
int exit_status(const Report& r);

// The ring between nodes: i <-> i+1 and the last back to the first; one link for two nodes, none for one.
std::vector<std::pair<int, int>> ring_links(int nodes);

// Probes that share a host compete for its cores: a phase per group of items whose hosts are all distinct.
// item_hosts[i] = the hosts item i uses (a node: its host; a link: both ends' hosts). Greedy, in item order:
// each item goes to the first phase none of whose items uses one of its hosts. Nodes on separate machines
// all land in phase 0; the local cluster's nodes (one host) get a phase each.
std::vector<int> phases(const std::vector<std::vector<std::string>>& item_hosts);

// "0-3,8" for a sorted list of ranks.
std::string rank_list(const std::vector<int>& ranks);

// A preflight command-line value: --min-fraction in (0, 1]. Throws std::invalid_argument with the one-line reason.
double parse_fraction(const std::string& text);

}  // namespace meshrun::preflight
