#include "meshrun/train/safetensors.hpp"

#include <unistd.h>

#include <cctype>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>

#include "meshrun/bounded_file.hpp"
#include "meshrun/json.hpp"

namespace meshrun::train {

std::string shape_text(const std::vector<std::int64_t>& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

namespace {

// Just enough JSON for a safetensors header: objects, arrays, strings, integers, literals.
struct JsonValue {
  enum Kind { object, array, string, number, literal } kind = literal;
  std::string text;  // string contents or number/literal spelling
  std::vector<std::pair<std::string, JsonValue>> members;
  std::vector<JsonValue> items;
  JsonValue();
};
JsonValue::JsonValue() = default;

class JsonParser {
 public:
  JsonParser(const std::string& s, const std::string& file) : s_(s), file_(file) {}
  JsonValue parse() {
    JsonValue v = value();
    skip();
    if (i_ != s_.size()) fail("trailing characters after the header object");
    return v;
  }

 private:
  [[noreturn]] void fail(const std::string& what) {
    throw SafetensorsError(file_ + ": malformed safetensors header at byte " + std::to_string(i_) + ": " + what);
  }
  void skip() { while (i_ < s_.size() && std::strchr(" \t\r\n", s_[i_]) && s_[i_]) ++i_; }
  char peek() { skip(); if (i_ >= s_.size()) fail("unexpected end"); return s_[i_]; }
  void expect(char c) { if (peek() != c) fail(std::string("expected '") + c + "'"); ++i_; }
  std::string str() {
    expect('"');
    std::string out;
    while (i_ < s_.size() && s_[i_] != '"') {
      char c = s_[i_++];
      if (c == '\\') {
        if (i_ >= s_.size()) fail("bad escape");
        char e = s_[i_++];
        if (e == 'u') {  // keep \uXXXX escapes verbatim (names are ASCII in practice)
          out += "\\u";
          continue;
        }
        c = e == 'n' ? '\n' : e == 't' ? '\t' : e == 'r' ? '\r' : e == 'b' ? '\b' : e == 'f' ? '\f' : e;
      }
      out += c;
    }
    if (i_ >= s_.size()) fail("unterminated string");
    ++i_;
    return out;
  }
  JsonValue value() {
    JsonValue v;
    const char c = peek();
    if (c == '{') {
      v.kind = JsonValue::object;
      ++i_;
      if (peek() == '}') { ++i_; return v; }
      for (;;) {
        std::string k = str();
        expect(':');
        v.members.emplace_back(std::move(k), value());
        if (peek() == ',') { ++i_; continue; }
        expect('}');
        return v;
      }
    }
    if (c == '[') {
      v.kind = JsonValue::array;
      ++i_;
      if (peek() == ']') { ++i_; return v; }
      for (;;) {
        v.items.push_back(value());
        if (peek() == ',') { ++i_; continue; }
        expect(']');
        return v;
      }
    }
    if (c == '"') {
      v.kind = JsonValue::string;
      v.text = str();
      return v;
    }
    const std::size_t start = i_;
    while (i_ < s_.size() && (std::isalnum(static_cast<unsigned char>(s_[i_])) || std::strchr("+-.", s_[i_]))) ++i_;
    if (start == i_) fail("unexpected character");
    v.text = s_.substr(start, i_ - start);
    v.kind = (std::isdigit(static_cast<unsigned char>(v.text[0])) || v.text[0] == '-') ? JsonValue::number
                                                                                       : JsonValue::literal;
    return v;
  }
  const std::string& s_;
  const std::string& file_;
  std::size_t i_ = 0;
};

std::int64_t as_int(const JsonValue& v, const std::string& file, const std::string& tensor) {
  if (v.kind != JsonValue::number || v.text.find_first_of(".eE") != std::string::npos)
    throw SafetensorsError(file + ": tensor " + tensor + ": expected an integer, got '" + v.text + "'");
  return std::stoll(v.text);
}

std::size_t dtype_bytes(const std::string& dtype) {
  if (dtype == "F64" || dtype == "I64" || dtype == "U64") return 8;
  if (dtype == "F32" || dtype == "I32" || dtype == "U32") return 4;
  if (dtype == "F16" || dtype == "BF16" || dtype == "I16" || dtype == "U16") return 2;
  if (dtype == "I8" || dtype == "U8" || dtype == "BOOL") return 1;
  return 0;
}

}  // namespace

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path) {
  // A FIFO or a device (/dev/zero) would hang or grow without bound: regular files only.
  if (std::string why; !check_regular_file(path, "safetensors file", &why)) throw SafetensorsError(why + " (checkpoint.load)");
  std::ifstream is(path, std::ios::binary);
  if (!is) throw SafetensorsError("cannot open safetensors file " + path + "; check checkpoint.load");
  bytes_.assign(std::istreambuf_iterator<char>(is), std::istreambuf_iterator<char>());
  if (bytes_.size() < 8) throw SafetensorsError(path + ": truncated: shorter than the 8-byte header length");
  std::uint64_t n = 0;
  for (int b = 7; b >= 0; --b) n = (n << 8) | static_cast<unsigned char>(bytes_[b]);
  if (n > bytes_.size() - 8)
    throw SafetensorsError(path + ": truncated: header of " + std::to_string(n) + " bytes runs past the end of the file");
  payload_ = 8 + static_cast<std::size_t>(n);
  const std::string header = bytes_.substr(8, static_cast<std::size_t>(n));
  const JsonValue root = JsonParser(header, path).parse();
  if (root.kind != JsonValue::object) throw SafetensorsError(path + ": header is not a JSON object");
  const std::uint64_t data_size = bytes_.size() - payload_;
  for (const auto& [name, v] : root.members) {
    if (name == "__metadata__") {
      for (const auto& [k, mv] : v.members) metadata_[k] = mv.text;
      continue;
    }
    TensorEntry e;
    bool have_offsets = false;
    for (const auto& [k, f] : v.members) {
      if (k == "dtype") e.dtype = f.text;
      if (k == "shape")
        for (const JsonValue& d : f.items) e.shape.push_back(as_int(d, path, name));
      if (k == "data_offsets" && f.items.size() == 2) {
        e.begin = static_cast<std::uint64_t>(as_int(f.items[0], path, name));
        e.end = static_cast<std::uint64_t>(as_int(f.items[1], path, name));
        have_offsets = true;
      }
    }
    if (!have_offsets || e.dtype.empty())
      throw SafetensorsError(path + ": tensor " + name + ": header entry lacks dtype or data_offsets");
    if (e.end < e.begin || e.end > data_size)
      throw SafetensorsError(path + ": tensor " + name + ": payload truncated: bytes [" + std::to_string(e.begin) +
                             ", " + std::to_string(e.end) + ") but the file holds " + std::to_string(data_size) +
                             " payload bytes; re-save or re-download the file");
    std::int64_t numel = 1;
    for (std::int64_t d : e.shape) numel *= d;
    const std::size_t es = dtype_bytes(e.dtype);
    if (es != 0 && static_cast<std::uint64_t>(numel) * es != e.end - e.begin)
      throw SafetensorsError(path + ": tensor " + name + ": " + std::to_string(e.end - e.begin) + " bytes do not hold " +
                             e.dtype + " " + shape_text(e.shape));
    tensors_[name] = std::move(e);
  }
}

const TensorEntry* SafetensorsFile::find(const std::string& name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

std::vector<std::string> SafetensorsFile::names() const {
  std::vector<std::string> out;
  for (const auto& [k, v] : tensors_) out.push_back(k);
  return out;
}

template <class T>
std::vector<T> SafetensorsFile::read(const std::string& name, const std::vector<std::int64_t>& expected) const {
  const TensorEntry* e = find(name);
  if (!e) throw SafetensorsError(path_ + ": tensor " + name + " is missing; the file does not match the model config");
  if (e->shape != expected)
    throw SafetensorsError(path_ + ": tensor " + name + " has shape " + shape_text(e->shape) + ", the model expects " +
                           shape_text(expected) + "; check the [model] sizes");
  std::int64_t numel = 1;
  for (std::int64_t d : expected) numel *= d;
  std::vector<T> out(static_cast<std::size_t>(numel));
  const char* p = bytes_.data() + payload_ + e->begin;
  if (e->dtype == "F32") {
    for (std::int64_t i = 0; i < numel; ++i) { float f; std::memcpy(&f, p + 4 * i, 4); out[i] = static_cast<T>(f); }
  } else if (e->dtype == "F64") {
    for (std::int64_t i = 0; i < numel; ++i) { double f; std::memcpy(&f, p + 8 * i, 8); out[i] = static_cast<T>(f); }
  } else if (e->dtype == "BF16") {
    for (std::int64_t i = 0; i < numel; ++i) {
      std::uint16_t b; std::memcpy(&b, p + 2 * i, 2);
      const std::uint32_t bits = std::uint32_t(b) << 16;
      float f; std::memcpy(&f, &bits, 4);
      out[i] = static_cast<T>(f);
    }
  } else {
    throw SafetensorsError(path_ + ": tensor " + name + " has dtype " + e->dtype + "; only F32, F64 and BF16 load");
  }
  return out;
}
template std::vector<float> SafetensorsFile::read<float>(const std::string&, const std::vector<std::int64_t>&) const;
template std::vector<double> SafetensorsFile::read<double>(const std::string&, const std::vector<std::int64_t>&) const;

void write_safetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  std::string header;
  {
    JsonWriter w(header);
    w.begin_object();
    if (!metadata.empty()) {
      w.key("__metadata__").begin_object();
      for (const auto& [k, v] : metadata) w.field(k, v);
      w.end_object();
    }
    std::uint64_t off = 0;
    for (const TensorToWrite& t : tensors) {
      w.key(t.name).begin_object();
      w.field("dtype", t.dtype);
      w.key("shape").begin_array();
      for (std::int64_t d : t.shape) w.value(d);
      w.end_array();
      w.key("data_offsets").begin_array().value(off).value(off + t.bytes).end_array();
      w.end_object();
      off += t.bytes;
    }
    w.end_object();
  }
  while (header.size() % 8 != 0) header += ' ';  // payload 8-byte aligned, as the reference writer does
  const std::string tmp = path + ".tmp" + std::to_string(::getpid());
  {
    std::ofstream os(tmp, std::ios::binary | std::ios::trunc);
    if (!os) throw SafetensorsError("cannot write " + path + "; check that its directory exists");
    const std::uint64_t n = header.size();
    char len[8];
    for (int b = 0; b < 8; ++b) len[b] = static_cast<char>((n >> (8 * b)) & 0xff);
    os.write(len, 8);
    os.write(header.data(), static_cast<std::streamsize>(header.size()));
    for (const TensorToWrite& t : tensors) os.write(static_cast<const char*>(t.data), static_cast<std::streamsize>(t.bytes));
    if (!os) throw SafetensorsError("writing " + path + " failed (disk full?)");
  }
  std::filesystem::rename(tmp, path);
}

}  // namespace meshrun::train
