// compute_task_env(): the one place that turns (rank map, Slurm task, node topology, GPU allocation, site
// policy, template [env]) into a task's environment. See task_env.hpp for the contract.
#include "meshrun/task_env.hpp"

#include <algorithm>
#include <filesystem>
#include <set>

namespace meshrun {
namespace {

std::string join(const std::vector<std::string>& parts, const char* sep = ",") {
  std::string out;
  for (const auto& p : parts) out += (out.empty() ? "" : sep) + p;
  return out;
}

std::string join_ints(const std::vector<int>& v) {
  std::vector<std::string> s;
  for (int x : v) s.push_back(std::to_string(x));
  return join(s);
}

// Variables a template may set (prefixes end in '*'); everything else needs the site's allow-list.
const std::vector<std::string> kBuiltinAllow = {
    "NCCL_*", "TORCH_*", "TORCHINDUCTOR_*", "PYTORCH_*", "OMP_*", "MKL_*", "OPENBLAS_*", "CUDA_*", "CUBLAS_*",
    "CUBLASLT_*", "CUDNN_*", "UCX_*", "FI_*", "HF_*", "TRANSFORMERS_*", "TOKENIZERS_*", "WANDB_*", "TRITON_*",
    "TZ", "LANG", "LC_ALL"};
// Variables that make a process load or run other code: never from a template, whatever the allow-list says.
// Each allowed prefix above was audited against its library's documented variables (docs/topology.md, "Loader
// variables", with the sources): a variable that names a library, plugin, program, Python module or a cache
// of compiled code that is loaded again is listed here; only the site's env (trusted) may set one.
const std::vector<std::string> kLoaderVars = {
    // The dynamic loader, shells and interpreters (not allow-listed; listed so a site allow-list cannot open them).
    "LD_*", "DYLD_*", "PATH", "PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "PYTHONUSERBASE", "PYTHONINSPECT",
    "BASH_ENV", "ENV", "IFS", "SHELLOPTS", "PERL5LIB", "PERL5OPT", "RUBYOPT", "NODE_OPTIONS", "GCONV_PATH",
    "GLIBC_TUNABLES", "HOSTALIASES", "MALLOC_CONF",
    // NCCL_*: plugin libraries, and the configuration file that can set them.
    "NCCL_NET_PLUGIN", "NCCL_TUNER_PLUGIN", "NCCL_PROFILER_PLUGIN", "NCCL_ENV_PLUGIN", "NCCL_CONF_FILE",
    // CUDA_*: the injection library, the driver's JIT cache (compiled kernels loaded again).
    "CUDA_INJECTION64_PATH", "CUDA_CACHE_PATH",
    // OMP_*: OMPT tool libraries (dlopen'ed by the OpenMP runtime).
    "OMP_TOOL_LIBRARIES",
    // UCX_*: the directory of loadable modules; the debugger command run on an error.
    "UCX_MODULE_DIR", "UCX_GDB_COMMAND",
    // FI_*: libfabric's DL provider directory.
    "FI_PROVIDER_PATH",
    // TRITON_*: programs and libraries Triton runs or loads, its kernel cache and override directories, and
    // the Python classes it imports for its cache.
    "TRITON_PTXAS_PATH", "TRITON_PTXAS_BLACKWELL_PATH", "TRITON_CUOBJDUMP_PATH", "TRITON_NVDISASM_PATH",
    "TRITON_LIBCUDA_PATH", "TRITON_LIBDEVICE_PATH", "TRITON_HIP_LLD_PATH", "TRITON_CACHE_DIR", "TRITON_HOME",
    "TRITON_OVERRIDE_DIR", "TRITON_CACHE_MANAGER", "TRITON_REMOTE_CACHE_BACKEND",
    // TORCH_* / TORCHINDUCTOR_* / PYTORCH_*: C++ extensions built and loaded, torch.hub's code, Inductor's
    // compiled-kernel cache, the jiterator's kernel cache.
    "TORCH_EXTENSIONS_DIR", "TORCH_HOME", "TORCHINDUCTOR_CACHE_DIR", "PYTORCH_KERNEL_CACHE_PATH",
    // HF_*: the directory of downloaded model code that transformers puts on sys.path.
    "HF_MODULES_CACHE"};
// Variables meshrun computes per task; neither the site nor a template may set them.
const std::vector<std::string> kComputed = {
    "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "NODE_RANK", "ROLE_RANK", "ROLE_WORLD_SIZE",
    "MASTER_ADDR", "MASTER_PORT", "CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "MESHRUN_*"};
// NCCL's "do not use in production" switches: passed only when the user sets them, with a warning.
const std::vector<std::string> kNcclDebug = {
    "NCCL_P2P_DISABLE", "NCCL_IB_DISABLE", "NCCL_SHM_DISABLE", "NCCL_ALGO", "NCCL_PROTO", "NCCL_P2P_LEVEL",
    "NCCL_NET_GDR_LEVEL", "NCCL_NET_GDR_READ", "NCCL_MIN_CTAS", "NCCL_MAX_CTAS", "NCCL_BUFFSIZE"};

bool matches(const std::string& name, const std::string& pattern) {
  if (!pattern.empty() && pattern.back() == '*')
    return name.compare(0, pattern.size() - 1, pattern, 0, pattern.size() - 1) == 0;
  return name == pattern;
}
bool matches_any(const std::string& name, const std::vector<std::string>& patterns) {
  return std::any_of(patterns.begin(), patterns.end(), [&](const auto& p) { return matches(name, p); });
}

bool valid_name(const std::string& n) {
  if (n.empty() || n.size() > 128 || std::isdigit(static_cast<unsigned char>(n[0]))) return false;
  return std::all_of(n.begin(), n.end(), [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; });
}

class VarList {
 public:
  explicit VarList(TaskEnv& env) : env_(env) {}
  void set(const std::string& name, const std::string& value) {
    for (auto& [k, v] : env_.vars)
      if (k == name) {
        v = value;
        return;
      }
    env_.vars.emplace_back(name, value);
  }
  void set(const std::string& name, int value) { set(name, std::to_string(value)); }

 private:
  TaskEnv& env_;
};

int device_index_in(const std::vector<int>& list, int id) {
  auto it = std::find(list.begin(), list.end(), id);
  return it == list.end() ? -1 : static_cast<int>(it - list.begin());
}

// The task's GPU, CUDA_VISIBLE_DEVICES and device index. Every task sees all of the step's GPUs on the node
// in PCI order (so device LOCAL_RANK is its own GPU, as under torchrun, and CUDA IPC/P2P to peers works),
// except where a per-task device cgroup shows it only its own GPU.
void place_gpu(const TaskContext& ctx, const NodeTopology& topo, const GpuAllocation& alloc, TaskEnv& env,
               VarList& vars) {
  const int topo_gpus = static_cast<int>(topo.gpus.size());
  std::vector<int> step = alloc.step_gpus;
  if (!alloc.managed)
    for (int i = 0; i < topo_gpus; ++i) step.push_back(i);
  if (alloc.gpus_per_task > 1)
    throw TaskEnvError("--gpus-per-task=" + std::to_string(alloc.gpus_per_task) +
                       ": meshrun runs one rank per GPU; use --gpus-per-task=1 or --gpus-per-node");
  if (static_cast<int>(step.size()) < ctx.local_world)
    throw TaskEnvError(std::to_string(ctx.local_world) + " tasks on this node but the step has " +
                       std::to_string(step.size()) + " GPU(s) here" +
                       (alloc.managed ? " (SLURM_STEP_GPUS=" + join_ints(step) + ")" : "") +
                       "; request --gpus-per-node=" + std::to_string(ctx.local_world) + " or fewer tasks per node");
  const int gpu = step[ctx.local_rank];
  if (topo_gpus == 0)
    env.warnings.push_back("the topology (" + topo.source + ") shows no NVIDIA GPU: CUDA_VISIBLE_DEVICES follows "
                           "Slurm's allocation alone, without CPU or NIC binding");
  else if (gpu < 0 || gpu >= topo_gpus)
    throw TaskEnvError("Slurm GPU index " + std::to_string(gpu) + " is not on this node's topology (" +
                       std::to_string(topo_gpus) + " GPUs in " + topo.source +
                       "); check gres.conf or pass the node's own topology file");
  std::string visible;
  int device = ctx.local_rank;
  if (alloc.constrained && alloc.gpus_per_task == 1) {
    visible = "0";
    device = 0;
    env.warnings.push_back(
        "--gpus-per-task with ConstrainDevices gives each task a cgroup with only its own GPU: NCCL loses "
        "CUDA IPC/NVLink P2P to its peers and programs calling set_device(LOCAL_RANK) fail; prefer "
        "--gpus-per-node (MESHRUN_CUDA_DEVICE=0 names the task's device)");
  } else if (alloc.constrained) {
    std::vector<int> local(step.size());
    for (size_t i = 0; i < local.size(); ++i) local[i] = static_cast<int>(i);
    visible = join_ints(local);
  } else {
    visible = join_ints(step);
    device = device_index_in(step, gpu);
  }
  env.gpu = gpu;
  vars.set("CUDA_VISIBLE_DEVICES", visible);
  vars.set("CUDA_DEVICE_ORDER", "PCI_BUS_ID");  // CUDA ids in nvidia-smi / Slurm order
  vars.set("MESHRUN_CUDA_DEVICE", device);
  vars.set("MESHRUN_GPU", gpu);
  if (gpu < topo_gpus) vars.set("MESHRUN_GPU_PCI", topo.gpus[gpu].pci);
}

CpuSet choose_cpus(const TaskContext& ctx, const NodeTopology& topo, int gpu, TaskEnv& env) {
  const CpuSet& allowed = ctx.allowed_cpus.empty() ? topo.machine_cpus : ctx.allowed_cpus;
  if (gpu >= 0 && gpu < static_cast<int>(topo.gpus.size())) {
    CpuSet near = cpuset_intersect(topo.gpus[gpu].cpus, allowed);
    if (near.empty() && !topo.gpus[gpu].cpus.empty())
      env.warnings.push_back("the CPUs near GPU " + std::to_string(gpu) + " (" + topo.gpus[gpu].cpus.str() +
                             ") are outside the task's allowed CPUs (" + allowed.str() +
                             "); affinity left to Slurm (ask for the GPU's socket with --gres-flags or --cpu-bind)");
    return near;
  }
  // No GPU (or none the topology knows): when the task may use the whole node, an even block per local task;
  // when a launcher or cgroup already narrowed it, that choice stands (splitting it again would shrink it).
  const int n = allowed.count(), k = std::max(1, ctx.local_world);
  if (!ctx.allowed_cpus.empty() && ctx.allowed_cpus != topo.machine_cpus) return CpuSet{};
  if (n < k) return CpuSet{};
  CpuSet share;
  const int lo = ctx.local_rank * n / k, hi = (ctx.local_rank + 1) * n / k;
  share.cpus.assign(allowed.cpus.begin() + lo, allowed.cpus.begin() + hi);
  return share;
}

void nccl_vars(const RankMap& map, const NodeTopology& topo, const EnvPolicy& policy, int gpu, TaskEnv& env,
               VarList& vars) {
  if (policy.nccl == EnvPolicy::Nccl::off || gpu < 0 || gpu >= static_cast<int>(topo.gpus.size())) return;
  // A hand-built topology may lack a pairing: treat an unpaired GPU like a node without NICs.
  const int nic = gpu < static_cast<int>(topo.nic_of_gpu.size()) ? topo.nic_of_gpu[gpu] : -1;
  if (nic < 0 || nic >= static_cast<int>(topo.nics.size())) {
    std::string ifs = policy.socket_ifname;
    if (ifs.empty() && !topo.eth_netdevs.empty()) ifs = "=" + join(topo.eth_netdevs);
    if (!ifs.empty()) vars.set("NCCL_SOCKET_IFNAME", ifs);
    env.warnings.push_back(std::string(topo.nics.empty() ? "no InfiniBand/RoCE NIC on this node"
                                                         : "no NIC paired with GPU " + std::to_string(gpu)) +
                           ": NCCL falls back to TCP sockets" +
                           (ifs.empty() ? std::string(" on an interface it picks itself") : " over " + ifs) +
                           "; expect far lower inter-node bandwidth");
    return;
  }
  env.nic = nic;
  constexpr int kPortActive = 4;  // IB port state ACTIVE
  if (topo.nics[nic].port_state >= 0 && topo.nics[nic].port_state != kPortActive)
    env.warnings.push_back(topo.nics[nic].name + " (paired with GPU " + std::to_string(gpu) + ") has port state " +
                           std::to_string(topo.nics[nic].port_state) + ", not ACTIVE, in " + topo.source +
                           ": NCCL cannot use it; check its link (ibstat) or pin another NIC with NCCL_IB_HCA in [env]");
  std::vector<std::string> hcas;
  if (policy.hca_scope == EnvPolicy::HcaScope::rank) {
    hcas.push_back(topo.nics[nic].name);
    env.warnings.push_back(hca_rank_warning());
  } else {
    hcas = node_hca_list(topo);  // one list for every rank of the node (NVIDIA/nccl#1478)
  }
  vars.set("NCCL_IB_HCA", "=" + join(hcas));  // '=': exact names (mlx5_1 would also match mlx5_10..19)
  vars.set("MESHRUN_NIC", topo.nics[nic].name);
  if (!policy.socket_ifname.empty()) vars.set("NCCL_SOCKET_IFNAME", policy.socket_ifname);
  // Rail-optimized fabric and one NIC per GPU: keep each ring/tree on its own rail.
  std::set<int> distinct(topo.nic_of_gpu.begin(), topo.nic_of_gpu.end());
  if (map.cluster().type.rail_optimized && distinct.size() == topo.gpus.size()) vars.set("NCCL_CROSS_NIC", "0");
  const int domain = std::max(topo.nvlink.domain_gpus, map.cluster().nvlink_domain_gpus);
  if (domain > static_cast<int>(topo.gpus.size())) {
    if (topo.nvlink.source == "nvml" && !topo.nvlink.fabric_complete) {
      vars.set("NCCL_MNNVL_ENABLE", "0");
      env.warnings.push_back("the GPU fabric is not ready (NVML fabric state not COMPLETED): multi-node NVLink "
                             "disabled for this task; check nvidia-imex and the fabric manager");
    } else {
      vars.set("NCCL_MNNVL_ENABLE", "1");
    }
  }
}

}  // namespace

const std::string* TaskEnv::get(const std::string& name) const {
  for (const auto& [k, v] : vars)
    if (k == name) return &v;
  return nullptr;
}

std::string cuda_device_max_connections(const Layout& l, int arch, std::string* warning) {
  warning->clear();
  const bool tp_cp = l.tp > 1 || l.cp > 1;
  if (l.zero_stage == 3) {
    if (tp_cp && arch > 0 && arch < 10)
      *warning = "tp/cp > 1 with zero_stage = 3 (FSDP-style sharding) on GPUs before Blackwell: Megatron-Core wants "
                 "CUDA_DEVICE_MAX_CONNECTIONS=1 for TP/CP but FSDP wants it above 1 or unset; left unset (set it in "
                 "[env] to prefer TP/CP overlap)";
    return "";
  }
  if (!tp_cp) return "";
  if (arch == 0) {
    *warning = "GPU generation unknown: CUDA_DEVICE_MAX_CONNECTIONS not set; Megatron-Core requires 1 with tp/cp > 1 "
               "before Blackwell, set it in [env] if these are Hopper or older GPUs";
    return "";
  }
  return arch < 10 ? "1" : "";  // "requirement no longer exists since the Blackwell architecture"
}

std::string imex_channel_problem(const std::string& dir) {
  std::error_code ec;
  for (auto it = std::filesystem::directory_iterator(dir, ec); !ec && it != std::filesystem::directory_iterator();
       it.increment(ec)) {
    if (it->path().filename().string().rfind("channel", 0) == 0 && it->is_character_file(ec)) return "";
  }
  return "multi-node NVLink needs an IMEX channel but " + dir + " has none (" +
         (ec ? ec.message() : std::string("no channel device")) +
         "); start nvidia-imex on the NVLink domain's nodes and create a channel (nvidia-modprobe -i 0:1), or run "
         "with NCCL_MNNVL_ENABLE=0 in [env]";
}

std::string hca_rank_warning() {
  return "hca_scope = rank sets a different NCCL_IB_HCA on each rank of a node; NCCL's maintainers say not to "
         "(NVIDIA/nccl#1478: ring construction across the node's ranks breaks) and NCCL pairs GPUs with their "
         "nearest NIC itself: use hca_scope = node (the default; MESHRUN_NIC still names each rank's NIC)";
}

int master_port(uint32_t job_id, uint32_t step_id, const EnvPolicy& p) {
  if (p.port_base < 1024 || p.port_jobs < 1 || p.port_steps < 1 ||
      static_cast<long>(p.port_base) + static_cast<long>(p.port_jobs) * p.port_steps > 32768)
    throw TaskEnvError("MASTER_PORT range " + std::to_string(p.port_base) + " + " + std::to_string(p.port_jobs) +
                       "x" + std::to_string(p.port_steps) +
                       " leaves 1024..32767; lower port_base, port_jobs or port_steps so it ends below the "
                       "ephemeral range (32768)");
  return p.port_base + static_cast<int>(job_id % static_cast<uint32_t>(p.port_jobs)) * p.port_steps +
         static_cast<int>(step_id % static_cast<uint32_t>(p.port_steps));
}

std::string check_extra_var(const std::string& name, const EnvPolicy& policy, const std::string& source) {
  if (!valid_name(name))
    return source + " name '" + name + "' is not a valid variable name; use letters, digits and '_'";
  if (matches_any(name, kLoaderVars))
    return source + " sets " + name + ", which makes tasks load or run other code; a job may never set it, "
           "remove it (only the site configuration may)";
  if (matches_any(name, kComputed))
    return source + " sets " + name + ", which meshrun computes for each task; remove it";
  if (!matches_any(name, kBuiltinAllow) && !matches_any(name, policy.allow))
    return source + " sets " + name + ", which is not in the allow-list (NCCL_*, TORCH_*, OMP_*, CUDA_*, UCX_*, ...); "
           "remove it or ask the site to allow it";
  return "";
}

namespace {
std::vector<std::pair<std::string, std::string>> layout_vars(const Layout& l, const Coord& c) {
  const std::pair<const char*, std::pair<int, int>> axes[] = {
      {"TP", {c.tp, l.tp}}, {"CP", {c.cp, l.cp}}, {"PP", {c.pp, l.pp}}, {"DP", {c.dp, l.dp}}, {"EP", {c.ep, l.ep}}};
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& [axis, rs] : axes) {
    out.emplace_back(std::string("MESHRUN_") + axis + "_RANK", std::to_string(rs.first));
    out.emplace_back(std::string("MESHRUN_") + axis + "_SIZE", std::to_string(rs.second));
  }
  out.emplace_back("MESHRUN_LAYOUT", "tp=" + std::to_string(l.tp) + ",cp=" + std::to_string(l.cp) + ",pp=" +
                                         std::to_string(l.pp) + ",dp=" + std::to_string(l.dp) + ",ep=" +
                                         std::to_string(l.ep));
  out.emplace_back("MESHRUN_ORDER", l.order.str());
  return out;
}
}  // namespace

std::vector<std::pair<std::string, std::string>> layout_env(const Layout& l, int rank) {
  return layout_vars(l, RankGrid(l).coords(rank));
}

std::vector<std::pair<std::string, std::string>> layout_env(const RankMap& map, int rank) {
  return layout_vars(map.layout(), map.coords(rank));
}

TaskEnv compute_task_env(const RankMap& map, const TaskContext& ctx, const NodeTopology& topo,
                         const GpuAllocation& gpus, const EnvPolicy& policy,
                         const std::map<std::string, std::string>& extra_env) {
  TaskEnv env;
  VarList vars(env);
  const int per_node = map.cluster().gpus_per_node;
  if (ctx.world != map.world())
    throw TaskEnvError("the step has " + std::to_string(ctx.world) + " tasks but the layout needs " +
                       std::to_string(map.world()) + " (tp*cp*pp*dp); launch --ntasks=" +
                       std::to_string(map.world()) + " or change the layout");
  if (ctx.rank < 0 || ctx.rank >= ctx.world)
    throw TaskEnvError("task rank " + std::to_string(ctx.rank) + " is outside 0.." + std::to_string(ctx.world - 1) +
                       "; check SLURM_PROCID");
  const Placement place = map.placement(ctx.rank);
  if (ctx.local_world != per_node || ctx.local_rank != place.local_rank)
    throw TaskEnvError("rank " + std::to_string(ctx.rank) + " is local task " + std::to_string(ctx.local_rank) +
                       " of " + std::to_string(ctx.local_world) + " but the layout places it as local rank " +
                       std::to_string(place.local_rank) + " of " + std::to_string(per_node) +
                       "; launch with --ntasks-per-node=" + std::to_string(per_node) + " --distribution=block");
  if (ctx.master_addr.empty())
    throw TaskEnvError("no master address: SLURM_STEP_NODELIST is empty; run inside a Slurm step or set it");

  // torchrun-compatible variables.
  vars.set("RANK", ctx.rank);
  vars.set("LOCAL_RANK", ctx.local_rank);
  vars.set("WORLD_SIZE", ctx.world);
  vars.set("LOCAL_WORLD_SIZE", ctx.local_world);
  vars.set("GROUP_RANK", place.node);
  vars.set("NODE_RANK", place.node);  // the node index under Lightning's name (LightningEnvironment)
  vars.set("ROLE_RANK", ctx.rank);
  vars.set("ROLE_WORLD_SIZE", ctx.world);
  vars.set("MASTER_ADDR", ctx.master_addr);
  vars.set("MASTER_PORT", master_port(ctx.job_id, ctx.step_id, policy));

  // The layout and this rank's coordinates.
  for (const auto& [name, value] : layout_env(map, ctx.rank)) vars.set(name, value);

  if (!topo.gpus.empty() || (gpus.managed && !gpus.step_gpus.empty())) {
    place_gpu(ctx, topo, gpus, env, vars);
  } else {
    env.warnings.push_back("no NVIDIA GPU on this node (" + topo.source +
                           "): CPU-only task, no CUDA_VISIBLE_DEVICES or NCCL variables");
  }
  if (policy.cpu_bind == EnvPolicy::CpuBind::numa) {
    env.cpus = choose_cpus(ctx, topo, env.gpu, env);
    if (!env.cpus.empty()) vars.set("MESHRUN_CPUS", env.cpus.str());
  }
  nccl_vars(map, topo, policy, env.gpu, env, vars);
  {
    const int arch = env.gpu >= 0 && env.gpu < static_cast<int>(topo.gpus.size())
                         ? gpu_arch_major(topo.gpus[env.gpu].pci_device_id, topo.gpus[env.gpu].model)
                         : 0;
    std::string warning;
    const std::string conns = cuda_device_max_connections(
        map.layout(), arch ? arch : gpu_arch_major(0, map.cluster().type.gpu), &warning);
    if (!conns.empty()) vars.set("CUDA_DEVICE_MAX_CONNECTIONS", conns);
    if (!warning.empty()) env.warnings.push_back(warning);
  }

  // OpenMP threads per task: torchrun sets OMP_NUM_THREADS=1 when it is unset (eight processes per node would
  // otherwise each start a thread per core). A value the task inherits is left alone; the site's or the
  // template's, set below, wins over this default.
  if (!ctx.omp_threads_given) vars.set("OMP_NUM_THREADS", "1");

  // Site variables: trusted, but never the computed ones.
  for (const auto& [k, v] : policy.site_env) {
    if (!valid_name(k) || matches_any(k, kComputed)) {
      env.warnings.push_back("site variable " + k + " ignored: meshrun computes it for each task");
      continue;
    }
    vars.set(k, v);
  }
  // The template's [env]: allow-listed; a user's NCCL_* replaces the computed value.
  for (const auto& [k, v] : extra_env) {
    if (std::string why = check_extra_var(k, policy); !why.empty()) throw TaskEnvError(why);
    if (matches_any(k, kNcclDebug))
      env.warnings.push_back(k + "=" + v + " is an NCCL debugging switch (\"not for production\"); remove it "
                             "from [env] once the problem it works around is understood");
    if (const std::string* old = env.get(k); old && *old != v && k.rfind("NCCL_", 0) == 0)
      env.warnings.push_back("[env] " + k + "=" + v + " replaces meshrun's " + k + "=" + *old);
    vars.set(k, v);
  }
  if (!ctx.omp_threads_given && !policy.site_env.count("OMP_NUM_THREADS") && !extra_env.count("OMP_NUM_THREADS"))
    env.notes.push_back("OMP_NUM_THREADS=1 for every task, as torchrun sets it when unset; set OMP_NUM_THREADS in "
                        "the environment or the template's [env] to give each rank more threads");
  return env;
}

}  // namespace meshrun
