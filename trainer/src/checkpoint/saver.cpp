// The save of the commit protocol (checkpoint.hpp): step-N.tmp, the host copy into the staging buffer, the
// shard written from it (here or in a background thread), the gather of the pieces' descriptions, and rank
// 0's commit, with the crash points of fault_points.hpp.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <thread>

#include "fault_points.hpp"
#include "file_io.hpp"
#include "manifest.hpp"
#include "meshrun/train/checkpoint/checkpoint.hpp"

namespace meshrun::train {

namespace fs = std::filesystem;
using nlohmann::json;
using namespace ckpt;
using Clock = std::chrono::steady_clock;

namespace {

double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// One piece this rank writes: the part of a tensor slot inside its shard region of a unit it holds, of one kind.
struct Piece {
  const TensorSlot* slot = nullptr;
  int kind = 0;
  std::int64_t a = 0, b = 0;  // flat range in the slot's local block (row-major)
  std::size_t staged = 0;     // byte offset of its values in the staging buffer
};

// Every rank learns every rank's string (failures, the commit's outcome).
std::vector<std::string> all_strings(Comm& world, const std::string& mine) {
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
}

// Rank 0 receives every rank's string (all-to-all with counts: a gather); other ranks get nothing.
std::vector<std::string> gather_strings(Comm& world, const std::string& mine) {
  const int rank = world.rank();
  std::int64_t len = static_cast<std::int64_t>(mine.size());
  std::vector<std::int64_t> lens(static_cast<std::size_t>(world.size()));
  world.all_gather(&len, lens.data(), 1);
  const std::int64_t my_words = (len + 7) / 8;
  std::vector<std::int64_t> words(static_cast<std::size_t>(my_words), 0);
  if (!mine.empty()) std::memcpy(words.data(), mine.data(), mine.size());
  std::vector<std::int64_t> send_counts(static_cast<std::size_t>(world.size()), 0), recv_counts(send_counts);
  send_counts[0] = my_words;
  std::int64_t total_words = 0;
  if (rank == 0)
    for (int r = 0; r < world.size(); ++r) total_words += recv_counts[static_cast<std::size_t>(r)] = (lens[r] + 7) / 8;
  std::vector<std::int64_t> all(static_cast<std::size_t>(std::max<std::int64_t>(total_words, 1)));
  world.all_to_all(host_buf(words.data(), my_words), send_counts.data(), host_buf(all.data(), total_words), recv_counts.data());
  std::vector<std::string> out;
  if (rank == 0) {
    std::int64_t at = 0;
    for (int r = 0; r < world.size(); ++r) {
      out.emplace_back(reinterpret_cast<const char*>(all.data() + at), static_cast<std::size_t>(lens[r]));
      at += recv_counts[static_cast<std::size_t>(r)];
    }
  }
  return out;
}

}  // namespace

template <class T>
struct CheckpointSaver<T>::State {
  State(Trainer<T>& t, std::string d, int k, std::int64_t tokens, bool bg)
      : tr(t), dir(std::move(d)), keep(k), data_tokens(tokens), background(bg) {}
  Trainer<T>& tr;
  std::string dir;
  int keep;
  std::int64_t data_tokens;
  bool background;

  // The staging buffer: this rank's state as the host type, grown once, never zero-filled, reused by every save.
  std::unique_ptr<unsigned char[]> staging;
  std::size_t staging_cap = 0;

  // The save in flight.
  int step = -1;
  Clock::time_point t0;
  double stall = 0;
  CrashHook hook;
  std::vector<Piece> pieces;
  std::thread writer;
  std::atomic<bool> written{false};
  std::string error;  // this rank's write failure
  json desc;          // this rank's file entry of the manifest
  std::int64_t bytes_rank = 0;

