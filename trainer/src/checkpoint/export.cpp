// Rank-agnostic reading of a whole checkpoint (meshrun-ckpt and the tests): one tensor in its global
// shape, verification of every piece, and export to one safetensors file.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>

#include "file_io.hpp"
#include "manifest.hpp"
#include "meshrun/train/checkpoint/checkpoint.hpp"

namespace meshrun::train {

namespace fs = std::filesystem;
using nlohmann::json;
using namespace ckpt;


namespace {
// Tensor `name` (kind k) in its global shape from the shards of a parsed manifest into out (R × C elements,
// not initialized: every element is read, counted against the exact coverage read_manifest proved);
// readers and buffers are reused.
template <class T>
void global_tensor(const Manifest& m, const std::string& name, int k, std::map<std::string, std::unique_ptr<ShardReader>>& readers,
                   T* out, GrowBuffer<T>& staging) {
  auto it = m.shapes.find(name);
  if (it == m.shapes.end()) throw CheckpointError(m.file + ": no tensor " + name);
  const std::int64_t R = it->second.at(0), C = it->second.size() > 1 ? it->second[1] : 1;
  std::int64_t placed = 0;
  for (const ManifestFile& f : m.files)
    for (const ManifestPiece& p : f.pieces) {
      if (p.tensor != name || p.kind != k) continue;
      auto& reader = readers[f.name];
      if (!reader) reader = open_shard(m, f);
      placed += place_piece(*reader, p, m.dtype, 0, 0, R, C, out, staging);
    }
  if (placed != R * C)
    throw CheckpointError(m.file + ": tensor " + piece_key(name, k) + ": the shards hold " + std::to_string(placed) + " of " +
                          std::to_string(R * C) + " elements; the checkpoint is incomplete");
}

std::size_t numel_of(const Manifest& m, const std::string& name) {
  auto it = m.shapes.find(name);
  if (it == m.shapes.end()) throw CheckpointError(m.file + ": no tensor " + name);
  return static_cast<std::size_t>(it->second.at(0) * (it->second.size() > 1 ? it->second[1] : 1));
}

int kind_index(const std::string& kind) {
  const int k = kind == "param" ? 0 : kind == "exp_avg" ? 1 : kind == "exp_avg_sq" ? 2 : -1;
  if (k < 0) throw CheckpointError("kind must be param, exp_avg or exp_avg_sq, not \"" + kind + "\"");
  return k;
}
}  // namespace

template <class T>
std::vector<T> read_global_tensor(const std::string& path, const std::string& name, const std::string& kind) {
  const Manifest m = read_manifest(path);
  if (m.dtype != dtype_name<T>()) throw CheckpointError(m.file + ": holds " + m.dtype + " values");
  const int k = kind_index(kind);
  std::map<std::string, std::unique_ptr<ShardReader>> readers;
  GrowBuffer<T> staging;
  std::vector<T> out(numel_of(m, name));
  global_tensor<T>(m, name, k, readers, out.data(), staging);
  return out;
}

std::int64_t verify_checkpoint(const std::string& path) {
  const Manifest m = read_manifest(path);  // every structural check, exact coverage included
  std::int64_t n = 0;
  for (const ManifestFile& f : m.files) {
    const std::unique_ptr<ShardReader> reader = open_shard(m, f);
    for (const ManifestPiece& p : f.pieces) {
      reader->verify(p.key, m.dtype, p.b - p.a, p.hash);
      ++n;
    }
  }
  return n;
}

std::int64_t export_checkpoint(const std::string& path, const std::string& out) {
  const Manifest m = read_manifest(path);
  const std::size_t es = m.dtype == "F64" ? 8 : 4;
  json header = json::object();
  header["__metadata__"] = {{"format", "pt"}, {"producer", "meshrun-ckpt export"}, {"step", std::to_string(m.step)}};
  std::uint64_t off = 0;
  for (const std::string& name : m.order) {
    const auto& shape = m.shapes.at(name);
    const std::uint64_t bytes = static_cast<std::uint64_t>(shape.at(0) * (shape.size() > 1 ? shape[1] : 1)) * es;
    header[name] = {{"dtype", m.dtype}, {"shape", shape}, {"data_offsets", {off, off + bytes}}};
    off += bytes;
  }
  std::string h = header.dump();
  while (h.size() % 8 != 0) h += ' ';
  const std::string tmp = out + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) throw CheckpointError("cannot write " + tmp + ": " + errno_text() + "; check the output directory");
  unsigned char len[8];
  for (int b = 0; b < 8; ++b) len[b] = static_cast<unsigned char>((static_cast<std::uint64_t>(h.size()) >> (8 * b)) & 0xff);
  std::map<std::string, std::unique_ptr<ShardReader>> readers;
  try {
    write_all(fd, len, 8, tmp);
    write_all(fd, h.data(), h.size(), tmp);
    // One tensor in memory at a time, in a buffer reused across tensors.
    auto write_tensors = [&](auto tag) {
      using T = decltype(tag);
      GrowBuffer<T> buf, staging;
          for (const std::string& name : m.order) {
        const std::size_t numel = numel_of(m, name);
        T* v = buf.get(numel);
        global_tensor<T>(m, name, 0, readers, v, staging);
        write_all(fd, v, numel * sizeof(T), tmp);
      }
    };
    if (es == 8) write_tensors(double{});
    else write_tensors(float{});
    if (::fsync(fd) != 0) throw CheckpointError("fsync of " + tmp + " failed: " + errno_text());
  } catch (...) {
    ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
  ::close(fd);
  if (::rename(tmp.c_str(), out.c_str()) != 0) throw CheckpointError("renaming " + tmp + " failed: " + errno_text());
  return static_cast<std::int64_t>(8 + h.size() + off);
}

template std::vector<float> read_global_tensor<float>(const std::string&, const std::string&, const std::string&);
template std::vector<double> read_global_tensor<double>(const std::string&, const std::string&, const std::string&);

}  // namespace meshrun::train
