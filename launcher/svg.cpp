#include "svg.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include "meshrun/schedule.hpp"
#include "plan_render.hpp"

namespace meshrun {
namespace {

constexpr int kMargin = 24;
constexpr int kLabelW = 128;
constexpr int kCellW = 64, kCellH = 46, kCellGap = 4, kRowGap = 10;
constexpr int kOverviewCols = 64, kSquare = 9;
constexpr int kLegendColW = 220;  // fits "stage 12: 8 layers in 4 chunks"
constexpr int kMaxOverviewSquares = 4096;

}  // namespace

std::string svg_escape(const std::string& s) {
  std::string o;
  for (char c : s) {
    switch (c) {
      case '&': o += "&amp;"; break;
      case '<': o += "&lt;"; break;
      case '>': o += "&gt;"; break;
      case '"': o += "&quot;"; break;
      default: o += c;
    }
  }
  return o;
}

std::string svg_preamble(const std::string& width, const std::string& height, std::string_view style_rules,
                         std::string_view defs) {
  std::string out = "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + width + "\" height=\"" + height +
                    "\" viewBox=\"0 0 " + width + " " + height +
                    "\" font-family=\"DejaVu Sans, Helvetica, Arial, sans-serif\">\n<style>\n";
  out += style_rules;
  out += "</style>\n";
  out += defs;
  out += "<rect width=\"100%\" height=\"100%\" fill=\"#fbfbfd\"/>\n";
  return out;
}

namespace {

// Light, distinguishable fills: a qualitative palette for short pipelines, evenly spaced hues beyond.
std::string stage_color(int stage, int pp) {
  static const char* palette[] = {"#8ecae6", "#ffb703", "#90be6d", "#f4978e", "#b8a1e3", "#f9c74f",
                                  "#4cc9a0", "#e9a1c8", "#a3b18a", "#ffd6a5", "#9bb1ff", "#d4a373"};
  if (pp <= 12) return palette[stage % 12];
  char buf[32];
  // Hues 0..300 only: the circle's ends (red and pink) would make the first and last stage look alike.
  std::snprintf(buf, sizeof buf, "hsl(%d,60%%,72%%)", static_cast<int>(300.0 * stage / (pp - 1)));
  return buf;
}

// "0-7", "0, 8, 16, … 1016 (every 8th)", or the members when few.
std::string members(const std::vector<int>& g) {
  if (g.size() == 1) return std::to_string(g[0]);
  int step = g[1] - g[0];
  bool even = true;
  for (size_t i = 1; i < g.size(); ++i) even = even && g[i] - g[i - 1] == step;
  if (even && step == 1) return std::to_string(g.front()) + "-" + std::to_string(g.back());
  if (g.size() <= 8) {
    std::string s;
    for (int r : g) s += (s.empty() ? "" : ", ") + std::to_string(r);
    return s;
  }
  std::string s = std::to_string(g[0]) + ", " + std::to_string(g[1]) + ", " + std::to_string(g[2]) + ", … " +
                  std::to_string(g.back());
  return even ? s + " (every " + std::to_string(step) + ")" : s;
}

int coord_of(const Coord& c, GroupKind k) {
  switch (k) {
    case GroupKind::tp: return c.tp;
    case GroupKind::cp: return c.cp;
    case GroupKind::pp: return c.pp;
    case GroupKind::dp: return c.dp;
    case GroupKind::ep: return c.ep;
    case GroupKind::dp_cp: return -1;
    case GroupKind::edp: return c.edp;
  }
  return -1;
}

std::string upper(const char* s) {
  std::string o(s);
  for (auto& ch : o) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
  return o;
}

// The hover text of one GPU: where it is and every group it belongs to.
std::string hover(const RankMap& map, int rank) {
  const RankGrid& grid = map.grid();
  Placement p = map.placement(rank);
  Coord c = map.coords(rank);
  std::ostringstream o;
  o << "rank " << rank << " on " << map.cluster().hosts[p.node] << " (node " << p.node << "), GPU " << p.gpu;
  for (GroupKind k : {GroupKind::tp, GroupKind::cp, GroupKind::pp, GroupKind::dp, GroupKind::ep}) {
    if (grid.group_size(k) == 1) continue;
    auto g = grid.group_of(rank, k);
    o << "\n" << upper(group_name(k)) << " " << coord_of(c, k) << " of " << g.size() << " over "
      << link_name(map.link_of(g)) << ": ranks " << members(g);
  }
  return o.str();
}

// Compact coordinates under the rank number: the axes with more than one rank, pipeline aside (the colour).
std::string cell_coords(const RankMap& map, int rank) {
  const Layout& l = map.layout();
  Coord c = map.coords(rank);
  std::string s;
  auto add = [&](const char* tag, int size, int v) {
    if (size > 1) s += (s.empty() ? "" : " ") + std::string(tag) + std::to_string(v);
  };
  add("t", l.tp, c.tp);
  add("c", l.cp, c.cp);
  add("d", l.dp, c.dp);
  add("e", l.ep, c.ep);
  return s;
}

class Canvas {
 public:
  std::ostringstream body;
  void rect(double x, double y, double w, double h, const std::string& attrs) {
    body << "<rect x=\"" << x << "\" y=\"" << y << "\" width=\"" << w << "\" height=\"" << h << "\" " << attrs
         << "/>\n";
  }
  void text(double x, double y, const std::string& s, const std::string& attrs = "") {
    body << "<text x=\"" << x << "\" y=\"" << y << "\"" << (attrs.empty() ? "" : " " + attrs) << ">" << svg_escape(s)
         << "</text>\n";
  }
};

// Draws the given nodes in full from y; returns the height used.
int draw_nodes(Canvas& cv, const RankMap& map, const std::vector<int>& nodes, int x0, int y0) {
  const Cluster& cl = map.cluster();
  const Layout& l = map.layout();
  int gpn = cl.gpus_per_node;
  int y = y0;
  for (int i = 0; i < gpn; ++i)
    cv.text(x0 + kLabelW + i * (kCellW + kCellGap) + kCellW / 2.0, y + 10, "GPU " + std::to_string(i),
            "class=\"axis\"");
  y += 18;
  int prev = -1;
  for (int node : nodes) {
    if (prev >= 0 && node != prev + 1) {
      cv.text(x0 + kLabelW - 8, y + 10, "… " + std::to_string(node - prev - 1) + " nodes", "class=\"axis end\"");
      y += 18;
    }
    prev = node;
    cv.text(x0, y + kCellH / 2.0 - 2, cl.hosts[node], "class=\"host\"");
    std::string sub = "node " + std::to_string(node);
    if (cl.nvlink_domain_gpus > gpn) sub += " · NVLink domain " + std::to_string(cl.nvlink_domain_of(node, 0));
    cv.text(x0, y + kCellH / 2.0 + 12, sub, "class=\"small\"");
    for (int local = 0; local < gpn; ++local) {
      int rank = map.rank_at(node, local);
      int x = x0 + kLabelW + local * (kCellW + kCellGap);
      Coord c = map.coords(rank);
      cv.body << "<g><title>" << svg_escape(hover(map, rank)) << "</title>\n";
      cv.rect(x, y, kCellW, kCellH, "rx=\"5\" fill=\"" + stage_color(c.pp, l.pp) + "\" class=\"gpu\"");
      cv.text(x + kCellW / 2.0, y + 20, std::to_string(rank), "class=\"rank\"");
      cv.text(x + kCellW / 2.0, y + 36, cell_coords(map, rank), "class=\"coord\"");
      cv.body << "</g>\n";
    }
    // TP outlines: one per run of neighbouring GPUs of the same group; dashed red when the group leaves the node.
    if (l.tp > 1) {
      const RankGrid& grid = map.grid();
      int local = 0;
      while (local < gpn) {
        int rank = map.rank_at(node, local);
        auto g = grid.group_of(rank, GroupKind::tp);
        int end = local + 1;
        while (end < gpn && grid.group_of(map.rank_at(node, end), GroupKind::tp).front() == g.front()) ++end;
        bool whole = end - local == static_cast<int>(g.size());
        double x = x0 + kLabelW + local * (kCellW + kCellGap) - 2.5;
        double w = (end - local) * (kCellW + kCellGap) - kCellGap + 5;
        cv.rect(x, y - 2.5, w, kCellH + 5, whole ? "rx=\"7\" class=\"tp\"" : "rx=\"7\" class=\"tp split\"");
        local = end;
      }
    }
    y += kCellH + kRowGap;
  }
  return y - y0;
}

// Schedule timeline: one row per pipeline rank, one box per compute action, time to the right.
constexpr int kTimelineRowH = 22, kTimelineMaxW = 1600;
const char* kColorF = "#4e79a7", *kColorB = "#f28e2b", *kColorW = "#59a14f";

// Draws the timeline from y; returns the height used and widens *width to fit.
int draw_schedule(Canvas& cv, const cli::ScheduleView& v, int x0, int y0, int* width) {
  const ScheduleSpec& spec = v.table.spec;
  const Timeline& tl = v.timeline;
  // Pixels per time unit: wide enough for a label where the step is short, at least 4 px where it is long.
  const double unit = std::clamp(double(kTimelineMaxW) / std::max(1.0, tl.makespan), 4.0, 30.0);
  *width = std::max(*width, int(x0 + kLabelW + tl.makespan * unit) + kMargin);
  int y = y0;
  char frac[32];
  std::snprintf(frac, sizeof frac, "%.4f", tl.bubble_fraction);
  std::ostringstream head;
  head << "Pipeline schedule: " << pipeline_schedule_name(spec.kind) << ", " << spec.microbatches
       << " micro-batches" << (spec.virtual_stages > 1 ? ", " + std::to_string(spec.virtual_stages) + " chunks per rank" : "")
       << "; bubble_fraction " << frac << ", peak_live_microbatches " << tl.peak_live_microbatches;
  cv.text(x0, y + 12, head.str(), "class=\"section\"");
  y += 18;
  cv.text(x0, y + 12, "Unit costs: F = B = W = 1 per chunk (fused BW = 2), free transfers. Hover a box for its action.",
          "class=\"small\"");
  y += 22;
  for (int r = 0; r < spec.pp; ++r) {
    cv.text(x0, y + 15, "pp rank " + std::to_string(r), "class=\"small\"");
    const double left = x0 + kLabelW;
    cv.rect(left, y, tl.makespan * unit, kTimelineRowH - 4, "fill=\"#eeeeee\"");  // idle shows through
    for (const TimedAction& ta : tl.ranks[r]) {
      const Action& a = v.table.ranks[r][ta.index];
      const double x = left + ta.start * unit, w = (ta.end - ta.start) * unit;
      cv.body << "<g><title>" << svg_escape("rank " + std::to_string(r) + ": " + action_text(a)) << "</title>\n";
      if (a.kind == ActionKind::BW) {  // its B part, then its W part
        const double split = w * v.costs.b.front() / (v.costs.b.front() + v.costs.w.front());
        cv.rect(x, y, split, kTimelineRowH - 4, std::string("fill=\"") + kColorB + "\" class=\"act\"");
        cv.rect(x + split, y, w - split, kTimelineRowH - 4, std::string("fill=\"") + kColorW + "\" class=\"act\"");
      } else {
        const char* fill = a.kind == ActionKind::F ? kColorF : a.kind == ActionKind::B ? kColorB : kColorW;
        cv.rect(x, y, w, kTimelineRowH - 4, std::string("fill=\"") + fill + "\" class=\"act\"");
      }
      const std::string label = cli::action_label(a, spec.virtual_stages);
      if (w >= 7.0 * label.size()) cv.text(x + w / 2, y + 13, label, "class=\"act-label\"");
      cv.body << "</g>\n";
    }
    y += kTimelineRowH;
  }
  y += 6;
  int x = x0;
  for (auto [name, fill] : {std::pair{"F forward", kColorF}, {"B input gradient", kColorB},
                            {"W weight gradient (a fused BW: B then W)", kColorW}, {"idle", "#eeeeee"}}) {
    cv.rect(x, y, 14, 14, std::string("rx=\"3\" fill=\"") + fill + "\"");
    cv.text(x + 20, y + 11, name, "class=\"small\"");
    x += 30 + 7 * int(std::string(name).size());
  }
  y += 22;
  return y - y0;
}

}  // namespace

void render_svg(std::ostream& out, const RankMap& map, const Config& cfg, const cli::ScheduleView* schedule) {
  const Cluster& cl = map.cluster();
  const Layout& l = map.layout();
  Canvas cv;
  int gpn = cl.gpus_per_node;
  bool summary = cl.nodes > kSvgDetailNodes;
  int grid_w = kLabelW + gpn * (kCellW + kCellGap);
  int width = std::max({grid_w, 3 * kLegendColW, summary ? kOverviewCols * (kSquare + 1) : 0}) + 2 * kMargin;
  int x0 = kMargin;
  int y = kMargin;

  std::ostringstream title;
  title << cfg.job.model.name << ": tp " << l.tp << " · cp " << l.cp << " · pp " << l.pp << " · dp " << l.dp;
  if (l.ep > 1) title << " · ep " << l.ep;
  title << " = " << map.world() << " ranks";
  cv.text(x0, y + 14, title.str(), "class=\"title\"");
  std::ostringstream sub;
  sub << cl.nodes << " node" << (cl.nodes == 1 ? "" : "s") << " × " << gpn << " GPUs (" << cl.type.name
      << "), order " << l.order.str() << " (leftmost fastest). Hover a GPU for its groups.";
  cv.text(x0, y + 34, sub.str(), "class=\"small\"");
  y += 52;

  // Which nodes to draw in full.
  std::vector<int> detail;
  int replica_nodes = 0;
  if (!summary) {
    for (int n = 0; n < cl.nodes; ++n) detail.push_back(n);
  } else {
    std::vector<bool> holds(cl.nodes, false);
    for (int r = 0; r < map.world(); ++r)
      if (map.coords(r).dp == 0) holds[map.placement(r).node] = true;
    for (int n = 0; n < cl.nodes; ++n)
      if (holds[n]) {
        ++replica_nodes;
        if (static_cast<int>(detail.size()) < kSvgDetailNodes) detail.push_back(n);
      }
    std::string head = "Data-parallel replica 0 in full: " + std::to_string(replica_nodes) + " node" +
                       (replica_nodes == 1 ? "" : "s") +
                       (replica_nodes > kSvgDetailNodes ? " (first " + std::to_string(kSvgDetailNodes) + " drawn)" : "") +
                       "; the other " + std::to_string(l.dp - 1) + " replicas have the same shape.";
    cv.text(x0, y + 12, head, "class=\"section\"");
    y += 24;
  }
  y += draw_nodes(cv, map, detail, x0, y);

  if (summary) {
    // Every node as a square coloured by its stage (grey when it holds several stages).
    y += 8;
    int per = (cl.nodes + kMaxOverviewSquares - 1) / kMaxOverviewSquares;
    int squares = (cl.nodes + per - 1) / per;
    std::string head = "All " + std::to_string(cl.nodes) + " nodes" +
                       (per > 1 ? " (one square per " + std::to_string(per) + " nodes)" : "") +
                       ", coloured by pipeline stage; outlined: drawn above.";
    cv.text(x0, y + 12, head, "class=\"section\"");
    y += 22;
    std::vector<bool> drawn(cl.nodes, false);
    for (int n : detail) drawn[n] = true;
    for (int s = 0; s < squares; ++s) {
      int node = s * per;
      int stage = map.coords(map.rank_at(node, 0)).pp;
      bool mixed = false;
      for (int local = 1; local < gpn; ++local) mixed = mixed || map.coords(map.rank_at(node, local)).pp != stage;
      int x = x0 + (s % kOverviewCols) * (kSquare + 1);
      int yy = y + (s / kOverviewCols) * (kSquare + 1);
      cv.body << "<rect x=\"" << x << "\" y=\"" << yy << "\" width=\"" << kSquare << "\" height=\"" << kSquare
              << "\" fill=\"" << (mixed ? "#bbbbbb" : stage_color(stage, l.pp)) << "\""
              << (drawn[node] ? " stroke=\"#222\" stroke-width=\"1.2\"" : "") << "><title>" << svg_escape(cl.hosts[node])
              << " (node " << node << "): " << (mixed ? "several stages" : "stage " + std::to_string(stage))
              << "</title></rect>\n";
    }
    y += ((squares + kOverviewCols - 1) / kOverviewCols) * (kSquare + 1) + 6;
  }

  // Legend: stage colours with their layers, the TP outline, and every axis's groups as counts.
  y += 10;
  cv.text(x0, y + 12, "Pipeline stages (fill)", "class=\"section\"");
  y += 20;
  auto layers = chunk_layers(cfg.job.model.layers, l.pp * l.virtual_stages);
  int shown_stages = std::min(l.pp, 16);
  int legend_cols = std::max(1, (width - 2 * kMargin) / kLegendColW);
  for (int s = 0; s < shown_stages; ++s) {
    int stage = l.pp <= 16 ? s : s * (l.pp - 1) / (shown_stages - 1);
    int x = x0 + (s % legend_cols) * kLegendColW, yy = y + (s / legend_cols) * 20;
    cv.rect(x, yy, 14, 14, "rx=\"3\" fill=\"" + stage_color(stage, l.pp) + "\" class=\"gpu\"");
    std::string label = "stage " + std::to_string(stage);
    if (layers) {
      // Interleaved and V pipelines: a stage holds every chunk c with chunk_rank(c) == stage; the picture gives
      // the total.
      const ChunkPlacement placement = chunk_placement(cfg.job.parallel.pipeline_schedule);
      int first = 0, count = 0;
      for (int i = 0; i < stage; ++i) first += (*layers)[i];
      for (int c = 0; c < int(layers->size()); ++c)
        if (chunk_rank(c, l.pp, placement) == stage) count += (*layers)[c];
      if (l.virtual_stages == 1)
        label += count == 1 ? ": layer " + std::to_string(first)
                            : ": layers " + std::to_string(first) + "-" + std::to_string(first + count - 1);
      else
        label += ": " + std::to_string(count) + " layers in " + std::to_string(l.virtual_stages) + " chunks";
    }
    cv.text(x + 20, yy + 11, label, "class=\"small\"");
  }
  y += ((shown_stages + legend_cols - 1) / legend_cols) * 20 + 8;
  if (l.tp > 1) {
    cv.rect(x0 + 1, y, 40, 16, "rx=\"7\" class=\"tp\"");
    cv.text(x0 + 50, y + 12, "TP group (" + std::to_string(l.tp) + " GPUs); dashed red: the group leaves its node",
            "class=\"small\"");
    y += 24;
  }
  cv.text(x0, y + 12, "Groups", "class=\"section\"");
  y += 20;
  cv.text(x0, y + 12, "Under each rank: t = TP index, c = CP, d = DP, e = EP (axes with more than one rank).",
          "class=\"small\"");
  y += 17;
  std::string unused;
  for (const auto& s : summarize_groups(map)) {
    if (s.kind == GroupKind::dp_cp && l.cp == 1) continue;  // same as dp
    if (s.kind == GroupKind::edp && l.ep == 1) continue;
    if (s.size == 1) {
      unused += (unused.empty() ? "" : ", ") + upper(group_name(s.kind));
      continue;
    }
    std::string links;
    for (Link ln : {Link::nvlink, Link::pcie, Link::network}) {
      int n = s.by_link[static_cast<int>(ln)];
      if (n == 0) continue;
      std::string how = ln == Link::network ? "cross the network" : ln == Link::nvlink ? "stay on NVLink" : "use PCIe";
      links += (links.empty() ? "" : ", ") + (n == s.count ? std::string(s.count == 1 ? "it" : "all") : std::to_string(n)) + " " + how;
    }
    std::ostringstream line;
    line << upper(group_name(s.kind)) << ": " << s.count << " group" << (s.count == 1 ? "" : "s") << " of " << s.size
         << " GPUs; " << links;
    cv.text(x0, y + 12, line.str(), "class=\"small\"");
    y += 17;
  }
  if (!unused.empty()) {
    cv.text(x0, y + 12, unused + ": size 1 (not split)", "class=\"small\"");
    y += 17;
  }
  if (schedule) {
    y += 10;
    y += draw_schedule(cv, *schedule, x0, y, &width);
  }
  int height = y + kMargin;

  out << svg_preamble(std::to_string(width), std::to_string(height),
                      ".title{font-size:17px;font-weight:bold;fill:#1d1d1f}\n"
                      ".section{font-size:13px;font-weight:bold;fill:#333}\n"
                      ".small{font-size:11px;fill:#444}\n"
                      ".host{font-size:12px;font-weight:bold;fill:#222}\n"
                      ".axis{font-size:10px;fill:#666;text-anchor:middle}\n"
                      ".end{text-anchor:end}\n"
                      ".gpu{stroke:#5f6b7a;stroke-width:0.8}\n"
                      ".rank{font-size:14px;font-weight:bold;fill:#1d1d1f;text-anchor:middle}\n"
                      ".coord{font-size:9.5px;fill:#333;text-anchor:middle}\n"
                      ".tp{fill:none;stroke:#1d3557;stroke-width:2.5}\n"
                      ".split{stroke:#c1121f;stroke-dasharray:6 3}\n"
                      "g:hover .gpu{stroke:#000;stroke-width:2}\n"
                      ".act{stroke:#fff;stroke-width:0.6}\n"
                      ".act-label{font-size:10px;fill:#fff;text-anchor:middle}\n")
      << cv.body.str() << "</svg>\n";
}

}  // namespace meshrun
