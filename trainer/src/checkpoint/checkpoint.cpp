#include "meshrun/train/checkpoint/checkpoint.hpp"

#include "meshrun/bounded_file.hpp"
#include "meshrun/train/checkpoint/safetensors.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>
#include <type_traits>

#include "json_read.hpp"

namespace meshrun::train {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// ---- small POSIX helpers -------------------------------------------------------------------------

std::string errno_text() { return std::strerror(errno); }

// A file descriptor closed on every path (writes that throw included).
struct Fd {
  int fd;
  explicit Fd(int f) : fd(f) {}
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  operator int() const { return fd; }
};

void write_all(int fd, const void* data, std::size_t n, const std::string& path) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) throw CheckpointError("writing " + path + " failed: " + errno_text() + "; check free space in checkpoint.dir");
    p += w;
    n -= static_cast<std::size_t>(w);
  }
}

void fsync_path(const std::string& path, bool directory) {
  const int fd = ::open(path.c_str(), directory ? (O_RDONLY | O_DIRECTORY) : O_RDONLY);
  if (fd < 0) throw CheckpointError("cannot open " + path + " to fsync it: " + errno_text());
  const int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) throw CheckpointError("fsync of " + path + " failed: " + errno_text());
}

// Writes `bytes` to `path` (temporary name, fsync, rename, fsync of the directory).
void write_file_atomic(const std::string& path, const std::string& bytes) {
  const std::string tmp = path + ".tmp";
  {
    const Fd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644));
    if (fd < 0) throw CheckpointError("cannot write " + tmp + ": " + errno_text() + "; check that checkpoint.dir is writable");
    write_all(fd, bytes.data(), bytes.size(), tmp);
    if (::fsync(fd) != 0) throw CheckpointError("fsync of " + tmp + " failed: " + errno_text());
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) throw CheckpointError("renaming " + tmp + " failed: " + errno_text());
  fsync_path(fs::path(path).parent_path().string(), true);
}

// 64-bit hash of a byte range: splitmix64 finalizer over 8-byte little-endian words, then the length.
std::uint64_t hash_bytes(const void* data, std::size_t n) {
  const unsigned char* p = static_cast<const unsigned char*>(data);
  std::uint64_t h = 0x6a09e667f3bcc908ULL;
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    std::uint64_t w;
    std::memcpy(&w, p + i, 8);
    h = mix64(h ^ w);
  }
  std::uint64_t tail = 0;
  for (std::size_t j = 0; i + j < n; ++j) tail |= static_cast<std::uint64_t>(p[i + j]) << (8 * j);
  return mix64(mix64(h ^ tail) ^ static_cast<std::uint64_t>(n));
}

std::string hex64(std::uint64_t v) {
  char b[17];
  std::snprintf(b, sizeof b, "%016llx", static_cast<unsigned long long>(v));
  return b;
}

std::string step_name(int step) { return "step-" + std::to_string(step); }
std::string shard_name(int rank) {
  char b[40];
  std::snprintf(b, sizeof b, "rank-%05d.safetensors", rank);
  return b;
}

const char* const kKinds[3] = {"param", "exp_avg", "exp_avg_sq"};
std::string piece_key(const std::string& tensor, int kind) {
  return kind == 0 ? tensor : std::string("optimizer.") + kKinds[kind] + "." + tensor;
}

template <class T>
const char* dtype_name() {
  return sizeof(T) == 4 ? "F32" : "F64";
}

// ---- crash points (test hook) --------------------------------------------------------------------

const std::vector<std::string> kCrashPoints = {"shard",          "shard-fsync", "gathered", "manifest",
                                               "manifest-fsync", "renamed",     "latest-tmp", "latest",
                                               "pruned"};

struct CrashHook {
  int step = -1, rank = -1, k = 1;
  bool fail = false;  // MESHRUN_CKPT_FAIL: throw (an I/O error) instead of SIGKILL
  std::string point;
  std::map<std::string, int> hits;
  bool active(int s, int r) const { return step == s && rank == r; }
  void at(int s, int r, const std::string& name) {
    if (!active(s, r) || name != point) return;
    if (++hits[name] != k) return;
    if (fail) throw CheckpointError("MESHRUN_CKPT_FAIL: injected write failure at " + name);
    std::fprintf(stderr, "meshrun-train: MESHRUN_CKPT_KILL: rank %d raises SIGKILL in the save of step %d at %s #%d\n", r,
                 s, name.c_str(), k);
    std::fflush(stderr);
    std::raise(SIGKILL);
  }
};

