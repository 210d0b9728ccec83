// The checkpoint format (internal to src/checkpoint/): names of the files in DIR/step-N, the manifest
// (what it records, parsing it with one-line errors), reading and checking shard pieces, and placing a
// piece's values into a block of its tensor.
#pragma once
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "meshrun/job.hpp"
#include "file_io.hpp"
#include "read_ahead.hpp"
#include "meshrun/train/checkpoint/checkpoint.hpp"

namespace meshrun::train::ckpt {

std::string step_name(int step);  // step-N
std::string shard_name(int rank); // rank-RRRRR.safetensors

// Piece kinds: k = 0 parameters, 1 and 2 the AdamW moments.
inline constexpr const char* kKinds[3] = {"param", "exp_avg", "exp_avg_sq"};
std::string piece_key(const std::string& tensor, int kind);  // the piece's name in its shard

template <class T>
const char* dtype_name() {
  return sizeof(T) == 4 ? "F32" : "F64";
}

nlohmann::json layout_json(const Layout& l, const JobConfig& cfg);

// The settings a resumed run must share with the saved one, as (section, key, value).
nlohmann::json must_match(const JobConfig& c, const DataIdentity& data);

// One piece as the manifest describes it.
struct ManifestPiece {
  std::string tensor, key, hash;
  int kind = 0;
  std::int64_t row0 = 0, col0 = 0, rows = 0, cols = 0, a = 0, b = 0;
};
struct ManifestFile {
  std::string name;
  std::int64_t bytes = 0;
  int rank = 0;
  std::vector<ManifestPiece> pieces;
};

struct Manifest {
  std::string path, file;  // directory, manifest.json
  nlohmann::json root;
  int version = 0;
  int step = 0;
  std::string dtype;
  PieceHash piece_hash = PieceHash::legacy_splitmix64;  // "piece_hash"; absent: written before the field existed
  std::map<std::string, std::vector<std::int64_t>> shapes;
  std::vector<std::string> order;  // tensor names as listed
  std::vector<ManifestFile> files;
};

// Parses DIR/manifest.json, checking every field it uses and check_consistency (CheckpointError naming file
// and field). Resume, export and inspect --verify all open a checkpoint through it.
Manifest read_manifest(const std::string& path);

// The checks read_manifest ends with: manifest_hash, step against directory, consumed_samples and
// lr_schedule, the shard list, exact coverage of every tensor by the pieces.
void check_consistency(const Manifest& m);

// After a failed save of `step` (rank 0): removes what it wrote; `latest` and its checkpoint stay.
void discard_failed_save(const std::string& dir, int step);

// The manifest's own hash: over its canonical JSON text without the manifest_hash field.
std::string manifest_digest(nlohmann::json root);

// The model a checkpoint holds, from its manifest's "model" section (CheckpointError naming a missing or
// mistyped field); seq_len (when not null): the training.seq_len it was trained at.
ModelSpec manifest_model(const Manifest& m, int* seq_len = nullptr);

// The run's settings against the manifest's (CheckpointError naming the first that differs).
void check_settings(const Manifest& m, const JobConfig& cfg, const DataIdentity& data);

struct ShardEntry {
  std::string dtype;
  std::vector<std::int64_t> shape;
  std::uint64_t begin = 0, end = 0;
};

// A grow-only, uninitialized buffer (new T[n]: no zero fill), reused across pieces and units.
template <class T>
class GrowBuffer {
 public:
  T* get(std::size_t n) {
    if (n > cap_) {
      p_.reset(new T[n]);
      cap_ = n;
    }
    return p_.get();
  }

 private:
  std::unique_ptr<T[]> p_;
  std::size_t cap_ = 0;
};

// One shard file, opened once: its size checked against the manifest's and its safetensors header parsed.
class ShardReader {
 public:
  ShardReader(const std::string& path, std::int64_t expected_bytes, const std::string& first_tensor, PieceHash algo);
  ~ShardReader();
  ShardReader(const ShardReader&) = delete;
  ShardReader& operator=(const ShardReader&) = delete;

