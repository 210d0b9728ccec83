// compute_task_env(): the full environment of every local rank on each fixture, GPU visibility under
// ConstrainDevices on/off and --gpus-per-task, errors, NIC fallback, and the [env] allow-list.
#include <catch2/catch.hpp>
#include <sys/stat.h>
#include <sys/sysmacros.h>

#include <cstdio>
#include <filesystem>
#include <map>
#include <set>
#include <string>

#include "meshrun/config.hpp"
#include "meshrun/site_policy.hpp"
#include "meshrun/task_env.hpp"

using namespace meshrun;
using Vars = std::map<std::string, std::string>;

namespace {

std::string fixture(const char* name) { return std::string(MESHRUN_TOPO_FIXTURES) + "/" + name; }

NodeTopology load(const char* name, const char* node_type) {
  TopologyRequest r;
  r.xml_path = fixture(name);
  r.node_type = find_node_type(node_type);
  return load_topology(r);
}

struct Job {
  Cluster cluster;
  Layout layout;
  RankMap map() const { return RankMap(layout, cluster); }
};

Job job(const char* node_type, int nodes, int gpus_per_node, int tp, int pp, const char* hosts) {
  ClusterSpec cs;
  cs.node_type = node_type;
  cs.nodes = nodes;
  cs.gpus_per_node = gpus_per_node;
  cs.hostlist = hosts;
  std::vector<Problem> problems;
  Job j;
  j.cluster = resolve_cluster(cs, &problems);
  LayoutSpec ls;
  ls.tp = tp;
  ls.pp = pp;
  auto l = resolve_layout(ls, j.cluster.gpus(), &problems);
  REQUIRE(problems.empty());
  REQUIRE(l);
  j.layout = *l;
  return j;
}

TaskContext task(int rank, int world, int per_node, const char* master, uint32_t job_id = 4242, uint32_t step = 3) {
  TaskContext c;
  c.rank = rank;
  c.world = world;
  c.local_rank = rank % per_node;
  c.local_world = per_node;
  c.node_id = rank / per_node;
  c.master_addr = master;
  c.job_id = job_id;
  c.step_id = step;
  return c;
}

GpuAllocation slurm_gpus(std::vector<int> ids, bool constrained = false, int per_task = 0) {
  GpuAllocation a;
  a.step_gpus = std::move(ids);
  a.managed = true;
  a.constrained = constrained;
  a.gpus_per_task = per_task;
  return a;
}

Vars as_map(const TaskEnv& env) {
  Vars m;
  for (const auto& [k, v] : env.vars) {
    INFO(k);
    CHECK(m.count(k) == 0);  // no duplicates
    m[k] = v;
  }
  return m;
}

// Expected torchrun + layout variables, written out from the convention (rank = tp + TP*(cp + CP*(dp + DP*pp))).
Vars rank_vars(int rank, int world, int per_node, const char* master, int port, int tp, int pp) {
  const int TP = tp, DP = world / (tp * pp);
  return {{"RANK", std::to_string(rank)},
          {"LOCAL_RANK", std::to_string(rank % per_node)},
          {"WORLD_SIZE", std::to_string(world)},
          {"LOCAL_WORLD_SIZE", std::to_string(per_node)},
          {"GROUP_RANK", std::to_string(rank / per_node)},
          {"NODE_RANK", std::to_string(rank / per_node)},
          {"ROLE_RANK", std::to_string(rank)},
          {"ROLE_WORLD_SIZE", std::to_string(world)},
          {"OMP_NUM_THREADS", "1"},
          {"MASTER_ADDR", master},
          {"MASTER_PORT", std::to_string(port)},
          {"MESHRUN_TP_RANK", std::to_string(rank % TP)},
          {"MESHRUN_TP_SIZE", std::to_string(TP)},
          {"MESHRUN_CP_RANK", "0"},
          {"MESHRUN_CP_SIZE", "1"},
          {"MESHRUN_DP_RANK", std::to_string((rank / TP) % DP)},
          {"MESHRUN_DP_SIZE", std::to_string(DP)},
          {"MESHRUN_PP_RANK", std::to_string(rank / (TP * DP))},
          {"MESHRUN_PP_SIZE", std::to_string(pp)},
          {"MESHRUN_EP_RANK", "0"},
          {"MESHRUN_EP_SIZE", "1"},
          {"MESHRUN_LAYOUT", "tp=" + std::to_string(TP) + ",cp=1,pp=" + std::to_string(pp) + ",dp=" +
                                 std::to_string(DP) + ",ep=1"},
          {"MESHRUN_ORDER", "tp-cp-ep-dp-pp"}};
}

void merge(Vars& into, const Vars& more) {
  for (const auto& [k, v] : more) into[k] = v;
}

}  // namespace

