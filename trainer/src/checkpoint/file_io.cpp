#include "file_io.hpp"

#include <fcntl.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "meshrun/train/checkpoint/checkpoint.hpp"
#include "meshrun/train/model/params.hpp"

namespace meshrun::train::ckpt {

namespace fs = std::filesystem;

std::string errno_text() { return std::strerror(errno); }

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

}  // namespace meshrun::train::ckpt
