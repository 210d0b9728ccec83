// Token files, the batch schedule and byte-level tokenization.
#include <catch2/catch.hpp>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "meshrun/train/data/data.hpp"

using namespace meshrun::train;
namespace fs = std::filesystem;

namespace {
struct TempDir {
  fs::path p = fs::temp_directory_path() / ("meshrun-data-" + std::to_string(::getpid()));
  TempDir() { fs::create_directories(p); }
  ~TempDir() { fs::remove_all(p); }
  std::string file(const std::string& name) const { return (p / name).string(); }
};
void write_u16(const std::string& path, const std::vector<std::uint16_t>& v) {
  std::ofstream os(path, std::ios::binary);
  os.write(reinterpret_cast<const char*>(v.data()), std::streamsize(v.size() * 2));
}
std::vector<std::uint16_t> iota16(int n, int mod) {
  std::vector<std::uint16_t> v(n);
  for (int i = 0; i < n; ++i) v[i] = std::uint16_t(i % mod);
  return v;
}
}  // namespace

TEST_CASE("missing, empty, ragged, too-short and out-of-vocabulary token files are clear errors", "[trainer][data]") {
  TempDir d;
  CHECK_THROWS_WITH(TokenFile(d.file("nope.bin"), "uint16", 256, 8, 4), Catch::Contains("nope.bin") && Catch::Contains("meshrun-tokenize"));
  write_u16(d.file("empty.bin"), {});
  CHECK_THROWS_WITH(TokenFile(d.file("empty.bin"), "uint16", 256, 8, 4), Catch::Contains("empty"));
  { std::ofstream(d.file("odd.bin"), std::ios::binary) << "abc"; }
  CHECK_THROWS_WITH(TokenFile(d.file("odd.bin"), "uint16", 256, 8, 4), Catch::Contains("not a multiple of 2"));
  write_u16(d.file("short.bin"), iota16(32, 256));  // one batch needs 4·8 + 1 = 33
  CHECK_THROWS_WITH(TokenFile(d.file("short.bin"), "uint16", 256, 8, 4), Catch::Contains("33"));
  write_u16(d.file("big.bin"), iota16(300, 300));
  CHECK_THROWS_WITH(TokenFile(d.file("big.bin"), "uint16", 256, 8, 4), Catch::Contains("token 256 has id 256"));
  CHECK_THROWS_WITH(TokenFile(d.file("big.bin"), "int8", 256, 8, 4), Catch::Contains("uint16"));
  CHECK_NOTHROW(TokenFile(d.file("big.bin"), "uint16", 300, 8, 4));
}

TEST_CASE("a uint32 id >= 2^31 is refused, not read back as a negative int32", "[trainer][data]") {
  TempDir d;
  // The audit's reproducer without its first (selector) byte: ids 1, 0xffffff01, 255.
  const std::string bytes("\x01\x00\x00\x00\x01\xff\xff\xff\xff\x00\x00\x00", 12);
  { std::ofstream(d.file("neg.bin"), std::ios::binary) << bytes; }
  CHECK_THROWS_WITH(TokenFile(d.file("neg.bin"), "uint32", 256, 1, 2),
                    Catch::Contains("neg.bin") && Catch::Contains("token 1 has id 4294967041 >= model.vocab (256)"));
  // The largest vocabulary whose ids fit an int32 still reads the id back unchanged.
  const std::string top("\x00\x00\x00\x00\xff\xff\xff\x7f\x05\x00\x00\x00", 12);
  { std::ofstream(d.file("top.bin"), std::ios::binary) << top; }
  const TokenFile f(d.file("top.bin"), "uint32", std::int64_t{1} << 31, 1, 2);
  CHECK(f.at(1) == 0x7fffffff);
  CHECK_THROWS_WITH(TokenFile(d.file("top.bin"), "uint32", (std::int64_t{1} << 31) + 1, 1, 2), Catch::Contains("2^31"));
  CHECK_THROWS_WITH(TokenFile(d.file("top.bin"), "uint32", 0, 1, 2), Catch::Contains("model.vocab = 0"));
}

TEST_CASE("unshuffled sequence i of step s starts at token (s·B + i)·S", "[trainer][data]") {
  TempDir d;
  write_u16(d.file("t.bin"), iota16(1000, 1000));
  const TokenFile f(d.file("t.bin"), "uint16", 1000, 8, 4);
  const BatchSchedule b(f, 8, 4, false, 1);
  std::vector<std::int32_t> ids(8), tgt(8);
  b.sequence(2 * 4 + 3, ids.data(), tgt.data());  // step 2, sequence 3
  CHECK(ids[0] == (2 * 4 + 3) * 8);
  CHECK(tgt[0] == ids[0] + 1);
  CHECK(tgt[7] == ids[0] + 8);  // S + 1 tokens per sequence
  CHECK(f.windows() == (1000 - 1) / 8);
  CHECK(b.window_start(f.windows()) == 0);  // wraps after one pass
}

TEST_CASE("uint32 token files", "[trainer][data]") {
  TempDir d;
  std::vector<std::uint32_t> v(50);
  for (int i = 0; i < 50; ++i) v[i] = 70000 + i;
  { std::ofstream os(d.file("w.bin"), std::ios::binary); os.write(reinterpret_cast<const char*>(v.data()), 200); }
  const TokenFile f(d.file("w.bin"), "uint32", 80000, 4, 2);
  CHECK(f.at(3) == 70003);
}

TEST_CASE("shuffled schedule visits every window once per epoch, reproducibly", "[trainer][data]") {
  TempDir d;
  write_u16(d.file("t.bin"), iota16(801, 1000));
  const TokenFile f(d.file("t.bin"), "uint16", 1000, 8, 4);
  const BatchSchedule a(f, 8, 4, true, 5), b(f, 8, 4, true, 5), c(f, 8, 4, true, 6);
  std::set<std::int64_t> seen;
  bool differs = false, moved = false;
  for (std::int64_t i = 0; i < f.windows(); ++i) {
    seen.insert(a.window_start(i));
    CHECK(a.window_start(i) == b.window_start(i));
    differs = differs || a.window_start(i) != c.window_start(i);
    moved = moved || a.window_start(i) != i * 8;
  }
  CHECK(seen.size() == std::size_t(f.windows()));
  CHECK(differs);
  CHECK(moved);
}

TEST_CASE("byte-level tokenizer: files and directories, one token per byte", "[trainer][data]") {
  TempDir d;
  fs::create_directories(d.p / "corpus");
  { std::ofstream(d.file("corpus/b.txt")) << "é!"; }  // 2 bytes of UTF-8 + 1
  { std::ofstream(d.file("corpus/a.txt")) << "hi"; }
  const auto n = tokenize_bytes({d.file("corpus")}, d.file("out.bin"), "uint16");
  CHECK(n == 5);
  const TokenFile f(d.file("out.bin"), "uint16", 256, 2, 2);
  CHECK(f.at(0) == 'h');  // a.txt first (sorted)
  CHECK(f.at(2) == 0xC3);
  CHECK(f.at(4) == '!');
  { std::ofstream(d.file("empty.txt")); }
  CHECK_THROWS_WITH(tokenize_bytes({d.file("empty.txt")}, d.file("x.bin"), "uint16"), Catch::Contains("no bytes"));
  CHECK_THROWS_WITH(tokenize_bytes({d.file("missing.txt")}, d.file("x.bin"), "uint16"), Catch::Contains("missing.txt"));
}
