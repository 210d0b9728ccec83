// Files meshrun opens from user or site input: they must be regular files, and what is read into memory has a
// limit by kind. A FIFO, /dev/zero or a directory given as a template would otherwise hang or grow without
// bound (sbatch --mesh-template=/dev/zero reached 3.9 GB in 6 s). Opening uses O_NONBLOCK so a FIFO cannot
// block open(); the type and size are checked on the opened descriptor (no race with a rename).
#pragma once
#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

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

// Untrusted text (a value from a template, a flag, the environment, a file name, a checkpoint manifest)
// made safe to echo in a one-line message, then cut: the one function every message that repeats input uses.
//  - control bytes are escaped: \n \r \t by name, the others (ESC, NUL, DEL, ...) as \xNN ("\x1b"), so a
//    value can neither split a message over lines nor send terminal escape sequences;
//  - bytes that are not valid UTF-8 (a damaged header, a stray continuation byte, an overlong form, a
//    surrogate) are escaped one by one as \xNN;
//  - valid UTF-8 is kept ("é", "…"), except code points a terminal acts on or that reorder the line: C1
//    controls U+0080..U+009F, U+2028/U+2029 and the bidirectional marks, overrides and isolates, as \uXXXX;
//  - the result is at most max_chars bytes, then "…" (a 10,000-character value is not repeated); an escape
//    or a UTF-8 character is never split. A backslash itself is kept as is.
std::string cut_value(std::string_view value, size_t max_chars = 60);

// The same over a whole message: every byte escaped as above (a '\n' in it becomes "\n"), and every run
// of characters without a space, quote, comma, '=', ':', ';' or bracket that is longer than 60 characters
// cut to 60 and "…" (runs holding a '/' -- paths -- only beyond 200). The error types of the core
// (ConfigError, TaskEnvError, TopologyError) apply it to every message, and the command-line front ends
// and the plugin to what they print, so a message is always one printable line, and at most 1536 bytes (a
// longer one is cut at a character or escape boundary and ends in "…"). Applying it twice gives the same text.
std::string cut_long_values(std::string_view message);
// Several messages, each cut by cut_long_values (so none holds a newline), joined by '\n'.
std::string cut_lines(const std::vector<std::string>& messages);
// `message` printed line by line: each '\n'-separated line cut by cut_long_values and prefixed with `prefix`,
// each ending in '\n' (a ConfigError of several problems is one line each).
std::string message_lines(std::string_view prefix, std::string_view message);

}  // namespace meshrun
