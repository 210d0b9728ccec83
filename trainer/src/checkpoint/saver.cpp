// The save of the commit protocol (checkpoint.hpp): step-N.tmp, the host copy into the staging buffer, the
// shard written from it (here or in a background thread), the gather of the pieces' descriptions, and rank
// 0's commit, with the crash points of fault_points.hpp.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <thread>
#include <utility>
#include <cstdlib>
#include <new>

#include "fault_points.hpp"
#include "meshrun/bounded_file.hpp"
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
  int unit = 0;
  const TensorSlot* slot = nullptr;
  int kind = 0;
  std::int64_t a = 0, b = 0;  // flat range in the slot's local block (row-major)
  std::size_t staged = 0;     // byte offset of its values in the payload (after the header)
};

constexpr std::size_t kDirectAlign = 4096;          // O_DIRECT: buffer address, file offset and length
constexpr std::size_t kHugePage = std::size_t(2) << 20;
#ifdef MADV_POPULATE_WRITE
constexpr int kMadvPopulateWrite = MADV_POPULATE_WRITE;
#else
constexpr int kMadvPopulateWrite = 23;  // Linux 5.14 (glibc headers may predate it)
#endif

// An anonymous mapping, unmapped when replaced or destroyed.
class Mapping {
 public:
  Mapping() = default;
  Mapping(unsigned char* p, std::size_t n) : p_(p), n_(n) {}
  Mapping(Mapping&& o) noexcept : p_(std::exchange(o.p_, nullptr)), n_(std::exchange(o.n_, 0)) {}
  Mapping& operator=(Mapping&& o) noexcept {
    if (this != &o) {
      reset();
      p_ = std::exchange(o.p_, nullptr);
      n_ = std::exchange(o.n_, 0);
    }
    return *this;
  }
  ~Mapping() { reset(); }
  unsigned char* get() const { return p_; }
  unsigned char& operator[](std::size_t i) const { return p_[i]; }

 private:
  void reset() {
    if (p_) ::munmap(p_, n_);
    p_ = nullptr;
  }
  unsigned char* p_ = nullptr;
  std::size_t n_ = 0;
};
constexpr std::size_t kWriteChunk = std::size_t(64) << 20;

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
  State(Trainer<T>& t, std::string d, int k, DataIdentity id, bool bg)
      : tr(t), dir(std::move(d)), keep(k), data(std::move(id)), background(bg) {}
  Trainer<T>& tr;
  std::string dir;
  int keep;
  DataIdentity data;
  bool background;

  // The staging buffer: the shard's file image (this rank's state as the host type), aligned for O_DIRECT,
  // grown when a save needs more, never zero-filled, reused by every save; and a scratch region.
  Mapping image;
  std::size_t image_cap = 0, image_bytes = 0, data_start = 0;
  std::vector<T> scratch;

  // The save in flight.
  int step = -1;
  Clock::time_point t0;
  double stall = 0;
  CrashHook hook;
  std::vector<Piece> pieces;
  std::thread writer;
  std::thread pruner;  // async (rank 0): removes what checkpoint.keep dropped, after the commit
  std::atomic<bool> written{false};
  std::string error;  // this rank's write failure
  json desc;          // this rank's file entry of the manifest
  double write_seconds = 0;  // write_shard's own time (the part async takes off the step)

  void write_shard();
  void copy_state();
  void wait_pruned() {
    if (pruner.joinable()) pruner.join();
  }
  std::size_t layout(int for_step, std::string* header_text);  // the pieces; returns the image's size
  void ensure_image(std::size_t bytes, bool populate);
};