TEST_CASE("DGX H100 and 2 nodes: full environment of every local rank") {
  const NodeTopology topo = load("dgx-h100.xml", "dgx-h100");
  const Job j = job("dgx-h100", 2, 0, 4, 2, "dgx[07-08]");
  const RankMap map = j.map();
  const char* hca[] = {"=mlx5_0", "=mlx5_3", "=mlx5_4", "=mlx5_5", "=mlx5_6", "=mlx5_9", "=mlx5_10", "=mlx5_11"};
  const char* pci[] = {"0000:1b:00.0", "0000:43:00.0", "0000:52:00.0", "0000:61:00.0",
                       "0000:9d:00.0", "0000:c3:00.0", "0000:d1:00.0", "0000:df:00.0"};
  for (int rank = 0; rank < 16; ++rank) {
    const int l = rank % 8;
    INFO("rank " << rank);
    const TaskEnv env = compute_task_env(map, task(rank, 16, 8, "dgx07"), topo,
                                         slurm_gpus({0, 1, 2, 3, 4, 5, 6, 7}), EnvPolicy{}, {});
    // 20000 + (4242 mod 750) * 16 + 3 = 27875
    Vars want = rank_vars(rank, 16, 8, "dgx07", 27875, 4, 2);
    merge(want, {{"CUDA_VISIBLE_DEVICES", "0,1,2,3,4,5,6,7"},
                 {"CUDA_DEVICE_ORDER", "PCI_BUS_ID"},
                 {"MESHRUN_CUDA_DEVICE", std::to_string(l)},
                 {"MESHRUN_GPU", std::to_string(l)},
                 {"MESHRUN_GPU_PCI", pci[l]},
                 {"MESHRUN_CPUS", l < 4 ? "0-55,112-167" : "56-111,168-223"},
                 {"NCCL_IB_HCA", "=mlx5_0,mlx5_3,mlx5_4,mlx5_5,mlx5_6,mlx5_9,mlx5_10,mlx5_11"},  // one list per node
                 {"MESHRUN_NIC", hca[l] + 1},
                 {"NCCL_CROSS_NIC", "0"},
                 {"CUDA_DEVICE_MAX_CONNECTIONS", "1"}});  // tp = 4 on Hopper (Megatron-Core's rule)
    CHECK(as_map(env) == want);
    CHECK(env.cpus.str() == (l < 4 ? "0-55,112-167" : "56-111,168-223"));
    CHECK(env.gpu == l);
    CHECK(env.warnings.empty());
  }
}

TEST_CASE("A100 PCI-only node with the dgx-a100 type: full environment of every local rank") {
  const NodeTopology topo = load("a100-pci.xml", "dgx-a100");
  const Job j = job("dgx-a100", 1, 0, 8, 1, "a100n1");
  const char* hca[] = {"=mlx5_0", "=mlx5_1", "=mlx5_2", "=mlx5_3", "=mlx5_6", "=mlx5_7", "=mlx5_8", "=mlx5_9"};
  const char* pci[] = {"0000:07:00.0", "0000:0f:00.0", "0000:47:00.0", "0000:4e:00.0",
                       "0000:87:00.0", "0000:90:00.0", "0000:b7:00.0", "0000:bd:00.0"};
  for (int rank = 0; rank < 8; ++rank) {
    INFO("rank " << rank);
    const TaskEnv env = compute_task_env(j.map(), task(rank, 8, 8, "a100n1", 7, 0), topo,
                                         GpuAllocation{}, EnvPolicy{}, {});
    Vars want = rank_vars(rank, 8, 8, "a100n1", 20000 + 7 * 16, 8, 1);
    merge(want, {{"CUDA_VISIBLE_DEVICES", "0,1,2,3,4,5,6,7"},
                 {"CUDA_DEVICE_ORDER", "PCI_BUS_ID"},
                 {"MESHRUN_CUDA_DEVICE", std::to_string(rank)},
                 {"MESHRUN_GPU", std::to_string(rank)},
                 {"MESHRUN_GPU_PCI", pci[rank]},
                 {"MESHRUN_CPUS", rank < 4 ? "0-63,128-191" : "64-127,192-255"},
                 {"NCCL_IB_HCA", "=mlx5_0,mlx5_1,mlx5_2,mlx5_3,mlx5_6,mlx5_7,mlx5_8,mlx5_9"},
                 {"MESHRUN_NIC", hca[rank] + 1},
                 {"NCCL_CROSS_NIC", "0"},
                 {"CUDA_DEVICE_MAX_CONNECTIONS", "1"}});  // tp = 8 on Ampere
    CHECK(as_map(env) == want);
  }
}

