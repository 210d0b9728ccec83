// meshrun-train's metrics file: rank 0's JSON Lines, schema 1 (docs/trainer.md, "Metrics"). A run record
// when a run starts (a resumed run appends its own), then one step record per step. Readers (meshrun plot,
// the planner's calibration, scripts) select records by their "record" key and ignore kinds they do not
// know; a field is added, never renamed or re-purposed, without raising the schema number.
#pragma once
#include <cstdint>
#include <cstdio>
#include <string>

#include "meshrun/job.hpp"
#include "meshrun/layout.hpp"
#include "meshrun/train/run/trainer.hpp"
#include "step_log.hpp"
#include "stragglers.hpp"

namespace meshrun::train::cli {

inline constexpr int kMetricsSchema = 1;

// Where the metrics go: --metrics FILE, else job.output_dir/metrics.jsonl, else checkpoint.dir/metrics.jsonl,
// else nowhere (--no-metrics: nowhere). `why` says which rule chose (for the banner).
struct MetricsTarget {
  std::string path;  // "" = not written
  std::string why;
};
MetricsTarget metrics_target(const std::string& flag, bool disabled, const JobConfig& cfg);

// What the run record says of the run.
struct RunFacts {
  int start_step = 0;  // 0, or the checkpoint step a resumed run starts after
  std::int64_t params = 0;
  std::string schedule;
  std::int64_t microbatches = 1;
  int world = 1;
  // Where the ranks ran, for the planner's CPU model: nodes, the ranks on rank 0's node, and the CPUs they
  // may run on together (the union of their affinity masks).
  int nodes = 1, ranks_per_node = 1, node_cpus = 0;
  std::string backend;   // the backend's own name: the device, and "emulated" when it is the CUDA emulator
};

class MetricsFile {
 public:
  MetricsFile() = default;
  MetricsFile(MetricsFile&& o) noexcept : f_(o.f_), path_(std::move(o.path_)) { o.f_ = nullptr; }
  MetricsFile& operator=(MetricsFile&&) = delete;
  MetricsFile(const MetricsFile&) = delete;
  ~MetricsFile() { close(); }

  // Opens `path` fresh, or for a run resumed at step `start` > 0 keeps what came before it (the run
  // records of earlier starts, the step records of steps <= start) and appends. Returns the error line
  // ("" when open).
  std::string open(const std::string& path, int start);
  explicit operator bool() const { return f_ != nullptr; }
  // The run record; flushed.
  void write_run(const JobConfig& cfg, const Layout& layout, const RunFacts& run, const Utilization& u);
  // One step record, flushed (a killed run keeps every step it printed).
  void write_step(const StepStats& st, std::int64_t memory_bytes, bool experts, const Utilization& u,
                  double elapsed_s);
  // A straggler named at the end of a window (stragglers.hpp); flushed.
  void write_straggler(const StragglerReport& r, const Straggler& s, const RankPlace& place);
  void close();

 private:
  void write_line(const std::string& line);
  std::FILE* f_ = nullptr;
  std::string path_;
  bool failed_ = false;  // the last write failed (warned once per failure streak)
};

}  // namespace meshrun::train::cli