// The shard's file image in the staging buffer: the 8-byte length, the safetensors header, then every piece,
// copied from this rank's shard regions (read from the store one unit and kind at a time into a reused
// scratch vector). The writer then only streams the image to the file.
template <class T>
std::size_t CheckpointSaver<T>::State::layout(int for_step, std::string* header_text) {
  pieces.clear();
  ParamStore& st = tr.store();
  const ParamTable& table = tr.table();
  const int rank = tr.world().rank();
  std::size_t payload = 0;
  for (std::size_t uu = 0; uu < table.units.size(); ++uu) {
    const int u = static_cast<int>(uu);
    if (!st.holds(u)) continue;
    const Unit& unit = table.units[uu];
    const std::int64_t lo = st.shard_begin(u), hi = std::min(lo + st.shard_len(u), unit.size);
    for (int k = 0; k < 3; ++k)
      for (const TensorSlot& t : unit.tensors) {
        if (t.split == Split::replicated && tr.coord().tp != 0) continue;  // TP rank 0 writes replicated tensors
        const std::int64_t a = std::max(lo, t.offset), b = std::min(hi, t.offset + t.numel());
        if (a >= b) continue;
        pieces.push_back({u, &t, k, a - t.offset, b - t.offset, payload});
        payload += static_cast<std::size_t>(b - a) * sizeof(T);
      }
  }
  json header = json::object();
  header["__metadata__"] = {{"format", "pt"}, {"producer", "meshrun-train"}, {"step", std::to_string(for_step)},
                            {"rank", std::to_string(rank)}};
  for (const Piece& p : pieces) {
    const std::size_t bytes = static_cast<std::size_t>(p.b - p.a) * sizeof(T);
    header[piece_key(p.slot->name, p.kind)] = {
        {"dtype", dtype_name<T>()}, {"shape", {p.b - p.a}}, {"data_offsets", {p.staged, p.staged + bytes}}};
  }
  *header_text = header.dump();
  while (header_text->size() % 8 != 0) *header_text += ' ';
  return 8 + header_text->size() + payload;
}

template <class T>
void CheckpointSaver<T>::State::ensure_image(std::size_t bytes, bool populate) {
  // Capacity rounded up to the O_DIRECT block, so the last block can be written whole.
  const std::size_t cap = (bytes + kDirectAlign - 1) / kDirectAlign * kDirectAlign;
  if (cap <= image_cap) return;
  // Anonymous memory in transparent huge pages where the kernel allows (madvise mode): touching every page
  // once takes 512 times fewer faults. Page-aligned for O_DIRECT.
  const std::size_t len = (cap + kHugePage - 1) / kHugePage * kHugePage;
  void* mem = ::mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (mem == MAP_FAILED) throw std::bad_alloc();
  (void)::madvise(mem, len, MADV_HUGEPAGE);  // a hint: without THP the buffer still works
  image = Mapping(static_cast<unsigned char*>(mem), len);
  image_cap = len;
  if (populate && ::madvise(mem, len, kMadvPopulateWrite) != 0)  // Linux < 5.14: touch each page
    for (std::size_t i = 0; i < len; i += 4096) static_cast<volatile unsigned char*>(mem)[i] = 0;
}

// The shard's file image in the staging buffer: the 8-byte length, the safetensors header, then every piece,
// read from this rank's shard regions. The writer then only streams the image to the file.
template <class T>
void CheckpointSaver<T>::State::copy_state() {
  ParamStore& st = tr.store();
  std::string h;
  image_bytes = layout(step, &h);
  data_start = 8 + h.size();
  ensure_image(image_bytes, false);
  for (int b = 0; b < 8; ++b) image[b] = static_cast<unsigned char>((static_cast<std::uint64_t>(h.size()) >> (8 * b)) & 0xff);
  std::memcpy(image.get() + 8, h.data(), h.size());
  const ParamStore::Region kinds[3] = {ParamStore::Region::params, ParamStore::Region::exp_avg, ParamStore::Region::exp_avg_sq};
  // Pieces come unit by unit, kind by kind, in region order. Where one (unit, kind)'s pieces tile its whole
  // region (no padding, no replicated tensor left to TP rank 0) the region is read straight into the image;
  // otherwise through the scratch region.
  for (std::size_t i = 0; i < pieces.size();) {
    const Piece& first = pieces[i];
    std::size_t j = i;
    std::int64_t covered = 0;
    for (; j < pieces.size() && pieces[j].unit == first.unit && pieces[j].kind == first.kind; ++j) covered += pieces[j].b - pieces[j].a;
    const std::int64_t len = st.shard_len(first.unit);
    if (covered == len && first.slot->offset + first.a == st.shard_begin(first.unit)) {
      st.read_region(first.unit, kinds[first.kind], reinterpret_cast<T*>(image.get() + data_start + first.staged));
    } else {
      if (scratch.size() < static_cast<std::size_t>(len)) scratch.resize(static_cast<std::size_t>(len));
      st.read_region(first.unit, kinds[first.kind], scratch.data());
      for (std::size_t q = i; q < j; ++q) {
        const Piece& p = pieces[q];
        const std::int64_t at = p.slot->offset + p.a - st.shard_begin(p.unit);
        std::memcpy(image.get() + data_start + p.staged, scratch.data() + at, static_cast<std::size_t>(p.b - p.a) * sizeof(T));
      }
    }
    i = j;
  }
}