// GB200 (Blackwell, PCI 10de:2941): no CUDA_DEVICE_MAX_CONNECTIONS although tp = 4 ("requirement no longer
// exists since the Blackwell architecture").
TEST_CASE("GB200 NVL72 trays: MNNVL on and full environment of every local rank") {
  const NodeTopology topo = load("gb200-tray.xml", "gb200-nvl72");
  const Job j = job("gb200-nvl72", 2, 0, 4, 1, "gb[001-002]");
  for (int rank = 0; rank < 8; ++rank) {
    const int l = rank % 4;
    INFO("rank " << rank);
    const TaskEnv env = compute_task_env(j.map(), task(rank, 8, 4, "gb001", 100, 0), topo,
                                         slurm_gpus({0, 1, 2, 3}), EnvPolicy{}, {});
    Vars want = rank_vars(rank, 8, 4, "gb001", 20000 + 100 * 16, 4, 1);
    merge(want, {{"CUDA_VISIBLE_DEVICES", "0,1,2,3"},
                 {"CUDA_DEVICE_ORDER", "PCI_BUS_ID"},
                 {"MESHRUN_CUDA_DEVICE", std::to_string(l)},
                 {"MESHRUN_GPU", std::to_string(l)},
                 {"MESHRUN_GPU_PCI", std::vector<std::string>{"0008:01:00.0", "0009:01:00.0", "0018:01:00.0",
                                                              "0019:01:00.0"}[l]},
                 {"MESHRUN_CPUS", l < 2 ? "0-71" : "72-143"},
                 {"NCCL_IB_HCA", "=mlx5_0,mlx5_1,mlx5_2,mlx5_3"},
                 {"MESHRUN_NIC", "mlx5_" + std::to_string(l)},
                 {"NCCL_CROSS_NIC", "0"},
                 {"NCCL_MNNVL_ENABLE", "1"}});
    CHECK(as_map(env) == want);
  }
}

TEST_CASE("ConstrainDevices on and off and half a DGX (GPUs 4-7)") {
  const NodeTopology topo = load("dgx-h100.xml", "dgx-h100");
  const Job j = job("dgx-h100", 1, 4, 4, 1, "dgx01");
  for (int l = 0; l < 4; ++l) {
    INFO("local " << l);
    const TaskEnv off = compute_task_env(j.map(), task(l, 4, 4, "dgx01"), topo, slurm_gpus({4, 5, 6, 7}, false),
                                         EnvPolicy{}, {});
    CHECK(*off.get("CUDA_VISIBLE_DEVICES") == "4,5,6,7");  // global ids
    CHECK(*off.get("MESHRUN_CUDA_DEVICE") == std::to_string(l));
    CHECK(off.gpu == 4 + l);
    CHECK(*off.get("MESHRUN_NIC") == std::vector<std::string>{"mlx5_6", "mlx5_9", "mlx5_10", "mlx5_11"}[l]);
    CHECK(*off.get("NCCL_IB_HCA") == "=mlx5_0,mlx5_3,mlx5_4,mlx5_5,mlx5_6,mlx5_9,mlx5_10,mlx5_11");
    CHECK(off.cpus.str() == "56-111,168-223");
    const TaskEnv on = compute_task_env(j.map(), task(l, 4, 4, "dgx01"), topo, slurm_gpus({4, 5, 6, 7}, true),
                                        EnvPolicy{}, {});
    CHECK(*on.get("CUDA_VISIBLE_DEVICES") == "0,1,2,3");  // cgroup-relative
    CHECK(*on.get("MESHRUN_CUDA_DEVICE") == std::to_string(l));
    CHECK(on.gpu == 4 + l);
    CHECK(*on.get("MESHRUN_GPU_PCI") == off.get("MESHRUN_GPU_PCI")->c_str());
  }
}

TEST_CASE("gpus-per-task: per-task cgroups and unconstrained binding") {
  const NodeTopology topo = load("dgx-h100.xml", "dgx-h100");
  const Job j = job("dgx-h100", 1, 0, 8, 1, "dgx01");
  const TaskEnv on = compute_task_env(j.map(), task(3, 8, 8, "dgx01"), topo,
                                      slurm_gpus({0, 1, 2, 3, 4, 5, 6, 7}, true, 1), EnvPolicy{}, {});
  CHECK(*on.get("CUDA_VISIBLE_DEVICES") == "0");
  CHECK(*on.get("MESHRUN_CUDA_DEVICE") == "0");
  CHECK(on.gpu == 3);
  CHECK(*on.get("MESHRUN_NIC") == "mlx5_5");
  REQUIRE(on.warnings.size() == 1);
  CHECK_THAT(on.warnings[0], Catch::Contains("--gpus-per-node"));
  const TaskEnv off = compute_task_env(j.map(), task(3, 8, 8, "dgx01"), topo,
                                       slurm_gpus({0, 1, 2, 3, 4, 5, 6, 7}, false, 1), EnvPolicy{}, {});
  CHECK(*off.get("CUDA_VISIBLE_DEVICES") == "0,1,2,3,4,5,6,7");  // peers stay visible for CUDA IPC
  CHECK(*off.get("MESHRUN_CUDA_DEVICE") == "3");
  CHECK(off.warnings.empty());
  CHECK_THROWS_WITH(compute_task_env(j.map(), task(3, 8, 8, "dgx01"), topo,
                                     slurm_gpus({0, 1, 2, 3, 4, 5, 6, 7}, false, 2), EnvPolicy{}, {}),
                    Catch::Contains("--gpus-per-task=1"));
}