CrashHook crash_hook() {
  CrashHook h;
  const char* v = std::getenv("MESHRUN_CKPT_KILL");
  if (!v || !*v) {
    v = std::getenv("MESHRUN_CKPT_FAIL");
    h.fail = true;
  }
  if (!v || !*v) return h;
  std::stringstream ss(v);
  std::string part;
  std::vector<std::string> f;
  while (std::getline(ss, part, ':')) f.push_back(part);
  if (f.size() < 3 || std::find(kCrashPoints.begin(), kCrashPoints.end(), f[2]) == kCrashPoints.end())
    throw CheckpointError(std::string("MESHRUN_CKPT_KILL = \"") + v + "\": expected STEP:RANK:POINT[:K] with POINT one of "
                          "shard, shard-fsync, gathered, manifest, manifest-fsync, renamed, latest-tmp, latest, pruned");
  h.step = std::stoi(f[0]);
  h.rank = std::stoi(f[1]);
  h.point = f[2];
  if (f.size() > 3) h.k = std::stoi(f[3]);
  return h;
}

// ---- what a rank holds ---------------------------------------------------------------------------

struct Piece {
  int unit = 0;
  const TensorSlot* slot = nullptr;
  std::int64_t a = 0, b = 0;    // flat range in the slot's local block (row-major)
  std::int64_t region = 0;      // offset of element a in the rank's shard region of the unit
};

