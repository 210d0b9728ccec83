#include "preflight_core.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <set>
#include <stdexcept>

#include "meshrun/hostlist.hpp"

namespace meshrun::preflight {
namespace {

std::string fixed(double v, int decimals) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, v);
  return buf;
}

// The reference a figure is judged against: the site's, else the median of `values` when there are at least
// `min_count` of them. `unit` and `key` shape the text.
struct Reference {
  double value = 0;
  std::string text;  // "the median 41.2" / "the site's 40.0 (site.toml)"
  bool known() const { return value > 0; }
};
Reference reference(double site_value, const std::vector<double>& values, size_t min_count, int decimals,
                    const Expected& e) {
  Reference r;
  if (site_value > 0) {
    r.value = site_value;
    r.text = "the site's " + fixed(site_value, decimals) + (e.site.empty() ? "" : " (" + e.site + ")");
  } else if (values.size() >= min_count) {
    r.value = median(values);
    r.text = "the median " + fixed(r.value, decimals);
  }
  return r;
}

// PASS/FAIL of `figure` against `ref`; info when there is nothing to compare with.
void verdict(Check& c, double figure, const Reference& ref, const Expected& e, const std::string& no_ref) {
  if (!ref.known()) {
    c.status = Status::info;
    c.verdict = no_ref;
    return;
  }
  const double ratio = figure / ref.value;
  c.status = ratio < e.min_fraction ? Status::fail : Status::pass;
  c.verdict = fixed(ratio, 2) + " of " + ref.text + (c.status == Status::fail ? " (min " + fixed(e.min_fraction, 2) + ")" : "");
}

const char* status_word(Status s) {
  switch (s) {
    case Status::pass: return "PASS";
    case Status::fail: return "FAIL";
    case Status::skipped: return "skipped";
    case Status::info: return "";
  }
  return "";
}

std::string cell(const Check& c) {
  switch (c.status) {
    case Status::pass:
    case Status::fail: return std::string(status_word(c.status)) + (c.verdict.empty() ? "" : ": " + c.verdict);
    case Status::skipped: return c.verdict.rfind("skipped", 0) == 0 ? c.verdict : "skipped: " + c.verdict;
    case Status::info: return c.verdict.empty() ? "-" : c.verdict;
  }
  return c.verdict;
}

}  // namespace

double median(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
}

std::string rank_list(const std::vector<int>& ranks) {
  std::string out;
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (!out.empty()) out += ',';
    out += std::to_string(ranks[i]);
    if (j > i) out += (j == i + 1 ? "," : "-") + std::to_string(ranks[j]);
    i = j + 1;
  }
  return out;
}

std::vector<std::pair<int, int>> ring_links(int nodes) {
  std::vector<std::pair<int, int>> links;
  if (nodes == 2) links.emplace_back(0, 1);
  if (nodes > 2)
    for (int i = 0; i < nodes; ++i) links.emplace_back(i, (i + 1) % nodes);
  return links;
}

std::vector<int> phases(const std::vector<std::vector<std::string>>& item_hosts) {
  std::vector<std::set<std::string>> used;  // hosts busy in each phase
  std::vector<int> out;
  for (const auto& hosts : item_hosts) {
    size_t p = 0;
    for (; p < used.size(); ++p) {
      bool clash = false;
      for (const auto& h : hosts) clash = clash || used[p].count(h) > 0;
      if (!clash) break;
    }
    if (p == used.size()) used.emplace_back();
    used[p].insert(hosts.begin(), hosts.end());
    out.push_back(static_cast<int>(p));
  }
  return out;
}

double parse_fraction(const std::string& text) {
  size_t used = 0;
  double v = 0;
  try {
    v = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != text.size() || !std::isfinite(v) || v <= 0 || v > 1)
    throw std::invalid_argument("--min-fraction " + text + ": expected a number in (0, 1], e.g. 0.5");
  return v;
}

