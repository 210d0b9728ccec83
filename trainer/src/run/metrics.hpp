// meshrun-train --metrics FILE.jsonl: rank 0's file of one JSON record per step.
#pragma once
#include <cstdint>
#include <cstdio>
#include <string>

#include "meshrun/train/run/trainer.hpp"

namespace meshrun::train::cli {

class MetricsFile {
 public:
  MetricsFile() = default;
  MetricsFile(MetricsFile&& o) noexcept : f_(o.f_) { o.f_ = nullptr; }
  MetricsFile& operator=(MetricsFile&&) = delete;
  MetricsFile(const MetricsFile&) = delete;
  ~MetricsFile() { close(); }

  // Opens `path` fresh, or for a run resumed at step `start` > 0 keeps the records of steps <= start and
  // appends. Returns the error line ("" when open).
  std::string open(const std::string& path, int start);
  explicit operator bool() const { return f_ != nullptr; }
  // One record, flushed (a killed run keeps every step it printed).
  void write(const StepStats& st, std::int64_t memory_bytes, bool experts);
  void close();

 private:
  std::FILE* f_ = nullptr;
};

}  // namespace meshrun::train::cli