TEST_CASE("fewer GPUs than tasks and GPUs outside the topology and wrong placement: clear errors") {
  const NodeTopology topo = load("dgx-h100.xml", "dgx-h100");
  const Job j = job("dgx-h100", 1, 0, 8, 1, "dgx01");
  CHECK_THROWS_WITH(compute_task_env(j.map(), task(1, 8, 8, "dgx01"), topo, slurm_gpus({0, 1, 2}), EnvPolicy{}, {}),
                    Catch::Contains("8 tasks on this node but the step has 3 GPU(s)") &&
                        Catch::Contains("--gpus-per-node=8"));
  CHECK_THROWS_WITH(compute_task_env(j.map(), task(1, 8, 8, "dgx01"), topo,
                                     slurm_gpus({0, 9, 10, 11, 12, 13, 14, 15}), EnvPolicy{}, {}),
                    Catch::Contains("GPU index 9 is not on this node's topology"));
  CHECK_THROWS_WITH(compute_task_env(j.map(), task(1, 16, 8, "dgx01"), topo, GpuAllocation{}, EnvPolicy{}, {}),
                    Catch::Contains("--ntasks=8"));
  TaskContext cyclic = task(1, 8, 8, "dgx01");
  cyclic.local_rank = 0;
  CHECK_THROWS_WITH(compute_task_env(j.map(), cyclic, topo, GpuAllocation{}, EnvPolicy{}, {}),
                    Catch::Contains("--distribution=block"));
  CHECK_THROWS_WITH(compute_task_env(j.map(), task(1, 8, 8, ""), topo, GpuAllocation{}, EnvPolicy{}, {}),
                    Catch::Contains("SLURM_STEP_NODELIST"));
}

TEST_CASE("a node without RDMA NICs: socket fallback with a warning") {
  NodeTopology topo = load("dgx-h100.xml", "dgx-h100");
  topo.nics.clear();
  for (auto& row : topo.gpu_nic) row.clear();
  topo.nic_of_gpu.assign(8, -1);
  const Job j = job("dgx-h100", 1, 0, 8, 1, "dgx01");
  const TaskEnv env = compute_task_env(j.map(), task(2, 8, 8, "dgx01"), topo, GpuAllocation{}, EnvPolicy{}, {});
  CHECK(*env.get("NCCL_SOCKET_IFNAME") == "=eno3");
  CHECK(env.get("NCCL_IB_HCA") == nullptr);
  CHECK(env.get("NCCL_CROSS_NIC") == nullptr);
  CHECK(env.nic == -1);
  REQUIRE(env.warnings.size() == 1);
  CHECK_THAT(env.warnings[0], Catch::Contains("TCP sockets over =eno3"));
  NodeTopology unpaired = load("dgx-h100.xml", "dgx-h100");
  unpaired.nic_of_gpu.clear();  // a hand-built topology without pairing: no crash, the same fallback
  const TaskEnv u = compute_task_env(j.map(), task(2, 8, 8, "dgx01"), unpaired, GpuAllocation{}, EnvPolicy{}, {});
  CHECK(u.get("NCCL_IB_HCA") == nullptr);
  CHECK_THAT(u.warnings.at(0), Catch::Contains("no NIC paired with GPU 2"));
  EnvPolicy site;
  site.socket_ifname = "^docker,lo";
  CHECK(*compute_task_env(j.map(), task(2, 8, 8, "dgx01"), topo, GpuAllocation{}, site, {})
             .get("NCCL_SOCKET_IFNAME") == "^docker,lo");
}

TEST_CASE("template env allow-list: loader variables and computed names are rejected") {
  const NodeTopology topo = load("dgx-h100.xml", "dgx-h100");
  const Job j = job("dgx-h100", 1, 0, 8, 1, "dgx01");
  auto run = [&](const Vars& extra, const EnvPolicy& p = EnvPolicy{}) {
    return compute_task_env(j.map(), task(0, 8, 8, "dgx01"), topo, GpuAllocation{}, p, extra);
  };
  CHECK_THROWS_WITH(run({{"LD_PRELOAD", "/tmp/evil.so"}}),
                    Catch::Contains("LD_PRELOAD") && Catch::Contains("a job may never set it"));
  CHECK_THROWS_AS(run({{"LD_LIBRARY_PATH", "/opt"}}), TaskEnvError);
  CHECK_THROWS_AS(run({{"PYTHONPATH", "/opt"}}), TaskEnvError);
  CHECK_THROWS_AS(run({{"NCCL_NET_PLUGIN", "evil"}}), TaskEnvError);
  EnvPolicy lax;
  lax.allow = {"LD_*", "FOO_*"};  // the site cannot open loader variables to templates
  CHECK_THROWS_AS(run({{"LD_PRELOAD", "x"}}, lax), TaskEnvError);
  CHECK_THROWS_WITH(run({{"RANK", "0"}}), Catch::Contains("computes"));
  CHECK_THROWS_WITH(run({{"CUDA_VISIBLE_DEVICES", "0"}}), Catch::Contains("computes"));
  CHECK_THROWS_WITH(run({{"FOO_BAR", "1"}}), Catch::Contains("allow-list"));
  CHECK_THROWS_WITH(run({{"BAD-NAME", "1"}}), Catch::Contains("not a valid variable name"));
  CHECK(*run({{"FOO_BAR", "1"}}, lax).get("FOO_BAR") == "1");
  const TaskEnv ok = run({{"OMP_NUM_THREADS", "8"}, {"NCCL_DEBUG", "INFO"}});
  CHECK(*ok.get("OMP_NUM_THREADS") == "8");
  CHECK(*ok.get("NCCL_DEBUG") == "INFO");
  CHECK(ok.warnings.empty());
  CHECK(check_extra_var("TORCH_NCCL_ASYNC_ERROR_HANDLING", EnvPolicy{}).empty());
}

