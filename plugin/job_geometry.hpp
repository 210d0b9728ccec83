// How many nodes, tasks and GPUs a submission asks for, read from sbatch/salloc/srun's own arguments and the
// batch script's #SBATCH lines. sbatch's plugin context (S_CTX_ALLOCATOR), and srun before it allocates, get
// no node or task counts from Slurm, so without this a wrong layout would only fail after a job exists. Unknown = 0; a range such as
// -N 2-4 leaves the count unknown and the check to the job's srun steps.
#pragma once
#include <string>
#include <string_view>
#include <vector>

namespace meshrun::plugin {

struct JobGeometry {
  int nodes = 0;
  int ntasks = 0;
  int ntasks_per_node = 0;
  int gpus_per_node = 0;
  int gpus_total = 0;     // -G / --gpus
  bool wrap = false;      // --wrap: no script file
  std::string operand;    // sbatch: the batch script; srun/salloc: the command ("" = none found)
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

// The shape the running sbatch/salloc/srun (this process: /proc/self/cmdline, plus the batch script's #SBATCH
// lines) asks for. Returns false when unknown (*why empty) or inconsistent (*why says why).
bool own_submission_shape(TaskShape* shape, std::string* why);

// This process's argv from /proc/self/cmdline, and the head (up to `limit` bytes) of a file.
std::vector<std::string> read_own_cmdline();
std::string read_file_head(const std::string& path, size_t limit);

}  // namespace meshrun::plugin
