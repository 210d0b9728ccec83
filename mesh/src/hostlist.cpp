#include "meshrun/hostlist.hpp"

#include <charconv>

namespace meshrun {
namespace {

constexpr size_t kMaxHosts = 1u << 22;  // a typo like node[1-99999999] must not eat the machine

// Expands one bracket body "001-003,7" into zero-padded strings.
bool expand_range(std::string_view body, std::vector<std::string>& out, std::string* error) {
  size_t start = 0;
  while (start <= body.size()) {
    size_t comma = body.find(',', start);
    std::string_view item = body.substr(start, comma == std::string_view::npos ? std::string_view::npos : comma - start);
    if (item.empty()) {
      *error = "empty range in '[" + std::string(body) + "]'; write e.g. node[001-004,007]";
      return false;
    }
    size_t dash = item.find('-');
    std::string_view lo = item.substr(0, dash);
    std::string_view hi = dash == std::string_view::npos ? lo : item.substr(dash + 1);
    unsigned long a = 0, b = 0;
    auto r1 = std::from_chars(lo.data(), lo.data() + lo.size(), a);
    auto r2 = std::from_chars(hi.data(), hi.data() + hi.size(), b);
    if (lo.empty() || hi.empty() || r1.ec != std::errc() || r1.ptr != lo.data() + lo.size() || r2.ec != std::errc() ||
        r2.ptr != hi.data() + hi.size()) {
      *error = "bad range '" + std::string(item) + "' in hostlist; ranges are numbers like 001-128";
      return false;
    }
    if (b < a) {
      *error = "range '" + std::string(item) + "' runs backwards; write the lower bound first";
      return false;
    }
    if (b - a + 1 > kMaxHosts) {
      *error = "range '" + std::string(item) + "' expands to more than 4194304 hosts; check the bounds";
      return false;
    }
    size_t width = lo.size();
    for (unsigned long v = a; v <= b; ++v) {
      std::string num = std::to_string(v);
      if (num.size() < width) num.insert(0, width - num.size(), '0');
      out.push_back(std::move(num));
    }
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  return true;
}

// Expands one host expression without top-level commas: "rack[1-2]-n[01-02]".
bool expand_one(std::string_view expr, std::vector<std::string>& out, std::string* error) {
  std::vector<std::string> partial{""};
  size_t i = 0;
  while (i < expr.size()) {
    if (expr[i] == '[') {
      size_t close = expr.find(']', i);
      if (close == std::string_view::npos) {
        *error = "unclosed '[' in hostlist '" + std::string(expr) + "'; close it like node[001-004]";
        return false;
      }
      std::vector<std::string> nums;
      if (!expand_range(expr.substr(i + 1, close - i - 1), nums, error)) return false;
      if (partial.size() * nums.size() > kMaxHosts) {
        *error = "hostlist '" + std::string(expr) + "' expands to too many hosts; check the ranges";
        return false;
      }
      std::vector<std::string> next;
      next.reserve(partial.size() * nums.size());
      for (const auto& p : partial)
        for (const auto& n : nums) next.push_back(p + n);
      partial = std::move(next);
      i = close + 1;
    } else if (expr[i] == ']') {
      *error = "unexpected ']' in hostlist '" + std::string(expr) + "'";
      return false;
    } else {
      size_t j = expr.find_first_of("[]", i);
      std::string_view lit = expr.substr(i, j == std::string_view::npos ? std::string_view::npos : j - i);
      for (auto& p : partial) p += lit;
      i = j == std::string_view::npos ? expr.size() : j;
    }
  }
  for (auto& p : partial) out.push_back(std::move(p));
  return true;
}

}  // namespace

std::optional<std::vector<std::string>> expand_hostlist(std::string_view expr, std::string* error) {
  std::vector<std::string> hosts;
  int depth = 0;
  size_t start = 0;
  for (size_t i = 0; i <= expr.size(); ++i) {
    char c = i < expr.size() ? expr[i] : ',';
    if (c == '[') ++depth;
    if (c == ']') --depth;
    if ((c == ',' || c == ' ') && depth == 0) {
      std::string_view item = expr.substr(start, i - start);
      if (!item.empty() && !expand_one(item, hosts, error)) return std::nullopt;
      start = i + 1;
    }
  }
  if (depth != 0) {
    *error = depth > 0 ? "unclosed '[' in hostlist '" + std::string(expr) + "'; close it like node[001-004]"
                       : "unbalanced ']' in hostlist '" + std::string(expr) + "'";
    return std::nullopt;
  }
  if (hosts.empty()) {
    *error = "hostlist '" + std::string(expr) + "' names no hosts";
    return std::nullopt;
  }
  return hosts;
}

}  // namespace meshrun
