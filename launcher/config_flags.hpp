// Command-line flags shared by every subcommand that builds a configuration (plan, exec, sbatch, run):
//   --set section.key=value   --mesh-tp N --mesh-cp N --mesh-pp N --mesh-dp N|auto --mesh-ep N --mesh-order O
//   --nodes N --gpus-per-node G --site FILE --no-site
// The same --mesh-* names as the SPANK plugin's options, so a layout reads the same everywhere.
#pragma once
#include <string>
#include <vector>

#include "meshrun/config.hpp"

namespace meshrun::cli {

// If args[i] (and possibly args[i+1]) is a configuration flag, records it in `req`, advances i past it and
// returns true. Throws ConfigError for a flag that lacks its value.
bool take_config_flag(const std::vector<std::string>& args, size_t& i, ConfigRequest& req);

// If args[i] is `flag VALUE` or `flag=VALUE`, stores VALUE in *out, advances i past it and returns true.
// Throws ConfigError when the value is missing.
bool take_value(const std::vector<std::string>& args, size_t& i, const std::string& flag, std::string* out);

// Help text for those flags (one line each).
const char* config_flags_help();

}  // namespace meshrun::cli