Report judge(const Measurements& m, const Expected& e) {
  Report r;
  r.nodes = m.nodes;
  const int n = static_cast<int>(m.nodes.size());

  // GEMM: each node's slowest device against the site's figure or the median of every device.
  std::vector<double> all;
  for (const auto& node : m.nodes)
    for (const auto& d : node.devices) all.push_back(d.gflops);
  const Reference gemm_ref = reference(e.gemm_gflops, all, 2, 1, e);
  for (auto& node : r.nodes) {
    if (node.devices.empty()) continue;
    Check c{"gemm", "", Status::info, ""};
    auto slowest = std::min_element(node.devices.begin(), node.devices.end(),
                                    [](const Device& a, const Device& b) { return a.gflops < b.gflops; });
    c.figure = fixed(slowest->gflops, 1) + " GFLOP/s";
    if (node.devices.size() > 1) {
      c.figure += " (slowest of";
      for (const auto& d : node.devices) c.figure += " " + std::to_string(d.rank) + ":" + fixed(d.gflops, 1);
      c.figure += ")";
    }
    verdict(c, slowest->gflops, gemm_ref, e, "no reference (one device; set site.preflight_gemm_gflops)");
    node.checks.push_back(c);
  }

  // Point-to-point: a node's figure is its best link, so that only the node whose every link is slow is blamed
  // (a slow node's neighbours keep one good link each), and the median is over those figures (over the links,
  // a slow node's two slow links of a 4-node ring would pull the median down to it).
  std::vector<double> best(static_cast<size_t>(n), -1);
  std::vector<std::string> parts(static_cast<size_t>(n));
  for (const auto& l : m.links)
    for (const int i : {l.a, l.b}) {
      const int other = l.a == i ? l.b : l.a;
      best[static_cast<size_t>(i)] = std::max(best[static_cast<size_t>(i)], l.gbs);
      std::string& p = parts[static_cast<size_t>(i)];
      p += (p.empty() ? "" : ", ") + std::string("to ") + m.nodes[static_cast<size_t>(other)].name + " " + fixed(l.gbs, 2);
    }
  std::vector<double> node_figures;
  for (double b : best)
    if (b >= 0) node_figures.push_back(b);
  const Reference p2p_ref = reference(e.p2p_gbs, node_figures, 3, 2, e);
  for (int i = 0; i < n; ++i) {
    Check c{"p2p", "", Status::info, ""};
    const double b = best[static_cast<size_t>(i)];
    if (b < 0) {
      c.status = Status::skipped;
      c.verdict = "skipped: one node, no link to measure";
      r.nodes[static_cast<size_t>(i)].checks.push_back(c);
      continue;
    }
    c.figure = fixed(b, 2) + " GB/s (" + parts[static_cast<size_t>(i)] + ")";
    verdict(c, b, p2p_ref, e, "no reference (two nodes, one link; from 3 nodes the median, or set site.preflight_p2p_gbs)");
    r.nodes[static_cast<size_t>(i)].checks.push_back(c);
  }

  // All-reduce over one rank per node: the allocation's, never one node's.
  Check ar{"all-reduce", "", Status::info, ""};
  if (m.allreduce_gbs < 0) {
    ar.status = Status::skipped;
    ar.verdict = "skipped: one node";
  } else {
    ar.figure = fixed(m.allreduce_gbs, 2) + " GB/s bus (" + std::to_string(n) + " nodes)";
    const Reference ref = reference(e.allreduce_gbs, {}, 1, 2, e);
    verdict(ar, m.allreduce_gbs, ref, e, "no reference (one figure per allocation; set site.preflight_allreduce_gbs)");
    if (ar.status == Status::fail) r.allocation_failed = true;
  }
  r.allocation.push_back(ar);

  for (const auto& node : r.nodes)
    for (const auto& c : node.checks)
      if (c.status == Status::fail) {
        r.failing.push_back(node.name);
        break;
      }
  return r;
}

std::string render(const Report& r) {
  struct Row {
    std::string node, check, figure, verdict;
  };
  std::vector<Row> rows{{"node", "check", "figure", "verdict"}};
  for (const auto& node : r.nodes)
    for (const auto& c : node.checks) rows.push_back({node.name, c.name, c.figure.empty() ? "-" : c.figure, cell(c)});
  for (const auto& c : r.allocation) rows.push_back({"(all)", c.name, c.figure.empty() ? "-" : c.figure, cell(c)});
  size_t w0 = 0, w1 = 0, w2 = 0;
  for (const auto& row : rows) {
    w0 = std::max(w0, row.node.size());
    w1 = std::max(w1, row.check.size());
    w2 = std::max(w2, row.figure.size());
  }
  w2 = std::min<size_t>(w2, 60);  // long figures push only their own row's verdict
  std::string out;
  for (const auto& row : rows) {
    std::string line = row.node + std::string(w0 + 2 - row.node.size(), ' ') + row.check +
                       std::string(w1 + 2 - row.check.size(), ' ') + row.figure;
    line += std::string(row.figure.size() < w2 + 2 ? w2 + 2 - row.figure.size() : 2, ' ') + row.verdict;
    out += line + "\n";
  }
  if (!r.failing.empty()) {
    out += "failing nodes: " + compress_hostlist(r.failing) + "\n";
  } else if (r.allocation_failed) {
    out += "failing nodes: none attributable; the all-reduce over all " + std::to_string(r.nodes.size()) +
           " nodes is below the site's figure\n";
  } else {
    out += "all " + std::to_string(r.nodes.size()) + (r.nodes.size() == 1 ? " node passed\n" : " nodes passed\n");
  }
  return out;
}

int exit_status(const Report& r) { return r.failing.empty() && !r.allocation_failed ? 0 : 1; }

}  // namespace meshrun::preflight
