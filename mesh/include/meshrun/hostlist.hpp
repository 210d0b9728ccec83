// Slurm hostlist expressions, expanded without calling scontrol.
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

}  // namespace meshrun
