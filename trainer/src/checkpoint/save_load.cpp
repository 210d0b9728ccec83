// The committed `latest`, the status file, clean-up after a failed save, and loading this rank's blocks
// from any layout's shards (the save itself is saver.cpp).
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>

#include "fault_points.hpp"
#include "file_io.hpp"
#include "manifest.hpp"
#include "meshrun/train/checkpoint/checkpoint.hpp"
#include "meshrun/train/checkpoint/safetensors.hpp"

namespace meshrun::train {

namespace fs = std::filesystem;
using nlohmann::json;
using namespace ckpt;

// After a failed save (rank 0, every rank agreed it failed): what it wrote goes, so a full disk gets its space
// back, and the directory is as before the save: `latest` and the checkpoint it names are untouched. A step-N
// that `latest` does not name (renamed before the failure) goes too, and a step-N moved aside comes back.
void ckpt::discard_failed_save(const std::string& dir, int step) {
  const fs::path root(dir);
  std::error_code ec;
  fs::remove_all(root / (step_name(step) + ".tmp"), ec);
  fs::remove(root / "latest.tmp", ec);
  const fs::path final_dir = root / step_name(step), aside = root / (step_name(step) + ".old.tmp");
  std::string latest;
  std::getline(std::ifstream(root / "latest"), latest);
  if (latest != step_name(step)) {
    fs::remove_all(final_dir, ec);
    if (fs::exists(aside, ec)) fs::rename(aside, final_dir, ec);
  }
  fs::remove_all(aside, ec);
}

std::string status_file_path(const std::string& dir) { return (fs::path(dir) / "status").string(); }

void write_status_file(const std::string& dir, const std::string& line) {
  write_file_atomic(status_file_path(dir), line + "\n");
}

std::string latest_checkpoint(const std::string& dir) {
  const fs::path latest = fs::path(dir) / "latest";
  std::error_code ec;
  if (!fs::exists(latest, ec)) return "";
  std::ifstream is(latest);
  std::string name;
  std::getline(is, name);
  if (name.rfind("step-", 0) != 0 || name.find('/') != std::string::npos)
    throw CheckpointError(latest.string() + ": expected one line \"step-N\", got \"" + name + "\"; fix or remove the file");
  const fs::path path = fs::path(dir) / name;
  if (!fs::exists(path / "manifest.json", ec))
    throw CheckpointError(latest.string() + " names " + path.string() + ", which has no manifest.json; restore it or remove " +
                          latest.string() + " to start fresh");
  return path.string();
}

template <class T>
int load_checkpoint(Trainer<T>& tr, const std::string& path, std::int64_t data_tokens) {
  const Manifest m = read_manifest(path);
  const JobConfig& cfg = tr.config();
  check_settings(m, cfg, data_tokens);
  if (m.dtype != dtype_name<T>())
    throw CheckpointError(m.file + ": the checkpoint holds " + m.dtype + " values but this run computes in " + dtype_name<T>());
  const ParamTable& table = tr.table();
  // Tensor names and shapes must be the model's, both ways.
  std::map<std::string, std::pair<int, const TensorSlot*>> mine;
  for (std::size_t u = 0; u < table.units.size(); ++u)
    for (const TensorSlot& t : table.units[u].tensors) {
      mine[t.name] = {static_cast<int>(u), &t};
      auto it = m.shapes.find(t.name);
      if (it == m.shapes.end())
        throw CheckpointError(m.file + ": tensor " + t.name + " is missing; the checkpoint is of another model");
      if (it->second != t.shape())
        throw CheckpointError(m.file + ": tensor " + t.name + " has shape " + shape_text(it->second) + ", the model expects " +
                              shape_text(t.shape()) + "; check the [model] sizes");
    }
  for (const auto& [name, shape] : m.shapes)
    if (!mine.count(name)) throw CheckpointError(m.file + ": tensor " + name + " is not part of this model");

  ParamStore& st = tr.store();
  // Unit by unit (at most one unit's parameters and moments extra in memory, in buffers reused across units
  // and never zero-filled: the coverage check below proves every element was read), each shard file opened once.
  std::map<std::string, std::unique_ptr<ShardReader>> readers;
  GrowBuffer<T> buf[3], staging;
  GrowBuffer<std::uint8_t> seen_buf;
  for (std::size_t uu = 0; uu < table.units.size(); ++uu) {
    const int u = static_cast<int>(uu);
    if (!st.holds(u)) continue;
    const std::size_t n = static_cast<std::size_t>(table.units[uu].size);
    T* const dst[3] = {buf[0].get(n), buf[1].get(n), buf[2].get(n)};
    std::uint8_t* const seen0 = seen_buf.get(3 * n);
    std::memset(seen0, 0, 3 * n);
    std::uint8_t* const seen[3] = {seen0, seen0 + n, seen0 + 2 * n};
    for (const ManifestFile& f : m.files) {
      const std::string fpath = (fs::path(path) / f.name).string();
      for (const ManifestPiece& p : f.pieces) {
        const auto& [pu, t] = mine.at(p.tensor);
        if (pu != u || !overlaps(p, t->row0, t->col0, t->local_rows, t->local_cols)) continue;
        auto& reader = readers[f.name];
        if (!reader) reader = open_shard(m, f);
        // The slot's block inside the unit buffer: placed into a view starting at its offset.
        place_piece(*reader, p, m.dtype, t->row0, t->col0, t->local_rows, t->local_cols, dst[p.kind] + t->offset,
                    seen[p.kind] + t->offset, staging, fpath);
      }
    }
    for (int k = 0; k < 3; ++k)
      for (const TensorSlot& t : table.units[uu].tensors) {
        const std::uint8_t* b = seen[k] + t.offset;  // 0 or 1 each: covered iff no 0 (memchr, not a scalar count)
        if (std::memchr(b, 0, static_cast<std::size_t>(t.numel())) == nullptr) continue;
        const auto have = std::count(b, b + t.numel(), 1);
        throw CheckpointError(m.file + ": tensor " + piece_key(t.name, k) + ": the shards hold " + std::to_string(have) + " of the " +
                              std::to_string(t.numel()) + " elements this rank needs; the checkpoint is incomplete");
      }
    st.write_state(u, dst[0], dst[1], dst[2]);
  }
  return m.step;
}

template int load_checkpoint<float>(Trainer<float>&, const std::string&, std::int64_t);
template int load_checkpoint<double>(Trainer<double>&, const std::string&, std::int64_t);

}  // namespace meshrun::train
