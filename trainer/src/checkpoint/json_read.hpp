// Reading JSON that a user points meshrun at (safetensors headers, checkpoint manifests) with nlohmann:
// nesting bounded and integers checked, so hostile input is one located error, never a deep recursion
// (dump() and the users of a parsed value recurse) or a silently wrapped or truncated number.
#pragma once
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace meshrun::train {

// Far more than either format needs (a safetensors header nests 3 deep, a manifest 5).
inline constexpr int kMaxJsonDepth = 32;

// Parses `text`; malformed JSON or nesting deeper than kMaxJsonDepth throws E(where + ": " + reason).
template <class E>
nlohmann::json parse_json_bounded(std::string_view text, const std::string& where) {
  using nlohmann::json;
  struct TooDeep {};
  const json::parser_callback_t bound = [](int depth, json::parse_event_t ev, json&) {
    if ((ev == json::parse_event_t::object_start || ev == json::parse_event_t::array_start) && depth >= kMaxJsonDepth)
      throw TooDeep{};  // stop at once: the rest of the input is never looked at
    return true;
  };
  try {
    return json::parse(text.begin(), text.end(), bound);
  } catch (const TooDeep&) {
    throw E(where + ": JSON nested deeper than " + std::to_string(kMaxJsonDepth) + " levels");
  } catch (const json::exception& e) {
    throw E(where + ": malformed JSON (" + e.what() + ")");
  }
}

// j as an integer in [lo, hi]; nothing for a float (1.0, 1e3), a string, a literal or a value out of range.
inline std::optional<std::int64_t> json_int(const nlohmann::json& j, std::int64_t lo = 0,
                                            std::int64_t hi = std::numeric_limits<std::int64_t>::max()) {
  std::int64_t v = 0;
  if (j.is_number_unsigned()) {
    const std::uint64_t u = j.get<std::uint64_t>();
    if (u > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) return std::nullopt;
    v = static_cast<std::int64_t>(u);
  } else if (j.is_number_integer()) {
    v = j.get<std::int64_t>();
  } else {
    return std::nullopt;
  }
  if (v < lo || v > hi) return std::nullopt;
  return v;
}

// A short rendering of a value for an error message (bounded: the value is never fully dumped).
inline std::string json_snippet(const nlohmann::json& j) {
  std::string s = j.is_structured() ? (j.is_object() ? "an object" : "an array") : j.dump();
  if (s.size() > 40) s = s.substr(0, 37) + "...";
  return s;
}

}  // namespace meshrun::train
