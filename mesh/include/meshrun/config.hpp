// Job configuration from layered sources, each value remembering where it came from.
//
// Layers, lowest first: built-in defaults < site file < template < SLURM_*/SBATCH_* environment <
// command-line flags < --set section.key=value. One schema (config.cpp) drives parsing, --set, error
// messages with did-you-mean, and the dry run's "source" column.
#pragma once
#include <cstdint>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "meshrun/bounded_file.hpp"
#include "meshrun/job.hpp"

namespace meshrun {

// A user-facing input error. what() is one line, "file:line:col: problem; fix" where a location exists.
// Command-line front ends print it and exit 2.
struct ConfigError : std::runtime_error {
  explicit ConfigError(const std::string& message) : std::runtime_error(cut_long_values(message)) {}
  // Several problems, one line each (each cut on its own; what() joins them with '\n'). Front ends print
  // each line with their prefix (message_lines, bounded_file.hpp).
  explicit ConfigError(const std::vector<std::string>& lines) : std::runtime_error(cut_lines(lines)) {}
};

enum class SourceKind { defaults, site, template_file, environment, flag, set };
const char* source_kind_name(SourceKind k);

struct Origin {
  SourceKind kind = SourceKind::defaults;
  std::string where;  // "templates/x.toml:12:5", "SLURM_NNODES", "--mesh-tp", "--set parallel.tp=4", ...
  std::string str() const;  // "template templates/x.toml:12:5"
};

struct Config {
  JobConfig job;
  std::map<std::string, Origin> origins;  // "section.key" -> where its value came from; absent = default
  std::vector<std::string> files;         // files read, lowest layer first
  Origin origin_of(const std::string& key) const;
};

// Key names and types of the schema.
// blend: [[weight, path], ...] (TOML array, or its text after --set), or a path (one dataset, weight 1).
enum class ValueType { integer, number, string, boolean, int_or_auto, table, blend };
struct KeyInfo {
  std::string key;  // "parallel.tp"
  ValueType type;
  std::string help;
};
const std::vector<KeyInfo>& config_keys();
// Nearest valid key for a misspelled one ("" when nothing is close).
std::string suggest_key(std::string_view wrong);
// "unknown key 'training.learning_rate'; did you mean 'training.lr'?": the candidates a template's key gets
// (another trainer's name, the nearest key, the same name in another section, else the section's keys).
std::string unknown_set_key_message(const std::string& key);

// Layer operations. Each throws ConfigError (one line, located) on bad input and leaves `cfg` unchanged.
void apply_toml_file(Config& cfg, const std::string& path, SourceKind kind);
void apply_toml_text(Config& cfg, std::string_view text, const std::string& source_name, SourceKind kind);
// "section.key=value" (value parsed by the key's type; strings may be quoted).
void apply_set(Config& cfg, std::string_view assignment, SourceKind kind = SourceKind::set,
               const std::string& where = "");
// A typed value (an option already parsed to an integer, e.g. the plugin's --mesh-tp=2): stored as is, with
// the same checks as apply_value(), without a round trip through text.
void apply_int(Config& cfg, const std::string& key, int64_t value, const Origin& origin);
// Sets one key from a string value (used for flags and environment variables).
void apply_value(Config& cfg, const std::string& key, std::string_view value, const Origin& origin);

// The value of a key rendered as text ("auto" for dp = 0), for the dry run.
std::string value_text(const JobConfig& job, const std::string& key);

// Convenience: defaults + template file.
Config load_template(const std::string& path);

// The whole stack in one call. Front ends (meshrun plan/exec/sbatch/run, the plugin, the trainer) fill what
// they have and get one Config with an origin for every value that is not a default.
struct ConfigRequest {
  std::string template_path;                       // empty = no template
  // Site file: explicit path; else $MESHRUN_SITE_CONFIG from `environment`; else /etc/meshrun/site.toml if it
  // exists. `use_site = false` skips the layer (tests, golden output).
  std::string site_path;
  bool use_site = true;
  const std::map<std::string, std::string>* environment = nullptr;  // process environment (SLURM_*/SBATCH_*)
  struct Flag {
    std::string key;    // "parallel.tp"
    std::string value;  // "8"
    std::string flag;   // "--mesh-tp" (for the origin)
  };
  std::vector<Flag> flags;
  std::vector<std::string> sets;                   // "section.key=value"
};
// Ends with check_limits.
Config build_config(const ConfigRequest& request);

// Products of keys against meshrun/limits.hpp (tp·cp·pp·dp and nodes × gpus_per_node ≤ kWorld,
// pp·virtual_stages ≤ kLayers); each key alone is bounded when it is stored. Throws ConfigError located at
// the largest factor's origin.
void check_limits(const Config& cfg);

// The SLURM_*/SBATCH_* environment layer (config_env.cpp): which variables set which keys.
void apply_environment(Config& cfg, const std::map<std::string, std::string>& environment);

// The process environment as a map (for front ends; the core never reads it implicitly).
std::map<std::string, std::string> environment_map(char** envp);

}  // namespace meshrun