// The loader-variable audit (docs/topology.md, "Loader variables"): every variable of an allow-listed prefix that
// its library documents as loading a library, plugin, program, Python module or compiled-code cache is refused
// from a template, also when the site's allow-list would let every name through; the rest of each prefix passes.
TEST_CASE("template env: every audited loader variable is refused, its prefix's other variables pass") {
  const char* blocked[] = {
      "NCCL_NET_PLUGIN", "NCCL_TUNER_PLUGIN", "NCCL_PROFILER_PLUGIN", "NCCL_ENV_PLUGIN", "NCCL_CONF_FILE",
      "CUDA_INJECTION64_PATH", "CUDA_CACHE_PATH", "OMP_TOOL_LIBRARIES", "UCX_MODULE_DIR", "UCX_GDB_COMMAND",
      "FI_PROVIDER_PATH", "TRITON_PTXAS_PATH", "TRITON_PTXAS_BLACKWELL_PATH", "TRITON_CUOBJDUMP_PATH",
      "TRITON_NVDISASM_PATH", "TRITON_LIBCUDA_PATH", "TRITON_LIBDEVICE_PATH", "TRITON_HIP_LLD_PATH",
      "TRITON_CACHE_DIR", "TRITON_HOME", "TRITON_OVERRIDE_DIR", "TRITON_CACHE_MANAGER",
      "TRITON_REMOTE_CACHE_BACKEND", "TORCH_EXTENSIONS_DIR", "TORCH_HOME", "TORCHINDUCTOR_CACHE_DIR",
      "PYTORCH_KERNEL_CACHE_PATH", "HF_MODULES_CACHE",
      // and the loader/interpreter variables outside the allow-list, which a site allow-list cannot open
      "LD_PRELOAD", "LD_AUDIT", "LD_LIBRARY_PATH", "DYLD_INSERT_LIBRARIES", "PATH", "PYTHONPATH", "PYTHONHOME",
      "PYTHONSTARTUP", "PYTHONUSERBASE", "PYTHONINSPECT", "BASH_ENV", "ENV", "IFS", "SHELLOPTS", "PERL5LIB",
      "PERL5OPT", "RUBYOPT", "NODE_OPTIONS", "GCONV_PATH", "GLIBC_TUNABLES", "HOSTALIASES", "MALLOC_CONF"};
  EnvPolicy open;
  open.allow = {"*"};  // a site allow-list that lets every name through still cannot open these
  for (const char* name : blocked) {
    INFO(name);
    CHECK_THAT(check_extra_var(name, EnvPolicy{}), Catch::Contains("makes tasks load or run other code"));
    CHECK_THAT(check_extra_var(name, open), Catch::Contains("makes tasks load or run other code"));
  }
  // Negative: ordinary settings of the same prefixes still pass (the block is by name, not by prefix).
  const char* allowed[] = {"NCCL_DEBUG", "NCCL_NET", "NCCL_SOCKET_NTHREADS", "CUDA_LAUNCH_BLOCKING",
                           "CUDA_MODULE_LOADING", "OMP_NUM_THREADS", "OMP_PROC_BIND", "UCX_TLS", "UCX_NET_DEVICES",
                           "FI_PROVIDER", "FI_EFA_USE_DEVICE_RDMA", "TRITON_PRINT_AUTOTUNING", "TORCH_NCCL_ASYNC_ERROR_HANDLING",
                           "TORCH_CUDA_ARCH_LIST", "TORCHINDUCTOR_MAX_AUTOTUNE", "PYTORCH_CUDA_ALLOC_CONF",
                           "HF_HOME", "HF_DATASETS_CACHE", "TRANSFORMERS_OFFLINE", "WANDB_MODE", "MKL_NUM_THREADS",
                           "TZ"};
  for (const char* name : allowed) {
    INFO(name);
    CHECK(check_extra_var(name, EnvPolicy{}).empty());
  }
  // Through compute_task_env, as the plugin and meshrun exec apply a template's [env].
  const NodeTopology topo = load("dgx-h100.xml", "dgx-h100");
  const Job j = job("dgx-h100", 1, 0, 8, 1, "dgx01");
  CHECK_THROWS_WITH(compute_task_env(j.map(), task(0, 8, 8, "dgx01"), topo, GpuAllocation{}, open,
                                     {{"OMP_TOOL_LIBRARIES", "/tmp/tool.so"}}),
                    Catch::Contains("OMP_TOOL_LIBRARIES") && Catch::Contains("a job may never set it"));
  CHECK(*compute_task_env(j.map(), task(0, 8, 8, "dgx01"), topo, GpuAllocation{}, EnvPolicy{},
                          {{"UCX_TLS", "rc,sm"}}).get("UCX_TLS") == "rc,sm");
}

