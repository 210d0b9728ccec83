// The checkpoint load's read-ahead (src/checkpoint/read_ahead.cpp) against the bytes of the files it reads:
// odd offsets and lengths, ranges across chunk boundaries, adjacent ranges read as one, gaps, two files in
// turn, a range before the previous one; O_DIRECT, buffered (pages already cached, or asked for), and a
// file system that refuses O_DIRECT;
// a truncated file, a read out of the plan's order, a load abandoned half way. And the piece hash fed in
// parts of any length (the read-ahead's parts end where its chunks do) equal to the hash of the whole.
#include <catch2/catch.hpp>
#include <fcntl.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "../../trainer/src/checkpoint/file_io.hpp"
#include "../../trainer/src/checkpoint/read_ahead.hpp"
#include "meshrun/train/checkpoint/checkpoint.hpp"

using namespace meshrun::train;
using ckpt::ReadAhead;
namespace fs = std::filesystem;

namespace {
struct Dir {
  fs::path dir;
  explicit Dir(const fs::path& under) : dir(under / ("meshrun-ra-" + std::to_string(::getpid()))) { fs::create_directories(dir); }
  ~Dir() { fs::remove_all(dir); }
};

std::string random_bytes(std::size_t n, unsigned seed) {
  std::mt19937_64 rng(seed);
  std::string s(n, '\0');
  for (char& c : s) c = static_cast<char>(rng());
  return s;
}

std::string write(const fs::path& p, const std::string& bytes) {
  std::ofstream(p, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  return p.string();
}

// Consumes every range of `plan` and checks each against the files' bytes.
void check_plan(const std::vector<std::string>& paths, const std::vector<std::string>& contents,
                const std::vector<ReadAhead::Range>& plan, bool direct, int* buffered = nullptr, int* cached_chunks = nullptr) {
  ReadAhead ra(paths, plan, direct);
  int parts = 0;
  for (const ReadAhead::Range& r : plan) {
    std::string got;
    ra.consume(r.file, r.offset, r.bytes, "t", [&](const char* p, std::size_t n) {
      got.append(p, n);
      ++parts;
    });
    REQUIRE(got.size() == r.bytes);
    REQUIRE(got == contents[static_cast<std::size_t>(r.file)].substr(r.offset, r.bytes));
  }
  CHECK(parts >= static_cast<int>(plan.size()) - 1);  // zero-length ranges have no part
  if (buffered) *buffered = ra.buffered_files();
  if (cached_chunks) *cached_chunks = ra.buffered_chunks();
}

// Writes the files' dirty pages and drops them from the page cache (the next read goes to the disk).
void drop_cache(const std::vector<std::string>& paths) {
  for (const std::string& p : paths) {
    const int fd = ::open(p.c_str(), O_RDONLY);
    REQUIRE(fd >= 0);
    REQUIRE(::fdatasync(fd) == 0);
    REQUIRE(::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED) == 0);
    ::close(fd);
  }
}

// A plan over two files: odd offsets, chunk-crossing and adjacent ranges, a gap, a switch of files, a
// range before the previous one, a zero-length range, and the files' last bytes.
std::vector<ReadAhead::Range> mixed_plan(std::uint64_t a, std::uint64_t b) {
  const std::uint64_t C = ReadAhead::kChunk;
  return {{0, 3, 5},           {0, 8, C + 17},       {0, C + 25, 2 * C},  // adjacent: one segment over 2 chunk edges
          {0, 3 * C + 4000, 12}, {1, 1, 4095},       {1, 4096, 1},        // a gap; file 1 at and across a block edge
          {0, 100, 10},         {0, 50, 10},         {0, 62, 3},          // backwards, again, a 2-byte gap
          {1, b - 9, 9},        {0, 200, 0},                              // the end of file 1; nothing
          {0, a - C - 5, C + 5}};                                         // the end of file 0, from mid-chunk
}
}  // namespace

TEST_CASE("read-ahead: every planned range's bytes, O_DIRECT and buffered", "[trainer][checkpoint]") {
  Dir d(fs::temp_directory_path());
  const std::uint64_t a = 3 * ReadAhead::kChunk + 12345, b = 3 * 4096 + 7;
  const std::vector<std::string> contents = {random_bytes(a, 1), random_bytes(b, 2)};
  const std::vector<std::string> paths = {write(d.dir / "a", contents[0]), write(d.dir / "b", contents[1])};
  int refused = -1, buffered_chunks = -1;
  check_plan(paths, contents, mixed_plan(a, b), true, &refused, &buffered_chunks);
  CHECK(buffered_chunks > 0);  // just written: the pages are in the page cache, read from there
  drop_cache(paths);
  check_plan(paths, contents, mixed_plan(a, b), true, &refused, &buffered_chunks);
  if (refused == 0) CHECK(buffered_chunks == 0);  // dropped: every chunk read with O_DIRECT
  check_plan(paths, contents, mixed_plan(a, b), false);
}

