// Files meshrun opens from user or site input: they must be regular files, and what is read into memory has a
// limit by kind. A FIFO, /dev/zero or a directory given as a template would otherwise hang or grow without
// bound (sbatch --mesh-template=/dev/zero reached 3.9 GB in 6 s). Opening uses O_NONBLOCK so a FIFO cannot
// block open(); the type and size are checked on the opened descriptor (no race with a rename).
#pragma once
#include <cstddef>
#include <string>

namespace meshrun {

inline constexpr size_t kTemplateFileLimit = size_t(1) << 20;     // templates and site files: 1 MiB
inline constexpr size_t kTopologyXmlLimit = size_t(64) << 20;     // hwloc XML exports: 64 MiB
inline constexpr size_t kSlurmConfLimit = size_t(16) << 20;       // slurm.conf / plugstack.conf read by probes

// Reads all of `path` into *out. `what` names the kind in messages ("template", "site file", "topology XML").
// Returns false with a one-line *error (problem; fix) when the file is missing, not a regular file, or larger
// than `limit`; never reads more than limit + 1 bytes.
bool read_bounded_file(const std::string& path, size_t limit, const std::string& what, std::string* out,
                       std::string* error);

// Only the regular-file check (for files that are mapped or streamed, e.g. token files and safetensors).
bool check_regular_file(const std::string& path, const std::string& what, std::string* error);

// A value echoed in a message: at most 60 characters, then "…" (a 10,000-character value is not repeated).
std::string cut_value(const std::string& value, size_t max_chars = 60);

// The same over a whole message: every run of characters without a space, quote, comma, '=', ':', ';' or bracket that is
// longer than 60 characters is cut to 60 and "…" (runs holding a '/' -- paths -- only beyond 200). The error
// types of the core (ConfigError, TaskEnvError, TopologyError) apply it to every message, so a 10,000-character
// value is never echoed back.
std::string cut_long_values(const std::string& message);

}  // namespace meshrun