TEST_CASE("NCCL debug switches only when the user sets them and user NCCL_* wins with a note") {
  const NodeTopology topo = load("dgx-h100.xml", "dgx-h100");
  const Job j = job("dgx-h100", 1, 0, 8, 1, "dgx01");
  const TaskEnv plain = compute_task_env(j.map(), task(0, 8, 8, "dgx01"), topo, GpuAllocation{}, EnvPolicy{}, {});
  for (const char* v : {"NCCL_P2P_DISABLE", "NCCL_IB_DISABLE", "NCCL_ALGO", "NCCL_PROTO", "NCCL_DEBUG"})
    CHECK(plain.get(v) == nullptr);
  const TaskEnv dbg = compute_task_env(j.map(), task(0, 8, 8, "dgx01"), topo, GpuAllocation{}, EnvPolicy{},
                                       {{"NCCL_ALGO", "Ring"}, {"NCCL_IB_HCA", "=mlx5_0,mlx5_3"}});
  CHECK(*dbg.get("NCCL_ALGO") == "Ring");
  CHECK(*dbg.get("NCCL_IB_HCA") == "=mlx5_0,mlx5_3");
  REQUIRE(dbg.warnings.size() == 2);
  CHECK_THAT(dbg.warnings[0], Catch::Contains("debugging switch"));
  CHECK_THAT(dbg.warnings[1], Catch::Contains("replaces meshrun's NCCL_IB_HCA==mlx5_0"));
}

TEST_CASE("hca_scope = rank: the rank's own NIC only, as an explicit site choice, with NCCL's warning") {
  const NodeTopology topo = load("dgx-h100.xml", "dgx-h100");
  const Job j = job("dgx-h100", 1, 0, 8, 1, "dgx01");
  EnvPolicy p;
  CHECK(p.hca_scope == EnvPolicy::HcaScope::node);  // the default: one list per node (NVIDIA/nccl#1478)
  p.hca_scope = EnvPolicy::HcaScope::rank;
  const char* nic[] = {"mlx5_0", "mlx5_3", "mlx5_4", "mlx5_5", "mlx5_6", "mlx5_9", "mlx5_10", "mlx5_11"};
  for (int rank = 0; rank < 8; ++rank) {
    const TaskEnv env = compute_task_env(j.map(), task(rank, 8, 8, "dgx01"), topo, GpuAllocation{}, p, {});
    CHECK(*env.get("NCCL_IB_HCA") == std::string("=") + nic[rank]);
    REQUIRE(env.warnings.size() == 1);
    CHECK(env.warnings[0] == hca_rank_warning());
    CHECK_THAT(env.warnings[0], Catch::Contains("NVIDIA/nccl#1478") && Catch::Contains("hca_scope = node"));
  }
}

TEST_CASE("site policy: node-wide HCA list and site variables and NCCL off and no CPU binding") {
  const NodeTopology topo = load("dgx-h100.xml", "dgx-h100");
  const Job j = job("dgx-h100", 1, 0, 8, 1, "dgx01");
  EnvPolicy p;
  p.hca_scope = EnvPolicy::HcaScope::node;
  p.site_env = {{"NCCL_IB_TIMEOUT", "22"}, {"UCX_TLS", "rc"}, {"MASTER_PORT", "1"}};
  const TaskEnv env = compute_task_env(j.map(), task(6, 8, 8, "dgx01"), topo, GpuAllocation{}, p,
                                       {{"UCX_TLS", "dc"}});
  CHECK(*env.get("NCCL_IB_HCA") == "=mlx5_0,mlx5_3,mlx5_4,mlx5_5,mlx5_6,mlx5_9,mlx5_10,mlx5_11");
  CHECK(*env.get("MESHRUN_NIC") == "mlx5_10");
  CHECK(*env.get("NCCL_IB_TIMEOUT") == "22");
  CHECK(*env.get("UCX_TLS") == "dc");  // the template wins over the site
  CHECK(*env.get("MASTER_PORT") != "1");
  REQUIRE(env.warnings.size() == 1);
  CHECK_THAT(env.warnings[0], Catch::Contains("site variable MASTER_PORT ignored"));
  p.nccl = EnvPolicy::Nccl::off;
  p.cpu_bind = EnvPolicy::CpuBind::none;
  const TaskEnv quiet = compute_task_env(j.map(), task(6, 8, 8, "dgx01"), topo, GpuAllocation{}, p, {});
  CHECK(quiet.get("NCCL_IB_HCA") == nullptr);
  CHECK(quiet.get("NCCL_CROSS_NIC") == nullptr);
  CHECK(quiet.cpus.empty());
  CHECK(quiet.get("MESHRUN_CPUS") == nullptr);
}

TEST_CASE("CPU affinity stays inside the task's allowed CPUs") {
  const NodeTopology topo = load("dgx-h100.xml", "dgx-h100");
  const Job j = job("dgx-h100", 1, 0, 8, 1, "dgx01");
  TaskContext c = task(1, 8, 8, "dgx01");
  c.allowed_cpus = *parse_cpuset("0-27,112-139");
  CHECK(compute_task_env(j.map(), c, topo, GpuAllocation{}, EnvPolicy{}, {}).cpus.str() == "0-27,112-139");
  c.allowed_cpus = *parse_cpuset("56-60");
  const TaskEnv far = compute_task_env(j.map(), c, topo, GpuAllocation{}, EnvPolicy{}, {});
  CHECK(far.cpus.empty());
  REQUIRE(far.warnings.size() == 1);
  CHECK_THAT(far.warnings[0], Catch::Contains("outside the task's allowed CPUs"));
}

