// POSIX file helpers of the sharded checkpoints: writes that fsync and rename, reads that loop, and the
// piece hashes (XXH3-64, and the legacy splitmix64 hash of checkpoints written before the manifest named one).
// Internal to src/checkpoint/; failures are CheckpointErrors naming the path.
#pragma once
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <sys/types.h>

namespace meshrun::train::ckpt {

std::string errno_text();

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

void write_all(int fd, const void* data, std::size_t n, const std::string& path);
void fsync_path(const std::string& path, bool directory);

// Writes `bytes` to `path` (temporary name, fsync, rename, fsync of the directory).
void write_file_atomic(const std::string& path, const std::string& bytes);

// Reads exactly n bytes at `offset` (looping on short reads and EINTR); a read error or the end of the file
// first throws CheckpointError(path + ": tensor " + what + ": ...").
void pread_all(int fd, void* dst, std::size_t n, off_t offset, const std::string& path, const std::string& what);

// The hash of each piece's bytes, as the manifest's top-level "piece_hash" names it: "xxh3-64" (XXH3 64-bit,
// seed 0, libxxhash), written by every save; a manifest without the field predates it and holds legacy hashes.
enum class PieceHash { legacy_splitmix64, xxh3_64 };
inline constexpr const char* kPieceHashField = "piece_hash";
inline constexpr const char* kPieceHashXxh3 = "xxh3-64";
std::uint64_t hash_bytes_xxh3(const void* data, std::size_t n);
// The legacy piece hash: splitmix64 finalizer over 8-byte little-endian words, then the length.
std::uint64_t hash_bytes_legacy_splitmix64(const void* data, std::size_t n);

// A piece hash over bytes that arrive in parts of any length.
class PieceHasher {
 public:
  explicit PieceHasher(PieceHash algo);
  ~PieceHasher();
  PieceHasher(const PieceHasher&) = delete;
  PieceHasher& operator=(const PieceHasher&) = delete;
  void update(const void* data, std::size_t n);
  std::uint64_t digest() const;

 private:
  PieceHash algo_;
  void* xxh_ = nullptr;       // XXH3_state_t*
  std::uint64_t h_ = 0, n_ = 0;  // legacy: running state and length
  unsigned char pend_[8] = {};   // legacy: bytes of a word not yet complete (npend_ of them)
  int npend_ = 0;
};

std::string hex64(std::uint64_t v);

}  // namespace meshrun::train::ckpt
