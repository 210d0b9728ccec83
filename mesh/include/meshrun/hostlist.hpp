// Slurm hostlist expressions, expanded without calling scontrol.
#pragma once
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace meshrun {

// "node[001-003,7],gpu-[1-2]-ib" -> node001 node002 node003 node007 gpu-1-ib gpu-2-ib.
// Zero padding follows the lower bound's width, as Slurm does. Several bracket groups in one name
// expand as a product. Returns nullopt and sets *error on malformed input.
std::optional<std::vector<std::string>> expand_hostlist(std::string_view expr, std::string* error);

}  // namespace meshrun
