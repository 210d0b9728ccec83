#include "file_io.hpp"

#include <fcntl.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include <xxhash.h>

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

void pread_all(int fd, void* dst, std::size_t n, off_t offset, const std::string& path, const std::string& what) {
  char* p = static_cast<char*>(dst);
  while (n > 0) {
    const ssize_t r = ::pread(fd, p, n, offset);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) throw CheckpointError(path + ": tensor " + what + ": read failed (" + errno_text() + ")");
    if (r == 0) throw CheckpointError(path + ": tensor " + what + ": the shard ends early (short read); restore it or resume from an older step");
    p += r;
    offset += r;
    n -= static_cast<std::size_t>(r);
  }
}

std::uint64_t hash_bytes_xxh3(const void* data, std::size_t n) { return XXH3_64bits(data, n); }

namespace {
std::uint64_t legacy_words(std::uint64_t h, const unsigned char* p, std::size_t n) {
  for (std::size_t i = 0; i + 8 <= n; i += 8) {
    std::uint64_t w;
    std::memcpy(&w, p + i, 8);
    h = mix64(h ^ w);
  }
  return h;
}
std::uint64_t legacy_tail(const unsigned char* p, std::size_t n) {  // n < 8 bytes, little-endian
  std::uint64_t tail = 0;
  for (std::size_t j = 0; j < n; ++j) tail |= static_cast<std::uint64_t>(p[j]) << (8 * j);
  return tail;
}
constexpr std::uint64_t kLegacySeed = 0x6a09e667f3bcc908ULL;
}  // namespace

std::uint64_t hash_bytes_legacy_splitmix64(const void* data, std::size_t n) {
  const unsigned char* p = static_cast<const unsigned char*>(data);
  const std::uint64_t h = legacy_words(kLegacySeed, p, n);
  const std::size_t full = n & ~std::size_t{7};
  return mix64(mix64(h ^ legacy_tail(p + full, n - full)) ^ static_cast<std::uint64_t>(n));
}

PieceHasher::PieceHasher(PieceHash algo) : algo_(algo), h_(kLegacySeed) {
  if (algo_ == PieceHash::xxh3_64) {
    XXH3_state_t* s = XXH3_createState();
    if (s == nullptr || XXH3_64bits_reset(s) != XXH_OK) {
      XXH3_freeState(s);
      throw CheckpointError("cannot allocate an XXH3 hash state");
    }
    xxh_ = s;
  }
}

PieceHasher::~PieceHasher() { XXH3_freeState(static_cast<XXH3_state_t*>(xxh_)); }

void PieceHasher::update(const void* data, std::size_t n) {
  if (n == 0) return;
  if (algo_ == PieceHash::xxh3_64) {
    if (XXH3_64bits_update(static_cast<XXH3_state_t*>(xxh_), data, n) != XXH_OK) throw CheckpointError("XXH3 update failed");
    return;
  }
  const unsigned char* p = static_cast<const unsigned char*>(data);
  n_ += n;
  if (npend_ > 0) {  // complete the word a previous part began
    const std::size_t take = std::min<std::size_t>(8 - npend_, n);
    std::memcpy(pend_ + npend_, p, take);
    npend_ += static_cast<int>(take);
    p += take;
    n -= take;
    if (npend_ < 8) return;
    h_ = legacy_words(h_, pend_, 8);
    npend_ = 0;
  }
  h_ = legacy_words(h_, p, n);
  const std::size_t full = n & ~std::size_t{7};
  std::memcpy(pend_, p + full, n - full);
  npend_ = static_cast<int>(n - full);
}

std::uint64_t PieceHasher::digest() const {
  if (algo_ == PieceHash::xxh3_64) return XXH3_64bits_digest(static_cast<const XXH3_state_t*>(xxh_));
  return mix64(mix64(h_ ^ legacy_tail(pend_, static_cast<std::size_t>(npend_))) ^ n_);
}

std::string hex64(std::uint64_t v) {
  char b[17];
  std::snprintf(b, sizeof b, "%016llx", static_cast<unsigned long long>(v));
  return b;
}

}  // namespace meshrun::train::ckpt