TEST_CASE("no rail-optimized fabric or shared NICs: no NCCL_CROSS_NIC") {
  NodeTopology topo = load("dgx-h100.xml", "dgx-h100");
  const Job generic = job("generic", 1, 8, 8, 1, "n1");
  CHECK(compute_task_env(generic.map(), task(0, 8, 8, "n1"), topo, GpuAllocation{}, EnvPolicy{}, {})
            .get("NCCL_CROSS_NIC") == nullptr);
  topo.nic_of_gpu = {0, 0, 3, 3, 6, 6, 9, 9};  // two GPUs per NIC
  const Job dgx = job("dgx-h100", 1, 0, 8, 1, "n1");
  const TaskEnv env = compute_task_env(dgx.map(), task(1, 8, 8, "n1"), topo, GpuAllocation{}, EnvPolicy{}, {});
  CHECK(env.get("NCCL_CROSS_NIC") == nullptr);
  CHECK(*env.get("NCCL_IB_HCA") == "=mlx5_0,mlx5_3,mlx5_6,mlx5_9");  // the paired NICs, each once
  CHECK(*env.get("MESHRUN_NIC") == "mlx5_0");
}

TEST_CASE("CPU-only node and Slurm GPUs the topology cannot see") {
  NodeTopology cpu;
  cpu.source = "live";
  cpu.machine_cpus = *parse_cpuset("0-7");
  const Job j = job("generic", 1, 4, 1, 1, "n1");
  const TaskEnv env = compute_task_env(j.map(), task(2, 4, 4, "n1"), cpu, GpuAllocation{}, EnvPolicy{}, {});
  CHECK(env.get("CUDA_VISIBLE_DEVICES") == nullptr);
  CHECK(env.get("NCCL_IB_HCA") == nullptr);
  CHECK(env.cpus.str() == "4-5");  // an even block per local task
  TaskContext bound = task(2, 4, 4, "n1");
  bound.allowed_cpus = *parse_cpuset("6");  // already bound by the launcher: left alone
  CHECK(compute_task_env(j.map(), bound, cpu, GpuAllocation{}, EnvPolicy{}, {}).cpus.empty());
  bound.allowed_cpus = cpu.machine_cpus;
  CHECK(compute_task_env(j.map(), bound, cpu, GpuAllocation{}, EnvPolicy{}, {}).cpus.str() == "4-5");
  CHECK(env.gpu == -1);
  REQUIRE(env.warnings.size() == 1);
  CHECK_THAT(env.warnings[0], Catch::Contains("CPU-only"));
  const TaskEnv fake = compute_task_env(j.map(), task(2, 4, 4, "n1"), cpu, slurm_gpus({4, 5, 6, 7}), EnvPolicy{}, {});
  CHECK(*fake.get("CUDA_VISIBLE_DEVICES") == "4,5,6,7");
  CHECK(*fake.get("MESHRUN_CUDA_DEVICE") == "2");
  CHECK(fake.gpu == 6);
  CHECK(fake.get("MESHRUN_GPU_PCI") == nullptr);
  CHECK(fake.get("NCCL_IB_HCA") == nullptr);
  CHECK_THAT(fake.warnings.at(0), Catch::Contains("shows no NVIDIA GPU"));
}

TEST_CASE("MASTER_PORT: distinct for concurrent steps and nearby jobs and below the ephemeral range") {
  const EnvPolicy p;
  CHECK(master_port(4242, 3, p) == 27875);
  std::set<int> ports;
  for (uint32_t job = 1000; job < 1000 + 750; ++job)
    for (uint32_t step = 0; step < 16; ++step) {
      const int port = master_port(job, step, p);
      CHECK((port >= 20000 && port < 32768));
      ports.insert(port);
    }
  CHECK(ports.size() == 750 * 16);
  CHECK(master_port(7, 0xfffffffbu, p) == 20000 + 7 * 16 + 11);  // the batch step folds in too
  EnvPolicy wide;
  wide.port_jobs = 1000;
  CHECK_THROWS_WITH(master_port(1, 1, wide), Catch::Contains("ephemeral"));
}

TEST_CASE("a paired NIC whose port is not ACTIVE is pinned with a warning") {
  NodeTopology topo = load("dgx-h100.xml", "dgx-h100");
  REQUIRE(topo.nics[3].name == "mlx5_3");
  CHECK(topo.nics[3].port_state == 4);
  topo.nics[3].port_state = 1;  // DOWN
  const Job j = job("dgx-h100", 1, 0, 8, 1, "dgx01");
  const TaskEnv env = compute_task_env(j.map(), task(1, 8, 8, "dgx01"), topo, GpuAllocation{}, EnvPolicy{}, {});
  CHECK(*env.get("MESHRUN_NIC") == "mlx5_3");
  REQUIRE(env.warnings.size() == 1);
  CHECK_THAT(env.warnings[0], Catch::Contains("mlx5_3 (paired with GPU 1) has port state 1, not ACTIVE"));
  CHECK(compute_task_env(j.map(), task(2, 8, 8, "dgx01"), topo, GpuAllocation{}, EnvPolicy{}, {}).warnings.empty());
}

