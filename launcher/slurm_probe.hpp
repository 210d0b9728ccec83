// What the launcher asks the local Slurm installation: is the meshrun SPANK plugin installed, and how many
// CPUs do the partition's nodes have. Both are read, never assumed.
#pragma once
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace meshrun::launch {

struct PluginProbe {
  bool installed = false;
  std::string evidence;  // what decided it, for the dry run ("sbatch --help lists --mesh-tp", ...)
};
// `sbatch --help` listing --mesh-tp decides when sbatch can run here; otherwise the plugstack.conf that
// slurm.conf ($SLURM_CONF, else /etc/slurm/slurm.conf) names, includes followed.
PluginProbe detect_plugin(const std::map<std::string, std::string>& env);
// True when the plugstack file (or a file it includes) loads spank_meshrun; *evidence names the line.
bool plugstack_lists_meshrun(const std::string& path, std::string* evidence, int depth = 0);

// Smallest CPU count of the partition's nodes (`sinfo -h -o %c`), nullopt when sinfo cannot tell.
std::optional<int> partition_cpus(const std::string& partition);

// The local Slurm's release as major * 100 + minor (`sbatch --version`: "slurm 22.05.8" -> 2205); 0 unknown.
int slurm_version();
// The same from the text `sbatch --version` prints.
int parse_slurm_version(const std::string& text);

// Runs argv (no shell) with a time limit and returns its stdout; *rc gets the exit status (-1: not run or
// timed out). Its stderr is discarded unless show_stderr.
std::string run_capture(const std::vector<std::string>& argv, int timeout_s, int* rc, bool show_stderr = false);

}  // namespace meshrun::launch
