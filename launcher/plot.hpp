// `meshrun plot`: training curves from the trainer's metrics files (JSON Lines, docs/trainer.md) as one SVG of
// small multiples sharing the step axis: loss (eval loss as markers), learning rate, grad norm, global tokens/s
// and MFU. Several files overlay, one colour each, labelled by the layout of their run records. The output is a
// function of the input alone (fixed number formatting, no time or locale), so a golden file can pin it.
#pragma once
#include <cstdint>
#include <istream>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace meshrun::plot {

// Bad input: one line naming FILE:LINE (or FILE) and the problem.
struct PlotError : std::runtime_error {
  explicit PlotError(const std::string& message);
};

inline constexpr size_t kMaxLineBytes = size_t(1) << 20;  // a metrics line longer than 1 MiB is refused

// The values of one step; a field the record lacks (or holds as null: the trainer writes a non-finite value as
// null) stays empty.
enum Field { kLoss, kEvalLoss, kLr, kGradNorm, kTokensPerS, kMfu, kFields };

struct StepValues {
  std::optional<double> v[kFields];
};

// A run record (`"record":"run"`): the fields the plot uses.
struct RunRecord {
  int64_t start_step = 0;
  std::string model;
  std::string layout;  // "tp2·dp2·zero1": the axes above 1 (and the ZeRO stage above 0); "" without a layout
};

struct MetricsFile {
  std::string path;                       // as given
  std::string name;                       // its last path component, for labels
  std::vector<RunRecord> runs;            // in file order
  std::map<int64_t, StepValues> steps;    // by step; a repeated step keeps its later record
  int64_t lines = 0, other_records = 0;   // other_records: kinds the plot ignores (e.g. "straggler")
};

// Parses one metrics file's text. A line is a JSON object; `"record":"run"` starts a run, `"record":"step"` or
// no "record" key (files from before schema 1) is a step, any other kind is skipped. A run record with
// start_step S drops the steps after S read so far (the resumed run redoes them, as the trainer's own
// truncation does); a repeated step keeps its later record. Throws PlotError "NAME:LINE: problem" for a line
// over kMaxLineBytes, a line that is not a JSON object, a step record without an integer "step" >= 0, or a
// plotted field that is neither a number nor null; "NAME: no step records …" when none is found.
MetricsFile parse_metrics(std::istream& in, const std::string& path);

// Opens and parses one file (a regular file, read line by line: memory follows the steps, not the file).
MetricsFile read_metrics(const std::string& path);

// The names the legend shows: `labels` (--label, one per file, in order) when given, else each file's last path
// component, lengthened by its directories until no two files share a name ("ck1/metrics.jsonl" and
// "ck2/metrics.jsonl"); the same path given twice is told apart by "#2", "#3", ….
void name_runs(std::vector<MetricsFile>& files, const std::vector<std::string>& labels = {});

// The dashed reference line of the tokens/s panel.
struct Reference {
  double tokens_per_s = 0;  // global, the unit of the panel
  std::string label;        // e.g. "planner estimate: 205,581 tokens/s per GPU × 4 GPUs (h100-sxm)"
};

struct PlotOptions {
  std::string title;  // empty: "Training metrics" and the models of the run records
  std::optional<Reference> reference;
};

// The SVG document of one or more files, each with at least one step (as parse_metrics returns them). Panels
// whose field no file holds are left out.
std::string render_svg(const std::vector<MetricsFile>& files, const PlotOptions& options);

// Tick positions at round numbers (1, 2 or 5 × 10^k) covering [lo, hi], about `target` intervals; the first
// is <= lo and the last >= hi. lo == hi widens the range around the value.
std::vector<double> nice_ticks(double lo, double hi, int target);

// A tick label: the shortest fixed form of v at the precision the tick step needs ("0.5", "12", "25k",
// "1.2M", "5e-4"); `step` is the distance between ticks.
std::string tick_label(double v, double step);

// The layout label of a run record's "layout" object (exposed for the unit tests).
std::string layout_label(int tp, int cp, int pp, int dp, int ep, int zero, int virtual_stages);

}  // namespace meshrun::plot