  void write_shard();
  void copy_state();
};

// Host copies of this rank's shard regions of the units it holds, straight into the staging buffer (each
// unit's three regions side by side), and the pieces that point into them.
template <class T>
void CheckpointSaver<T>::State::copy_state() {
  pieces.clear();
  ParamStore& st = tr.store();
  const ParamTable& table = tr.table();
  std::size_t bytes = 0;
  std::vector<std::pair<int, std::size_t>> regions;  // unit, byte offset of its three regions
  for (std::size_t uu = 0; uu < table.units.size(); ++uu) {
    const int u = static_cast<int>(uu);
    if (!st.holds(u)) continue;
    const Unit& unit = table.units[uu];
    const std::int64_t lo = st.shard_begin(u), hi = std::min(lo + st.shard_len(u), unit.size);
    const std::size_t region_bytes = static_cast<std::size_t>(st.shard_len(u)) * sizeof(T);
    bool any = false;
    for (int k = 0; k < 3; ++k)
      for (const TensorSlot& t : unit.tensors) {
        if (t.split == Split::replicated && tr.coord().tp != 0) continue;  // TP rank 0 writes replicated tensors
        const std::int64_t a = std::max(lo, t.offset), b = std::min(hi, t.offset + t.numel());
        if (a >= b) continue;
        pieces.push_back({&t, k, a - t.offset, b - t.offset, bytes + k * region_bytes + static_cast<std::size_t>(a - lo) * sizeof(T)});
        any = true;
      }
    if (!any) continue;
    regions.emplace_back(u, bytes);
    bytes += 3 * region_bytes;
  }
  if (bytes > staging_cap) {
    staging.reset(new unsigned char[bytes]);  // default-initialized: no zero fill
    staging_cap = bytes;
  }
  const ParamStore::Region kinds[3] = {ParamStore::Region::params, ParamStore::Region::exp_avg, ParamStore::Region::exp_avg_sq};
  for (const auto& [u, at] : regions)
    for (int k = 0; k < 3; ++k)
      st.read_region(u, kinds[k],
                     reinterpret_cast<T*>(staging.get() + at + static_cast<std::size_t>(k * st.shard_len(u)) * sizeof(T)));
}

// This rank's shard, from the staging buffer: header, pieces, one fsync. No MPI (it may run in the thread).
template <class T>
void CheckpointSaver<T>::State::write_shard() {
  const int rank = tr.world().rank();
  const std::string file = shard_name(rank);
  const fs::path shard_path = fs::path(dir) / (step_name(step) + ".tmp") / file;
  try {
    json header = json::object();
    header["__metadata__"] = {{"format", "pt"}, {"producer", "meshrun-train"}, {"step", std::to_string(step)},
                              {"rank", std::to_string(rank)}};
    json list = json::array();
    std::uint64_t off = 0;
    for (const Piece& p : pieces) {
      const TensorSlot& t = *p.slot;
      const std::size_t bytes = static_cast<std::size_t>(p.b - p.a) * sizeof(T);
      const std::string key = piece_key(t.name, p.kind);
      header[key] = {{"dtype", dtype_name<T>()}, {"shape", {p.b - p.a}}, {"data_offsets", {off, off + bytes}}};
      off += bytes;
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
      for (const Piece& p : pieces) {
        const std::size_t bytes = static_cast<std::size_t>(p.b - p.a) * sizeof(T);
        const unsigned char* src = staging.get() + p.staged;
        write_all(fd, src, bytes, shard_path.string());
        const TensorSlot& t = *p.slot;
        list.push_back({{"tensor", t.name},
                        {"kind", kKinds[p.kind]},
                        {"key", piece_key(t.name, p.kind)},
                        {"block", {t.row0, t.col0, t.local_rows, t.local_cols}},
                        {"range", {p.a, p.b}},
                        {"hash", hex64(hash_bytes_xxh3(src, bytes))}});
        hook.at(step, rank, "shard");
      }
      if (::fsync(fd) != 0) throw CheckpointError("fsync of " + shard_path.string() + " failed: " + errno_text());
    }
    hook.at(step, rank, "shard-fsync");
    bytes_rank = static_cast<std::int64_t>(8 + h.size() + off);
    desc = {{"file", file}, {"rank", rank}, {"bytes", bytes_rank}, {"pieces", std::move(list)}};
  } catch (const std::exception& e) {
    desc = json();
    error = e.what();
  }
  written = true;
}

template <class T>
CheckpointSaver<T>::CheckpointSaver(Trainer<T>& trainer, std::string dir, int keep, std::int64_t data_tokens, bool background)
    : s_(std::make_unique<State>(trainer, std::move(dir), keep, data_tokens, background)) {}

template <class T>
CheckpointSaver<T>::~CheckpointSaver() {
  if (s_->writer.joinable()) s_->writer.join();  // a write in flight finishes; nothing is committed
}

template <class T>
bool CheckpointSaver<T>::in_flight() const {
  return s_->step >= 0;
}

template <class T>
int CheckpointSaver<T>::step_in_flight() const {
  return s_->step;
}

template <class T>
void CheckpointSaver<T>::start(int step) {
  State& s = *s_;
  if (s.step >= 0) throw std::logic_error("CheckpointSaver::start with a save in flight; finish() it first");
  s.t0 = Clock::now();
  Comm& world = s.tr.world();
  const int rank = world.rank();
  s.hook = crash_hook();
  const fs::path root(s.dir);
  const fs::path tmp = root / (step_name(step) + ".tmp");
  // rank 0 prepares step-N.tmp. This run holds checkpoint.dir's lock (lock_checkpoint_dir), so another
  // step-*.tmp can only be a dead writer's: removed.
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
  const std::vector<std::string> errors = all_strings(world, err);
  for (int r = 0; r < world.size(); ++r)
    if (!errors[static_cast<std::size_t>(r)].empty())
      throw CheckpointError("checkpoint of step " + std::to_string(step) + " not saved: rank " + std::to_string(r) + ": " +
                            errors[static_cast<std::size_t>(r)]);
  s.step = step;
  s.error.clear();
  s.desc = json();
  s.written = false;
  s.copy_state();
  if (s.background) {
    s.stall = since(s.t0);
    s.writer = std::thread([&s] { s.write_shard(); });
  } else {
    s.write_shard();
    s.stall = since(s.t0);
  }
}

template <class T>
bool CheckpointSaver<T>::ready() {
  State& s = *s_;
  Comm& world = s.tr.world();
  std::int64_t mine = s.written ? 1 : 0;
  std::vector<std::int64_t> all(static_cast<std::size_t>(world.size()));
  world.all_gather(&mine, all.data(), 1);
  return std::all_of(all.begin(), all.end(), [](std::int64_t v) { return v == 1; });
}

template <class T>
SaveResult CheckpointSaver<T>::finish() {
  State& s = *s_;
  if (s.step < 0) throw std::logic_error("CheckpointSaver::finish without a save in flight");
  const Clock::time_point finish_t0 = Clock::now();  // training waits for all of finish()
  if (s.writer.joinable()) s.writer.join();
  const int step = s.step;
  s.step = -1;
  Trainer<T>& tr = s.tr;
  Comm& world = tr.world();
  const int rank = world.rank();
  CrashHook& hook = s.hook;
  const fs::path root(s.dir);
  const fs::path tmp = root / (step_name(step) + ".tmp");
  const fs::path final_dir = root / step_name(step);
  SaveResult res;
  res.step = step;
  res.path = final_dir.string();
  res.files = world.size();
  res.bytes_rank = s.bytes_rank;
  res.background = s.background;

  // The descriptions (or a failure, marked '!') go to rank 0, which commits unless a rank failed.
  const std::vector<std::string> descs = gather_strings(world, s.error.empty() ? s.desc.dump() : "!" + s.error);
  hook.at(step, rank, "gathered");
  std::string err;
  int culprit = 0;
  if (rank == 0) {
    for (int r = 0; r < world.size() && err.empty(); ++r)
      if (!descs[static_cast<std::size_t>(r)].empty() && descs[static_cast<std::size_t>(r)][0] == '!') {
        err = descs[static_cast<std::size_t>(r)].substr(1);
        culprit = r;
      }
    if (err.empty()) try {
      const JobConfig& cfg = tr.config();
      json m = must_match(cfg, s.data_tokens);
      m["format"] = "meshrun-checkpoint";
      m["version"] = kCheckpointFormatVersion;
      m["step"] = step;
      m["consumed_samples"] = static_cast<std::int64_t>(step) * cfg.training.global_batch_size;
      m["dtype"] = dtype_name<T>();
      m[kPieceHashField] = kPieceHashXxh3;
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
        if (static_cast<int>(i) < s.keep || done[i].first == step) continue;
        fs::remove_all(done[i].second);
        res.removed.push_back(done[i].second.string());
        hook.at(step, rank, "pruned");
      }
      fsync_path(root.string(), true);
    } catch (const std::exception& e) {
      err = e.what();
    }
  }
  // Every rank learns the commit's outcome (rank 0 relays a peer's failure); a failure leaves the directory
  // as it was before the save.
  const std::vector<std::string> outcome = all_strings(world, rank == 0 && !err.empty() ? "rank " + std::to_string(culprit) + ": " + err : "");
  if (!outcome[0].empty()) {
    if (rank == 0) discard_failed_save(s.dir, step);
    throw CheckpointError("checkpoint of step " + std::to_string(step) + " not saved: " + outcome[0]);
  }
  res.seconds = since(s.t0);
  res.stall_seconds = s.stall + since(finish_t0);
  return res;
}

template <class T>
SaveResult save_checkpoint(Trainer<T>& tr, const std::string& dir, int step, int keep, std::int64_t data_tokens) {
  CheckpointSaver<T> saver(tr, dir, keep, data_tokens, false);
  saver.start(step);
  return saver.finish();
}

template class CheckpointSaver<float>;
template class CheckpointSaver<double>;
template SaveResult save_checkpoint<float>(Trainer<float>&, const std::string&, int, int, std::int64_t);
template SaveResult save_checkpoint<double>(Trainer<double>&, const std::string&, int, int, std::int64_t);

}  // namespace meshrun::train
