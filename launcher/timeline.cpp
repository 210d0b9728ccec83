#include "timeline.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <map>

#include <nlohmann/json.hpp>

#include "meshrun/bounded_file.hpp"
#include "plan_render.hpp"
#include "plot.hpp"
#include "svg.hpp"

namespace meshrun::timeline {

TimelineError::TimelineError(const std::string& message) : std::runtime_error(cut_long_values(message)) {}

namespace {

using nlohmann::json;

std::string shown(const std::string& path) { return cut_value(path, 200); }

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

// An integer member in [lo, hi]; `fallback` when absent and fallback is given, else an error.
int int_field(const json& obj, const char* key, const std::string& where, int lo, int hi, std::optional<int> fallback) {
  const auto it = obj.find(key);
  if (it == obj.end()) {
    if (fallback) return *fallback;
    throw TimelineError(where + ": no \"" + key + "\"");
  }
  if (!it->is_number_integer()) throw TimelineError(where + ": \"" + key + "\" is not an integer");
  const auto v = it->get<int64_t>();
  if (v < lo || v > hi)
    throw TimelineError(where + ": \"" + key + "\" = " + std::to_string(v) + " is outside [" + std::to_string(lo) + ", " +
                        std::to_string(hi) + "]");
  return static_cast<int>(v);
}

double number_field(const json& obj, const char* key, const std::string& where) {
  const auto it = obj.find(key);
  if (it == obj.end() || !it->is_number()) throw TimelineError(where + ": \"" + key + "\" is missing or not a number");
  const double v = it->get<double>();
  if (!std::isfinite(v) || v < 0) throw TimelineError(where + ": \"" + key + "\" is negative or not finite");
  return v;
}

std::optional<ActionKind> compute_kind(const std::string& name) {
  if (name == "F") return ActionKind::F;
  if (name == "B") return ActionKind::B;
  if (name == "W") return ActionKind::W;
  if (name == "BW") return ActionKind::BW;
  return std::nullopt;
}

bool is_compute(ActionKind k) {
  return k == ActionKind::F || k == ActionKind::B || k == ActionKind::W || k == ActionKind::BW;
}

constexpr int kMaxRanks = 1 << 24;

}  // namespace

Trace parse_trace(const std::string& text, const std::string& path) {
  const std::string name = shown(path);
  json doc;
  try {
    doc = json::parse(text);
  } catch (const json::parse_error& e) {
    throw TimelineError(name + ": not JSON (" + e.what() + "); give the trace.json meshrun-train --trace DIR writes");
  }
  const auto events = doc.is_object() ? doc.find("traceEvents") : doc.end();
  if (!doc.is_object() || events == doc.end() || !events->is_array())
    throw TimelineError(name + ": not a trace-event file (no \"traceEvents\" array); give the trace.json meshrun-train "
                        "--trace DIR writes");
  const auto other = doc.find("otherData");
  if (other == doc.end() || !other->is_object() || !other->contains("meshrun_trace"))
    throw TimelineError(name + ": a trace-event file without otherData.meshrun_trace: not written by meshrun-train "
                        "--trace, so its pipeline layout is unknown");
  const json& o = *other;
  const std::string where = name + ": otherData";
  Trace t;
  t.path = path;
  if (auto it = o.find("model"); it != o.end() && it->is_string()) t.model = it->get<std::string>();
  const auto sched = o.find("schedule");
  if (sched == o.end() || !sched->is_string() || !parse_pipeline_schedule(sched->get<std::string>()))
    throw TimelineError(where + ": \"schedule\" is missing or not gpipe, 1f1b, interleaved or zb");
  t.spec.kind = *parse_pipeline_schedule(sched->get<std::string>());
  t.spec.pp = int_field(o, "pp", where, 1, kMaxRanks, std::nullopt);
  t.spec.virtual_stages = int_field(o, "virtual_stages", where, 1, 1 << 16, std::nullopt);
  t.spec.microbatches = int_field(o, "microbatches", where, 1, 1 << 30, std::nullopt);
  if (int64_t(t.spec.microbatches) * t.spec.pp * t.spec.virtual_stages > kMaxScheduleSlots)
    throw TimelineError(where + ": microbatches × pp × virtual_stages is over " + std::to_string(kMaxScheduleSlots) +
                        " schedule slots, more than meshrun simulates");
  if (const std::string why = check_schedule_spec(t.spec); !why.empty()) throw TimelineError(where + ": " + why);
  t.tp = int_field(o, "tp", where, 1, kMaxRanks, 1);
  t.cp = int_field(o, "cp", where, 1, kMaxRanks, 1);
  t.dp = int_field(o, "dp", where, 1, kMaxRanks, 1);
  t.ep = int_field(o, "ep", where, 1, kMaxRanks, 1);
  t.world = int_field(o, "world", where, 1, kMaxRanks, 1);
  if (auto it = o.find("clock_error_bound_us"); it != o.end() && it->is_number()) t.clock_error_bound_us = it->get<double>();
  if (auto it = o.find("steps"); it != o.end() && it->is_array())
    for (const json& s : *it)
      if (s.is_number_integer()) t.steps.push_back(s.get<int>());
  const auto ranks = o.find("ranks");
  if (ranks == o.end() || !ranks->is_array()) throw TimelineError(where + ": no \"ranks\" array");
  for (size_t i = 0; i < ranks->size(); ++i) {
    const json& r = (*ranks)[i];
    const std::string w = where + ".ranks[" + std::to_string(i) + "]";
    if (!r.is_object()) throw TimelineError(w + ": not an object");
    TraceRank tr;
    tr.rank = int_field(r, "rank", w, 0, kMaxRanks, std::nullopt);
    tr.pp = int_field(r, "pp", w, 0, kMaxRanks, std::nullopt);
    tr.dp = int_field(r, "dp", w, 0, kMaxRanks, std::nullopt);
    tr.tp = int_field(r, "tp", w, 0, kMaxRanks, std::nullopt);
    tr.cp = int_field(r, "cp", w, 0, kMaxRanks, std::nullopt);
    if (auto it = r.find("node"); it != r.end() && it->is_string()) tr.node = it->get<std::string>();
    t.ranks.push_back(std::move(tr));
  }
  for (size_t i = 0; i < events->size(); ++i) {
    const json& e = (*events)[i];
    const std::string w = name + ": traceEvents[" + std::to_string(i) + "]";
    if (!e.is_object()) throw TimelineError(w + ": not an object");
    const auto ph = e.find("ph");
    if (ph == e.end() || !ph->is_string()) throw TimelineError(w + ": no \"ph\" string");
    if (*ph != "X") continue;
    TraceEvent ev;
    ev.tid = int_field(e, "tid", w, 0, std::numeric_limits<int>::max(), std::nullopt);
    if (ev.tid != 1 && ev.tid != 2 && ev.tid != 4) continue;  // the step, compute and wait tracks
    const auto nm = e.find("name");
    if (nm == e.end() || !nm->is_string()) throw TimelineError(w + ": no \"name\" string");
    ev.name = nm->get<std::string>();
    ev.pid = int_field(e, "pid", w, 0, kMaxRanks, std::nullopt);
    ev.ts = number_field(e, "ts", w);
    ev.dur = number_field(e, "dur", w);
    if (auto args = e.find("args"); args != e.end() && args->is_object()) {
      ev.step = int_field(*args, "step", w + ".args", 0, std::numeric_limits<int>::max(), -1);
      ev.microbatch = int_field(*args, "microbatch", w + ".args", 0, std::numeric_limits<int>::max(), -1);
      ev.chunk = int_field(*args, "chunk", w + ".args", 0, std::numeric_limits<int>::max(), -1);
    }
    t.events.push_back(std::move(ev));
  }
  return t;
}

Trace read_trace(const std::string& path) {
  std::string file = path, text, error;
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {  // a directory stands for its trace.json (what --trace DIR writes)
    file = (std::filesystem::path(path) / "trace.json").string();
    if (!std::filesystem::exists(file, ec))
      throw TimelineError(shown(path) + ": a directory without trace.json; give the directory meshrun-train --trace DIR "
                          "wrote, or its trace.json");
  }
  if (!read_bounded_file(file, kMaxTraceBytes, "trace", &text, &error)) throw TimelineError(error);
  return parse_trace(text, file);
}

Comparison compare(const Trace& t, std::optional<int> step) {
  const std::string name = shown(t.path);
  if (t.steps.empty()) throw TimelineError(name + ": no step was traced (otherData.steps is empty)");
  Comparison c;
  c.step = step.value_or(t.steps.back());
  if (std::find(t.steps.begin(), t.steps.end(), c.step) == t.steps.end()) {
    std::string list;
    for (int s : t.steps) list += (list.empty() ? "" : ", ") + std::to_string(s);
    throw TimelineError(name + ": step " + std::to_string(c.step) + " was not traced; the trace holds steps " + list);
  }
  const ScheduleSpec& spec = t.spec;
  const ScheduleTable table = generate_schedule(spec);

  // The pipeline of dp 0 (tp 0, cp 0): one rank per pipeline stage.
  std::vector<const TraceRank*> ranks(static_cast<size_t>(spec.pp), nullptr);
  for (const TraceRank& r : t.ranks)
    if (r.dp == 0 && r.tp == 0 && r.cp == 0 && r.pp < spec.pp) ranks[static_cast<size_t>(r.pp)] = &r;
  for (int p = 0; p < spec.pp; ++p)
    if (!ranks[static_cast<size_t>(p)])
      throw TimelineError(name + ": no rank of pipeline stage " + std::to_string(p) + " with dp 0, tp 0, cp 0 in otherData.ranks");

  double t0 = std::numeric_limits<double>::max(), t1 = std::numeric_limits<double>::lowest();
  std::vector<std::pair<double, double>> phase(static_cast<size_t>(spec.pp), {-1, -1});
  for (const TraceEvent& e : t.events)
    if (e.tid == 1 && e.name == "pipeline" && e.step == c.step)
      for (int p = 0; p < spec.pp; ++p)
        if (ranks[static_cast<size_t>(p)]->rank == e.pid) phase[static_cast<size_t>(p)] = {e.ts, e.ts + e.dur};
  for (int p = 0; p < spec.pp; ++p) {
    if (phase[static_cast<size_t>(p)].first < 0)
      throw TimelineError(name + ": rank " + std::to_string(ranks[static_cast<size_t>(p)]->rank) +
                          " has no \"pipeline\" phase in step " + std::to_string(c.step));
    t0 = std::min(t0, phase[static_cast<size_t>(p)].first);
    t1 = std::max(t1, phase[static_cast<size_t>(p)].second);
  }
  c.span_us = t1 - t0;
  if (!(c.span_us > 0)) throw TimelineError(name + ": step " + std::to_string(c.step) + "'s pipeline phase has no duration");

  // Measured rows, checked against the table: each rank ran its compute actions in the table's order.
  const int chunks = table.chunks();
  std::vector<double> f_sum(chunks, 0), b_sum(chunks, 0), w_sum(chunks, 0);
  std::vector<int> f_n(chunks, 0), b_n(chunks, 0), w_n(chunks, 0);
  for (int p = 0; p < spec.pp; ++p) {
    Row row;
    row.rank = ranks[static_cast<size_t>(p)]->rank;
    row.stage = p;
    row.node = ranks[static_cast<size_t>(p)]->node;
    row.phase_start = phase[static_cast<size_t>(p)].first - t0;
    row.phase_end = phase[static_cast<size_t>(p)].second - t0;
    c.start_skew_us = std::max(c.start_skew_us, row.phase_start);
    for (const TraceEvent& e : t.events) {
      if (e.pid != row.rank || e.step != c.step) continue;
      if (e.tid == 2) {
        const auto k = compute_kind(e.name);
        if (!k) continue;  // the compute track's other events (none so far)
        if (e.chunk < 0 || e.chunk >= chunks || e.microbatch < 0 || e.microbatch >= spec.microbatches)
          throw TimelineError(name + ": rank " + std::to_string(row.rank) + ": " + e.name + " with micro-batch " +
                              std::to_string(e.microbatch) + ", chunk " + std::to_string(e.chunk) +
                              " outside the layout's " + std::to_string(spec.microbatches) + " micro-batches and " +
                              std::to_string(chunks) + " chunks");
        Box b;
        b.action = Action{*k, e.microbatch, e.chunk, -1};
        b.start = e.ts - t0;
        b.end = e.ts + e.dur - t0;
        row.boxes.push_back(b);
      } else if (e.tid == 4) {
        const double a = std::max(e.ts, phase[static_cast<size_t>(p)].first), z = std::min(e.ts + e.dur, phase[static_cast<size_t>(p)].second);
        if (z > a) row.waits.push_back({a - t0, z - t0});
      }
    }
    std::stable_sort(row.boxes.begin(), row.boxes.end(), [](const Box& a, const Box& b) { return a.start < b.start; });
    std::vector<Action> want;
    for (const Action& a : table.ranks[static_cast<size_t>(p)])
      if (is_compute(a.kind)) want.push_back(Action{a.kind, a.microbatch, a.chunk, -1});
    for (size_t i = 0; i < std::max(want.size(), row.boxes.size()); ++i) {
      if (i < want.size() && i < row.boxes.size() && want[i] == row.boxes[i].action) continue;
      throw TimelineError(
          name + ": rank " + std::to_string(row.rank) + " (pipeline stage " + std::to_string(p) + ") in step " +
          std::to_string(c.step) + ": compute action " + std::to_string(i) + " is " +
          (i < row.boxes.size() ? action_text(row.boxes[i].action) : std::string("missing")) + " where the " +
          pipeline_schedule_name(spec.kind) + " table has " + (i < want.size() ? action_text(want[i]) : std::string("none")) +
          "; the trace does not match its otherData layout");
    }
    for (const Box& b : row.boxes) {
      const double d = b.end - b.start;
      row.busy += d;
      const auto ch = static_cast<size_t>(b.action.chunk);
      if (b.action.kind == ActionKind::F) f_sum[ch] += d, ++f_n[ch];
      else if (b.action.kind == ActionKind::W) w_sum[ch] += d, ++w_n[ch];
      else b_sum[ch] += d, ++b_n[ch];  // B, or a fused BW (its B and W are not timed apart)
    }
    c.measured.push_back(std::move(row));
  }
  double idle = 0;
  for (const Row& r : c.measured) idle += std::max(0.0, c.span_us - r.busy);
  c.measured_bubble = idle / (spec.pp * c.span_us);

  // The plan: meshrun plan --schedule's unit costs; and the same table with this step's mean costs.
  const Timeline unit = simulate_schedule(table, ScheduleCosts{});
  c.makespan = unit.makespan;
  c.simulated_bubble = unit.bubble_fraction;
  for (int p = 0; p < spec.pp; ++p) {
    Row row;
    row.stage = p;
    for (const TimedAction& ta : unit.ranks[static_cast<size_t>(p)]) {
      Box b;
      b.action = table.ranks[static_cast<size_t>(p)][static_cast<size_t>(ta.index)];
      b.start = ta.start;
      b.end = ta.end;
      row.busy += ta.end - ta.start;
      row.boxes.push_back(b);
    }
    c.simulated.push_back(std::move(row));
  }
  ScheduleCosts measured;
  measured.f.assign(chunks, 0);
  measured.b.assign(chunks, 0);
  measured.w.assign(chunks, 0);
  for (int ch = 0; ch < chunks; ++ch) {
    measured.f[ch] = f_n[ch] ? f_sum[ch] / f_n[ch] : 0;
    measured.b[ch] = b_n[ch] ? b_sum[ch] / b_n[ch] : 0;
    measured.w[ch] = w_n[ch] ? w_sum[ch] / w_n[ch] : 0;
  }
  c.simulated_measured_costs = simulate_schedule(table, measured).bubble_fraction;
  return c;
}

std::string summary_text(const Trace& t, const Comparison& c) {
  std::string ranks;
  for (const Row& r : c.measured) ranks += (ranks.empty() ? "" : " ") + std::to_string(r.rank);
  std::string s = "timeline: step " + std::to_string(c.step) + " of " + shown(t.path) + ": " +
                  (t.model.empty() ? "" : cut_value(t.model, 60) + ", ") + pipeline_schedule_name(t.spec.kind) +
                  ", pp " + std::to_string(t.spec.pp) +
                  (t.spec.virtual_stages > 1 ? " × " + std::to_string(t.spec.virtual_stages) + " chunks" : "") + ", " +
                  std::to_string(t.spec.microbatches) + " micro-batches; measured on ranks " + ranks + " (dp 0)\n";
  s += "  measured bubble_fraction " + fmt("%.4f", c.measured_bubble) + " (idle ÷ (pp × span); the pipeline phase spans " +
       fmt("%.3f", c.span_us / 1000) + " ms, its ranks began it within " + fmt("%.3f", c.start_skew_us / 1000) +
       " ms; clocks aligned within " + fmt("%.1f", t.clock_error_bound_us) + " us)\n";
  s += "  simulated bubble_fraction " + fmt("%.4f", c.simulated_bubble) +
       " (the schedule simulator, as meshrun plan --schedule: unit costs, F = B = W = 1 per chunk, free transfers)\n";
  s += "  simulated with this step's measured mean F, B, W per chunk: " + fmt("%.4f", c.simulated_measured_costs) + "\n";
  return s;
}

// ---------------------------------------------------------------------------------------------------------------
// The picture

namespace {

constexpr double kWidth = 1120, kMargin = 24, kLabelW = 150;
constexpr double kPlotX = kMargin + kLabelW, kPlotW = kWidth - kPlotX - kMargin;
constexpr double kBoxH = 20, kWaitH = 4, kRowPitch = 30;
const char* kColorF = "#4e79a7";  // svg.cpp's schedule timeline
const char* kColorB = "#f28e2b";
const char* kColorW = "#59a14f";
const char* kColorIdle = "#e9e9ee";
const char* kColorWait = "#c0392b";

std::string num(double v) {
  std::string s = fmt("%.1f", v);
  if (s == "-0.0") s = "0.0";
  return s;
}

std::string rect(double x, double y, double w, double h, const std::string& attrs) {
  return "<rect x=\"" + num(x) + "\" y=\"" + num(y) + "\" width=\"" + num(std::max(0.0, w)) + "\" height=\"" + num(h) +
         "\" " + attrs + "/>\n";
}

std::string text(double x, double y, const std::string& markup, const std::string& cls) {
  return "<text x=\"" + num(x) + "\" y=\"" + num(y) + "\" class=\"" + cls + "\">" + markup + "</text>\n";
}

// One panel of rows over [0, extent] (µs or time units); returns the markup and advances *y.
std::string draw_rows(const std::vector<Row>& rows, double extent, int virtual_stages, bool measured, double* y) {
  std::string o;
  const double scale = kPlotW / extent;
  for (const Row& r : rows) {
    const double top = *y;
    std::string label = "stage " + std::to_string(r.stage);
    if (measured) label += " · rank " + std::to_string(r.rank);
    o += text(kMargin, top + 14, svg_escape(label), "row");
    if (measured && !r.node.empty()) o += text(kMargin, top + 26, svg_escape(cut_value(r.node, 24)), "note");
    if (measured) {  // before and after the rank's own pipeline phase: hatched (idle in the span, elsewhere in the step)
      o += rect(kPlotX, top, kPlotW, kBoxH, "fill=\"url(#outside)\"");
      o += rect(kPlotX + r.phase_start * scale, top, (r.phase_end - r.phase_start) * scale, kBoxH,
                std::string("fill=\"") + kColorIdle + "\"");
    } else {
      o += rect(kPlotX, top, kPlotW, kBoxH, std::string("fill=\"") + kColorIdle + "\"");  // idle shows through
    }
    for (const Box& b : r.boxes) {
      const double x = kPlotX + b.start * scale, w = std::max(0.5, (b.end - b.start) * scale);
      const std::string when = measured ? fmt("%.3f", (b.end - b.start) / 1000) + " ms from " + fmt("%.3f", b.start / 1000) + " ms"
                                        : fmt("%g", b.end - b.start) + " units from " + fmt("%g", b.start);
      o += "<g><title>" + svg_escape((measured ? "rank " + std::to_string(r.rank) : "stage " + std::to_string(r.stage)) +
                                     ": " + action_text(b.action) + ", " + when) + "</title>\n";
      if (b.action.kind == ActionKind::BW) {  // fused: B over W (their times are not apart)
        o += rect(x, top, w, kBoxH / 2, std::string("fill=\"") + kColorB + "\" class=\"act\"");
        o += rect(x, top + kBoxH / 2, w, kBoxH / 2, std::string("fill=\"") + kColorW + "\" class=\"act\"");
      } else {
        const char* fill = b.action.kind == ActionKind::F ? kColorF : b.action.kind == ActionKind::B ? kColorB : kColorW;
        o += rect(x, top, w, kBoxH, std::string("fill=\"") + fill + "\" class=\"act\"");
      }
      const std::string lab = cli::action_label(b.action, virtual_stages);
      if (w >= 7.0 * lab.size() + 4) o += text(x + w / 2, top + 14, lab, "lab");
      o += "</g>\n";
    }
    for (const auto& [a, z] : r.waits)
      o += rect(kPlotX + a * scale, top + kBoxH + 1, std::max(0.5, (z - a) * scale), kWaitH,
                std::string("fill=\"") + kColorWait + "\"");
    *y += kRowPitch;
  }
  return o;
}

// Ticks under a panel: `extent` in the panel's unit, labels divided by `div` (µs → ms).
std::string draw_axis(double extent, double div, const std::string& unit, double* y) {
  std::string o;
  const auto ticks = plot::nice_ticks(0, extent / div, 10);
  const double step = ticks.size() > 1 ? ticks[1] - ticks[0] : 1;
  const double scale = kPlotW / extent;
  for (double tk : ticks) {
    if (tk > extent / div * (1 + 1e-9)) break;
    const double x = kPlotX + tk * div * scale;
    o += "<line x1=\"" + num(x) + "\" y1=\"" + num(*y - 4) + "\" x2=\"" + num(x) + "\" y2=\"" + num(*y + 2) + "\" class=\"tick\"/>\n";
    o += text(x, *y + 15, plot::tick_label(tk, step), "ticklab mid");
  }
  o += text(kPlotX + kPlotW, *y + 30, svg_escape(unit), "note end");
  *y += 38;
  return o;
}

}  // namespace

std::string render_timeline_svg(const Trace& t, const Comparison& c, const std::string& title) {
  std::string body;
  double y = kMargin;
  const std::string shown_title = title.empty() ? "Pipeline timeline, step " + std::to_string(c.step) +
                                                      ": measured against the schedule simulator"
                                                : cut_value(title, 160);
  body += text(kMargin, y + 16, svg_escape(shown_title), "title");
  y += 26;
  std::string layout = (t.model.empty() ? "" : cut_value(t.model, 60) + " · ") + pipeline_schedule_name(t.spec.kind) +
                       " · pp " + std::to_string(t.spec.pp) +
                       (t.spec.virtual_stages > 1 ? " × " + std::to_string(t.spec.virtual_stages) + " chunks" : "") +
                       " · " + std::to_string(t.spec.microbatches) + " micro-batches · tp " + std::to_string(t.tp) +
                       " cp " + std::to_string(t.cp) + " dp " + std::to_string(t.dp) + " · " + std::to_string(t.world) +
                       " ranks · " + cut_value(t.path, 120);
  body += text(kMargin, y + 12, svg_escape(layout), "note");
  y += 28;

  body += text(kMargin, y + 14,
               svg_escape("Measured: bubble_fraction " + fmt("%.4f", c.measured_bubble) + "  (idle ÷ (pp × span); the pipeline phase of dp 0's ranks spans " +
                          fmt("%.3f", c.span_us / 1000) + " ms)"),
               "panel");
  y += 20;
  body += text(kMargin, y + 12,
               svg_escape("each rank's action list, from the first rank's start of it to the last rank's end (ranks began within " +
                          fmt("%.3f", c.start_skew_us / 1000) + " ms); red: blocked in a receive, send or collective; clocks aligned within " +
                          fmt("%.1f", t.clock_error_bound_us) + " µs"),
               "note");
  y += 22;
  body += draw_rows(c.measured, c.span_us, t.spec.virtual_stages, true, &y);
  body += draw_axis(c.span_us, 1000, "ms", &y);
  y += 8;

  body += text(kMargin, y + 14,
               svg_escape("Simulated: bubble_fraction " + fmt("%.4f", c.simulated_bubble) + "  (meshrun plan --schedule; makespan " +
                          fmt("%g", c.makespan) + " units)"),
               "panel");
  y += 20;
  body += text(kMargin, y + 12,
               svg_escape("the same table with unit costs: F = B = W = 1 per chunk (fused BW = 2), free transfers; with "
                          "this step's measured mean costs per chunk the simulator gives " + fmt("%.4f", c.simulated_measured_costs)),
               "note");
  y += 22;
  body += draw_rows(c.simulated, c.makespan, t.spec.virtual_stages, false, &y);
  body += draw_axis(c.makespan, 1, "time units", &y);

  double x = kMargin;
  for (auto [label, fill] : {std::pair{"F forward", kColorF}, {"B input gradient", kColorB}, {"W weight gradient", kColorW},
                             {"BW fused: B over W", ""}, {"idle", kColorIdle}, {"blocked in communication", kColorWait},
                             {"outside the rank's pipeline phase (idle in the span)", "url(#outside)"}}) {
    if (*fill) {
      body += rect(x, y, 14, 14, std::string("rx=\"3\" fill=\"") + fill + "\"");
    } else {
      body += rect(x, y, 14, 7, std::string("fill=\"") + kColorB + "\"");
      body += rect(x, y + 7, 14, 7, std::string("fill=\"") + kColorW + "\"");
    }
    body += text(x + 20, y + 11, svg_escape(label), "note");
    x += 34 + 6.5 * std::string(label).size();
  }
  y += 22;
  const double height = y + kMargin;

  std::string out = svg_preamble(
      num(kWidth), num(height),
      ".title{font-size:17px;font-weight:bold;fill:#1d1d1f}\n"
      ".panel{font-size:13.5px;font-weight:bold;fill:#222}\n"
      ".row{font-size:12px;fill:#222}\n"
      ".note{font-size:11px;fill:#555}\n"
      ".lab{font-size:10.5px;fill:#fff;text-anchor:middle;font-weight:bold}\n"
      ".ticklab{font-size:10.5px;fill:#555}\n"
      ".tick{stroke:#888;stroke-width:1}\n"
      ".act{stroke:#fff;stroke-width:0.6}\n"
      ".mid{text-anchor:middle}\n"
      ".end{text-anchor:end}\n",
      "<defs><pattern id=\"outside\" width=\"6\" height=\"6\" patternUnits=\"userSpaceOnUse\" "
      "patternTransform=\"rotate(45)\"><rect width=\"6\" height=\"6\" fill=\"#f4f4f7\"/><line x1=\"0\" y1=\"0\" "
      "x2=\"0\" y2=\"6\" stroke=\"#cfcfd8\" stroke-width=\"2\"/></pattern></defs>\n");
  out += body;
  out += "</svg>\n";
  return out;
}

}  // namespace meshrun::timeline
