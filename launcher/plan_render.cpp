#include "plan_render.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <map>
#include <sstream>

#include "meshrun/geometry.hpp"
#include "meshrun/json.hpp"
#include "meshrun/limits.hpp"

namespace meshrun::cli {
namespace {

std::string pad(const std::string& s, size_t w, bool right = false) {
  if (s.size() >= w) return s;
  return right ? std::string(w - s.size(), ' ') + s : s + std::string(w - s.size(), ' ');
}

std::string layer_summary(const std::vector<int>& layers) {
  // "8 × 16" for even splits, else the list (shortened for many chunks).
  bool even = std::all_of(layers.begin(), layers.end(), [&](int x) { return x == layers.front(); });
  if (even) return std::to_string(layers.front()) + " layers in each of " + std::to_string(layers.size()) + " chunks";
  std::string s;
  for (size_t i = 0; i < layers.size(); ++i) {
    if (layers.size() > 8 && i == 3) {
      s += " …";
      i = layers.size() - 3;
    }
    s += (s.empty() ? "" : " ") + std::to_string(layers[i]);
  }
  s = "layers per chunk: " + s;
  if (layers.front() == 0) s += " (the first chunk holds only the embedding, the last only the output head)";
  return s;
}

// Decimal digits of v, as JsonWriter writes integers.
void append_int(std::string& out, int64_t v) {
  char buf[24];
  auto r = std::to_chars(buf, buf + sizeof buf, v);
  out.append(buf, size_t(r.ptr - buf));
}
// `key` (its quoted name and the colon, a literal) and v's digits.
template <size_t N>
void append_field(std::string& out, const char (&key)[N], int64_t v) {
  out.append(key, N - 1);
  append_int(out, v);
}

// Nodes to print: all, or the first two and the last.
std::vector<int> nodes_to_show(int nodes, bool all) {
  std::vector<int> v;
  if (all || nodes <= 4) {
    for (int i = 0; i < nodes; ++i) v.push_back(i);
  } else {
    v = {0, 1, nodes - 1};
  }
  return v;
}

}  // namespace

std::string rank_formula(const Layout& l) {
  std::vector<Axis> dense;
  for (Axis a : l.order.axes)
    if (a != Axis::ep) dense.push_back(a);
  // tp + TP·(cp + CP·(dp + DP·pp)), built from the slowest axis outwards.
  std::string inner = axis_name(dense.back());
  for (int i = static_cast<int>(dense.size()) - 2; i >= 0; --i) {
    bool single = i == static_cast<int>(dense.size()) - 2;
    inner = std::string(axis_name(dense[i])) + " + " + std::to_string(l.size(dense[i])) + "·" +
            (single ? inner : "(" + inner + ")");
  }
  return "rank = " + inner;
}

std::vector<ShownValue> shown_values(const Config& cfg, const Layout& l) {
  std::vector<ShownValue> out;
  for (const auto& k : config_keys()) {
    bool layout_key = k.key.rfind("parallel.", 0) == 0 || k.key.rfind("cluster.node", 0) == 0 ||
                      k.key == "cluster.gpus_per_node";
    bool set = cfg.origins.count(k.key) > 0;
    if (!layout_key && !set) continue;
    ShownValue v{k.key, value_text(cfg.job, k.key), cfg.origin_of(k.key).str()};
    if (k.key == "parallel.dp" && cfg.job.parallel.dp == 0)
      v.value = "auto = " + std::to_string(l.dp);
    if (k.key == "cluster.nodes" && cfg.job.cluster.nodes == 0) v.value = "0 (from hostlist, else 1)";
    if (k.key == "cluster.gpus_per_node" && cfg.job.cluster.gpus_per_node == 0) v.value = "0 (from node_type)";
    out.push_back(std::move(v));
  }
  for (const auto& [name, value] : cfg.job.env)
    out.push_back({"env." + name, value, cfg.origin_of("env." + name).str()});
  return out;
}

void render_plan_table(std::ostream& o, const PlanView& v) {
  const RankMap& map = v.map;
  const Layout& l = map.layout();
  const Cluster& c = map.cluster();
  const JobConfig& job = v.config.job;
  o << "meshrun plan" << (v.template_path.empty() ? "" : ": " + v.template_path) << "\n\n";
  o << "layout    tp=" << l.tp << " cp=" << l.cp << " pp=" << l.pp << " dp=" << l.dp << " ep=" << l.ep
    << "  zero=" << l.zero_stage << (l.sequence_parallel ? " sp" : "") << "\n";
  o << "order     " << l.order.str() << " (leftmost varies fastest): " << rank_formula(l) << "\n";
  o << "world     " << map.world() << " ranks = " << c.nodes << " nodes × " << c.gpus_per_node << " GPUs ("
    << c.type.name << ", NVLink domain " << c.nvlink_domain_gpus << " GPU" << (c.nvlink_domain_gpus == 1 ? "" : "s")
    << ")\n";
  if (v.rules == RuleSet::layout) {
    o << "pipeline  " << l.pp << " stage" << (l.pp == 1 ? "" : "s") << " × " << l.virtual_stages << " chunk"
      << (l.virtual_stages == 1 ? "" : "s") << "\n";
    o << "model     none: no template, so only the layout's rules were checked (give TEMPLATE.toml for the model's and the batch's)\n";
  } else {
    if (auto layers = chunk_layers(job.model.layers, l.pp * l.virtual_stages))
      o << "pipeline  " << l.pp << " stage" << (l.pp == 1 ? "" : "s") << " × " << l.virtual_stages << " chunk"
        << (l.virtual_stages == 1 ? "" : "s") << "; " << layer_summary(*layers) << "\n";
    // validate() passed, so the batch cuts over the layout (batch-dp, seq-cp, seq-sp): value() cannot throw.
    const BatchGeometry g = batch_geometry(job.training, l, static_cast<std::string*>(nullptr)).value();
    o << "batch     " << g.global_batch << " sequences × " << g.seq_len << " tokens per step; " << g.microbatches
      << " micro-batch" << (g.microbatches == 1 ? "" : "es") << " of " << g.micro_batch_size << " per DP rank\n";
  }

  o << "\nvalues (source)\n";
  for (const auto& sv : shown_values(v.config, l))
    o << "  " << pad(sv.key, 28) << pad(sv.value, 22) << " " << sv.source << "\n";

  o << "\nchecks passed (" << v.checks.size() << ", rules " << rule_set_name(v.rules) << "):";
  for (size_t i = 0; i < v.checks.size(); ++i) o << (i ? ", " : " ") << v.checks[i];
  o << "\n";

  auto shown = nodes_to_show(c.nodes, v.all_nodes);
  o << "\nranks";
  if (static_cast<int>(shown.size()) < c.nodes)
    o << " (nodes 0, 1 and " << c.nodes - 1 << " of " << c.nodes << "; --all prints every node)";
  o << "\n";
  int prev = -1;
  for (int node : shown) {
    if (prev >= 0 && node != prev + 1) o << "  … " << node - prev - 1 << " more nodes\n";
    prev = node;
    o << "  node " << node << "  " << c.hosts[node] << "  (NVLink domain " << c.nvlink_domain_of(node, 0) << ")\n";
    o << "    " << pad("rank", 7, true) << pad("local", 6, true) << pad("gpu", 5, true) << pad("tp", 5, true)
      << pad("cp", 5, true) << pad("pp", 5, true) << pad("dp", 6, true) << pad("ep", 5, true);
    for (const auto& h : v.extra_columns) o << "  " << pad(h, 12);
    o << "\n";
    for (int local = 0; local < c.gpus_per_node; ++local) {
      int r = map.rank_at(node, local);
      Coord x = map.coords(r);
      Placement p = map.placement(r);
      o << "    " << pad(std::to_string(r), 7, true) << pad(std::to_string(p.local_rank), 6, true)
        << pad(std::to_string(p.gpu), 5, true) << pad(std::to_string(x.tp), 5, true)
        << pad(std::to_string(x.cp), 5, true) << pad(std::to_string(x.pp), 5, true)
        << pad(std::to_string(x.dp), 6, true) << pad(std::to_string(x.ep), 5, true);
      if (v.extra_cells)
        for (const auto& cell : v.extra_cells(local)) o << "  " << pad(cell, 12);
      o << "\n";
    }
  }

  o << "\ngroups\n    " << pad("axis", 7) << pad("size", 7, true) << pad("count", 8, true) << "  link\n";
  for (GroupKind kind : kGroupKinds) {
    const GroupSummary s = summarize_group(map, kind);
    std::string links;
    const Link order[] = {Link::self, Link::nvlink, Link::pcie, Link::network};
    for (Link ln : order) {
      int n = s.by_link[static_cast<int>(ln)];
      if (n == 0) continue;
      if (!links.empty()) links += ", ";
      links += n == s.count ? std::string(link_name(ln)) : std::string(link_name(ln)) + " " + std::to_string(n);
    }
    o << "    " << pad(group_name(s.kind), 7) << pad(std::to_string(s.size), 7, true)
      << pad(std::to_string(s.count), 8, true) << "  " << links << "\n";
  }
  o << "\nwarnings:";
  if (v.warnings.empty()) o << " none\n";
  else {
    o << "\n";
    for (const auto& w : v.warnings) o << "  - " << w << "\n";
  }
}

void render_plan_json_body(JsonWriter& j, const PlanView& v, const std::function<void()>& flush) {
  const RankMap& map = v.map;
  const Layout& l = map.layout();
  const Cluster& c = map.cluster();
  j.field("template", v.template_path);
  j.field("world_size", map.world());
  j.key("layout").begin_object();
  j.field("tp", l.tp).field("cp", l.cp).field("pp", l.pp).field("dp", l.dp).field("ep", l.ep);
  j.field("order", l.order.str()).field("virtual_stages", l.virtual_stages).field("zero_stage", l.zero_stage);
  j.field("sequence_parallel", l.sequence_parallel).field("formula", rank_formula(l));
  j.end_object();
  j.key("cluster").begin_object();
  j.field("nodes", c.nodes).field("gpus_per_node", c.gpus_per_node).field("nvlink_domain_gpus", c.nvlink_domain_gpus);
  j.field("node_type", c.type.name);
  j.end_object();
  j.key("values").begin_object();
  for (const auto& sv : shown_values(v.config, l)) {
    j.key(sv.key).begin_object().field("value", sv.value).field("source", sv.source).end_object();
  }
  j.end_object();
  j.key("checks").begin_array();
  for (const auto& ch : v.checks) j.value(ch);
  j.end_array();
  j.field("rules", rule_set_name(v.rules));  // which rule set applied (layout.hpp RuleSet)
  if (auto layers = chunk_layers(v.config.job.model.layers, l.pp * l.virtual_stages); layers && v.rules != RuleSet::layout)
    j.key("chunk_layers").int_array(*layers);

  // A row per rank and a list per group: a million of each at the largest sizes, so each is written as one
  // piece of text (the bytes JsonWriter's fields would give) and the host's literal is escaped once a node.
  std::string text, host_literal;
  int host_node = -1;
  j.key("ranks").begin_array();
  for (int r = 0; r < map.world(); ++r) {
    Coord x = map.coords(r);
    Placement p = map.placement(r);
    if (p.node != host_node) {
      host_literal.clear();
      JsonWriter(host_literal).string_literal(c.hosts[p.node]);
      host_node = p.node;
    }
    text.clear();
    append_field(text, "{\"rank\":", r);
    append_field(text, ",\"node\":", p.node);
    text.append(",\"host\":", 8);
    text += host_literal;
    append_field(text, ",\"local_rank\":", p.local_rank);
    append_field(text, ",\"gpu\":", p.gpu);
    append_field(text, ",\"tp\":", x.tp);
    append_field(text, ",\"cp\":", x.cp);
    append_field(text, ",\"pp\":", x.pp);
    append_field(text, ",\"dp\":", x.dp);
    append_field(text, ",\"ep\":", x.ep);
    if (v.extra_cells) {
      auto cells = v.extra_cells(p.local_rank);
      JsonWriter cell(text);
      for (size_t k = 0; k < cells.size() && k < v.extra_columns.size(); ++k) {
        text += ',';
        cell.string_literal(v.extra_columns[k]);
        text += ':';
        cell.string_literal(cells[k]);
      }
    }
    text += '}';
    j.raw(text);
    if (flush) flush();
  }
  j.end_array();

  // Each kind's groups are computed once and serve both the listing and the link summary.
  std::vector<GroupSummary> summaries;
  j.key("groups").begin_object();
  for (GroupKind k : kGroupKinds) {
    j.key(group_name(k)).begin_array();
    summaries.push_back(summarize_group(map, k, [&](const std::vector<int>& g) {
      text.assign(1, '[');
      for (size_t i = 0; i < g.size(); ++i) {
        if (i) text += ',';
        append_int(text, g[i]);
      }
      text += ']';
      j.raw(text);
      if (flush) flush();
    }));
    j.end_array();
  }
  j.end_object();
  j.key("group_links").begin_object();
  for (const auto& s : summaries) {
    j.key(group_name(s.kind)).begin_object();
    j.field("size", s.size).field("count", s.count);
    for (Link ln : {Link::self, Link::nvlink, Link::pcie, Link::network})
      j.field(link_name(ln), s.by_link[static_cast<int>(ln)]);
    j.end_object();
  }
  j.end_object();
  j.key("warnings").begin_array();
  for (const auto& w : v.warnings) j.value(w);
  j.end_array();
}

std::string at_batch_origin(const Config& cfg, const std::string& why) {
  if (why.empty()) return "";
  const Origin origin = cfg.origin_of("training.global_batch_size");
  return (origin.where.empty() ? std::string() : origin.where + ": ") + why;
}

std::string schedule_view_problem(const Config& cfg, const Layout& layout) {
  const TrainingSpec& t = cfg.job.training;
  const std::string why = schedule_size_problem(t.global_batch_size, t.micro_batch_size, layout.dp, layout.pp,
                                                layout.virtual_stages, "--schedule draws");
  if (why.empty()) return "";
  return at_batch_origin(cfg, why + " to see the schedule (the plan without --schedule has no such limit)");
}

ScheduleView make_schedule_view(const JobConfig& job, const Layout& layout) {
  ScheduleSpec spec;
  spec.kind = *parse_pipeline_schedule(job.parallel.pipeline_schedule);  // the config accepts only known names
  spec.pp = layout.pp;
  spec.virtual_stages = layout.virtual_stages;
  // Shown for a validated layout (batch-dp checked), within schedule_size's bound: value() cannot throw.
  spec.microbatches = int(batch_geometry(job.training, layout, static_cast<std::string*>(nullptr)).value().microbatches);
  ScheduleView v{generate_schedule(spec), ScheduleCosts{}, {}};
  v.timeline = simulate_schedule(v.table, v.costs);
  return v;
}

std::string action_label(const Action& a, int virtual_stages) {
  std::string s = std::string(action_name(a.kind)) + std::to_string(a.microbatch);
  if (virtual_stages > 1) s += "c" + std::to_string(a.chunk);
  return s;
}

namespace {
// One column per time unit, as wide as the longest label plus a space, so an action of d units spans d columns
// and every label fits in its action's first column.
size_t schedule_column_width(const ScheduleView& v) {
  size_t width = 1;
  for (int r = 0; r < v.table.spec.pp; ++r)
    for (const TimedAction& ta : v.timeline.ranks[r])
      width = std::max(width, action_label(v.table.ranks[r][ta.index], v.table.spec.virtual_stages).size());
  return width + 1;
}
size_t schedule_prefix_width(const ScheduleView& v) {  // "  rank N  "
  return 2 + ("rank " + std::to_string(v.table.spec.pp - 1)).size() + 2;
}
}  // namespace

int schedule_panel_columns(const ScheduleView& v, int max_width, int* least_width) {
  const size_t width = schedule_column_width(v), prefix = schedule_prefix_width(v);
  if (least_width) *least_width = static_cast<int>(prefix + width);
  if (max_width < static_cast<int>(prefix + width)) return 0;
  return static_cast<int>((static_cast<size_t>(max_width) - prefix) / width);
}

void render_schedule_table(std::ostream& o, const ScheduleView& v, int max_width) {
  const ScheduleSpec& spec = v.table.spec;
  const Timeline& tl = v.timeline;
  o << "pipeline schedule  " << pipeline_schedule_name(spec.kind) << ": " << spec.pp << " rank"
    << (spec.pp == 1 ? "" : "s");
  if (spec.virtual_stages > 1 && chunk_placement(spec.kind) == ChunkPlacement::v)
    o << " × 2 chunks in a V (rank r holds chunks r and " << 2 * spec.pp - 1 << "−r)";
  else if (spec.virtual_stages > 1)
    o << " × " << spec.virtual_stages << " chunks (chunk c on rank c mod " << spec.pp << ")";
  o << ", " << spec.microbatches << " micro-batch" << (spec.microbatches == 1 ? "" : "es") << " per step\n";
  o << "  unit costs: F = B = W = 1 per chunk (fused BW = 2), free transfers; one column per time unit, . idle\n";
  const size_t width = schedule_column_width(v);
  const std::string rank_head = "rank " + std::to_string(spec.pp - 1);
  const long makespan = std::lround(tl.makespan);
  std::vector<std::string> rows;  // each rank's whole timeline, makespan columns of `width` characters
  for (int r = 0; r < spec.pp; ++r) {
    std::string line;
    long pos = 0;
    for (const TimedAction& ta : tl.ranks[r]) {
      const long start = std::lround(ta.start), end = std::lround(ta.end);
      for (; pos < start; ++pos) line += pad(".", width);
      line += pad(action_label(v.table.ranks[r][ta.index], spec.virtual_stages), size_t(end - start) * width);
      pos = end;
    }
    for (; pos < makespan; ++pos) line += pad(".", width);
    rows.push_back(line);
  }
  const long per_panel = max_width > 0 ? std::max(1, schedule_panel_columns(v, max_width)) : std::max(1L, makespan);
  for (long first = 0; first < std::max(1L, makespan); first += per_panel) {
    const long last = std::min(makespan, first + per_panel);  // columns [first, last)
    if (max_width > 0 && makespan > 0)
      o << "  time " << first << "-" << (last - 1) << " of " << makespan << "\n";
    for (int r = 0; r < spec.pp; ++r) {
      std::string line = "  " + pad("rank " + std::to_string(r), rank_head.size()) + "  " +
                         rows[r].substr(size_t(first) * width, size_t(last - first) * width);
      while (!line.empty() && line.back() == ' ') line.pop_back();
      o << line << "\n";
    }
  }
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.4f", tl.bubble_fraction);
  o << "  bubble_fraction " << buf << " (idle ÷ (pp × makespan); makespan " << tl.makespan << ", idle per rank";
  for (double idle : tl.idle) o << " " << idle;
  o << ")\n";
  o << "  peak_live_microbatches " << tl.peak_live_microbatches << " (per rank";
  for (int p : tl.peak_live_per_rank) o << " " << p;
  o << "; a slot lives from its F until its W or BW ends)\n";
}

void render_schedule_json(JsonWriter& j, const ScheduleView& v) {
  const ScheduleSpec& spec = v.table.spec;
  const Timeline& tl = v.timeline;
  j.begin_object();
  j.field("pipeline_schedule", pipeline_schedule_name(spec.kind)).field("pp", spec.pp);
  j.field("virtual_stages", spec.virtual_stages).field("microbatches", spec.microbatches);
  j.key("costs").begin_object();
  j.field("f", v.costs.f.front()).field("b", v.costs.b.front()).field("w", v.costs.w.front());
  j.field("transfer", v.costs.transfer).end_object();
  j.key("ranks").begin_array();
  for (int r = 0; r < spec.pp; ++r) {
    std::vector<const TimedAction*> timed(v.table.ranks[r].size(), nullptr);
    for (const TimedAction& ta : tl.ranks[r]) timed[ta.index] = &ta;
    j.begin_object().field("rank", r).key("actions").begin_array();
    for (size_t i = 0; i < v.table.ranks[r].size(); ++i) {
      const Action& a = v.table.ranks[r][i];
      j.begin_object().field("kind", action_name(a.kind)).field("microbatch", a.microbatch).field("chunk", a.chunk);
      if (a.peer >= 0) j.field("peer", a.peer);
      if (timed[i]) j.field("start", timed[i]->start).field("end", timed[i]->end);
      j.end_object();
    }
    j.end_array();
    j.field("idle", tl.idle[r]).field("peak_live", tl.peak_live_per_rank[r]).end_object();
  }
  j.end_array();
  j.field("makespan", tl.makespan).field("bubble_fraction", tl.bubble_fraction);
  j.field("peak_live_microbatches", tl.peak_live_microbatches);
  j.end_object();
}

}  // namespace meshrun::cli