TEST_CASE("a template whose env section sets LD_PRELOAD is rejected with a message") {
  Config cfg;
  apply_toml_text(cfg, "[env]\nOMP_NUM_THREADS = \"4\"\nLD_PRELOAD = \"/tmp/x.so\"\n", "evil.toml",
                  SourceKind::template_file);
  REQUIRE(cfg.job.env.count("LD_PRELOAD") == 1);
  const NodeTopology topo = load("dgx-h100.xml", "dgx-h100");
  const Job j = job("dgx-h100", 1, 0, 8, 1, "dgx01");
  CHECK_THROWS_WITH(compute_task_env(j.map(), task(0, 8, 8, "dgx01"), topo, GpuAllocation{}, EnvPolicy{}, cfg.job.env),
                    Catch::Equals("[env] sets LD_PRELOAD, which makes tasks load or run other code; a job may "
                                  "never set it, remove it (only the site configuration may)"));
  // Before any task: check_job_env names where each refused name came from.
  apply_value(cfg, "env.RANK", "\"3\"", Origin{SourceKind::flag, "--mesh-env RANK"});
  const auto problems = check_job_env(cfg, EnvPolicy{});
  REQUIRE(problems.size() == 2);
  CHECK(problems[0].message.rfind("[env] (evil.toml:", 0) == 0);
  CHECK(problems[0].message.find("sets LD_PRELOAD, which makes tasks load or run other code") != std::string::npos);
  CHECK(problems[1].message == "--mesh-env sets RANK, which meshrun computes for each task; remove it");
  CHECK(check_job_env(Config{}, EnvPolicy{}).empty());
}

TEST_CASE("CUDA_DEVICE_MAX_CONNECTIONS follows Megatron-Core's rule (arguments.py validate_args)") {
  Layout l;
  std::string w;
  l.tp = 2;
  CHECK(cuda_device_max_connections(l, 9, &w) == "1");  // Hopper, TP
  CHECK(w.empty());
  CHECK(cuda_device_max_connections(l, 8, &w) == "1");  // Ampere
  CHECK(cuda_device_max_connections(l, 10, &w).empty());  // Blackwell: no requirement
  CHECK(w.empty());
  l.tp = 1;
  CHECK(cuda_device_max_connections(l, 9, &w).empty());  // neither TP nor CP
  l.cp = 2;
  CHECK(cuda_device_max_connections(l, 9, &w) == "1");  // CP counts like TP
  l.zero_stage = 3;  // FSDP-style sharding wants it above 1 or unset
  CHECK(cuda_device_max_connections(l, 9, &w).empty());
  CHECK_THAT(w, Catch::Contains("FSDP"));
  l.zero_stage = 1;
  CHECK(cuda_device_max_connections(l, 0, &w).empty());
  CHECK_THAT(w, Catch::Contains("GPU generation unknown"));
  CHECK(gpu_arch_major(0x2330, "") == 9);
  CHECK(gpu_arch_major(0x20b2, "") == 8);
  CHECK(gpu_arch_major(0x2941, "") == 10);
  CHECK(gpu_arch_major(0, "NVIDIA H100 80GB HBM3") == 9);
  CHECK(gpu_arch_major(0, "h200") == 9);
  CHECK(gpu_arch_major(0, "a100-80gb") == 8);
  CHECK(gpu_arch_major(0, "gb200") == 10);
  CHECK(gpu_arch_major(0, "generic") == 0);
  // A template's [env] may still choose (CUDA_* is allowed) and wins.
  const NodeTopology topo = load("dgx-h100.xml", "dgx-h100");
  const Job j = job("dgx-h100", 1, 0, 8, 1, "dgx01");
  const TaskEnv env = compute_task_env(j.map(), task(0, 8, 8, "dgx01"), topo, GpuAllocation{}, EnvPolicy{},
                                       {{"CUDA_DEVICE_MAX_CONNECTIONS", "32"}});
  CHECK(*env.get("CUDA_DEVICE_MAX_CONNECTIONS") == "32");
}

TEST_CASE("IMEX channel pre-flight for multi-node NVLink") {
  const std::string dir = std::string(MESHRUN_TOPO_BUILD_DIR) + "/imex-test";
  std::filesystem::remove_all(dir);
  CHECK_THAT(imex_channel_problem(dir), Catch::StartsWith("multi-node NVLink needs an IMEX channel but " + dir) &&
                                            Catch::Contains("nvidia-imex"));
  std::filesystem::create_directories(dir);
  std::FILE* f = std::fopen((dir + "/channel0").c_str(), "w");  // a regular file is not a channel
  REQUIRE(f);
  std::fclose(f);
  CHECK_FALSE(imex_channel_problem(dir).empty());
  std::filesystem::remove(dir + "/channel0");
  if (::mknod((dir + "/channel0").c_str(), S_IFCHR | 0600, makedev(1, 3)) == 0)  // root only (as /dev/null)
    CHECK(imex_channel_problem(dir).empty());
  std::filesystem::remove_all(dir);
}