template <class T>
std::vector<Piece> held_pieces(Trainer<T>& tr) {
  std::vector<Piece> out;
  ParamStore<T>& st = tr.store();
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

// ---- manifest ------------------------------------------------------------------------------------

json layout_json(const Layout& l, const JobConfig& cfg) {
  return json{{"tp", l.tp},
              {"cp", l.cp},
              {"pp", l.pp},
              {"dp", l.dp},
              {"ep", l.ep},
              {"virtual_stages", l.virtual_stages},
              {"zero_stage", l.zero_stage},
              {"sequence_parallel", l.sequence_parallel},
              {"order", l.order.str()},
              {"pipeline_schedule", cfg.parallel.pipeline_schedule},
              {"micro_batch_size", cfg.training.micro_batch_size},
              {"world", l.world()}};
}

// The settings a resumed run must share with the saved one, as (section, key, value).
json must_match(const JobConfig& c, std::int64_t data_tokens) {
  const ModelSpec& m = c.model;
  const TrainingSpec& t = c.training;
  return json{{"model",
               {{"layers", m.layers},
                {"hidden", m.hidden},
                {"ffn_hidden", m.ffn_hidden},
                {"heads", m.heads},
                {"kv_heads", m.kv_heads},
                {"vocab", m.vocab},
                {"mlp", m.mlp},
                {"tied_embeddings", m.tied_embeddings},
                {"experts", m.experts},
                {"rope_theta", m.rope_theta},
                {"norm_eps", m.norm_eps}}},
              {"training",
               {{"dtype", t.dtype},
                {"seq_len", t.seq_len},
                {"global_batch_size", t.global_batch_size},
                {"steps", t.steps},
                {"lr", t.lr},
                {"min_lr", t.min_lr},
                {"warmup_steps", t.warmup_steps},
                {"weight_decay", t.weight_decay},
                {"beta1", t.beta1},
                {"beta2", t.beta2},
                {"adam_eps", t.adam_eps},
                {"grad_clip", t.grad_clip},
                {"seed", t.seed}}},
              {"data", {{"shuffle", c.data.shuffle}, {"token_dtype", c.data.token_dtype}, {"tokens", data_tokens}}}};
}

json read_json_file(const std::string& path) {
  if (!std::ifstream(path)) throw CheckpointError("cannot read " + path + "; the checkpoint directory is incomplete");
  // A manifest is a few KiB per rank; a larger file is not one. read_bounded_file sizes its buffer from the
  // file, so a resume does not allocate the limit.
  constexpr size_t kMaxManifest = size_t(256) << 20;
  std::string text, error;
  if (!read_bounded_file(path, kMaxManifest, "checkpoint manifest", &text, &error))
    throw CheckpointError(error + "; the checkpoint is damaged: remove it or point latest at an older step");
  try {
    return parse_json_bounded<CheckpointError>(text, path);
  } catch (const CheckpointError& e) {
    throw CheckpointError(std::string(e.what()) + "; the checkpoint is damaged: remove it or point latest at an older step");
  }
}

// A field of the manifest, with a one-line error naming it when it is missing or of the wrong type.
// Integers must be integers in range (never a float truncated or a large value wrapped).
template <class V>
V field(const json& j, const std::string& key, const std::string& where, const std::string& file) {
  if (!j.is_object() || !j.contains(key))
    throw CheckpointError(file + ": " + where + key + " is missing; the manifest is damaged or from another tool");
  const json& v = j.at(key);
  auto wrong = [&] { return CheckpointError(file + ": " + where + key + " has the wrong type (" + json_snippet(v) + ")"); };
  if constexpr (std::is_same_v<V, int> || std::is_same_v<V, std::int64_t>) {
    const auto n = json_int(v, std::numeric_limits<V>::min(), std::numeric_limits<V>::max());
    if (!n) throw wrong();
    return static_cast<V>(*n);
  } else if constexpr (std::is_same_v<V, std::vector<std::int64_t>>) {
    if (!v.is_array()) throw wrong();
    V out;
    for (const json& x : v) {
      const auto n = json_int(x, std::numeric_limits<std::int64_t>::min());
      if (!n) throw wrong();
      out.push_back(*n);
    }
    return out;
  } else {
    try {
      return v.get<V>();
    } catch (const json::exception&) {
      throw wrong();
    }
  }
}

// ---- shard reading -------------------------------------------------------------------------------

struct ShardEntry {
  std::string dtype;
  std::vector<std::int64_t> shape;
  std::uint64_t begin = 0, end = 0;
};

class ShardReader {
 public:
  ShardReader(const std::string& path, std::int64_t expected_bytes, const std::string& first_tensor) : path_(path) {
    fd_ = ::open(path.c_str(), O_RDONLY);
    if (fd_ < 0) throw CheckpointError(path + ": cannot open shard (" + errno_text() + "); the checkpoint is incomplete");
    struct stat sb{};
    ::fstat(fd_, &sb);
    size_ = static_cast<std::int64_t>(sb.st_size);
    auto wrong_size = [&](const std::string& tensor) {
      return CheckpointError(path + ": tensor " + tensor + ": the shard has " + std::to_string(size_) +
                             " bytes but the manifest records " + std::to_string(expected_bytes) +
                             (size_ < expected_bytes ? ": the shard is truncated" : ": the shard was replaced") +
                             "; restore it or resume from an older step");
    };
    if (size_ != expected_bytes && size_ < 8) throw wrong_size(first_tensor);
    unsigned char len[8];
    if (::pread(fd_, len, 8, 0) != 8) throw CheckpointError(path + ": tensor " + first_tensor + ": no safetensors header");
    std::uint64_t n = 0;
    for (int b = 7; b >= 0; --b) n = (n << 8) | len[b];
    if (n > static_cast<std::uint64_t>(size_ - 8)) {
      if (size_ != expected_bytes) throw wrong_size(first_tensor);
      throw CheckpointError(path + ": tensor " + first_tensor + ": the safetensors header runs past the end of the file");
    }
    std::string header(static_cast<std::size_t>(n), '\0');
    if (::pread(fd_, header.data(), n, 8) != static_cast<ssize_t>(n)) throw CheckpointError(path + ": cannot read the header");
    payload_ = 8 + n;
    // Checked against the size the manifest records, so a truncated shard still names its lost tensor below.
    const std::uint64_t payload_bytes = static_cast<std::uint64_t>(std::max(expected_bytes, size_)) - payload_;
    try {
      const SafetensorsHeader parsed = parse_safetensors_header(header, payload_bytes, path);
      for (const auto& [k, t] : parsed.tensors) entries_[k] = ShardEntry{t.dtype, t.shape, t.begin, t.end};
    } catch (const SafetensorsError& e) {
      throw CheckpointError(std::string(e.what()) + "; restore the shard or resume from an older step");
    }
    if (size_ != expected_bytes) {  // name the first tensor whose bytes are gone (or the first one)
      std::string tensor = first_tensor;
      std::uint64_t first_end = ~0ULL;
      for (const auto& [k, e] : entries_)
        if (payload_ + e.end > static_cast<std::uint64_t>(size_) && e.begin < first_end) {
          first_end = e.begin;
          tensor = k;
        }
      throw wrong_size(tensor);
    }
  }
  ~ShardReader() {
    if (fd_ >= 0) ::close(fd_);
  }
  ShardReader(const ShardReader&) = delete;
  ShardReader& operator=(const ShardReader&) = delete;

  // The bytes of piece `key`, checked against the manifest's dtype, element count and hash.
  std::string read(const std::string& key, const std::string& dtype, std::int64_t numel, const std::string& hash) const {
    auto it = entries_.find(key);
    if (it == entries_.end()) throw CheckpointError(path_ + ": tensor " + key + " is listed in the manifest but missing from the shard");
    const ShardEntry& e = it->second;
    const std::size_t es = dtype == "F64" ? 8 : 4;
    if (e.dtype != dtype || e.shape != std::vector<std::int64_t>{numel} || e.end < e.begin ||
        e.end - e.begin != static_cast<std::uint64_t>(numel) * es)
      throw CheckpointError(path_ + ": tensor " + key + ": header says " + e.dtype + " " + shape_text(e.shape) +
                            " but the manifest records " + dtype + " [" + std::to_string(numel) + "]");
    if (payload_ + e.end > static_cast<std::uint64_t>(size_))
      throw CheckpointError(path_ + ": tensor " + key + ": payload truncated");
    std::string bytes(e.end - e.begin, '\0');
    if (::pread(fd_, bytes.data(), bytes.size(), static_cast<off_t>(payload_ + e.begin)) != static_cast<ssize_t>(bytes.size()))
      throw CheckpointError(path_ + ": tensor " + key + ": short read");
    if (hex64(hash_bytes(bytes.data(), bytes.size())) != hash)
      throw CheckpointError(path_ + ": tensor " + key + ": contents do not match the manifest's hash (the shard was modified or damaged); restore it or resume from an older step");
    return bytes;
  }

 private:
  std::string path_;
  int fd_ = -1;
  std::int64_t size_ = 0;
  std::uint64_t payload_ = 0;
  std::map<std::string, ShardEntry> entries_;
};

// One piece as the manifest describes it.
struct ManifestPiece {
  std::string tensor, key, hash;
  int kind = 0;
  std::int64_t row0 = 0, col0 = 0, rows = 0, cols = 0, a = 0, b = 0;
};
struct ManifestFile {
  std::string name;
  std::int64_t bytes = 0;
  std::vector<ManifestPiece> pieces;
};

struct Manifest {
  std::string path, file;  // directory, manifest.json
  json root;
  int step = 0;
  std::string dtype;
  std::map<std::string, std::vector<std::int64_t>> shapes;
  std::vector<std::string> order;  // tensor names as listed
  std::vector<ManifestFile> files;
};

Manifest read_manifest(const std::string& path) {
  Manifest m;
  m.path = path;
  m.file = (fs::path(path) / "manifest.json").string();
  m.root = read_json_file(m.file);
  const json& r = m.root;
  if (field<std::string>(r, "format", "", m.file) != "meshrun-checkpoint")
    throw CheckpointError(m.file + ": format is not \"meshrun-checkpoint\"; this is not a meshrun checkpoint");
  const int version = field<int>(r, "version", "", m.file);
  if (version != kCheckpointFormatVersion)
    throw CheckpointError(m.file + ": format version " + std::to_string(version) + ", this meshrun-train reads version " +
                          std::to_string(kCheckpointFormatVersion));
  m.step = field<int>(r, "step", "", m.file);
  m.dtype = field<std::string>(r, "dtype", "", m.file);
  if (m.dtype != "F32" && m.dtype != "F64") throw CheckpointError(m.file + ": dtype \"" + m.dtype + "\" is not F32 or F64");
  for (const json& t : field<json>(r, "tensors", "", m.file)) {
    const std::string name = field<std::string>(t, "name", "tensors[].", m.file);
    const auto shape = field<std::vector<std::int64_t>>(t, "shape", "tensor " + name + ": ", m.file);
    // Dimensions below 2^31 keep every element index and slice product far inside int64.
    if (shape.empty() || shape.size() > 2 || std::any_of(shape.begin(), shape.end(), [](std::int64_t d) { return d < 1 || d >= (std::int64_t{1} << 31); }))
      throw CheckpointError(m.file + ": tensor " + name + ": shape " + shape_text(shape) + " is not 1 or 2 dimensions in [1, 2^31)");
    m.shapes[name] = shape;
    m.order.push_back(name);
  }
  for (const json& f : field<json>(r, "files", "", m.file)) {
    ManifestFile mf;
    mf.name = field<std::string>(f, "file", "files[].", m.file);
    if (mf.name.find('/') != std::string::npos || mf.name.empty() || mf.name[0] == '.')
      throw CheckpointError(m.file + ": shard file name \"" + mf.name + "\" is not a plain file name");
    mf.bytes = field<std::int64_t>(f, "bytes", mf.name + ": ", m.file);
    for (const json& p : field<json>(f, "pieces", mf.name + ": ", m.file)) {
      ManifestPiece mp;
      const std::string w = mf.name + ": piece ";
      mp.tensor = field<std::string>(p, "tensor", w, m.file);
      const std::string kind = field<std::string>(p, "kind", w + mp.tensor + " ", m.file);
      mp.kind = kind == "param" ? 0 : kind == "exp_avg" ? 1 : kind == "exp_avg_sq" ? 2 : -1;
      if (mp.kind < 0) throw CheckpointError(m.file + ": " + mf.name + ": tensor " + mp.tensor + ": unknown kind \"" + kind + "\"");
      mp.key = field<std::string>(p, "key", w + mp.tensor + " ", m.file);
      mp.hash = field<std::string>(p, "hash", w + mp.tensor + " ", m.file);
      const auto block = field<std::vector<std::int64_t>>(p, "block", w + mp.tensor + " ", m.file);
      const auto range = field<std::vector<std::int64_t>>(p, "range", w + mp.tensor + " ", m.file);
      auto it = m.shapes.find(mp.tensor);
      if (block.size() != 4 || range.size() != 2 || it == m.shapes.end())
        throw CheckpointError(m.file + ": " + mf.name + ": tensor " + mp.tensor + ": bad block/range or tensor not in \"tensors\"");
      mp.row0 = block[0];
      mp.col0 = block[1];
      mp.rows = block[2];
      mp.cols = block[3];
      mp.a = range[0];
      mp.b = range[1];
      const std::int64_t R = it->second.at(0), C = it->second.size() > 1 ? it->second[1] : 1;
      if (mp.row0 < 0 || mp.col0 < 0 || mp.rows <= 0 || mp.cols <= 0 || mp.rows > R - mp.row0 || mp.cols > C - mp.col0 ||
          mp.a < 0 || mp.b <= mp.a || mp.b > mp.rows * mp.cols)
        throw CheckpointError(m.file + ": " + mf.name + ": tensor " + mp.tensor + ": slice lies outside the tensor's shape " +
                              shape_text(it->second));
      mf.pieces.push_back(std::move(mp));
    }
    m.files.push_back(std::move(mf));
  }
  return m;
}

// Copies the part of piece p (values `src`) that falls into the destination block [r0, r0+lr) × [c0, c0+lc)
// of its tensor into dst (row-major block), marking `seen`; an element seen twice is an error.
template <class T>
void scatter_piece(const ManifestPiece& p, const T* src, std::int64_t r0, std::int64_t c0, std::int64_t lr,
                   std::int64_t lc, T* dst, std::uint8_t* seen, const std::string& file) {
  for (std::int64_t i = p.a; i < p.b;) {
    const std::int64_t r = i / p.cols, c = i % p.cols;
    const std::int64_t end = std::min(p.b, (r + 1) * p.cols);  // this row's segment [i, end)
    const std::int64_t gr = p.row0 + r;
    if (gr >= r0 && gr < r0 + lr) {
      const std::int64_t g_lo = std::max(p.col0 + c, c0), g_hi = std::min(p.col0 + c + (end - i), c0 + lc);
      for (std::int64_t gc = g_lo; gc < g_hi; ++gc) {
        const std::int64_t d = (gr - r0) * lc + (gc - c0);
        if (seen[d]) throw CheckpointError(file + ": tensor " + p.key + ": an element is held by two pieces; the manifest is damaged");
        seen[d] = 1;
        dst[d] = src[(i - p.a) + (gc - (p.col0 + c))];
      }
    }
    i = end;
  }
}

bool overlaps(const ManifestPiece& p, std::int64_t r0, std::int64_t c0, std::int64_t lr, std::int64_t lc) {
  const std::int64_t first_row = p.row0 + p.a / p.cols, last_row = p.row0 + (p.b - 1) / p.cols;
  return first_row < r0 + lr && last_row >= r0 && p.col0 < c0 + lc && p.col0 + p.cols > c0;
}

template <class T>
std::vector<T> decode(const std::string& bytes) {
  std::vector<T> v(bytes.size() / sizeof(T));
  std::memcpy(v.data(), bytes.data(), v.size() * sizeof(T));
  return v;
}

void check_settings(const Manifest& m, const JobConfig& cfg, std::int64_t data_tokens) {
  const json want = must_match(cfg, data_tokens);
  for (const auto& [section, keys] : want.items()) {
    const json& have = field<json>(m.root, section, "", m.file);
    for (const auto& [key, v] : keys.items()) {
      if (section == "data" && key == "tokens" && v.get<std::int64_t>() < 0) continue;
      const json& saved = field<json>(have, key, section + ".", m.file);
      if (saved != v) {
        const std::string name = section == "data" && key == "tokens" ? "the token file's length (data.path)" : section + "." + key;
        throw CheckpointError(m.file + ": " + name + " = " + saved.dump() + " in the checkpoint but " + v.dump() +
                              " in this run; resume with the saved value or use another checkpoint.dir");
      }
    }
  }
}

}  // namespace

