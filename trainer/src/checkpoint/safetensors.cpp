#include "meshrun/train/checkpoint/safetensors.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>

#include "meshrun/bounded_file.hpp"
#include "json_read.hpp"
#include "meshrun/json.hpp"

namespace meshrun::train {

std::string shape_text(const std::vector<std::int64_t>& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

namespace {

std::size_t dtype_bytes(const std::string& dtype) {  // 0: not a safetensors dtype
  if (dtype == "F64" || dtype == "I64" || dtype == "U64") return 8;
  if (dtype == "F32" || dtype == "I32" || dtype == "U32") return 4;
  if (dtype == "F16" || dtype == "BF16" || dtype == "I16" || dtype == "U16") return 2;
  if (dtype == "I8" || dtype == "U8" || dtype == "BOOL" || dtype == "F8_E4M3" || dtype == "F8_E5M2") return 1;
  return 0;
}

}  // namespace

SafetensorsHeader parse_safetensors_header(std::string_view text, std::uint64_t payload_bytes, const std::string& file) {
  const nlohmann::json root = parse_json_bounded<SafetensorsError>(text, file + ": safetensors header");
  if (!root.is_object()) throw SafetensorsError(file + ": safetensors header is not a JSON object");
  SafetensorsHeader h;
  std::vector<std::pair<std::uint64_t, std::uint64_t>> spans;  // [begin, end) of every tensor
  for (const auto& [name, v] : root.items()) {
    const std::string where = file + ": tensor " + name + ": ";
    if (name == "__metadata__") {
      if (!v.is_object()) throw SafetensorsError(file + ": __metadata__ is not a JSON object");
      for (const auto& [k, mv] : v.items()) {
        if (!mv.is_string()) throw SafetensorsError(file + ": __metadata__." + k + " is " + json_snippet(mv) + ", not a string");
        h.metadata[k] = mv.get<std::string>();
      }
      continue;
    }
    if (!v.is_object() || !v.contains("dtype") || !v.contains("shape") || !v.contains("data_offsets"))
      throw SafetensorsError(where + "header entry lacks dtype, shape or data_offsets");
    TensorEntry e;
    const nlohmann::json &dt = v.at("dtype"), &shape = v.at("shape"), &off = v.at("data_offsets");
    if (!dt.is_string()) throw SafetensorsError(where + "dtype is " + json_snippet(dt) + ", not a string");
    e.dtype = dt.get<std::string>();
    const std::size_t es = dtype_bytes(e.dtype);
    if (es == 0) throw SafetensorsError(where + "unknown dtype \"" + e.dtype + "\"; a safetensors dtype is F64, F32, F16, BF16, F8_E4M3, F8_E5M2, I64..I8, U64..U8 or BOOL");
    if (!shape.is_array()) throw SafetensorsError(where + "shape is " + json_snippet(shape) + ", not an array");
    std::uint64_t bytes = es;  // numel · element size, overflow-checked
    for (const nlohmann::json& d : shape) {
      const auto n = json_int(d);
      if (!n) throw SafetensorsError(where + "shape entry " + json_snippet(d) + " is not a non-negative integer");
      e.shape.push_back(*n);
      if (__builtin_mul_overflow(bytes, static_cast<std::uint64_t>(*n), &bytes))
        throw SafetensorsError(where + "shape " + shape_text(e.shape) + "... holds more than 2^64 bytes");
    }
    if (!off.is_array() || off.size() != 2 || !json_int(off[0]) || !json_int(off[1]))
      throw SafetensorsError(where + "data_offsets is " + json_snippet(off) + ", not [begin, end] of non-negative integers");
    e.begin = static_cast<std::uint64_t>(*json_int(off[0]));
    e.end = static_cast<std::uint64_t>(*json_int(off[1]));
    if (e.end < e.begin) throw SafetensorsError(where + "data_offsets [" + std::to_string(e.begin) + ", " + std::to_string(e.end) + "] end before they begin");
    if (e.end > payload_bytes)
      throw SafetensorsError(where + "payload truncated: bytes [" + std::to_string(e.begin) + ", " + std::to_string(e.end) +
                             ") but the file holds " + std::to_string(payload_bytes) +
                             " payload bytes; re-save or re-download the file");
    if (bytes != e.end - e.begin)
      throw SafetensorsError(where + std::to_string(e.end - e.begin) + " bytes do not hold " + e.dtype + " " + shape_text(e.shape) +
                             " (" + std::to_string(bytes) + " bytes)");
    spans.emplace_back(e.begin, e.end);
    h.tensors[name] = std::move(e);
  }
  // The format indexes the payload entirely and without overlap: sorted spans must tile [0, payload_bytes).
  std::sort(spans.begin(), spans.end());
  std::uint64_t at = 0;
  for (const auto& [b, e] : spans) {
    if (b != at)
      throw SafetensorsError(file + ": tensor data " + (b < at ? "overlaps" : "leaves a hole") + " at payload byte " +
                             std::to_string(std::min(b, at)) + "; the file is damaged: re-save or re-download it");
    at = e;
  }
  if (at != payload_bytes)
    throw SafetensorsError(file + ": " + std::to_string(payload_bytes - at) + " payload bytes after the last tensor belong to none; the file is damaged: re-save or re-download it");
  return h;
}

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path) {
  // A FIFO or a device (/dev/zero) would hang or grow without bound: regular files only.
  if (std::string why; !check_regular_file(path, "safetensors file", &why)) throw SafetensorsError(why + " (checkpoint.load)");
  std::ifstream is(path, std::ios::binary);
  if (!is) throw SafetensorsError("cannot open safetensors file " + path + "; check checkpoint.load");
  bytes_.assign(std::istreambuf_iterator<char>(is), std::istreambuf_iterator<char>());
  parse();
}

SafetensorsFile::SafetensorsFile(std::string bytes, const std::string& name) : path_(name), bytes_(std::move(bytes)) { parse(); }

void SafetensorsFile::parse() {
  if (bytes_.size() < 8) throw SafetensorsError(path_ + ": truncated: shorter than the 8-byte header length");
  std::uint64_t n = 0;
  for (int b = 7; b >= 0; --b) n = (n << 8) | static_cast<unsigned char>(bytes_[b]);
  if (n > bytes_.size() - 8)
    throw SafetensorsError(path_ + ": truncated: header of " + std::to_string(n) + " bytes runs past the end of the file");
  payload_ = 8 + static_cast<std::size_t>(n);
  SafetensorsHeader h = parse_safetensors_header(std::string_view(bytes_).substr(8, payload_ - 8), bytes_.size() - payload_, path_);
  tensors_ = std::move(h.tensors);
  metadata_ = std::move(h.metadata);
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