// Streams the image to this rank's shard file: O_DIRECT (DMA from the image, no page-cache copy) where the
// file system takes it, else buffered writes; one fsync. Pieces are hashed as they go. No MPI (it may run in
// the background thread).
template <class T>
void CheckpointSaver<T>::State::write_shard() {
  const int rank = tr.world().rank();
  const std::string file = shard_name(rank);
  const fs::path shard_path = fs::path(dir) / (step_name(step) + ".tmp") / file;
  const std::string where = shard_path.string();
  const Clock::time_point w0 = Clock::now();
  try {
    bool direct = true;
    int raw = ::open(shard_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_DIRECT, 0644);
    if (raw < 0 && errno == EINVAL) {  // the file system has no O_DIRECT (e.g. some FUSE mounts)
      direct = false;
      raw = ::open(shard_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    }
    const Fd fd(raw);
    if (fd < 0) throw CheckpointError("cannot create " + where + ": " + errno_text());
    std::size_t done = 0;  // bytes of the image written
    // Writes the image up to `until` (O_DIRECT: whole blocks only, except at the very end).
    auto write_to = [&](std::size_t until, bool last) {
      if (direct) until = last ? (until + kDirectAlign - 1) / kDirectAlign * kDirectAlign : until / kDirectAlign * kDirectAlign;
      while (done < until) {
        const std::size_t n = std::min(until - done, kWriteChunk);
        const ssize_t w = ::pwrite(fd, image.get() + done, n, static_cast<off_t>(done));
        if (w < 0 && errno == EINTR) continue;
        if (w < 0 && direct && errno == EINVAL && done == 0) {  // O_DIRECT refused at the first write: buffered
          direct = false;
          const int flags = ::fcntl(fd, F_GETFL);
          if (flags < 0 || ::fcntl(fd, F_SETFL, flags & ~O_DIRECT) != 0) throw CheckpointError("writing " + where + " failed: " + errno_text());
          until = last ? image_bytes : until;
          continue;
        }
        if (w <= 0) throw CheckpointError("writing " + where + " failed: " + errno_text() + "; check free space in checkpoint.dir");
        done += static_cast<std::size_t>(w);
      }
    };
    json list = json::array();
    for (std::size_t i = 0; i < pieces.size(); ++i) {
      const Piece& p = pieces[i];
      const std::size_t bytes = static_cast<std::size_t>(p.b - p.a) * sizeof(T);
      const unsigned char* src = image.get() + data_start + p.staged;
      write_to(data_start + p.staged + bytes, i + 1 == pieces.size());
      const TensorSlot& t = *p.slot;
      list.push_back({{"tensor", t.name},
                      {"kind", kKinds[p.kind]},
                      {"key", piece_key(t.name, p.kind)},
                      {"block", {t.row0, t.col0, t.local_rows, t.local_cols}},
                      {"range", {p.a, p.b}},
                      {"hash", hex64(hash_bytes_xxh3(src, bytes))}});
      hook.at(step, rank, "shard");
    }
    write_to(image_bytes, true);
    if (done > image_bytes && ::ftruncate(fd, static_cast<off_t>(image_bytes)) != 0)  // the last block's padding
      throw CheckpointError("truncating " + where + " failed: " + errno_text());
    if (::fsync(fd) != 0) throw CheckpointError("fsync of " + where + " failed: " + errno_text());
    hook.at(step, rank, "shard-fsync");
    desc = {{"file", file}, {"rank", rank}, {"bytes", image_bytes}, {"pieces", std::move(list)}};
  } catch (const std::exception& e) {
    desc = json();
    error = e.what();
  }
  write_seconds = since(w0);
  written = true;
}

template <class T>
CheckpointSaver<T>::CheckpointSaver(Trainer<T>& trainer, std::string dir, int keep, const DataIdentity& data, bool background)
    : s_(std::make_unique<State>(trainer, std::move(dir), keep, data, background)) {}

template <class T>
CheckpointSaver<T>::~CheckpointSaver() {
  if (s_->writer.joinable()) s_->writer.join();  // a write in flight finishes; nothing is committed
  s_->wait_pruned();
}

template <class T>
std::size_t CheckpointSaver<T>::reserve() {
  std::string h;
  const std::size_t bytes = s_->layout(999999999, &h);  // the widest step number: the largest header
  s_->ensure_image(bytes, true);
  std::int64_t scratch = 0;  // the region a (unit, kind) whose pieces leave gaps is read through
  for (const Piece& p : s_->pieces) scratch = std::max(scratch, s_->tr.store().shard_len(p.unit));
  s_->scratch.resize(static_cast<std::size_t>(scratch));
  return s_->image_cap + static_cast<std::size_t>(scratch) * sizeof(T);
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
  s.wait_pruned();  // the previous save's (async): long done by now, as a rule
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
  res.bytes_rank = s.error.empty() ? static_cast<std::int64_t>(s.image_bytes) : 0;
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
      json m = must_match(cfg, s.data);
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
      // The run's tokenizer, for meshrun-ckpt export (its files ship with the weights) and sample.
      if (!cfg.data.tokenizer.empty()) m["tokenizer"] = std::filesystem::absolute(cfg.data.tokenizer).lexically_normal().string();
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
      for (std::size_t i = 0; i < done.size(); ++i)
        if (static_cast<int>(i) >= s.keep && done[i].first != step) res.removed.push_back(done[i].second.string());
      auto prune = [&hook, step, rank, removed = res.removed, root] {
        for (const std::string& d : removed) {
          fs::remove_all(d);
          hook.at(step, rank, "pruned");
        }
        fsync_path(root.string(), true);
      };
      if (s.background && !res.removed.empty()) {
        // Removing a checkpoint's files took ~45 ms of a 0.07 s async stall (mid model): off the step, in a
        // thread of its own, waited for by the next save and at exit. A failure there is one warning line.
        res.removing_in_background = true;
        s.wait_pruned();
        s.pruner = std::thread([prune] {
          try {
            prune();
          } catch (const std::exception& e) {
            std::fprintf(stderr, "meshrun-train: warning: checkpoint.keep: an older checkpoint was not removed: %s; remove it by hand\n",
                         cut_long_values(e.what()).c_str());
          }
        });
      } else {
        prune();
      }
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
  res.work_seconds = res.stall_seconds + (s.background ? s.write_seconds : 0.0);
  return res;
}

template <class T>
SaveResult save_checkpoint(Trainer<T>& tr, const std::string& dir, int step, int keep, const DataIdentity& data) {
  CheckpointSaver<T> saver(tr, dir, keep, data, false);
  saver.start(step);
  return saver.finish();
}

template class CheckpointSaver<float>;
template class CheckpointSaver<double>;
template SaveResult save_checkpoint<float>(Trainer<float>&, const std::string&, int, int, const DataIdentity&);
template SaveResult save_checkpoint<double>(Trainer<double>&, const std::string&, int, int, const DataIdentity&);

}  // namespace meshrun::train