std::vector<std::string> crash_point_names() { return kCrashPoints; }

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

CheckpointInfo read_checkpoint_info(const std::string& path) {
  const Manifest m = read_manifest(path);
  CheckpointInfo info;
  info.path = path;
  info.step = m.step;
  info.consumed_samples = field<std::int64_t>(m.root, "consumed_samples", "", m.file);
  info.dtype = m.dtype;
  const json& l = field<json>(m.root, "layout", "", m.file);
  info.layout.tp = field<int>(l, "tp", "layout.", m.file);
  info.layout.cp = field<int>(l, "cp", "layout.", m.file);
  info.layout.pp = field<int>(l, "pp", "layout.", m.file);
  info.layout.dp = field<int>(l, "dp", "layout.", m.file);
  info.layout.ep = field<int>(l, "ep", "layout.", m.file);
  info.layout.virtual_stages = field<int>(l, "virtual_stages", "layout.", m.file);
  info.layout.zero_stage = field<int>(l, "zero_stage", "layout.", m.file);
  info.layout.sequence_parallel = field<bool>(l, "sequence_parallel", "layout.", m.file);
  char b[256];
  std::snprintf(b, sizeof b, "tp=%d cp=%d pp=%d dp=%d ep=%d virtual_stages=%d zero=%d sp=%s order=%s",
                info.layout.tp, info.layout.cp, info.layout.pp, info.layout.dp, info.layout.ep,
                info.layout.virtual_stages, info.layout.zero_stage, info.layout.sequence_parallel ? "on" : "off",
                field<std::string>(l, "order", "layout.", m.file).c_str());
  info.layout_text = b;
  for (const std::string& n : m.order) info.tensors.emplace_back(n, m.shapes.at(n));
  info.files = static_cast<int>(m.files.size());
  return info;
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
  ParamStore<T>& st = tr.store();
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
      const T* regions[3] = {st.param_region(p.unit), st.exp_avg_region(p.unit), st.exp_avg_sq_region(p.unit)};
      for (int k = 0; k < 3; ++k) {
        const T* src = regions[k] + p.region;
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
    if (!outcome[0].empty()) throw CheckpointError("checkpoint of step " + std::to_string(step) + " not saved: " + outcome[0]);
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

  ParamStore<T>& st = tr.store();
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
        if (!reader) reader = std::make_unique<ShardReader>(fpath, f.bytes, p.key);
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

namespace {
// Tensor `name` (kind k) in its global shape from the shards of a parsed manifest; readers are cached.
template <class T>
std::vector<T> global_tensor(const Manifest& m, const std::string& name, int k,
                             std::map<std::string, std::unique_ptr<ShardReader>>& readers) {
  auto it = m.shapes.find(name);
  if (it == m.shapes.end()) throw CheckpointError(m.file + ": no tensor " + name);
  const std::int64_t R = it->second.at(0), C = it->second.size() > 1 ? it->second[1] : 1;
  std::vector<T> out(static_cast<std::size_t>(R * C));
  std::vector<std::uint8_t> seen(out.size(), 0);
  for (const ManifestFile& f : m.files) {
    const std::string fpath = (fs::path(m.path) / f.name).string();
    for (const ManifestPiece& p : f.pieces) {
      if (p.tensor != name || p.kind != k) continue;
      auto& reader = readers[f.name];
      if (!reader) reader = std::make_unique<ShardReader>(fpath, f.bytes, p.key);
      const std::vector<T> vals = decode<T>(reader->read(p.key, m.dtype, p.b - p.a, p.hash));
      scatter_piece(p, vals.data(), 0, 0, R, C, out.data(), seen.data(), fpath);
    }
  }
  const auto have = std::count(seen.begin(), seen.end(), 1);
  if (have != static_cast<std::int64_t>(out.size()))
    throw CheckpointError(m.file + ": tensor " + piece_key(name, k) + ": the shards hold " + std::to_string(have) + " of " +
                          std::to_string(out.size()) + " elements; the checkpoint is incomplete");
  return out;
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
  std::map<std::string, std::unique_ptr<ShardReader>> readers;
  return global_tensor<T>(m, name, kind_index(kind), readers);
}

std::int64_t verify_checkpoint(const std::string& path) {
  const Manifest m = read_manifest(path);
  std::int64_t n = 0;
  for (const ManifestFile& f : m.files) {
    const ShardReader reader((fs::path(path) / f.name).string(), f.bytes, f.pieces.empty() ? "-" : f.pieces[0].key);
    for (const ManifestPiece& p : f.pieces) {
      (void)reader.read(p.key, m.dtype, p.b - p.a, p.hash);
      ++n;
    }
  }
  // Every element of every tensor, of every kind, is held exactly once.
  for (const auto& [name, shape] : m.shapes) {
    const std::int64_t numel = shape.at(0) * (shape.size() > 1 ? shape[1] : 1);
    for (int k = 0; k < 3; ++k) {
      std::int64_t have = 0;
      for (const ManifestFile& f : m.files)
        for (const ManifestPiece& p : f.pieces)
          if (p.tensor == name && p.kind == k) have += p.b - p.a;
      if (have != numel)
        throw CheckpointError(m.file + ": tensor " + piece_key(name, k) + ": the pieces hold " + std::to_string(have) + " of " +
                              std::to_string(numel) + " elements; the checkpoint is incomplete");
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
    for (const std::string& name : m.order) {  // one tensor in memory at a time
      if (es == 8) {
        const std::vector<double> v = global_tensor<double>(m, name, 0, readers);
        write_all(fd, v.data(), v.size() * 8, tmp);
      } else {
        const std::vector<float> v = global_tensor<float>(m, name, 0, readers);
        write_all(fd, v.data(), v.size() * 4, tmp);
      }
    }
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

template SaveResult save_checkpoint<float>(Trainer<float>&, const std::string&, int, int, std::int64_t);
template SaveResult save_checkpoint<double>(Trainer<double>&, const std::string&, int, int, std::int64_t);
template int load_checkpoint<float>(Trainer<float>&, const std::string&, std::int64_t);
template int load_checkpoint<double>(Trainer<double>&, const std::string&, std::int64_t);
template std::vector<float> read_global_tensor<float>(const std::string&, const std::string&, const std::string&);
template std::vector<double> read_global_tensor<double>(const std::string&, const std::string&, const std::string&);

}  // namespace meshrun::train
