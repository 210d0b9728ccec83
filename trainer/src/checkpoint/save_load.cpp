// The commit protocol (checkpoint.hpp): the collective save with its crash points, the committed `latest`,
// the status file, and loading this rank's blocks from any layout's shards.
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

namespace {

// What this rank writes: the part of each tensor slot inside its shard region of a unit it holds.
struct Piece {
  int unit = 0;
  const TensorSlot* slot = nullptr;
  std::int64_t a = 0, b = 0;    // flat range in the slot's local block (row-major)
  std::int64_t region = 0;      // offset of element a in the rank's shard region of the unit
};

template <class T>
std::vector<Piece> held_pieces(Trainer<T>& tr) {
  std::vector<Piece> out;
  ParamStore& st = tr.store();
  const ParamTable& table = tr.table();
  for (std::size_t uu = 0; uu < table.units.size(); ++uu) {
    const int u = static_cast<int>(uu);
    if (!st.holds(u)) continue;
    const Unit& unit = table.units[uu];
    const std::int64_t lo = st.shard_begin(u), hi = std::min(lo + st.shard_len(u), unit.size);
    for (const TensorSlot& t : unit.tensors) {
      if (t.split == Split::replicated && tr.coord().tp != 0) continue;  // TP rank 0 writes replicated tensors
      const std::int64_t a = std::max(lo, t.offset), b = std::min(hi, t.offset + t.numel());
      if (a >= b) continue;
      out.push_back({u, &t, a - t.offset, b - t.offset, a - lo});
    }
  }
  return out;
}

// After a failed save (rank 0, every rank agreed it failed): what it wrote goes, so a full disk gets its space
// back, and the directory is as before the save: `latest` and the checkpoint it names are untouched. A step-N
// that `latest` does not name (renamed before the failure) goes too, and a step-N moved aside comes back.
void discard_failed_save(const fs::path& root, int step) {
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

}  // namespace

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
SaveResult save_checkpoint(Trainer<T>& tr, const std::string& dir, int step, int keep, std::int64_t data_tokens) {
  const auto t0 = std::chrono::steady_clock::now();
  Comm& world = tr.world();
  const int rank = world.rank();
  CrashHook hook = crash_hook();
  const fs::path root(dir);
  const fs::path tmp = root / (step_name(step) + ".tmp");
  const fs::path final_dir = root / step_name(step);
  SaveResult res;
  res.step = step;
  res.path = final_dir.string();
  res.files = world.size();

  // Agreement helper: every rank learns whether any failed, and the first failure's text.
  auto agree = [&](const std::string& mine) {
    std::int64_t len = static_cast<std::int64_t>(mine.size());
    std::vector<std::int64_t> lens(static_cast<std::size_t>(world.size()));
    world.all_gather(&len, lens.data(), 1);
    std::int64_t maxw = 0;
    for (std::int64_t l : lens) maxw = std::max(maxw, (l + 7) / 8);
    std::vector<std::int64_t> words(static_cast<std::size_t>(maxw), 0), all(static_cast<std::size_t>(maxw * world.size()));
    if (!mine.empty()) std::memcpy(words.data(), mine.data(), mine.size());  // no memcpy from null: UB even for 0 bytes
    if (maxw > 0) world.all_gather(words.data(), all.data(), maxw);
    std::vector<std::string> out;
    for (int r = 0; r < world.size(); ++r)
      out.emplace_back(reinterpret_cast<const char*>(all.data() + r * maxw), static_cast<std::size_t>(lens[r]));
    return out;
  };
  auto fail_if_any = [&](const std::vector<std::string>& errors, bool error_strings) {
    for (int r = 0; r < world.size(); ++r) {
      const std::string& e = errors[static_cast<std::size_t>(r)];
      if (error_strings ? !e.empty() : (!e.empty() && e[0] == '!'))
        throw CheckpointError("checkpoint of step " + std::to_string(step) + " not saved: rank " + std::to_string(r) + ": " +
                              (error_strings ? e : e.substr(1)));
    }
  };

  // 1. rank 0 prepares step-N.tmp (stale temporary directories of crashed saves are removed).
  std::string err;
  if (rank == 0) {
    try {
      fs::create_directories(root);
      for (const auto& e : fs::directory_iterator(root)) {
        const std::string n = e.path().filename().string();
        if (e.is_directory() && n.rfind("step-", 0) == 0 && n.size() > 4 && n.compare(n.size() - 4, 4, ".tmp") == 0)
          fs::remove_all(e.path());
      }
      fs::create_directory(tmp);
    } catch (const fs::filesystem_error& e) {
      err = std::string("cannot prepare ") + tmp.string() + ": " + e.code().message() + "; check checkpoint.dir";
    }
  }
  fail_if_any(agree(err), true);

  // 2. every rank writes and fsyncs its shard.
  const std::vector<Piece> pieces = held_pieces(tr);
  ParamStore& st = tr.store();
  // Host copies of this rank's shard regions (parameters and both moments) of the units it writes.
  std::map<int, std::array<std::vector<T>, 3>> regions;
  for (const Piece& p : pieces) {
    auto [it, fresh] = regions.try_emplace(p.unit);
    if (!fresh) continue;
    const ParamStore::Region kinds[3] = {ParamStore::Region::params, ParamStore::Region::exp_avg,
                                         ParamStore::Region::exp_avg_sq};
    for (int k = 0; k < 3; ++k) {
      it->second[k].resize(static_cast<std::size_t>(st.shard_len(p.unit)));
      st.read_region(p.unit, kinds[k], it->second[k].data());
    }
  }
  const std::string file = shard_name(rank);
  const fs::path shard_path = tmp / file;
  json desc;  // this rank's file entry of the manifest
  try {
    json header = json::object();
    header["__metadata__"] = {{"format", "pt"}, {"producer", "meshrun-train"}, {"step", std::to_string(step)},
                              {"rank", std::to_string(rank)}};
    std::vector<std::pair<const void*, std::size_t>> data;
    json list = json::array();
    std::uint64_t off = 0;
    for (const Piece& p : pieces) {
      const TensorSlot& t = *p.slot;
      for (int k = 0; k < 3; ++k) {
        const T* src = regions.at(p.unit)[k].data() + p.region;
        const std::size_t bytes = static_cast<std::size_t>(p.b - p.a) * sizeof(T);
        const std::string key = piece_key(t.name, k);
        header[key] = {{"dtype", dtype_name<T>()}, {"shape", {p.b - p.a}}, {"data_offsets", {off, off + bytes}}};
        off += bytes;
        data.emplace_back(src, bytes);
        list.push_back({{"tensor", t.name},
                        {"kind", kKinds[k]},
                        {"key", key},
                        {"block", {t.row0, t.col0, t.local_rows, t.local_cols}},
                        {"range", {p.a, p.b}},
                        {"hash", hex64(hash_bytes(src, bytes))}});
      }
    }
    std::string h = header.dump();
    while (h.size() % 8 != 0) h += ' ';
    {
      const Fd fd(::open(shard_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644));
      if (fd < 0) throw CheckpointError("cannot create " + shard_path.string() + ": " + errno_text());
      std::uint64_t n = h.size();
      unsigned char len[8];
      for (int b = 0; b < 8; ++b) len[b] = static_cast<unsigned char>((n >> (8 * b)) & 0xff);
      write_all(fd, len, 8, shard_path.string());
      write_all(fd, h.data(), h.size(), shard_path.string());
      for (const auto& [ptr, bytes] : data) {
        write_all(fd, ptr, bytes, shard_path.string());
        hook.at(step, rank, "shard");
      }
      if (::fsync(fd) != 0) throw CheckpointError("fsync of " + shard_path.string() + " failed: " + errno_text());
    }
    hook.at(step, rank, "shard-fsync");
    res.bytes_rank = static_cast<std::int64_t>(8 + h.size() + off);
    desc = {{"file", file}, {"rank", rank}, {"bytes", res.bytes_rank}, {"pieces", std::move(list)}};
  } catch (const std::exception& e) {
    desc = json();
    err = e.what();
  }
  // 3. the descriptions (or a failure, marked '!') go to rank 0 only (all-to-all with counts: a gather), which
  //    commits unless a rank failed.
  std::vector<std::string> descs;
  {
    const std::string mine = err.empty() ? desc.dump() : "!" + err;
    std::int64_t len = static_cast<std::int64_t>(mine.size());
    std::vector<std::int64_t> lens(static_cast<std::size_t>(world.size()));
    world.all_gather(&len, lens.data(), 1);
    const std::int64_t my_words = (len + 7) / 8;
    std::vector<std::int64_t> words(static_cast<std::size_t>(my_words), 0);
    if (!mine.empty()) std::memcpy(words.data(), mine.data(), mine.size());  // no memcpy from null: UB even for 0 bytes
    std::vector<std::int64_t> send_counts(static_cast<std::size_t>(world.size()), 0), recv_counts(send_counts);
    send_counts[0] = my_words;
    std::int64_t total_words = 0;
    if (rank == 0)
      for (int r = 0; r < world.size(); ++r) total_words += recv_counts[static_cast<std::size_t>(r)] = (lens[r] + 7) / 8;
    std::vector<std::int64_t> all(static_cast<std::size_t>(std::max<std::int64_t>(total_words, 1)));
    world.all_to_all(host_buf(words.data(), my_words), send_counts.data(), host_buf(all.data(), total_words), recv_counts.data());
    if (rank == 0) {
      std::int64_t at = 0;
      for (int r = 0; r < world.size(); ++r) {
        descs.emplace_back(reinterpret_cast<const char*>(all.data() + at), static_cast<std::size_t>(lens[r]));
        at += recv_counts[static_cast<std::size_t>(r)];
      }
    }
  }
  hook.at(step, rank, "gathered");

  if (rank == 0) {
    for (int r = 0; r < world.size() && err.empty(); ++r)
      if (!descs[static_cast<std::size_t>(r)].empty() && descs[static_cast<std::size_t>(r)][0] == '!') err = descs[static_cast<std::size_t>(r)].substr(1);
    if (err.empty()) try {
      const JobConfig& cfg = tr.config();
      json m = must_match(cfg, data_tokens);
      m["format"] = "meshrun-checkpoint";
      m["version"] = kCheckpointFormatVersion;
      m["step"] = step;
      m["consumed_samples"] = static_cast<std::int64_t>(step) * cfg.training.global_batch_size;
      m["dtype"] = dtype_name<T>();
      m["layout"] = layout_json(tr.grid().layout(), cfg);
      json tensors = json::array();
      for (const Unit& u : tr.table().units)
        for (const TensorSlot& t : u.tensors) tensors.push_back({{"name", t.name}, {"shape", t.shape()}});
      m["tensors"] = std::move(tensors);
      json files = json::array();
      std::int64_t total = 0;
      for (const std::string& d : descs) {
        json f = json::parse(d);
        total += f.at("bytes").get<std::int64_t>();
        files.push_back(std::move(f));
      }
      m["files"] = std::move(files);
      m["lr_schedule"] = {{"completed_steps", step}, {"next_lr", lr_at(cfg.training, step)}};
      m["manifest_hash"] = manifest_digest(m);
      const std::string text = m.dump(1) + "\n";
      res.bytes_total = total + static_cast<std::int64_t>(text.size());
      const std::string mpath = (tmp / "manifest.json").string();
      {
        const Fd fd(::open(mpath.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644));
        if (fd < 0) throw CheckpointError("cannot create " + mpath + ": " + errno_text());
        write_all(fd, text.data(), text.size() / 2, mpath);
        hook.at(step, rank, "manifest");
        write_all(fd, text.data() + text.size() / 2, text.size() - text.size() / 2, mpath);
        if (::fsync(fd) != 0) throw CheckpointError("fsync of " + mpath + " failed: " + errno_text());
      }
      fsync_path(tmp.string(), true);
      hook.at(step, rank, "manifest-fsync");
      // A step-N left by an earlier run (checkpoint.resume = false) is replaced: moved aside, then removed.
      std::error_code ec;
      const fs::path aside = root / (step_name(step) + ".old.tmp");
      if (fs::exists(final_dir, ec)) fs::rename(final_dir, aside);
      fs::rename(tmp, final_dir);
      fsync_path(root.string(), true);
      hook.at(step, rank, "renamed");
      const std::string ltmp = (root / "latest.tmp").string();
      {
        const std::string line = step_name(step) + "\n";
        const Fd lfd(::open(ltmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644));
        if (lfd < 0) throw CheckpointError("cannot create " + ltmp + ": " + errno_text());
        write_all(lfd, line.data(), line.size(), ltmp);
        if (::fsync(lfd) != 0) throw CheckpointError("fsync of " + ltmp + " failed: " + errno_text());
      }
      hook.at(step, rank, "latest-tmp");
      if (::rename(ltmp.c_str(), (root / "latest").c_str()) != 0) throw CheckpointError("renaming " + ltmp + " failed: " + errno_text());
      fsync_path(root.string(), true);
      hook.at(step, rank, "latest");
      fs::remove_all(aside, ec);
      // checkpoint.keep: the newest `keep` complete checkpoints stay.
      std::vector<std::pair<int, fs::path>> done;
      for (const auto& e : fs::directory_iterator(root)) {
        const std::string n = e.path().filename().string();
        if (!e.is_directory() || n.rfind("step-", 0) != 0 || n.find_first_not_of("0123456789", 5) != std::string::npos || n.size() == 5)
          continue;
        done.emplace_back(std::stoi(n.substr(5)), e.path());
      }
      std::sort(done.rbegin(), done.rend());
      for (std::size_t i = 0; i < done.size(); ++i) {
        if (static_cast<int>(i) < keep || done[i].first == step) continue;
        fs::remove_all(done[i].second);
        res.removed.push_back(done[i].second.string());
        hook.at(step, rank, "pruned");
      }
      fsync_path(root.string(), true);
    } catch (const std::exception& e) {
      err = e.what();
    }
  }
  // 4. final barrier: every rank learns the commit's outcome (rank 0 relays a peer's failure).
  {
    std::string relay = err;
    if (rank == 0 && !err.empty()) {
      int culprit = 0;
      for (int r = 0; r < world.size(); ++r)
        if (!descs[static_cast<std::size_t>(r)].empty() && descs[static_cast<std::size_t>(r)][0] == '!') { culprit = r; break; }
      relay = "rank " + std::to_string(culprit) + ": " + err;
    }
    const std::vector<std::string> outcome = agree(rank == 0 ? relay : std::string());
    if (!outcome[0].empty()) {
      if (rank == 0) discard_failed_save(root, step);
      throw CheckpointError("checkpoint of step " + std::to_string(step) + " not saved: " + outcome[0]);
    }
  }
  res.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return res;
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
  // Unit by unit (at most one unit's parameters and moments extra in memory), each shard file opened once.
  std::map<std::string, std::unique_ptr<ShardReader>> readers;
  for (std::size_t uu = 0; uu < table.units.size(); ++uu) {
    const int u = static_cast<int>(uu);
    if (!st.holds(u)) continue;
    const std::size_t n = static_cast<std::size_t>(table.units[uu].size);
    std::vector<T> buf[3] = {std::vector<T>(n, T(0)), std::vector<T>(n, T(0)), std::vector<T>(n, T(0))};
    std::vector<std::uint8_t> seen[3] = {std::vector<std::uint8_t>(n, 0), std::vector<std::uint8_t>(n, 0),
                                         std::vector<std::uint8_t>(n, 0)};
    for (const ManifestFile& f : m.files) {
      const std::string fpath = (fs::path(path) / f.name).string();
      for (const ManifestPiece& p : f.pieces) {
        const auto& [pu, t] = mine.at(p.tensor);
        if (pu != u || !overlaps(p, t->row0, t->col0, t->local_rows, t->local_cols)) continue;
        auto& reader = readers[f.name];
        if (!reader) reader = open_shard(m, f);
        const std::vector<T> vals = decode<T>(reader->read(p.key, m.dtype, p.b - p.a, p.hash));
        // The slot's block inside the unit buffer: scatter into a view starting at its offset.
        scatter_piece(p, vals.data(), t->row0, t->col0, t->local_rows, t->local_cols, buf[p.kind].data() + t->offset,
                      seen[p.kind].data() + t->offset, fpath);
      }
    }
    for (int k = 0; k < 3; ++k)
      for (const TensorSlot& t : table.units[uu].tensors) {
        const auto b = seen[k].begin() + t.offset;
        const auto have = std::count(b, b + t.numel(), 1);
        if (have != t.numel())
          throw CheckpointError(m.file + ": tensor " + piece_key(t.name, k) + ": the shards hold " + std::to_string(have) + " of the " +
                                std::to_string(t.numel()) + " elements this rank needs; the checkpoint is incomplete");
      }
    st.write_state(u, buf[0].data(), buf[1].data(), buf[2].data());
  }
  return m.step;
}

template SaveResult save_checkpoint<float>(Trainer<float>&, const std::string&, int, int, std::int64_t);
template SaveResult save_checkpoint<double>(Trainer<double>&, const std::string&, int, int, std::int64_t);
template int load_checkpoint<float>(Trainer<float>&, const std::string&, std::int64_t);
template int load_checkpoint<double>(Trainer<double>&, const std::string&, std::int64_t);

}  // namespace meshrun::train
