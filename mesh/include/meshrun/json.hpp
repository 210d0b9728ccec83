// A minimal streaming JSON writer into a std::string. Debian ships nlohmann-json (used where meshrun parses
// JSON); this stays for output because it writes as it goes: for a 131,072-GPU plan it is ~10x faster and
// uses under a third of the memory of building an nlohmann document and dumping it (docs/mesh.md, "JSON
// output"; bench/json_bench.sh).
// Commas are inserted automatically; the caller keeps begin/end balanced.
#pragma once
#include <charconv>
#include <cmath>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace meshrun {

class JsonWriter {
 public:
  explicit JsonWriter(std::string& out) : out_(out) {}

  JsonWriter& begin_object() { open('{'); return *this; }
  JsonWriter& end_object() { close('}'); return *this; }
  JsonWriter& begin_array() { open('['); return *this; }
  JsonWriter& end_array() { close(']'); return *this; }

  JsonWriter& key(std::string_view k) {
    comma();
    string_literal(k);
    out_ += ':';
    after_key_ = true;
    return *this;
  }
  JsonWriter& value(std::string_view s) { comma(); string_literal(s); return *this; }
  JsonWriter& value(const char* s) { return value(std::string_view(s)); }
  JsonWriter& value(const std::string& s) { return value(std::string_view(s)); }
  JsonWriter& value(bool b) { comma(); out_ += b ? "true" : "false"; return *this; }
  JsonWriter& value(int v) { return value(static_cast<int64_t>(v)); }
  JsonWriter& value(int64_t v) {
    comma();
    char buf[24];
    auto r = std::to_chars(buf, buf + sizeof buf, v);
    out_.append(buf, r.ptr);
    return *this;
  }
  JsonWriter& value(uint64_t v) {
    comma();
    char buf[24];
    auto r = std::to_chars(buf, buf + sizeof buf, v);
    out_.append(buf, r.ptr);
    return *this;
  }
  JsonWriter& value(double v) {
    comma();
    if (!std::isfinite(v)) { out_ += "null"; return *this; }
    char buf[32];
    auto r = std::to_chars(buf, buf + sizeof buf, v);  // shortest round-trip form
    out_.append(buf, r.ptr);
    return *this;
  }
  // A value already serialized as JSON (e.g. a section produced by another module).
  JsonWriter& raw(std::string_view json) { comma(); out_ += json; return *this; }
  JsonWriter& null() { comma(); out_ += "null"; return *this; }
  JsonWriter& int_array(const std::vector<int>& xs) {
    begin_array();
    for (int x : xs) value(x);
    return end_array();
  }
  template <class T>
  JsonWriter& field(std::string_view k, const T& v) { key(k); return value(v); }

  // Appends s as a quoted JSON string with escapes.
  void string_literal(std::string_view s) {
    out_ += '"';
    for (char ch : s) {
      auto c = static_cast<unsigned char>(ch);
      switch (c) {
        case '"': out_ += "\\\""; break;
        case '\\': out_ += "\\\\"; break;
        case '\n': out_ += "\\n"; break;
        case '\r': out_ += "\\r"; break;
        case '\t': out_ += "\\t"; break;
        default:
          if (c < 0x20) {
            static const char* hex = "0123456789abcdef";
            out_ += "\\u00";
            out_ += hex[c >> 4];
            out_ += hex[c & 15];
          } else {
            out_ += ch;
          }
      }
    }
    out_ += '"';
  }

 private:
  void comma() {
    if (after_key_) { after_key_ = false; return; }
    if (!first_.empty()) {
      if (!first_.back()) out_ += ',';
      first_.back() = false;
    }
  }
  void open(char c) { comma(); out_ += c; first_.push_back(true); }
  void close(char c) { out_ += c; first_.pop_back(); }

  std::string& out_;
  std::vector<bool> first_;
  bool after_key_ = false;
};

}  // namespace meshrun
