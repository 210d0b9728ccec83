// The format: file names, the manifest (written by the save, parsed with one-line errors by everything
// that reads a checkpoint) and shard reading with its size, header and hash checks.
#include "manifest.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <type_traits>

#include "file_io.hpp"
#include "json_read.hpp"
#include "meshrun/bounded_file.hpp"
#include "meshrun/train/checkpoint/safetensors.hpp"
#include "meshrun/train/run/trainer.hpp"

namespace meshrun::train {

namespace fs = std::filesystem;
using nlohmann::json;

namespace ckpt {

std::string step_name(int step) { return "step-" + std::to_string(step); }
std::string shard_name(int rank) {
  char b[40];
  std::snprintf(b, sizeof b, "rank-%05d.safetensors", rank);
  return b;
}

std::string piece_key(const std::string& tensor, int kind) {
  return kind == 0 ? tensor : std::string("optimizer.") + kKinds[kind] + "." + tensor;
}

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
json must_match(const JobConfig& c, const DataIdentity& data) {
  const ModelSpec& m = c.model;
  json blend = json::array();  // empty for one dataset
  for (const DataIdentity::Entry& e : data.blend) {
    json entry{{"weight", e.weight}, {"tokens", e.tokens}};
    if (e.documents >= 0) entry["documents"] = e.documents;
    blend.push_back(std::move(entry));
  }
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
                {"top_k", m.top_k},
                {"moe_ffn_hidden", m.moe_ffn_hidden},
                {"router_aux", m.router_aux},
                {"router_aux_loss_coef", m.aux_loss_coef()},
                {"rope_theta", m.rope_theta},
                {"norm_eps", m.norm_eps}}},
              {"training",
               {{"dtype", t.dtype},
                {"seq_len", t.seq_len},
                {"global_batch_size", t.global_batch_size},
                {"lr_decay_steps", t.decay_horizon()},  // the schedule's horizon; training.steps may grow
                {"lr", t.lr},
                {"min_lr", t.min_lr},
                {"warmup_steps", t.warmup_steps},
                {"weight_decay", t.weight_decay},
                {"beta1", t.beta1},
                {"beta2", t.beta2},
                {"adam_eps", t.adam_eps},
                {"grad_clip", t.grad_clip},
                {"seed", t.seed}}},
              {"data",
               {{"shuffle", c.data.shuffle}, {"token_dtype", c.data.token_dtype}, {"tokens", data.tokens}, {"blend", blend}}}};
}

namespace {

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

// The saved schedule's horizon: training.lr_decay_steps, or training.steps in manifests written before it existed.
int saved_decay_horizon(const json& training, const std::string& file) {
  return training.contains("lr_decay_steps") ? field<int>(training, "lr_decay_steps", "training.", file)
                                             : field<int>(training, "steps", "training.", file);
}

}  // namespace

std::string manifest_digest(json root) {
  root.erase("manifest_hash");
  const std::string text = root.dump();
  return hex64(hash_bytes_xxh3(text.data(), text.size()));
}

