#include "meshrun/hostlist.hpp"

#include <algorithm>
#include <charconv>
#include <tuple>

#include "meshrun/limits.hpp"

namespace meshrun {
namespace {

constexpr int64_t kSaturated = INT64_MAX;

int64_t add(int64_t a, int64_t b) {
  int64_t r;
  return __builtin_add_overflow(a, b, &r) ? kSaturated : r;
}
int64_t mul(int64_t a, int64_t b) {
  int64_t r;
  return __builtin_mul_overflow(a, b, &r) ? kSaturated : r;
}
// Numbers in lo..hi, saturated.
int64_t span(unsigned long lo, unsigned long hi) {
  return hi - lo >= static_cast<unsigned long>(kSaturated) ? kSaturated : static_cast<int64_t>(hi - lo) + 1;
}
int digits(unsigned long v) {
  int d = 1;
  for (; v >= 10; v /= 10) ++d;
  return d;
}

struct Range {
  unsigned long lo = 0, hi = 0;
  int64_t width = 0;  // the lower bound's width: Slurm's zero padding
};
// A literal, or (ranges non-empty) one bracket group.
struct Part {
  std::string_view literal;
  std::vector<Range> ranges;
};
using Item = std::vector<Part>;  // one host expression without top-level commas: "rack[1-2]-n[01-02]"

// Characters of the numbers lo..hi, each padded to width, one step per decade (not per number).
int64_t range_bytes(const Range& r) {
  int64_t total = 0;
  for (unsigned long v = r.lo;;) {
    const int d = digits(v);
    unsigned long end = r.hi;
    if (d < 20) {
      unsigned long top = 1;
      for (int i = 0; i < d; ++i) top *= 10;
      end = std::min(end, top - 1);
    }
    total = add(total, mul(span(v, end), std::max<int64_t>(d, r.width)));
    if (end == r.hi) return total;
    v = end + 1;
  }
}

// Parses one bracket body "001-003,7".
bool parse_ranges(std::string_view body, std::vector<Range>& out, std::string* error) {
  size_t start = 0;
  while (true) {
    size_t comma = body.find(',', start);
    std::string_view item = body.substr(start, comma == std::string_view::npos ? std::string_view::npos : comma - start);
    if (item.empty()) {
      *error = "empty range in '[" + std::string(body) + "]'; write e.g. node[001-004,007]";
      return false;
    }
    size_t dash = item.find('-');
    std::string_view lo = item.substr(0, dash);
    std::string_view hi = dash == std::string_view::npos ? lo : item.substr(dash + 1);
    Range r;
    auto r1 = std::from_chars(lo.data(), lo.data() + lo.size(), r.lo);
    auto r2 = std::from_chars(hi.data(), hi.data() + hi.size(), r.hi);
    if (lo.empty() || hi.empty() || r1.ec != std::errc() || r1.ptr != lo.data() + lo.size() || r2.ec != std::errc() ||
        r2.ptr != hi.data() + hi.size()) {
      *error = "bad range '" + std::string(item) + "' in hostlist; ranges are numbers like 001-128";
      return false;
    }
    if (r.hi < r.lo) {
      *error = "range '" + std::string(item) + "' runs backwards; write the lower bound first";
      return false;
    }
    r.width = static_cast<int64_t>(lo.size());
    out.push_back(r);
    if (comma == std::string_view::npos) return true;
    start = comma + 1;
  }
}

bool parse_item(std::string_view expr, Item& out, std::string* error) {
  size_t i = 0;
  while (i < expr.size()) {
    if (expr[i] == '[') {
      size_t close = expr.find(']', i);
      if (close == std::string_view::npos) {
        *error = "unclosed '[' in hostlist '" + std::string(expr) + "'; close it like node[001-004]";
        return false;
      }
      Part p;
      if (!parse_ranges(expr.substr(i + 1, close - i - 1), p.ranges, error)) return false;
      out.push_back(std::move(p));
      i = close + 1;
    } else if (expr[i] == ']') {
      *error = "unexpected ']' in hostlist '" + std::string(expr) + "'";
      return false;
    } else {
      size_t j = std::min(expr.find_first_of("[]", i), expr.size());
      out.push_back(Part{expr.substr(i, j - i), {}});
      i = j;
    }
  }
  return true;
}

// Splits at top-level ',' and ' ' and parses every item.
std::optional<std::vector<Item>> parse(std::string_view expr, std::string* error) {
  std::vector<Item> items;
  int depth = 0;
  size_t start = 0;
  for (size_t i = 0; i <= expr.size(); ++i) {
    char c = i < expr.size() ? expr[i] : ',';
    if (c == '[') ++depth;
    if (c == ']') --depth;
    if ((c == ',' || c == ' ') && depth == 0) {
      std::string_view text = expr.substr(start, i - start);
      if (!text.empty()) {
        Item item;
        if (!parse_item(text, item, error)) return std::nullopt;
        items.push_back(std::move(item));
      }
      start = i + 1;
    }
  }
  if (depth != 0) {
    *error = depth > 0 ? "unclosed '[' in hostlist '" + std::string(expr) + "'; close it like node[001-004]"
                       : "unbalanced ']' in hostlist '" + std::string(expr) + "'";
    return std::nullopt;
  }
  if (items.empty()) {
    *error = "hostlist '" + std::string(expr) + "' names no hosts";
    return std::nullopt;
  }
  return items;
}

// An item with hosts N, literal characters L and bracket groups j of n_j numbers with D_j characters:
// N = Π n_j; every host carries the literals, and each number of group j appears in N / n_j hosts.
HostlistSize item_size(const Item& item) {
  int64_t hosts = 1, literal = 0;
  for (const Part& p : item) {
    if (p.ranges.empty()) literal += static_cast<int64_t>(p.literal.size());
    int64_t n = 0;
    for (const Range& r : p.ranges) n = add(n, span(r.lo, r.hi));
    if (!p.ranges.empty()) hosts = mul(hosts, n);
  }
  if (hosts == kSaturated) return {kSaturated, kSaturated};
  int64_t bytes = mul(hosts, literal);
  for (const Part& p : item) {
    if (p.ranges.empty()) continue;
    int64_t n = 0, d = 0;
    for (const Range& r : p.ranges) n = add(n, span(r.lo, r.hi)), d = add(d, range_bytes(r));
    bytes = add(bytes, mul(hosts / n, d));
  }
  return {hosts, bytes};
}

HostlistSize total_size(const std::vector<Item>& items) {
  HostlistSize total;
  for (const Item& item : items) {
    HostlistSize s = item_size(item);
    total.hosts = add(total.hosts, s.hosts);
    total.bytes = add(total.bytes, s.bytes);
  }
  return total;
}

bool within_limits(const HostlistSize& s, std::string* error) {
  if (s.hosts > limits::kHosts) {
    *error = "expands to " + (s.hosts == kSaturated ? std::string("more than 2^63") : std::to_string(s.hosts)) +
             " hosts, more than the " + std::to_string(limits::kHosts) +
             " meshrun accepts (docs/mesh.md, Limits); check the ranges";
    return false;
  }
  if (s.bytes > limits::kHostlistBytes) {
    *error = "expands to " + std::to_string(s.bytes) + " bytes of host names, more than the " +
             std::to_string(limits::kHostlistBytes) + " meshrun accepts (docs/mesh.md, Limits); use shorter names";
    return false;
  }
  return true;
}

std::string number(unsigned long v, int64_t width) {
  std::string num = std::to_string(v);
  if (static_cast<int64_t>(num.size()) < width) num.insert(0, static_cast<size_t>(width) - num.size(), '0');
  return num;
}

}  // namespace

std::optional<HostlistSize> hostlist_size(std::string_view expr, std::string* error) {
  auto items = parse(expr, error);
  if (!items) return std::nullopt;
  return total_size(*items);
}

bool check_hostlist(std::string_view expr, std::string* error) {
  auto size = hostlist_size(expr, error);
  return size && within_limits(*size, error);
}

std::optional<std::vector<std::string>> expand_hostlist(std::string_view expr, std::string* error) {
  auto items = parse(expr, error);
  if (!items) return std::nullopt;
  HostlistSize size = total_size(*items);
  if (!within_limits(size, error)) return std::nullopt;
  std::vector<std::string> hosts;
  hosts.reserve(static_cast<size_t>(size.hosts));
  for (const Item& item : *items) {
    std::vector<std::string> partial{""};
    for (const Part& p : item) {
      if (p.ranges.empty()) {
        for (auto& h : partial) h += p.literal;
        continue;
      }
      std::vector<std::string> next;
      for (const auto& h : partial)
        for (const Range& r : p.ranges)
          for (unsigned long k = 0; k <= r.hi - r.lo; ++k) next.push_back(h + number(r.lo + k, r.width));
      partial = std::move(next);
    }
    for (auto& h : partial) hosts.push_back(std::move(h));
  }
  return hosts;
}

}  // namespace meshrun

