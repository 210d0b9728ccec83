// Slurm hostlist expressions, expanded and compressed without calling scontrol.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace meshrun {

// "node[001-003,7],gpu-[1-2]-ib" -> node001 node002 node003 node007 gpu-1-ib gpu-2-ib.
// Zero padding follows the lower bound's width, as Slurm does. Several bracket groups in one name
// expand as a product. Returns nullopt and sets *error on malformed input or when check_hostlist refuses it;
// nothing is allocated for a refused hostlist. Joining the result with ',' expands to the same list.
std::optional<std::vector<std::string>> expand_hostlist(std::string_view expr, std::string* error);

// The size of an expansion, computed from the ranges without expanding: host count and the characters of
// all host names. Saturates at INT64_MAX. nullopt and *error on malformed input.
struct HostlistSize {
  int64_t hosts = 0;
  int64_t bytes = 0;
};
std::optional<HostlistSize> hostlist_size(std::string_view expr, std::string* error);

// Well-formed and within limits::kHosts hosts and limits::kHostlistBytes characters, counted over the whole
// hostlist (every bracket, every comma-separated item). *error is one line without the expression.
bool check_hostlist(std::string_view expr, std::string* error);

// The inverse, as `scontrol show hostlist` writes it: n1 n2 n3 n7 -> "n[1-3,7]". Names are grouped by the text
// before their trailing digits and sorted by number; a run of consecutive numbers becomes a range when every
// number is written with the run's first width (n9 n10 -> "n[9-10]", node001..node100 -> "node[001-100]",
// n01 n2 -> "n[01,2]"). A lone name stays plain ("n4"); names without trailing digits (or with more than 18)
// are listed as they are. Duplicates are dropped. expand_hostlist() of the result gives the same names, sorted
// by prefix and number. "" for an empty list. For `srun --exclude` and `sbatch --exclude` lists.
std::string compress_hostlist(const std::vector<std::string>& hosts);

// Slurm's per-node task counts (SLURM_TASKS_PER_NODE, SLURM_STEP_TASKS_PER_NODE, SLURM_NTASKS_PER_NODE):
// "2(x3),1" = 2 tasks on each of 3 nodes, then 1. The one parser of that syntax in meshrun. nullopt when
// malformed: an item that is not COUNT or COUNT(xREPEAT) with COUNT >= 0 and 1 <= REPEAT, more than 2^20
// items, or an empty text.
struct TaskCountRun {
  int count = 0;   // tasks per node
  int repeat = 1;  // nodes
};
std::optional<std::vector<TaskCountRun>> parse_task_counts(std::string_view spec);
// The tasks on node `node` (0-based) of `runs`; -1 past the end.
int tasks_on_node(const std::vector<TaskCountRun>& runs, int node);

}  // namespace meshrun