namespace {

// Every element of every tensor, of each kind, held by exactly one piece: the pieces become row segments
// [c0, c1) of global rows, sorted, and must tile each row of the tensor without overlap or hole. Costs the
// rows the pieces span (no per-element bitmap), so a 405B manifest is checked in well under a second.
void check_coverage(const Manifest& m) {
  struct Segment {
    std::int64_t row, c0, c1;
    const std::string* file;
  };
  std::map<std::pair<std::string, int>, std::vector<Segment>> segs;
  for (const ManifestFile& f : m.files)
    for (const ManifestPiece& p : f.pieces) {
      std::vector<Segment>& out = segs[{p.tensor, p.kind}];
      for (std::int64_t i = p.a; i < p.b;) {
        const std::int64_t r = i / p.cols, c = i % p.cols, end = std::min(p.b, (r + 1) * p.cols);
        out.push_back({p.row0 + r, p.col0 + c, p.col0 + c + (end - i), &f.name});
        i = end;
      }
    }
  for (const std::string& name : m.order) {
    const std::vector<std::int64_t>& shape = m.shapes.at(name);
    const std::int64_t R = shape[0], C = shape.size() > 1 ? shape[1] : 1;
    for (int k = 0; k < 3; ++k) {
      auto it = segs.find({name, k});
      if (it == segs.end())
        throw CheckpointError(m.file + ": tensor " + piece_key(name, k) + " has no piece in any shard; the checkpoint is incomplete");
      std::vector<Segment>& v = it->second;
      std::sort(v.begin(), v.end(), [](const Segment& x, const Segment& y) { return x.row != y.row ? x.row < y.row : x.c0 < y.c0; });
      std::int64_t row = 0, col = 0;  // the next element that must be covered
      for (const Segment& s : v) {
        if (s.row > row || (s.row == row && s.c0 > col))
          throw CheckpointError(m.file + ": tensor " + piece_key(name, k) + ": element [" + std::to_string(row) + ", " +
                                std::to_string(col) + "] is held by no piece; the checkpoint is incomplete or the manifest damaged");
        if (s.c0 < col || s.row < row)
          throw CheckpointError(m.file + ": tensor " + piece_key(name, k) + ": element [" + std::to_string(s.row) + ", " +
                                std::to_string(s.c0) + "] is held by two pieces (one in " + *s.file + "); the manifest is damaged");
        col = s.c1;
        if (col == C) {
          ++row;
          col = 0;
        }
      }
      if (row != R)
        throw CheckpointError(m.file + ": tensor " + piece_key(name, k) + ": element [" + std::to_string(row) + ", " +
                              std::to_string(col) + "] is held by no piece; the checkpoint is incomplete or the manifest damaged");
    }
  }
}

}  // namespace

// The manifest agrees with itself, its directory and its shards' list: its own hash (format 2), step against
// the step-N directory, consumed_samples and the learning-rate position against step, one shard per rank
// named after it, and exact coverage of every tensor. Run by everything that reads a checkpoint (resume,
// export, inspect --verify), so they accept and refuse the same directories.
void check_consistency(const Manifest& m) {
  const json& r = m.root;
  const std::string damaged = "; the manifest is damaged: restore it or resume from an older step";
  if (m.version >= 2) {
    const std::string want = field<std::string>(r, "manifest_hash", "", m.file);
    if (manifest_digest(r) != want)
      throw CheckpointError(m.file + ": the manifest's contents do not match its manifest_hash (it was edited or damaged)" + damaged);
  }
  if (m.step < 0) throw CheckpointError(m.file + ": step " + std::to_string(m.step) + " is negative" + damaged);
  fs::path norm = fs::path(m.path).lexically_normal();
  if (norm.filename().empty()) norm = norm.parent_path();  // "DIR/step-4/"
  const std::string dir = norm.filename().string();
  if (dir.rfind("step-", 0) == 0 && dir.size() > 5 && dir.find_first_not_of("0123456789", 5) == std::string::npos &&
      dir != step_name(m.step))
    throw CheckpointError(m.file + ": step " + std::to_string(m.step) + " does not match the directory " + dir + damaged);
  const json& training = field<json>(r, "training", "", m.file);
  TrainingSpec t;
  t.global_batch_size = field<int>(training, "global_batch_size", "training.", m.file);
  const std::int64_t consumed = field<std::int64_t>(r, "consumed_samples", "", m.file);
  if (consumed != static_cast<std::int64_t>(m.step) * t.global_batch_size)
    throw CheckpointError(m.file + ": consumed_samples = " + std::to_string(consumed) + " but step " + std::to_string(m.step) +
                          " × training.global_batch_size " + std::to_string(t.global_batch_size) + " = " +
                          std::to_string(static_cast<std::int64_t>(m.step) * t.global_batch_size) + damaged);
  if (m.version >= 2) {
    const json& s = field<json>(r, "lr_schedule", "", m.file);
    const int completed = field<int>(s, "completed_steps", "lr_schedule.", m.file);
    t.lr = field<double>(training, "lr", "training.", m.file);
    t.min_lr = field<double>(training, "min_lr", "training.", m.file);
    t.warmup_steps = field<int>(training, "warmup_steps", "training.", m.file);
    t.lr_decay_steps = saved_decay_horizon(training, m.file);
    const double next_lr = field<double>(s, "next_lr", "lr_schedule.", m.file);
    if (completed != m.step || next_lr != lr_at(t, m.step))
      throw CheckpointError(m.file + ": lr_schedule (completed_steps " + std::to_string(completed) +
                            ") does not agree with step " + std::to_string(m.step) + " and the training settings" + damaged);
  }
  std::vector<char> rank_seen(m.files.size(), 0);
  for (const ManifestFile& f : m.files) {
    if (f.rank < 0 || f.rank >= static_cast<int>(m.files.size()) || rank_seen[static_cast<std::size_t>(f.rank)] ||
        f.name != shard_name(f.rank))
      throw CheckpointError(m.file + ": shard " + f.name + " is listed as rank " + std::to_string(f.rank) + " of " +
                            std::to_string(m.files.size()) + " files; each rank's shard must be listed once under its name" + damaged);
    rank_seen[static_cast<std::size_t>(f.rank)] = 1;
  }
  check_coverage(m);
}

