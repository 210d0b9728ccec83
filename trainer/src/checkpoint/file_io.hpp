// POSIX file helpers of the sharded checkpoints: writes that fsync and rename, and the piece hash.
// Internal to src/checkpoint/; failures are CheckpointErrors naming the path.
#pragma once
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <string>

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

// 64-bit hash of a byte range: splitmix64 finalizer over 8-byte little-endian words, then the length.
std::uint64_t hash_bytes(const void* data, std::size_t n);
std::string hex64(std::uint64_t v);

}  // namespace meshrun::train::ckpt
