// Benchmark: load a node topology (hwloc XML export or the live machine) and compute the environment of
// every local task, as the plugin does once per task. Target: < 50 ms for an 8-GPU node.
//   meshrun-bench-topology [XML ...]   (default: tests/topology/fixtures/dgx-h100.xml and the live machine)
#include <algorithm>
#include <chrono>
#include <ctime>
#include <cstdio>
#include <string>
#include <vector>

#include "meshrun/task_env.hpp"

namespace {

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

// CPU time of this process: unlike wall time it barely moves when other jobs share the cores.
double cpu_ms() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

// One full round: load, then every local rank's environment. Returns {load ms, env ms}.
std::pair<double, double> round(const std::string& xml, const meshrun::RankMap& map) {
  auto t0 = Clock::now();
  meshrun::TopologyRequest req;
  req.xml_path = xml;
  req.use_nvml = false;
  const meshrun::NodeTopology topo = meshrun::load_topology(req);
  const double load = ms_since(t0);
  t0 = Clock::now();
  const int per_node = map.cluster().gpus_per_node;
  size_t vars = 0;
  for (int local = 0; local < per_node; ++local) {
    meshrun::TaskContext ctx;
    ctx.rank = local;
    ctx.world = map.world();
    ctx.local_rank = local;
    ctx.local_world = per_node;
    ctx.master_addr = "node0";
    ctx.job_id = 1234;
    meshrun::GpuAllocation gpus;  // unmanaged: all of the topology's GPUs, or CPU blocks without GPUs
    vars += meshrun::compute_task_env(map, ctx, topo, gpus, meshrun::EnvPolicy{}, {}).vars.size();
  }
  if (vars == 0) std::fprintf(stderr, "no variables computed\n");
  return {load, ms_since(t0)};
}

}  // namespace

// A one-node map whose GPUs per node match the topology (8 when it has none: CPU blocks then).
meshrun::RankMap map_for(int gpus) {
  meshrun::ClusterSpec cs;
  cs.node_type = "generic";
  cs.nodes = 1;
  cs.gpus_per_node = gpus > 0 ? gpus : 8;
  std::vector<meshrun::Problem> problems;
  const meshrun::Cluster cluster = meshrun::resolve_cluster(cs, &problems);
  meshrun::LayoutSpec ls;
  ls.tp = cluster.gpus_per_node;
  return meshrun::RankMap(*meshrun::resolve_layout(ls, cluster.gpus(), &problems), cluster);
}

int main(int argc, char** argv) {
  std::vector<std::string> inputs;
  for (int i = 1; i < argc; ++i) inputs.push_back(argv[i]);
  if (inputs.empty()) inputs = {"tests/topology/fixtures/dgx-h100.xml", ""};
  const int reps = 20;
  std::printf("%-48s %10s %10s %10s %10s %10s\n", "topology", "load p50", "env p50", "total p50", "total max",
              "cpu p50");
  for (const auto& xml : inputs) {
    std::vector<double> load, env, total, cpu;
    try {
      meshrun::TopologyRequest req;
      req.xml_path = xml;
      req.use_nvml = false;
      const meshrun::RankMap map = map_for(static_cast<int>(meshrun::load_topology(req).gpus.size()));
      for (int r = 0; r < reps; ++r) {
        const double c0 = cpu_ms();
        auto [l, e] = round(xml, map);
        cpu.push_back(cpu_ms() - c0);
        load.push_back(l);
        env.push_back(e);
        total.push_back(l + e);
      }
    } catch (const std::exception& e) {
      std::fprintf(stderr, "%s: %s\n", xml.empty() ? "live" : xml.c_str(), e.what());
      return 2;
    }
    auto p50 = [](std::vector<double> v) {
      std::sort(v.begin(), v.end());
      return v[v.size() / 2];
    };
    std::printf("%-48s %8.2fms %8.3fms %8.2fms %8.2fms %8.2fms\n",
                xml.empty() ? "live (hwloc I/O discovery)" : xml.c_str(), p50(load), p50(env), p50(total),
                *std::max_element(total.begin(), total.end()), p50(cpu));
  }
  std::printf("(%d rounds each; a round = load + the environment of every local task; wall times except cpu)\n", reps);
  return 0;
}