ShardReader::ShardReader(const std::string& path, std::int64_t expected_bytes, const std::string& first_tensor, PieceHash algo)
    : path_(path), algo_(algo) {
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) throw CheckpointError(path + ": cannot open shard (" + errno_text() + "); the checkpoint is incomplete");
  (void)::posix_fadvise(fd_, 0, 0, POSIX_FADV_SEQUENTIAL);  // pieces are read in file order: a larger readahead
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
    metadata_ = parsed.metadata;
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

std::unique_ptr<ShardReader> open_shard(const Manifest& m, const ManifestFile& f) {
  const std::string fpath = (fs::path(m.path) / f.name).string();
  auto reader = std::make_unique<ShardReader>(fpath, f.bytes, f.pieces.empty() ? "-" : f.pieces[0].key, m.piece_hash);
  if (m.version >= 2) {  // the shard's own record of what it is (safetensors __metadata__)
    const auto& md = reader->metadata();
    auto get = [&](const char* k) {
      auto it = md.find(k);
      return it == md.end() ? std::string("(none)") : it->second;
    };
    if (get("step") != std::to_string(m.step) || get("rank") != std::to_string(f.rank))
      throw CheckpointError(fpath + ": the shard says step " + get("step") + ", rank " + get("rank") + " but the manifest lists it as step " +
                            std::to_string(m.step) + ", rank " + std::to_string(f.rank) +
                            "; a shard of another save was copied here: restore it or resume from an older step");
  }
  return reader;
}

ShardReader::~ShardReader() {
  if (fd_ >= 0) ::close(fd_);
}

const ShardEntry& ShardReader::entry(const std::string& key, const std::string& dtype, std::int64_t numel) const {
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
  return e;
}

// Reads the piece into dst (from the read-ahead when there is one, else with pread in chunks), or through
// chunk_ when dst is null, hashing each part while it is still in cache.
void ShardReader::read_checked(const std::string& key, const ShardEntry& e, const std::string& hash, char* dst) const {
  constexpr std::uint64_t kChunk = std::uint64_t{2} << 20;
  const std::uint64_t total = e.end - e.begin;
  PieceHasher h(algo_);
  if (ahead_ != nullptr && dst != nullptr) {
    std::uint64_t done = 0;
    ahead_->consume(ahead_index_, payload_ + e.begin, total, key, [&](const char* part, std::size_t n) {
      std::memcpy(dst + done, part, n);
      h.update(part, n);
      done += n;
    });
  } else {
    char* buf = dst != nullptr ? nullptr : chunk_.get(static_cast<std::size_t>(std::min(total, kChunk)));
    for (std::uint64_t done = 0; done < total;) {
      const std::size_t n = static_cast<std::size_t>(std::min(kChunk, total - done));
      char* at = dst != nullptr ? dst + done : buf;
      pread_all(fd_, at, n, static_cast<off_t>(payload_ + e.begin + done), path_, key);
      h.update(at, n);
      done += n;
    }
  }
  if (hex64(h.digest()) != hash)
    throw CheckpointError(path_ + ": tensor " + key + ": contents do not match the manifest's hash (the shard was modified or damaged); restore it or resume from an older step");
}

