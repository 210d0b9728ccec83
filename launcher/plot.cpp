#include "plot.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <set>
#include <streambuf>

#include <nlohmann/json.hpp>

#include "meshrun/bounded_file.hpp"
#include "svg.hpp"

namespace meshrun::plot {

PlotError::PlotError(const std::string& message) : std::runtime_error(cut_long_values(message)) {}

namespace {

using nlohmann::json;

constexpr const char* kFieldKeys[kFields] = {"loss", "eval_loss", "lr", "grad_norm", "tokens_per_s", "mfu"};

std::string shown_name(const std::string& path) { return cut_value(path, 200); }

bool f_absolute(const std::string& path) { return !path.empty() && path.front() == '/'; }

std::string base_name(const std::string& path) {
  std::string p = path;
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  const auto slash = p.rfind('/');
  return slash == std::string::npos ? p : p.substr(slash + 1);
}

// An integer member of a run record's layout object, `fallback` when it is missing or not an integer.
int int_member(const json& obj, const char* key, int fallback) {
  const auto it = obj.find(key);
  if (it == obj.end() || !it->is_number_integer()) return fallback;
  const auto v = it->get<int64_t>();
  return v < 0 || v > std::numeric_limits<int>::max() ? fallback : static_cast<int>(v);
}

RunRecord run_record(const json& obj) {
  RunRecord r;
  if (auto it = obj.find("start_step"); it != obj.end() && it->is_number_integer()) r.start_step = it->get<int64_t>();
  if (auto it = obj.find("model"); it != obj.end() && it->is_string()) r.model = it->get<std::string>();
  if (auto it = obj.find("layout"); it != obj.end() && it->is_object()) {
    const json& l = *it;
    r.layout = layout_label(int_member(l, "tp", 1), int_member(l, "cp", 1), int_member(l, "pp", 1),
                            int_member(l, "dp", 1), int_member(l, "ep", 1), int_member(l, "zero", 0),
                            int_member(l, "virtual_stages", 1));
  }
  return r;
}

// One line of the file (without its '\n' and a trailing '\r'); false at the end. Refuses a line over the limit
// before it is held whole.
bool next_line(std::streambuf* sb, std::string* line, const std::string& where_prefix, int64_t line_no) {
  line->clear();
  int c = sb->sbumpc();
  if (c == std::char_traits<char>::eof()) return false;
  while (c != std::char_traits<char>::eof() && c != '\n') {
    if (line->size() >= kMaxLineBytes)
      throw PlotError(where_prefix + ":" + std::to_string(line_no) +
                      ": line longer than 1 MiB; a metrics line is a few hundred bytes, check that this is a metrics "
                      "file");
    line->push_back(static_cast<char>(c));
    c = sb->sbumpc();
  }
  if (!line->empty() && line->back() == '\r') line->pop_back();
  return true;
}

}  // namespace

std::string layout_label(int tp, int cp, int pp, int dp, int ep, int zero, int virtual_stages) {
  std::string s;
  auto add = [&](const std::string& part) { s += (s.empty() ? "" : "·") + part; };
  if (tp > 1) add("tp" + std::to_string(tp));
  if (cp > 1) add("cp" + std::to_string(cp));
  if (pp > 1) add("pp" + std::to_string(pp) + (virtual_stages > 1 ? "×v" + std::to_string(virtual_stages) : ""));
  if (dp > 1) add("dp" + std::to_string(dp));
  if (ep > 1) add("ep" + std::to_string(ep));
  if (zero > 0) add("zero" + std::to_string(zero));
  return s.empty() ? "1 rank" : s;
}

void name_runs(std::vector<MetricsFile>& files, const std::vector<std::string>& labels) {
  if (!labels.empty()) {
    for (size_t i = 0; i < files.size() && i < labels.size(); ++i) files[i].name = labels[i];
    return;
  }
  // The path's components, without empty ones ("a//b/" -> a, b) and "." components.
  auto parts = [](const std::string& path) {
    std::vector<std::string> out;
    size_t i = 0;
    while (i <= path.size()) {
      const size_t j = std::min(path.find('/', i), path.size());
      if (std::string c = path.substr(i, j - i); !c.empty() && c != ".") out.push_back(c);
      i = j + 1;
    }
    return out;
  };
  std::vector<std::vector<std::string>> comps;
  for (const auto& f : files) comps.push_back(parts(f.path));
  auto suffix = [&](size_t i, size_t n) {
    const auto& c = comps[i];
    std::string s;
    for (size_t k = c.size() > n ? c.size() - n : 0; k < c.size(); ++k) s += (s.empty() ? "" : "/") + c[k];
    if (n > c.size() && !f_absolute(files[i].path)) return s;
    return n > c.size() ? "/" + s : s;
  };
  for (size_t i = 0; i < files.size(); ++i) {
    // The fewest trailing components that no other file (of another path) shares.
    size_t n = 1;
    for (;; ++n) {
      bool clash = false;
      for (size_t j = 0; j < files.size() && !clash; ++j)
        clash = j != i && comps[j] != comps[i] && suffix(j, n) == suffix(i, n);
      if (!clash || n > comps[i].size()) break;
    }
    files[i].name = suffix(i, n);
  }
  for (size_t i = 0; i < files.size(); ++i) {  // one path given more than once
    int seen = 1;
    for (size_t j = 0; j < i; ++j) seen += comps[j] == comps[i];
    if (seen > 1) files[i].name += " #" + std::to_string(seen);
  }
}

MetricsFile parse_metrics(std::istream& in, const std::string& path) {
  MetricsFile f;
  f.path = path;
  f.name = base_name(path);
  const std::string where = shown_name(path);
  std::string line;
  std::streambuf* sb = in.rdbuf();
  int64_t line_no = 0;
  while (next_line(sb, &line, where, line_no + 1)) {
    ++line_no;
    if (line.find_first_not_of(" \t") == std::string::npos) continue;  // blank lines are allowed
    const std::string at = where + ":" + std::to_string(line_no) + ": ";
    json obj;
    try {
      obj = json::parse(line);
    } catch (const json::parse_error& e) {
      throw PlotError(at + "not JSON (syntax error at byte " + std::to_string(e.byte) +
                      "); each line of a metrics file is one JSON object");
    }
    if (!obj.is_object()) throw PlotError(at + "not a JSON object; each line of a metrics file is one JSON object");
    std::string kind = "step";
    if (auto it = obj.find("record"); it != obj.end()) {
      if (!it->is_string()) throw PlotError(at + "\"record\" is not a string (expected \"run\", \"step\", …)");
      kind = it->get<std::string>();
    }
    if (kind == "run") {
      RunRecord r = run_record(obj);
      // The resumed run redoes the steps after its checkpoint: what an earlier run wrote after it is stale.
      f.steps.erase(f.steps.upper_bound(r.start_step), f.steps.end());
      f.runs.push_back(std::move(r));
      continue;
    }
    if (kind != "step") {
      ++f.other_records;
      continue;
    }
    const auto st = obj.find("step");
    if (st == obj.end() || !st->is_number_integer() || st->get<int64_t>() < 0)
      throw PlotError(at + "a step record needs \"step\", a whole number >= 0" +
                      (st == obj.end() ? std::string(" (it has none)") : ""));
    StepValues v;
    for (int k = 0; k < kFields; ++k) {
      const auto it = obj.find(kFieldKeys[k]);
      if (it == obj.end() || it->is_null()) continue;
      if (!it->is_number()) throw PlotError(at + "\"" + kFieldKeys[k] + "\" is not a number");
      // Beyond ±1e300 (a diverged run, or 1e999 read as infinity) a value would overflow the axis arithmetic:
      // it is left out like the trainer's null for a non-finite value.
      if (const double x = it->get<double>(); std::isfinite(x) && std::fabs(x) <= 1e300) v.v[k] = x;
    }
    f.steps[st->get<int64_t>()] = v;  // a repeated step: the later record wins
  }
  f.lines = line_no;
  if (f.steps.empty())
    throw PlotError(where + ": no step records (" + std::to_string(line_no) + " lines, " +
                    std::to_string(f.runs.size()) + " run records); give a metrics file written by meshrun-train "
                    "--metrics or a run's directory");
  return f;
}

MetricsFile read_metrics(const std::string& path) {
  std::string error;
  if (!check_regular_file(path, "metrics file", &error)) throw PlotError(error);
  std::ifstream in(path, std::ios::binary);
  if (!in) throw PlotError(shown_name(path) + ": cannot read the metrics file; check the path and its permissions");
  return parse_metrics(in, path);
}

// ---------------------------------------------------------------------------------------------------------------
// Numbers and ticks

namespace {

std::string printf_string(const char* format, double v, int decimals = -1) {
  char buf[64];
  if (decimals >= 0)
    std::snprintf(buf, sizeof buf, format, decimals, v);
  else
    std::snprintf(buf, sizeof buf, format, v);
  return buf;
}

// "%.*f" without trailing zeros after the point, and never "-0".
std::string fixed(double v, int decimals) {
  std::string s = printf_string("%.*f", v, std::max(0, decimals));
  if (s.find('.') != std::string::npos) {
    while (s.back() == '0') s.pop_back();
    if (s.back() == '.') s.pop_back();
  }
  if (s == "-0") s = "0";
  return s;
}

// Decimals that show multiples of `step` exactly (1 for 0.5, 2 for 0.25, 0 for 20).
int decimals_for(double step) {
  int d = 0;
  for (double scaled = step; d < 12 && std::fabs(scaled - std::round(scaled)) > 1e-6 * scaled; scaled *= 10) ++d;
  return d;
}

// A coordinate: one decimal, fixed.
std::string num(double v) { return fixed(v, 1); }

// About three significant digits with k/M: "822k", "43.7k", "1.23M", "950".
std::string compact(double v) {
  const double a = std::fabs(v);
  auto sig3 = [](double x) { return fixed(x, x >= 100 ? 0 : x >= 10 ? 1 : 2); };
  if (a >= 1e9) return sig3(v / 1e9) + "G";
  if (a >= 1e6) return sig3(v / 1e6) + "M";
  if (a >= 1e4) return sig3(v / 1e3) + "k";
  if (a >= 100) return fixed(v, 0);
  return sig3(v);
}

}  // namespace

std::vector<double> nice_ticks(double lo, double hi, int target) {
  if (!(hi > lo)) {
    const double pad = lo == 0 ? 1 : std::fabs(lo) * 0.1;
    lo -= pad;
    hi += pad;
  }
  const double raw = (hi - lo) / std::max(1, target);
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  const double r = raw / mag;
  const double step = (r <= 1 ? 1 : r <= 2 ? 2 : r <= 5 ? 5 : 10) * mag;
  // Integer multiples, so that the ticks carry no accumulated rounding.
  const auto first = static_cast<int64_t>(std::floor(lo / step + 1e-9));
  const auto last = static_cast<int64_t>(std::ceil(hi / step - 1e-9));
  std::vector<double> ticks;
  for (int64_t k = first; k <= last; ++k) ticks.push_back(static_cast<double>(k) * step);
  if (ticks.size() < 2) ticks.push_back(static_cast<double>(first + 1) * step);
  return ticks;
}

std::string tick_label(double v, double step) {
  if (std::fabs(v) < step * 1e-6) return "0";
  const double a = std::fabs(v);
  if (step < 0.01) {  // 5e-4, 1.5e-3
    const int exp = static_cast<int>(std::floor(std::log10(a) + 1e-9));
    const double scale = std::pow(10.0, exp);
    return fixed(v / scale, decimals_for(step / scale)) + "e" + std::to_string(exp);
  }
  if (step >= 1000) {  // 5k, 1.2M
    const double div = a >= 1e9 ? 1e9 : a >= 1e6 ? 1e6 : 1e3;
    const char* suffix = div == 1e9 ? "G" : div == 1e6 ? "M" : "k";
    if (a < 1e3) return fixed(v, 0);
    return fixed(v / div, decimals_for(step / div)) + suffix;
  }
  return fixed(v, decimals_for(step));
}

// ---------------------------------------------------------------------------------------------------------------
// The picture

namespace {

constexpr double kWidth = 920, kMargin = 24, kAxisW = 64;
constexpr double kPlotX = kMargin + kAxisW, kPlotW = kWidth - kPlotX - 36;
constexpr double kPanelH = 150, kPanelTitleH = 24, kPanelGap = 14, kLegendRowH = 19;

// Tableau 10: distinguishable, also for most colour-blind readers; more files cycle.
const char* kPalette[] = {"#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2",
                          "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac"};
const char* colour(size_t i) { return kPalette[i % 10]; }

struct Panel {
  Field field;
  const char* title;
  double scale;      // value × scale is drawn (MFU: a fraction drawn in %)
  bool from_zero;    // the y axis starts at 0
};

const Panel kPanels[] = {
    {kLoss, "loss", 1, false},
    {kLr, "learning rate", 1, true},
    {kGradNorm, "grad norm", 1, true},
    {kTokensPerS, "tokens/s (global: all ranks)", 1, true},
    {kMfu, "MFU (%)", 100, true},
};

std::string text_safe(const std::string& s, size_t max_chars = 120) { return svg_escape(cut_value(s, max_chars)); }

class Doc {
 public:
  std::string body;
  void raw(const std::string& s) { body += s; }
  // `s` is markup: escape text first.
  void text(double x, double y, const std::string& s, const std::string& cls) {
    body += "<text x=\"" + num(x) + "\" y=\"" + num(y) + "\" class=\"" + cls + "\">" + s + "</text>\n";
  }
  void line(double x1, double y1, double x2, double y2, const std::string& attrs) {
    body += "<line x1=\"" + num(x1) + "\" y1=\"" + num(y1) + "\" x2=\"" + num(x2) + "\" y2=\"" + num(y2) + "\" " +
            attrs + "/>\n";
  }
};

struct Range {
  double lo = 0, hi = 0;
  std::vector<double> ticks;
};

// The points of one curve, in step order, split where a value is missing; each piece thinned to the lowest and
// highest value per pixel column when it has more points than the plot has columns (the output stays bounded).
std::vector<std::vector<std::pair<double, double>>> curve_pieces(const MetricsFile& f, Field field, double scale,
                                                                 const Range& xr) {
  std::vector<std::vector<std::pair<double, double>>> pieces(1);
  for (const auto& [step, vals] : f.steps) {
    if (!vals.v[field]) {
      if (!pieces.back().empty()) pieces.emplace_back();
      continue;
    }
    pieces.back().push_back({static_cast<double>(step), *vals.v[field] * scale});
  }
  if (pieces.back().empty()) pieces.pop_back();
  const double px_per_step = kPlotW / (xr.hi - xr.lo);
  for (auto& p : pieces) {
    if (p.size() <= static_cast<size_t>(2 * kPlotW)) continue;
    std::vector<std::pair<double, double>> thin;
    size_t i = 0;
    while (i < p.size()) {
      const auto column = static_cast<int64_t>((p[i].first - xr.lo) * px_per_step);
      size_t lo = i, hi = i, j = i;
      for (; j < p.size() && static_cast<int64_t>((p[j].first - xr.lo) * px_per_step) == column; ++j) {
        if (p[j].second < p[lo].second) lo = j;
        if (p[j].second > p[hi].second) hi = j;
      }
      thin.push_back(p[std::min(lo, hi)]);
      if (lo != hi) thin.push_back(p[std::max(lo, hi)]);
      i = j;
    }
    p = std::move(thin);
  }
  return pieces;
}

}  // namespace

std::string render_svg(const std::vector<MetricsFile>& files, const PlotOptions& options) {
  // Which panels have data, the x range, and each panel's y range.
  bool has[kFields] = {};
  double x_lo = std::numeric_limits<double>::max(), x_hi = std::numeric_limits<double>::lowest();
  for (const auto& f : files) {
    x_lo = std::min(x_lo, static_cast<double>(f.steps.begin()->first));
    x_hi = std::max(x_hi, static_cast<double>(f.steps.rbegin()->first));
    for (const auto& [step, vals] : f.steps)
      for (int k = 0; k < kFields; ++k) has[k] = has[k] || vals.v[k].has_value();
  }
  Range xr;
  xr.ticks = nice_ticks(x_lo, x_hi, 8);
  // A run from step 1 reads better on an axis from 0.
  xr.lo = x_lo >= 0 && xr.ticks.front() > 0 && x_lo <= (x_hi - x_lo) * 0.1 ? 0 : xr.ticks.front();
  if (xr.lo == 0 && xr.ticks.front() > 0) xr.ticks.insert(xr.ticks.begin(), 0.0);
  xr.hi = xr.ticks.back();
  auto x_px = [&](double step) { return kPlotX + (step - xr.lo) / (xr.hi - xr.lo) * kPlotW; };

  const std::optional<Reference>& ref = options.reference;
  bool any_eval = has[kEvalLoss], any_resume = false;
  for (const auto& f : files) any_resume = any_resume || f.runs.size() > 1;

  Doc d;
  double y = kMargin;
  // Title and the legend: one row per file (its colour, layout and file name, steps), then the key.
  std::string title = options.title;
  if (title.empty()) {
    std::vector<std::string> models;
    for (const auto& f : files)
      for (const auto& r : f.runs)
        if (!r.model.empty() && std::find(models.begin(), models.end(), r.model) == models.end())
          models.push_back(r.model);
    title = "Training metrics";
    for (size_t i = 0; i < models.size(); ++i) title += (i == 0 ? ": " : ", ") + models[i];
  }
  d.text(kMargin, y + 16, text_safe(title, 160), "title");
  y += 30;
  for (size_t i = 0; i < files.size(); ++i) {
    const MetricsFile& f = files[i];
    std::vector<std::string> layouts;
    for (const auto& r : f.runs)
      if (!r.layout.empty() && (layouts.empty() || layouts.back() != r.layout)) layouts.push_back(r.layout);
    std::string label;
    for (size_t k = 0; k < layouts.size(); ++k) label += (k ? " → " : "") + layouts[k];
    label = label.empty() ? f.name : label + " (" + f.name + ")";
    std::string detail = "steps " + std::to_string(f.steps.begin()->first) + "–" + std::to_string(f.steps.rbegin()->first);
    for (size_t k = 1; k < f.runs.size(); ++k)
      detail += (k == 1 ? ", resumed after step " : ", ") + std::to_string(f.runs[k].start_step);
    d.line(kMargin, y + 9, kMargin + 26, y + 9, std::string("stroke=\"") + colour(i) + "\" class=\"swatch\"");
    d.text(kMargin + 34, y + 13, text_safe(label, 160) + "<tspan class=\"note\" dx=\"10\">" + svg_escape(detail) + "</tspan>",
           "legend");
    y += kLegendRowH;
  }
  std::string key;
  if (any_eval) key += "circles: eval loss";
  if (any_resume) key += std::string(key.empty() ? "" : " · ") + "dotted verticals: a resumed run starts";
  if (!key.empty()) {
    d.text(kMargin, y + 13, svg_escape(key), "note");
    y += kLegendRowH;
  }
  y += 8;

  int panel_index = 0;
  std::vector<const Panel*> shown;
  for (const Panel& p : kPanels)
    if (has[p.field]) shown.push_back(&p);
  for (const Panel* p : shown) {
    const bool last = p == shown.back();
    // y range over every file's values (the loss panel includes eval loss)
    double lo = std::numeric_limits<double>::max(), hi = std::numeric_limits<double>::lowest();
    for (const auto& f : files)
      for (const auto& [step, vals] : f.steps)
        for (Field k : {p->field, p->field == kLoss ? kEvalLoss : p->field})
          if (vals.v[k]) lo = std::min(lo, *vals.v[k] * p->scale), hi = std::max(hi, *vals.v[k] * p->scale);
    const double data_hi = hi;
    // The planner's estimate joins the axis when it is within 3× the measured peak; above that it would flatten
    // every measured curve, so the panel title says where it is instead.
    const bool ref_here = p->field == kTokensPerS && ref.has_value();
    const bool ref_on_axis = ref_here && ref->tokens_per_s <= 3 * std::max(data_hi, 0.0) && ref->tokens_per_s >= 0;
    if (ref_on_axis) hi = std::max(hi, ref->tokens_per_s), lo = std::min(lo, ref->tokens_per_s);
    if (p->from_zero) lo = std::min(lo, 0.0);
    // A little room above and below the data so that no curve runs along the frame (none below 0 on a panel
    // that starts there); the ticks are the round numbers inside.
    Range yr;
    const double pad = hi > lo ? 0.06 * (hi - lo) : (hi == 0 ? 1 : 0.1 * std::fabs(hi));
    yr.lo = p->from_zero && lo == 0 ? 0 : lo - pad;
    yr.hi = hi + pad;
    const std::vector<double> all_ticks = nice_ticks(yr.lo, yr.hi, 4);
    const double step = all_ticks[1] - all_ticks[0];
    for (double t : all_ticks)
      if (t >= yr.lo - step * 1e-6 && t <= yr.hi + step * 1e-6) yr.ticks.push_back(t);
    
    d.text(kPlotX, y + 16, p->title, "panel");
    double head = kPanelTitleH;
    if (ref_here) {
      const std::string what = ref_on_axis ? ref->label
                                           : "↑ " + ref->label + ", above this axis: " +
                                                 compact(ref->tokens_per_s / std::max(data_hi, 1e-300)) +
                                                 "× the highest measured";
      d.line(kPlotX, y + head + 4, kPlotX + 28, y + head + 4, "class=\"estimate\"");
      d.text(kPlotX + 36, y + head + 8, svg_escape(cut_value(what, 200)), "note");
      head += 18;
    }
    const double top = y + head, bottom = top + kPanelH;
    auto y_px = [&](double v) { return bottom - (v - yr.lo) / (yr.hi - yr.lo) * kPanelH; };
    const std::string clip = "p" + std::to_string(panel_index++);
    d.raw("<clipPath id=\"" + clip + "\"><rect x=\"" + num(kPlotX) + "\" y=\"" + num(top - 3) + "\" width=\"" +
          num(kPlotW) + "\" height=\"" + num(kPanelH + 6) + "\"/></clipPath>\n");
    d.raw("<rect x=\"" + num(kPlotX) + "\" y=\"" + num(top) + "\" width=\"" + num(kPlotW) + "\" height=\"" +
          num(kPanelH) + "\" class=\"frame\"/>\n");
    for (double t : yr.ticks) {
      const double ty = y_px(t);
      if (ty > top + 0.5 && ty < bottom - 0.5) d.line(kPlotX, ty, kPlotX + kPlotW, ty, "class=\"grid\"");
      d.text(kPlotX - 7, ty + 4, svg_escape(tick_label(t, step)), "tick end");
    }
    for (double t : xr.ticks) {
      const double tx = x_px(t);
      if (t != xr.lo && t != xr.hi) d.line(tx, top, tx, bottom, "class=\"grid\"");
      if (last) d.text(tx, bottom + 16, tick_label(t, xr.ticks[1] - xr.ticks[0]), "tick mid");
    }
    d.raw("<g clip-path=\"url(#" + clip + ")\">\n");
    if (ref_on_axis)
      d.line(kPlotX, y_px(ref->tokens_per_s), kPlotX + kPlotW, y_px(ref->tokens_per_s), "class=\"estimate\"");
    for (size_t i = 0; i < files.size(); ++i) {
      const MetricsFile& f = files[i];
      for (size_t k = 1; k < f.runs.size(); ++k) {
        const double rx = x_px(static_cast<double>(f.runs[k].start_step));
        d.line(rx, top, rx, bottom, std::string("stroke=\"") + colour(i) + "\" class=\"resume\"");
      }
      for (const auto& piece : curve_pieces(f, p->field, p->scale, xr)) {
        std::string pts;
        for (const auto& [sx, sy] : piece) pts += (pts.empty() ? "" : " ") + num(x_px(sx)) + "," + num(y_px(sy));
        if (piece.size() == 1)  // a lone point between gaps: a dot, since a one-point polyline draws nothing
          d.raw("<circle cx=\"" + num(x_px(piece[0].first)) + "\" cy=\"" + num(y_px(piece[0].second)) +
                "\" r=\"2\" fill=\"" + colour(i) + "\"/>\n");
        else
          d.raw("<polyline points=\"" + pts + "\" stroke=\"" + colour(i) + "\" class=\"curve\"/>\n");
      }
      if (p->field == kLoss)
        for (const auto& [step_no, vals] : f.steps)
          if (vals.v[kEvalLoss])
            d.raw("<circle cx=\"" + num(x_px(static_cast<double>(step_no))) + "\" cy=\"" +
                  num(y_px(*vals.v[kEvalLoss])) + "\" r=\"3.5\" stroke=\"" + colour(i) + "\" class=\"eval\"/>\n");
    }
    d.raw("</g>\n");
    y = bottom + (last ? 22 : kPanelGap);
  }
  d.text(kPlotX + kPlotW / 2, y + 14, "step", "axis mid");
  y += 22;
  const double height = y + kMargin;

  std::string out = svg_preamble(num(kWidth), num(height),
                                 ".title{font-size:17px;font-weight:bold;fill:#1d1d1f}\n"
                                 ".panel{font-size:13px;font-weight:bold;fill:#333}\n"
                                 ".legend{font-size:12.5px;fill:#222}\n"
                                 ".note{font-size:11px;fill:#555}\n"
                                 ".tick{font-size:11px;fill:#555}\n"
                                 ".axis{font-size:12px;fill:#333}\n"
                                 ".end{text-anchor:end}\n"
                                 ".mid{text-anchor:middle}\n"
                                 ".frame{fill:#fff;stroke:#9aa0a6;stroke-width:1}\n"
                                 ".grid{stroke:#e6e6e6;stroke-width:1}\n"
                                 ".curve{fill:none;stroke-width:1.8;stroke-linejoin:round;stroke-linecap:round}\n"
                                 ".swatch{stroke-width:3}\n"
                                 ".eval{fill:#fff;stroke-width:1.6}\n"
                                 ".resume{stroke-width:1.2;stroke-dasharray:2 3}\n"
                                 ".estimate{stroke:#222;stroke-width:1.4;stroke-dasharray:7 4}\n");
  out += d.body;
  out += "</svg>\n";
  return out;
}

}  // namespace meshrun::plot