TEST_CASE("read-ahead: a file system that refuses O_DIRECT is read through the page cache", "[trainer][checkpoint]") {
  if (!fs::is_directory("/dev/shm")) {
    WARN("no /dev/shm: the O_DIRECT refusal is not exercised");
    return;
  }
  Dir d("/dev/shm");
  const std::uint64_t a = ReadAhead::kChunk + 999, b = 5000;
  const std::vector<std::string> contents = {random_bytes(a, 3), random_bytes(b, 4)};
  const std::vector<std::string> paths = {write(d.dir / "a", contents[0]), write(d.dir / "b", contents[1])};
  const int probe = ::open(paths[0].c_str(), O_RDONLY | O_DIRECT);  // does this file system take O_DIRECT?
  const bool refuses = probe < 0;
  if (probe >= 0) ::close(probe);
  int buffered = -1;
  check_plan(paths, contents, {{0, 7, a - 7}, {1, 0, b}, {0, 0, 7}}, true, &buffered);
  if (refuses) CHECK(buffered == 2);
}

TEST_CASE("read-ahead: a truncated file, a read off the plan, a load abandoned half way", "[trainer][checkpoint]") {
  Dir d(fs::temp_directory_path());
  const std::string bytes = random_bytes(2 * ReadAhead::kChunk, 5);
  const std::vector<std::string> paths = {write(d.dir / "a", bytes)};
  for (bool direct : {true, false}) {
    {  // the plan says the file is longer than it is
      ReadAhead ra(paths, {{0, 0, 10}, {0, ReadAhead::kChunk, ReadAhead::kChunk + 100}}, direct);
      ra.consume(0, 0, 10, "first", [](const char*, std::size_t) {});
      try {
        ra.consume(0, ReadAhead::kChunk, ReadAhead::kChunk + 100, "model.norm.weight", [](const char*, std::size_t) {});
        FAIL("a truncated file was read without an error");
      } catch (const CheckpointError& e) {
        const std::string msg = e.what();
        CHECK(msg.find(paths[0] + ": tensor model.norm.weight: the file ends at byte " + std::to_string(bytes.size())) == 0);
        CHECK(msg.find("truncated") != std::string::npos);
      }
    }
    {
      ReadAhead ra(paths, {{0, 0, 10}, {0, 20, 10}}, direct);
      CHECK_THROWS_AS(ra.consume(0, 20, 10, "x", [](const char*, std::size_t) {}), std::logic_error);
    }
    {  // many chunks planned, one consumed: the destructor stops the reader (the test would hang otherwise)
      std::vector<ReadAhead::Range> plan;
      for (int i = 0; i < 16; ++i) plan.push_back({0, static_cast<std::uint64_t>(i) * 4096, 4096});
      plan.push_back({0, 0, bytes.size()});
      ReadAhead ra(paths, plan, direct);
      ra.consume(0, 0, 4096, "x", [](const char*, std::size_t) {});
    }
  }
}

TEST_CASE("piece hash: parts of any length hash as the whole", "[trainer][checkpoint]") {
  const std::string bytes = random_bytes(100003, 6);
  std::mt19937 rng(7);
  for (auto algo : {ckpt::PieceHash::legacy_splitmix64, ckpt::PieceHash::xxh3_64}) {
    const std::uint64_t whole = algo == ckpt::PieceHash::xxh3_64 ? ckpt::hash_bytes_xxh3(bytes.data(), bytes.size())
                                                               : ckpt::hash_bytes_legacy_splitmix64(bytes.data(), bytes.size());
    for (int trial = 0; trial < 20; ++trial) {
      ckpt::PieceHasher h(algo);
      for (std::size_t at = 0; at < bytes.size();) {
        const std::size_t n = std::min<std::size_t>(bytes.size() - at, trial % 2 ? rng() % 13 : rng() % 9000);
        h.update(bytes.data() + at, n);
        at += n;
      }
      CHECK(h.digest() == whole);
    }
    ckpt::PieceHasher h(algo);  // and a hash that must differ: one byte changed
    std::string other = bytes;
    other[50001] ^= 1;
    h.update(other.data(), 3);
    h.update(other.data() + 3, other.size() - 3);
    CHECK(h.digest() != whole);
  }
}