std::pair<std::uint64_t, std::uint64_t> ShardReader::extent(const std::string& key, const std::string& dtype, std::int64_t numel) const {
  const ShardEntry& e = entry(key, dtype, numel);
  return {payload_ + e.begin, e.end - e.begin};
}

void ShardReader::read_into(const std::string& key, const std::string& dtype, std::int64_t numel, const std::string& hash,
                            void* dst) const {
  read_checked(key, entry(key, dtype, numel), hash, static_cast<char*>(dst));
}

void ShardReader::verify(const std::string& key, const std::string& dtype, std::int64_t numel, const std::string& hash) const {
  read_checked(key, entry(key, dtype, numel), hash, nullptr);
}

Manifest read_manifest(const std::string& path) {
  Manifest m;
  m.path = path;
  m.file = (fs::path(path) / "manifest.json").string();
  m.root = read_json_file(m.file);
  const json& r = m.root;
  if (field<std::string>(r, "format", "", m.file) != "meshrun-checkpoint")
    throw CheckpointError(m.file + ": format is not \"meshrun-checkpoint\"; this is not a meshrun checkpoint");
  m.version = field<int>(r, "version", "", m.file);
  if (m.version < 1 || m.version > kCheckpointFormatVersion)
    throw CheckpointError(m.file + ": format version " + std::to_string(m.version) + ", this meshrun-train reads versions 1 to " +
                          std::to_string(kCheckpointFormatVersion) + "; use the meshrun that wrote it");
  m.step = field<int>(r, "step", "", m.file);
  m.dtype = field<std::string>(r, "dtype", "", m.file);
  if (m.dtype != "F32" && m.dtype != "F64") throw CheckpointError(m.file + ": dtype \"" + m.dtype + "\" is not F32 or F64");
  if (r.contains(kPieceHashField)) {  // absent: a checkpoint written before the field, with legacy hashes
    const std::string algo = field<std::string>(r, kPieceHashField, "", m.file);
    if (algo != kPieceHashXxh3)
      throw CheckpointError(m.file + ": piece_hash \"" + algo + "\" is not a hash this meshrun-train knows (\"" + kPieceHashXxh3 + "\")");
    m.piece_hash = PieceHash::xxh3_64;
  }
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
    mf.rank = field<int>(f, "rank", mf.name + ": ", m.file);
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
  check_consistency(m);
  return m;
}

bool overlaps(const ManifestPiece& p, std::int64_t r0, std::int64_t c0, std::int64_t lr, std::int64_t lc) {
  const std::int64_t first_row = p.row0 + p.a / p.cols, last_row = p.row0 + (p.b - 1) / p.cols;
  return first_row < r0 + lr && last_row >= r0 && p.col0 < c0 + lc && p.col0 + p.cols > c0;
}

namespace {
// Model settings a manifest records since the Hugging Face export (which needs them); older manifests lack them.
bool added_later(const std::string& section, const std::string& key) {
  return (section == "model" && (key == "top_k" || key == "moe_ffn_hidden" || key == "router_aux_loss_coef" || key == "router_aux")) ||
         (section == "data" && key == "blend");
}

// The first difference between a saved data.blend record and this run's (must_match), in words.
std::string blend_difference(const json& saved, const json& now) {
  auto entries = [](const json& b) {
    return b.empty() ? std::string("one dataset (data.path)") : std::to_string(b.size()) + " entries";
  };
  auto get = [](const json& entry, const char* key) { return entry.is_object() && entry.contains(key) ? entry.at(key) : json(); };
  auto dataset = [&](const json& entry) {
    const json documents = get(entry, "documents");
    return json_snippet(get(entry, "tokens")) + " tokens, " +
           (documents.is_null() ? std::string("a raw token file") : json_snippet(documents) + " documents");
  };
  if (!saved.is_array() || saved.size() != now.size())
    return (saved.is_array() ? entries(saved) : json_snippet(saved)) + " in the checkpoint but " + entries(now) + " in this run";
  for (std::size_t i = 0; i < now.size(); ++i) {
    const std::string entry = "entry " + std::to_string(i);
    if (get(saved[i], "weight") != get(now[i], "weight"))
      return entry + "'s normalised weight = " + json_snippet(get(saved[i], "weight")) + " in the checkpoint but " +
             get(now[i], "weight").dump() + " in this run";
    if (saved[i] != now[i])
      return entry + "'s dataset = " + dataset(saved[i]) + " in the checkpoint but " + dataset(now[i]) + " in this run";
  }
  return "the entries differ";  // not reached: the arrays differ somewhere
}
}  // namespace

