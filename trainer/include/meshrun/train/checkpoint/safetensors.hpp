// Safetensors files (huggingface/safetensors format): an 8-byte little-endian header length, a JSON
// header {"name": {"dtype", "shape", "data_offsets": [begin, end)}, "__metadata__": {...}}, then the
// payload. Written with F32/F64; read with F32, F64 or BF16 (released checkpoints), converted to T.
#pragma once
#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "meshrun/bounded_file.hpp"

namespace meshrun::train {

// Its message echoes names and values from the file: printable and cut where it is built (cut_long_values).
struct SafetensorsError : std::runtime_error {
  explicit SafetensorsError(const std::string& message) : std::runtime_error(cut_long_values(message)) {}
};

struct TensorEntry {
  std::string dtype;  // "F32", "F64", "BF16", ...
  std::vector<std::int64_t> shape;
  std::uint64_t begin = 0, end = 0;  // byte offsets into the payload
};

struct SafetensorsHeader {
  std::map<std::string, TensorEntry> tensors;
  std::map<std::string, std::string> metadata;
};
// Parses and checks the JSON header of a file whose payload has `payload_bytes` bytes: nesting at most
// kMaxJsonDepth (json_read.hpp), a known dtype, shape entries and offsets non-negative integers, the
// byte size (overflow-checked) equal to the offsets' span, and the spans tiling the payload without
// overlap or hole. Anything else is a SafetensorsError naming `file` (and the tensor); nothing else
// escapes. For fuzzing and for the checkpoint shard reader.
SafetensorsHeader parse_safetensors_header(std::string_view header, std::uint64_t payload_bytes, const std::string& file);

class SafetensorsFile {
 public:
  // Reads and checks the whole file (parse_safetensors_header; a truncated payload names the tensor).
  // Only SafetensorsError escapes.
  explicit SafetensorsFile(const std::string& path);
  // The same over the bytes of a file; `name` stands for the path in messages.
  SafetensorsFile(std::string bytes, const std::string& name);
  const TensorEntry* find(const std::string& name) const;
  std::vector<std::string> names() const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // Tensor `name` as T; a missing tensor, a different shape or an unsupported dtype is a
  // SafetensorsError naming the tensor.
  template <class T>
  std::vector<T> read(const std::string& name, const std::vector<std::int64_t>& expected_shape) const;

 private:
  void parse();
  std::string path_;
  std::string bytes_;
  std::size_t payload_ = 0;  // offset of the payload in bytes_
  std::map<std::string, TensorEntry> tensors_;
  std::map<std::string, std::string> metadata_;
};

struct TensorToWrite {
  std::string name;
  std::string dtype;  // "F32" or "F64"
  std::vector<std::int64_t> shape;
  const void* data;
  std::size_t bytes;
};
// Writes atomically (temporary file, then rename).
void write_safetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                       const std::map<std::string, std::string>& metadata);

std::string shape_text(const std::vector<std::int64_t>& shape);  // "[64, 256]"

}  // namespace meshrun::train
