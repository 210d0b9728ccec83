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
nlohmann::json must_match(const JobConfig& c, std::int64_t data_tokens);

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

// The run's settings against the manifest's (CheckpointError naming the first that differs).
void check_settings(const Manifest& m, const JobConfig& cfg, std::int64_t data_tokens);

struct ShardEntry {
  std::string dtype;
  std::vector<std::int64_t> shape;
  std::uint64_t begin = 0, end = 0;
};

// One shard file, opened once: its size checked against the manifest's and its safetensors header parsed.
class ShardReader {
 public:
  ShardReader(const std::string& path, std::int64_t expected_bytes, const std::string& first_tensor);
  ~ShardReader();
  ShardReader(const ShardReader&) = delete;
  ShardReader& operator=(const ShardReader&) = delete;

  // The bytes of piece `key`, checked against the manifest's dtype, element count and hash.
  std::string read(const std::string& key, const std::string& dtype, std::int64_t numel, const std::string& hash) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

 private:
  std::string path_;
  int fd_ = -1;
  std::int64_t size_ = 0;
  std::uint64_t payload_ = 0;
  std::map<std::string, ShardEntry> entries_;
  std::map<std::string, std::string> metadata_;
};

// Opens shard f of manifest m and checks its header's step and rank against the manifest (format 2).
std::unique_ptr<ShardReader> open_shard(const Manifest& m, const ManifestFile& f);

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

bool overlaps(const ManifestPiece& p, std::int64_t r0, std::int64_t c0, std::int64_t lr, std::int64_t lc);

template <class T>
std::vector<T> decode(const std::string& bytes) {
  std::vector<T> v(bytes.size() / sizeof(T));
  std::memcpy(v.data(), bytes.data(), v.size() * sizeof(T));
  return v;
}

}  // namespace meshrun::train::ckpt