ModelSpec manifest_model(const Manifest& m, int* seq_len) {
  const json& j = field<json>(m.root, "model", "", m.file);
  ModelSpec s;
  s.layers = field<int>(j, "layers", "model.", m.file);
  s.hidden = field<int>(j, "hidden", "model.", m.file);
  s.ffn_hidden = field<int>(j, "ffn_hidden", "model.", m.file);
  s.heads = field<int>(j, "heads", "model.", m.file);
  s.kv_heads = field<int>(j, "kv_heads", "model.", m.file);
  s.vocab = field<std::int64_t>(j, "vocab", "model.", m.file);
  s.mlp = field<std::string>(j, "mlp", "model.", m.file);
  s.tied_embeddings = field<bool>(j, "tied_embeddings", "model.", m.file);
  s.experts = field<int>(j, "experts", "model.", m.file);
  s.rope_theta = field<double>(j, "rope_theta", "model.", m.file);
  s.norm_eps = field<double>(j, "norm_eps", "model.", m.file);
  if (s.experts > 0 && !j.contains("top_k"))
    throw CheckpointError(m.file + ": model.top_k is missing (a checkpoint written before meshrun recorded it); resume it "
                                   "once with this meshrun-train and save again");
  if (j.contains("top_k")) s.top_k = field<int>(j, "top_k", "model.", m.file);
  if (j.contains("moe_ffn_hidden")) s.moe_ffn_hidden = field<int>(j, "moe_ffn_hidden", "model.", m.file);
  if (j.contains("router_aux_loss_coef")) s.router_aux_loss_coef = field<double>(j, "router_aux_loss_coef", "model.", m.file);
  if (j.contains("router_aux")) s.router_aux = field<std::string>(j, "router_aux", "model.", m.file);
  if (seq_len) *seq_len = field<int>(field<json>(m.root, "training", "", m.file), "seq_len", "training.", m.file);
  return s;
}

void check_settings(const Manifest& m, const JobConfig& cfg, const DataIdentity& data) {
  const json want = must_match(cfg, data);
  for (const auto& [section, keys] : want.items()) {
    const json& have = field<json>(m.root, section, "", m.file);
    for (const auto& [key, v] : keys.items()) {
      if (section == "data" && key == "tokens" && v.get<std::int64_t>() < 0) continue;
      const bool horizon = section == "training" && key == "lr_decay_steps";
      if (!horizon && !have.contains(key) && added_later(section, key)) continue;  // a manifest written before the field
      const json saved = horizon ? json(saved_decay_horizon(have, m.file)) : field<json>(have, key, section + ".", m.file);
      if (saved != v) {
        if (section == "data" && key == "blend")
          throw CheckpointError(m.file + ": data.blend differs from the checkpoint's: " + blend_difference(saved, v) +
                                "; resume with the saved data.blend or use another checkpoint.dir");
        if (horizon)  // the schedule cannot change mid-run: an extended run needs the saved horizon or a planned one
          throw CheckpointError(m.file + ": the learning-rate schedule's horizon (training.lr_decay_steps, or training.steps "
                                "when unset) = " + saved.dump() + " in the checkpoint but " + v.dump() + " in this run; set "
                                "training.lr_decay_steps = " + saved.dump() + " to continue its schedule, or use another checkpoint.dir");
        const std::string name = section == "data" && key == "tokens" ? "the token file's length (data.path)" : section + "." + key;
        throw CheckpointError(m.file + ": " + name + " = " + saved.dump() + " in the checkpoint but " + v.dump() +
                              " in this run; resume with the saved value or use another checkpoint.dir");
      }
    }
  }
}

}  // namespace ckpt

using namespace ckpt;

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

}  // namespace meshrun::train
