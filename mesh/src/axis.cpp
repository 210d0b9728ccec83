#include <algorithm>
#include <cctype>

#include "meshrun/bounded_file.hpp"
#include "meshrun/layout.hpp"

namespace meshrun {

const char* axis_name(Axis a) {
  switch (a) {
    case Axis::tp: return "tp";
    case Axis::cp: return "cp";
    case Axis::ep: return "ep";
    case Axis::dp: return "dp";
    case Axis::pp: return "pp";
  }
  return "?";
}

std::string AxisOrder::str() const {
  std::string s;
  for (Axis a : axes) {
    if (!s.empty()) s += '-';
    s += axis_name(a);
  }
  return s;
}

int AxisOrder::position(Axis a) const {
  for (int i = 0; i < kAxes; ++i)
    if (axes[i] == a) return i;
  return -1;
}

std::optional<AxisOrder> parse_order(std::string_view text, std::string* error) {
  std::vector<Axis> seen;
  std::string word;
  auto flush = [&]() -> bool {
    if (word.empty()) return true;
    static const std::pair<const char*, Axis> names[] = {
        {"tp", Axis::tp}, {"cp", Axis::cp}, {"ep", Axis::ep}, {"dp", Axis::dp}, {"pp", Axis::pp}};
    for (auto& [n, a] : names) {
      if (word == n) {
        if (std::find(seen.begin(), seen.end(), a) != seen.end()) {
          *error = "axis '" + cut_value(word) + "' appears twice in order '" + cut_value(std::string(text)) +
                   "'; name each of tp, cp, ep, dp, pp once, e.g. tp-cp-ep-dp-pp";
          return false;
        }
        seen.push_back(a);
        word.clear();
        return true;
      }
    }
    *error = "unknown axis '" + cut_value(word) + "' in order '" + cut_value(std::string(text)) +
             "'; axes are tp, cp, ep, dp, pp (leftmost varies fastest), e.g. tp-cp-ep-dp-pp";
    return false;
  };
  for (char c : text) {
    if (c == '-' || c == ',' || c == ' ' || c == '_') {
      if (!flush()) return std::nullopt;
    } else {
      word += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    }
  }
  if (!flush()) return std::nullopt;
  bool has_ep = std::find(seen.begin(), seen.end(), Axis::ep) != seen.end();
  if (!has_ep) {
    // Llama 3 writes [TP, CP, PP, DP]: fold ep in right after the first of cp and dp, where Megatron places it.
    auto cp = std::find(seen.begin(), seen.end(), Axis::cp);
    auto dp = std::find(seen.begin(), seen.end(), Axis::dp);
    if (cp != seen.end() && dp != seen.end()) seen.insert(std::min(cp, dp) + 1, Axis::ep);
  }
  if (seen.size() != kAxes) {
    // ep is optional (folded in above when cp and dp are both named), so a missing ep is never the problem:
    // name only the required axes that are absent.
    std::vector<Axis> absent;
    for (Axis a : {Axis::tp, Axis::cp, Axis::dp, Axis::pp})
      if (std::find(seen.begin(), seen.end(), a) == seen.end()) absent.push_back(a);
    std::string missing;
    for (std::size_t i = 0; i < absent.size(); ++i)
      missing += std::string(i == 0 ? "" : i + 1 == absent.size() ? " and " : ", ") + axis_name(absent[i]);
    *error = "order '" + cut_value(std::string(text)) + "' does not name " + missing +
             "; name each of tp, cp, dp and pp once (ep may be left out: it then follows the first of cp and dp), "
             "e.g. tp-cp-dp-pp or tp-cp-ep-dp-pp";
    return std::nullopt;
  }
  AxisOrder o;
  std::copy(seen.begin(), seen.end(), o.axes.begin());
  return o;
}

int Layout::size(Axis a) const {
  switch (a) {
    case Axis::tp: return tp;
    case Axis::cp: return cp;
    case Axis::ep: return ep;
    case Axis::dp: return dp;
    case Axis::pp: return pp;
  }
  return 1;
}

}  // namespace meshrun
