// Shared helpers of the libFuzzer targets (docs/robustness.md). Each target asserts the code's own contracts:
// a broken one prints what was expected and aborts, which libFuzzer reports as a crash with the input saved.
#pragma once
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <vector>

#define FUZZ_CHECK(cond, what)                                                                    \
  do {                                                                                            \
    if (!(cond)) {                                                                                \
      std::fprintf(stderr, "fuzz contract broken at %s:%d: %s (%s)\n", __FILE__, __LINE__, #cond, \
                   std::string(what).c_str());                                                    \
      std::abort();                                                                               \
    }                                                                                             \
  } while (0)

namespace meshrun::fuzz {

// A per-process scratch directory (the loaders under test take paths, as the CLI passes them).
inline const std::filesystem::path& scratch_dir() {
  static const std::filesystem::path dir = [] {
    const char* t = std::getenv("TMPDIR");
    std::filesystem::path d = std::filesystem::path(t && *t ? t : "/tmp") / ("meshrun-fuzz-" + std::to_string(getpid()));
    std::filesystem::create_directories(d);
    return d;
  }();
  return dir;
}

// Writes `data` to scratch_dir()/name and returns the path.
inline std::string write_scratch(const std::string& name, const uint8_t* data, size_t size) {
  const std::filesystem::path p = scratch_dir() / name;
  std::ofstream(p, std::ios::binary | std::ios::trunc).write(reinterpret_cast<const char*>(data),
                                                              static_cast<std::streamsize>(size));
  return p.string();
}

// Removes the scratch directory when the fuzzer exits normally.
struct ScratchCleanup {
  ~ScratchCleanup() {
    std::error_code ec;
    std::filesystem::remove_all(scratch_dir(), ec);
  }
};

// An error message the CLI prints: non-empty, bounded, one line when its input had no line break.
inline bool one_line_message(const std::string& m, bool input_had_newline) {
  return !m.empty() && m.size() < 2048 && (input_had_newline || m.find('\n') == std::string::npos);
}
// A message of several problems (a template's: at most 8 and a "more problems" line): each line one problem.
inline bool bounded_lines_message(const std::string& m, size_t max_lines) {
  size_t lines = 0, start = 0;
  while (start <= m.size()) {
    const size_t nl = std::min(m.find('\n', start), m.size());
    if (nl == start || nl - start >= 2048) return false;
    ++lines;
    start = nl + 1;
  }
  return !m.empty() && lines <= max_lines;
}

}  // namespace meshrun::fuzz