  // Reads piece `key` (numel values of `dtype`) straight into dst with pread, hashing the bytes as they
  // arrive; its header entry is checked against the manifest's dtype and element count, its bytes against
  // the manifest's hash (CheckpointError naming the file and the tensor).
  void read_into(const std::string& key, const std::string& dtype, std::int64_t numel, const std::string& hash, void* dst) const;
  // The same checks, the bytes streamed through a small reused buffer and dropped (meshrun-ckpt --verify).
  void verify(const std::string& key, const std::string& dtype, std::int64_t numel, const std::string& hash) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // Where piece `key` lies in the file (byte offset and length), its header entry checked as read_into does.
  std::pair<std::uint64_t, std::uint64_t> extent(const std::string& key, const std::string& dtype, std::int64_t numel) const;
  // From here on read_into takes the bytes from `ahead` (this shard is its file `index`), in its plan's order.
  void read_through(ReadAhead* ahead, int index) {
    ahead_ = ahead;
    ahead_index_ = index;
  }

 private:
  const ShardEntry& entry(const std::string& key, const std::string& dtype, std::int64_t numel) const;
  void read_checked(const std::string& key, const ShardEntry& e, const std::string& hash, char* dst) const;

  std::string path_;
  int fd_ = -1;
  std::int64_t size_ = 0;
  std::uint64_t payload_ = 0;
  PieceHash algo_;
  std::map<std::string, ShardEntry> entries_;
  std::map<std::string, std::string> metadata_;
  mutable GrowBuffer<char> chunk_;  // verify's buffer
  ReadAhead* ahead_ = nullptr;
  int ahead_index_ = -1;
};

// Opens shard f of manifest m and checks its header's step and rank against the manifest (format 2).
std::unique_ptr<ShardReader> open_shard(const Manifest& m, const ManifestFile& f);

// Copies the part of piece p (values `src`) that falls into the destination block [r0, r0+lr) × [c0, c0+lc)
// of its tensor into dst (row-major block); returns how many elements it placed.
template <class T>
std::int64_t scatter_piece(const ManifestPiece& p, const T* src, std::int64_t r0, std::int64_t c0, std::int64_t lr,
                           std::int64_t lc, T* dst) {
  std::int64_t placed = 0;
  for (std::int64_t i = p.a; i < p.b;) {
    const std::int64_t r = i / p.cols, c = i % p.cols;
    const std::int64_t end = std::min(p.b, (r + 1) * p.cols);  // this row's segment [i, end)
    const std::int64_t gr = p.row0 + r;
    if (gr >= r0 && gr < r0 + lr) {
      const std::int64_t g_lo = std::max(p.col0 + c, c0), g_hi = std::min(p.col0 + c + (end - i), c0 + lc);
      if (g_hi > g_lo) {
        std::memcpy(dst + (gr - r0) * lc + (g_lo - c0), src + (i - p.a) + (g_lo - (p.col0 + c)),
                    static_cast<std::size_t>(g_hi - g_lo) * sizeof(T));
        placed += g_hi - g_lo;
      }
    }
    i = end;
  }
  return placed;
}

bool overlaps(const ManifestPiece& p, std::int64_t r0, std::int64_t c0, std::int64_t lr, std::int64_t lc);

// Reads piece p into the destination block [r0, r0+lr) × [c0, c0+lc) (row-major at dst) and returns how many
// of the block's elements it placed: when the piece's elements are one contiguous run of the block (same
// columns, rows inside it) they are read straight into place; otherwise the whole piece is read into
// `staging` (its hash covers all of it) and its overlap copied. No element is placed twice: read_manifest
// proved that the pieces cover every tensor exactly once, so a count equal to the block's size is complete.
template <class T>
std::int64_t place_piece(const ShardReader& reader, const ManifestPiece& p, const std::string& dtype, std::int64_t r0,
                         std::int64_t c0, std::int64_t lr, std::int64_t lc, T* dst, GrowBuffer<T>& staging) {
  const std::int64_t first_row = p.row0 + p.a / p.cols, last_row = p.row0 + (p.b - 1) / p.cols, n = p.b - p.a;
  if (p.col0 == c0 && p.cols == lc && first_row >= r0 && last_row < r0 + lr) {
    reader.read_into(p.key, dtype, n, p.hash, dst + (p.row0 - r0) * lc + p.a);  // element i lands at (row0 - r0)·lc + i
    return n;
  }
  T* vals = staging.get(static_cast<std::size_t>(n));
  reader.read_into(p.key, dtype, n, p.hash, vals);
  return scatter_piece(p, vals, r0, c0, lr, lc, dst);
}

}  // namespace meshrun::train::ckpt
