// How many nodes, tasks and GPUs a submission asks for, read from sbatch/salloc/srun's own arguments and the
// batch script's #SBATCH lines. sbatch's plugin context (S_CTX_ALLOCATOR), and srun before it allocates, get
// no node or task counts from Slurm, so without this a wrong layout would only fail after a job exists. Unknown = 0; a range such as
// -N 2-4 leaves the count unknown and the check to the job's srun steps.
#pragma once
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace meshrun::plugin {

struct JobGeometry {
  int nodes = 0;          // a single count; 0 when absent or a range
  int nodes_min = 0;      // -N MIN-MAX (or a single count: both equal it); 0 = not given
  int nodes_max = 0;
  int ntasks = 0;
  int ntasks_per_node = 0;
  int gpus_per_node = 0;
  int gpus_total = 0;     // -G / --gpus
  bool wrap = false;      // --wrap: no script file
  std::string operand;    // sbatch: the batch script; srun/salloc: the command ("" = none found)
  std::string distribution;  // -m / --distribution ("" = not given)
  // An option that changes where tasks go in ways this parser does not model (-w, -x, -r, --multi-prog, a
  // heterogeneous ':' separator, -F): the shape is then left to Slurm (and the step's own check).
  std::string opaque;
  bool srun = false;
  bool operand_required = true;  // salloc runs a shell when no command is given
};

// Parses the arguments (argv[0] excluded) of `program` ("sbatch", "salloc" or "srun"; their short options
// differ). Later values win, as in Slurm. A long option given without '=' takes the next token as its value
// unless it is a known flag or that token starts with '-'.
void parse_job_args(const std::string& program, const std::vector<std::string>& args, JobGeometry* g);
// Applies the #SBATCH lines of a batch script (only those before the first command), without
// overriding what the command line already set.
void apply_sbatch_lines(std::string_view script_text, const std::vector<std::string>& cmdline, JobGeometry* g);

// The task count and tasks per node Slurm will use, or false (unknown / not evenly spread) with a
// reason in *why (empty when simply unknown: node ranges, a script on stdin, an unparsed command line).
struct TaskShape {
  int nodes = 0;
  int tasks = 0;
  int tasks_per_node = 0;
  int gpus_per_node = 0;  // 0 = no GPU request seen
};
bool task_shape(const JobGeometry& g, TaskShape* shape, std::string* why);

// Every shape a node range allows (-N MIN-MAX): one TaskShape per count in the range that the task options
// spread evenly, at most `limit` counts (false when the range is wider, or the shape is unknown).
bool range_shapes(const JobGeometry& g, int limit, std::vector<TaskShape>* shapes);

// srun's step: its own arguments, and inside an allocation (SLURM_JOB_ID in `env`) the SLURM_* variables srun
// takes its defaults from. Observed on 22.05 (docs/plugin.md): the task count is -n, else SLURM_NTASKS, else
// --ntasks-per-node (or SLURM_NTASKS_PER_NODE) per node, else one per node; the node count is -N, else
// SLURM_NNODES, lowered to the task count. Returns false when unknown (*why empty) or refused (*why says why).
bool srun_step_shape(const JobGeometry& g, const std::map<std::string, std::string>& env, TaskShape* shape,
                     std::string* why);

// srun A : B : C (a heterogeneous step): the components' argument lists, split at each ':' token followed by an
// option (so a ':' argument of a command stays). One list when the step is not heterogeneous.
std::vector<std::vector<std::string>> het_components(const std::vector<std::string>& args);

// The rank map of a heterogeneous step is one block map over all components, so every component needs the same
// tasks per node. "" when they agree (*total = the whole step), else the refusal naming the component sizes and
// a layout that fits (`group` = tp·cp·pp of the layout, `flags` the --mesh-* options to show).
// `node_runs`: the "components" are runs of nodes with equal counts (slurmstepd sees only
// SLURM_STEP_TASKS_PER_NODE), so the message speaks of nodes.
std::string het_shape_problem(const std::vector<TaskShape>& components, int group, const std::string& flags,
                              TaskShape* total, bool node_runs = false);

// "" when `dist` (an srun -m value or SLURM_DISTRIBUTION) places tasks in blocks per node, else the refusal.
std::string distribution_problem(const std::string& dist, const std::string& source);

// The shape the running sbatch/salloc/srun (this process: /proc/self/cmdline, plus the batch script's #SBATCH
// lines) asks for. Returns false when unknown (*why empty) or inconsistent (*why says why).
// `geometry` (optional) receives what was parsed, e.g. a node range. For an srun heterogeneous step, when `het`
// is given and every component's shape is known, *het receives them (one per component) and the return is
// false with *why empty: the caller checks them together (het_shape_problem).
bool own_submission_shape(TaskShape* shape, std::string* why, JobGeometry* geometry = nullptr,
                          std::vector<TaskShape>* het = nullptr);

// This process's argv from /proc/self/cmdline, and the head (up to `limit` bytes) of a file.
std::vector<std::string> read_own_cmdline();
std::string read_file_head(const std::string& path, size_t limit);

}  // namespace meshrun::plugin
