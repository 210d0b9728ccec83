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
#include <vector>

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

namespace {

// What load_checkpoint and load_checkpoint_weights share: this rank's blocks of the units it holds, placed
// from the pieces of every shard that overlap them; `weights_only` places the parameters (piece kind 0) alone.
template <class T>
void place_state(Trainer<T>& tr, const Manifest& m, const std::string& path, bool weights_only) {
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
  // First what this rank reads, unit by unit, each shard file opened once: the plan of the read-ahead,
  // which streams those bytes from the disk while the pieces before them are hashed and placed.
  struct Placement {
    int unit, file;
    const ManifestPiece* piece;
    const TensorSlot* slot;
  };
  std::vector<Placement> placements;
  std::vector<std::unique_ptr<ShardReader>> readers(m.files.size());
  std::vector<std::string> paths;
  std::vector<ReadAhead::Range> plan;
  for (const ManifestFile& f : m.files) paths.push_back((fs::path(path) / f.name).string());
  for (std::size_t uu = 0; uu < table.units.size(); ++uu) {
    const int u = static_cast<int>(uu);
    if (!st.holds(u)) continue;
    for (std::size_t fi = 0; fi < m.files.size(); ++fi)
      for (const ManifestPiece& p : m.files[fi].pieces) {
        const auto& [pu, t] = mine.at(p.tensor);
        if (weights_only && p.kind != 0) continue;
        if (pu != u || !overlaps(p, t->row0, t->col0, t->local_rows, t->local_cols)) continue;
        if (!readers[fi]) readers[fi] = open_shard(m, m.files[fi]);
        const auto [offset, bytes] = readers[fi]->extent(p.key, m.dtype, p.b - p.a);
        plan.push_back({static_cast<int>(fi), offset, bytes});
        placements.push_back({u, static_cast<int>(fi), &p, t});
      }
  }
  ReadAhead ahead(paths, std::move(plan));
  for (std::size_t fi = 0; fi < readers.size(); ++fi)
    if (readers[fi]) readers[fi]->read_through(&ahead, static_cast<int>(fi));

  // Then unit by unit. Where the store holds a part of the unit whole in host memory (CPU backends), the
  // pieces go straight into it; otherwise into buffers reused across units (at most one unit's parameters
  // and moments extra in memory), then uploaded. Nothing is zero-filled: read_manifest proved that the pieces
  // cover every tensor exactly once, so a tensor whose count of placed elements equals its size was read
  // whole. A failed load ends the run, so a store half overwritten is never trained on.
  GrowBuffer<T> buf[3], staging;
  std::vector<std::int64_t> placed;  // per kind and tensor of the unit
  constexpr ParamStore::Region kRegion[3] = {ParamStore::Region::params, ParamStore::Region::exp_avg,
                                             ParamStore::Region::exp_avg_sq};
  std::size_t next = 0;
  for (std::size_t uu = 0; uu < table.units.size(); ++uu) {
    const int u = static_cast<int>(uu);
    if (!st.holds(u)) continue;
    const std::size_t n = static_cast<std::size_t>(table.units[uu].size);
    T* in_place[3];
    T* dst[3];
    const int kinds = weights_only ? 1 : 3;
    for (int k = 0; k < 3; ++k) {
      in_place[k] = k < kinds ? st.state_in_place<T>(u, kRegion[k]) : nullptr;
      dst[k] = in_place[k] ? in_place[k] : k < kinds ? buf[k].get(n) : nullptr;
    }
    const std::vector<TensorSlot>& slots = table.units[uu].tensors;
    placed.assign(3 * slots.size(), 0);
    for (; next < placements.size() && placements[next].unit == u; ++next) {
      const Placement& pl = placements[next];
      const ManifestPiece& p = *pl.piece;
      const TensorSlot* t = pl.slot;
      // The slot's block in the unit's destination starts at the slot's offset.
      placed[static_cast<std::size_t>(p.kind) * slots.size() + static_cast<std::size_t>(t - slots.data())] +=
          place_piece(*readers[static_cast<std::size_t>(pl.file)], p, m.dtype, t->row0, t->col0, t->local_rows, t->local_cols,
                      dst[p.kind] + t->offset, staging);
    }
    for (int k = 0; k < kinds; ++k)
      for (std::size_t i = 0; i < slots.size(); ++i) {
        const std::int64_t have = placed[static_cast<std::size_t>(k) * slots.size() + i];
        if (have != slots[i].numel())
          throw CheckpointError(m.file + ": tensor " + piece_key(slots[i].name, k) + ": the shards hold " + std::to_string(have) +
                                " of the " + std::to_string(slots[i].numel()) + " elements this rank needs; the checkpoint is incomplete");
      }
    if (weights_only) {
      if (!in_place[0]) st.write_state<T>(u, dst[0], nullptr, nullptr);
    } else if (!in_place[0] || !in_place[1] || !in_place[2]) {
      st.write_state(u, in_place[0] ? nullptr : dst[0], in_place[1] ? nullptr : dst[1], in_place[2] ? nullptr : dst[2]);
    }
  }
}

template <class T>
void check_dtype(const Manifest& m, const char* fix) {
  if (m.dtype != dtype_name<T>())
    throw CheckpointError(m.file + ": the checkpoint holds " + m.dtype + " values but this run computes in " +
                          dtype_name<T>() + fix);
}

}  // namespace

std::string finetune_checkpoint(const std::string& dir) {
  std::error_code ec;
  if (fs::exists(fs::path(dir) / "latest", ec)) return latest_checkpoint(dir);
  if (fs::exists(fs::path(dir) / "manifest.json", ec)) return dir;
  throw CheckpointError("checkpoint.finetune = " + dir + " is not a meshrun checkpoint (no latest, no manifest.json); name a "
                        "checkpoint.dir or one of its step-N, or set checkpoint.load for a safetensors file or a Hugging "
                        "Face directory");
}

template <class T>
int load_checkpoint(Trainer<T>& tr, const std::string& path, const DataIdentity& data) {
  const Manifest m = read_manifest(path);
  check_settings(m, tr.config(), data);
  check_dtype<T>(m, "");
  place_state(tr, m, path, /*weights_only=*/false);
  return m.step;
}

template <class T>
int load_checkpoint_weights(Trainer<T>& tr, const std::string& path) {
  const Manifest m = read_manifest(path);
  check_dtype<T>(m, m.dtype == "F64" ? "; set training.dtype = fp64 to fine-tune it"
                                      : "; set training.dtype = fp32 (or bf16) to fine-tune it");
  place_state(tr, m, path, /*weights_only=*/true);
  return m.step;
}

template int load_checkpoint<float>(Trainer<float>&, const std::string&, const DataIdentity&);
template int load_checkpoint<double>(Trainer<double>&, const std::string&, const DataIdentity&);
template int load_checkpoint_weights<float>(Trainer<float>&, const std::string&);
template int load_checkpoint_weights<double>(Trainer<double>&, const std::string&);

}  // namespace meshrun::train
