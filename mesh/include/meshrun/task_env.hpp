// The one function that computes everything a task needs before it starts: rank variables, GPU visibility,
// CPU affinity, NCCL network variables and the allowed extra variables. The SPANK plugin (task_init),
// `meshrun exec` and the trainer all call compute_task_env(); nothing else computes these values.
//
// Contract for slurmstepd: every function here is pure over its arguments (no environment reads, no I/O, no
// globals), bounded in work, and reports bad input by throwing TaskEnvError (one line: problem; fix). Callers
// inside slurmstepd catch it; nothing here aborts.
//
// CHANGELOG:
//   2026-12-01: EnvPolicy::hca_scope defaults to node (one NCCL_IB_HCA per node, NVIDIA/nccl#1478);
//               hca_rank_warning(); task_env_from_slurm(); layout_env(RankMap, rank).
#pragma once
#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "meshrun/bounded_file.hpp"
#include "meshrun/rank_map.hpp"
#include "meshrun/topology.hpp"

namespace meshrun {

// Bad input for a task's environment (fewer GPUs than tasks, a forbidden variable, ...). Front ends print
// what() and exit 2; the plugin logs it with slurm_error and fails the task.
struct TaskEnvError : std::runtime_error {
  explicit TaskEnvError(const std::string& message) : std::runtime_error(cut_long_values(message)) {}
};

// The GPUs Slurm gave this step on this node, and how the task can see them.
struct GpuAllocation {
  // Global GPU indices (nvidia-smi / PCI order) of the step on this node, ascending: SLURM_STEP_GPUS, else
  // SLURM_JOB_GPUS, else CUDA_VISIBLE_DEVICES when unconstrained. Empty with `managed` false = Slurm manages
  // no GPUs here: every GPU of the topology is the step's.
  std::vector<int> step_gpus;
  bool managed = false;      // a Slurm GPU variable was present
  // ConstrainDevices: the task's device cgroup holds only its GPUs and CUDA numbers them from 0.
  bool constrained = false;
  // --gpus-per-task (0 = not given). With ConstrainDevices each task's cgroup then holds only its own GPUs.
  int gpus_per_task = 0;
};

// Who the task is. Filled from Slurm's variables by task_context_from_slurm(), or by hand.
struct TaskContext {
  int rank = 0;              // SLURM_PROCID (global, het-job offset included)
  int world = 1;             // SLURM_NTASKS
  int local_rank = 0;        // SLURM_LOCALID
  int local_world = 1;       // tasks of this step on this node (SLURM_TASKS_PER_NODE / SLURM_STEP_TASKS_PER_NODE)
  int node_id = 0;           // SLURM_NODEID (index in the step's node list)
  std::string master_addr;   // first host of SLURM_STEP_NODELIST (else SLURM_JOB_NODELIST)
  uint32_t job_id = 0;       // SLURM_JOB_ID
  uint32_t step_id = 0;      // SLURM_STEP_ID
  CpuSet allowed_cpus;       // CPUs the task may use (its cgroup / affinity mask); empty = the whole node
  bool omp_threads_given = false;  // OMP_NUM_THREADS is already set in the task's environment
};

// What the site allows and wants. Defaults suit a DGX-style cluster; the site file can change them.
struct EnvPolicy {
  enum class Nccl { automatic, off };  // off: emit no NCCL_* variable at all (the user's still pass)
  Nccl nccl = Nccl::automatic;
  // NCCL_IB_HCA: "node" (default) = every GPU-paired NIC of the node (storage ports excluded), the same list on
  // every rank of the node; NCCL pairs each GPU with its nearest NIC itself. "rank" = only the task's paired
  // NIC: an explicit site choice that NCCL's maintainers advise against ("You should not set NCCL_IB_HCA
  // differently on each rank", NVIDIA/nccl#1478); compute_task_env() warns when it is on.
  enum class HcaScope { rank, node };
  HcaScope hca_scope = HcaScope::node;
  enum class CpuBind { numa, none };   // numa: the GPU's NUMA domain (intersected with allowed_cpus)
  CpuBind cpu_bind = CpuBind::numa;
  std::string socket_ifname;           // NCCL_SOCKET_IFNAME from the site; "" = derive from the topology
  // Extra names (exact, or prefixes ending in '*') the site allows in a template's [env], besides the built-in
  // list (NCCL_*, TORCH_*, OMP_*, CUDA_* ...). Loader variables (LD_*, PYTHONPATH, ...) are never allowed.
  std::vector<std::string> allow;
  // Variables the site sets on every task (trusted: any name except the computed ones). Template values of
  // the same name win, where the allow-list lets them.
  std::map<std::string, std::string> site_env;
  // MASTER_PORT = port_base + (job_id mod port_jobs) * port_steps + (step_id mod port_steps).
  int port_base = 20000;
  int port_jobs = 750;
  int port_steps = 16;
};

// The result. `vars` are in a stable order (computed ones first, then site, then user); the caller sets each
// (spank_setenv with overwrite, or setenv before exec). `cpus` empty = leave affinity alone.
struct TaskEnv {
  std::vector<std::pair<std::string, std::string>> vars;
  CpuSet cpus;
  int gpu = -1;              // global GPU index (topology index) of the task, -1 on a CPU-only node
  int nic = -1;              // paired NIC (topology index), -1 if none
  std::vector<std::string> warnings;  // one line each
  std::vector<std::string> notes;     // defaults worth knowing (OMP_NUM_THREADS), one line each; said once per job
  const std::string* get(const std::string& name) const;  // nullptr if absent
};

// The environment of one task. `extra_env` is the template's [env] (user variables, allow-listed).
// Throws TaskEnvError on: the task's rank/local rank disagreeing with the rank map's block placement, more
// tasks than GPUs on the node, a GPU index outside the topology, a forbidden or unknown extra variable.
TaskEnv compute_task_env(const RankMap& map, const TaskContext& ctx, const NodeTopology& topo,
                         const GpuAllocation& gpus, const EnvPolicy& policy,
                         const std::map<std::string, std::string>& extra_env);

// Builders from a map of Slurm variables (pure: the caller passes the environment, e.g. environment_map()).
// Missing or malformed SLURM_PROCID/SLURM_NTASKS/SLURM_LOCALID throw TaskEnvError naming the variable.
TaskContext task_context_from_slurm(const std::map<std::string, std::string>& env);
// Reads SLURM_STEP_GPUS, SLURM_JOB_GPUS, CUDA_VISIBLE_DEVICES, SLURM_GPUS_PER_TASK and the optional
// MESHRUN_CONSTRAIN_DEVICES=0|1 (the plugin sets it from cgroup.conf when it knows). Without it, ConstrainDevices
// is inferred: CUDA_VISIBLE_DEVICES holding 0-based indices that are not the task's global indices.
GpuAllocation gpu_allocation_from_slurm(const std::map<std::string, std::string>& env);

// The one path from Slurm's task variables to a task's environment, shared by the SPANK plugin's task_init and
// `meshrun exec` under srun: task_context_from_slurm() (who the task is, and that Slurm placed the step in equal
// blocks) + gpu_allocation_from_slurm() + compute_task_env(). `allowed_cpus` = the CPUs the task may use now
// (its affinity mask); empty = the whole node. Throws TaskEnvError with a one-line message.
TaskEnv task_env_from_slurm(const RankMap& map, const std::map<std::string, std::string>& slurm_env,
                            const NodeTopology& topo, const EnvPolicy& policy,
                            const std::map<std::string, std::string>& extra_env, const CpuSet& allowed_cpus);

// The layout part of compute_task_env()'s output for one rank: MESHRUN_{TP,CP,PP,DP,EP}_{RANK,SIZE},
// MESHRUN_LAYOUT and MESHRUN_ORDER. Exposed so a program can check what a launcher set against its own map.
std::vector<std::pair<std::string, std::string>> layout_env(const Layout& layout, int rank);
// The same from a rank map the caller already holds (no second rank grid).
std::vector<std::pair<std::string, std::string>> layout_env(const RankMap& map, int rank);

// CUDA_DEVICE_MAX_CONNECTIONS by Megatron-Core's rule (megatron/training/arguments.py, validate_args): with
// tp > 1 or cp > 1 on GPUs before Blackwell (compute capability < 10) it must be 1 -- unless FSDP-style sharding
// (meshrun's zero_stage = 3) is on, which wants it above 1 or unset (then: unset and a warning). Blackwell and
// later: no requirement, unset. "" = leave unset; *warning gets one line where the rule cannot be met or the GPU
// generation is unknown. `arch_major` from gpu_arch_major().
std::string cuda_device_max_connections(const Layout& layout, int arch_major, std::string* warning);

// Multi-node NVLink (NCCL_MNNVL_ENABLE=1) needs an IMEX channel: a character device in `dir`
// (/dev/nvidia-caps-imex-channels/channelN, made by the NVIDIA driver when nvidia-imex runs). "" when one
// exists, else the one-line refusal. Reads the directory (not pure): front ends call it before running a task.
std::string imex_channel_problem(const std::string& dir = "/dev/nvidia-caps-imex-channels");

// The warning every front end prints when the site chose hca_scope = rank (one line).
std::string hca_rank_warning();

// The port formula, exposed for tests and the docs.
int master_port(uint32_t job_id, uint32_t step_id, const EnvPolicy& policy);

// Whether a template may set `name` under `policy` (empty return = yes, else the reason, one line).
std::string check_extra_var(const std::string& name, const EnvPolicy& policy, const std::string& source = "[env]");

}  // namespace meshrun