namespace meshrun {

std::string compress_hostlist(const std::vector<std::string>& hosts) {
  struct Name {
    std::string prefix, digits;  // digits empty: listed as it is
    unsigned long value = 0;
  };
  std::vector<Name> names;
  names.reserve(hosts.size());
  for (const std::string& h : hosts) {
    size_t cut = h.size();
    while (cut > 0 && h[cut - 1] >= '0' && h[cut - 1] <= '9') --cut;
    Name n;
    n.prefix = h.substr(0, cut);
    n.digits = h.substr(cut);
    if (n.digits.size() > 18) {  // beyond unsigned long: keep the name whole
      n.prefix = h;
      n.digits.clear();
    }
    if (!n.digits.empty()) std::from_chars(n.digits.data(), n.digits.data() + n.digits.size(), n.value);
    names.push_back(std::move(n));
  }
  auto key = [](const Name& n) { return std::tuple(n.prefix, n.digits.empty(), n.value, n.digits.size()); };
  std::sort(names.begin(), names.end(), [&](const Name& a, const Name& b) { return key(a) < key(b); });
  names.erase(std::unique(names.begin(), names.end(),
                          [](const Name& a, const Name& b) { return a.prefix == b.prefix && a.digits == b.digits; }),
              names.end());
  std::string out;
  for (size_t i = 0; i < names.size();) {
    if (!out.empty()) out += ',';
    if (names[i].digits.empty()) {
      out += names[i++].prefix;
      continue;
    }
    size_t end = i;  // names[i, end) share the prefix and have digits
    while (end < names.size() && !names[end].digits.empty() && names[end].prefix == names[i].prefix) ++end;
    if (end - i == 1) {
      out += names[i].prefix + names[i].digits;
      i = end;
      continue;
    }
    out += names[i].prefix + '[';
    for (size_t r = i; r < end;) {
      const int64_t width = static_cast<int64_t>(names[r].digits.size());
      size_t last = r;
      while (last + 1 < end && names[last + 1].value == names[last].value + 1 &&
             names[last + 1].digits == number(names[last + 1].value, width))
        ++last;
      if (r != i) out += ',';
      out += names[r].digits;
      if (last > r) out += '-' + names[last].digits;
      r = last + 1;
    }
    out += ']';
    i = end;
  }
  return out;
}

std::optional<std::vector<TaskCountRun>> parse_task_counts(std::string_view spec) {
  auto number = [](std::string_view t, int lo, int* out) {
    auto r = std::from_chars(t.data(), t.data() + t.size(), *out);
    return !t.empty() && r.ec == std::errc() && r.ptr == t.data() + t.size() && *out >= lo;
  };
  if (spec.empty()) return std::nullopt;
  std::vector<TaskCountRun> runs;
  for (size_t pos = 0; pos <= spec.size();) {
    size_t end = spec.find(',', pos);
    if (end == std::string_view::npos) end = spec.size();
    const std::string_view item = spec.substr(pos, end - pos);
    const size_t paren = item.find("(x");
    TaskCountRun run;
    if (!number(item.substr(0, paren), 0, &run.count)) return std::nullopt;
    if (paren != std::string_view::npos &&
        (item.back() != ')' || !number(item.substr(paren + 2, item.size() - paren - 3), 1, &run.repeat)))
      return std::nullopt;
    if (runs.size() >= (1u << 20)) return std::nullopt;
    runs.push_back(run);
    if (end == spec.size()) break;
    pos = end + 1;
  }
  return runs;
}

int tasks_on_node(const std::vector<TaskCountRun>& runs, int node) {
  long long seen = 0;
  for (const TaskCountRun& r : runs) {
    if (node < seen + r.repeat) return r.count;
    seen += r.repeat;
  }
  return -1;
}

}  // namespace meshrun
