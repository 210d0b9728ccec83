// Megatron-LM indexed datasets (.bin/.idx): the bytes against the layout of indexed_dataset.py, the round
// trip, and one refusal per way a dataset can be broken.
#include <catch2/catch.hpp>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "meshrun/train/data/data.hpp"
#include "meshrun/train/data/indexed_dataset.hpp"

using namespace meshrun::train;
namespace fs = std::filesystem;

namespace {
struct TempDir {
  fs::path p = fs::temp_directory_path() / ("meshrun-idx-" + std::to_string(::getpid()));
  TempDir() { fs::create_directories(p); }
  ~TempDir() { fs::remove_all(p); }
  std::string prefix(const std::string& name) const { return (p / name).string(); }
};
std::vector<unsigned char> slurp(const std::string& path) {
  std::ifstream is(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(is), {}};
}
void spit(const std::string& path, const std::vector<unsigned char>& b) {
  std::ofstream os(path, std::ios::binary | std::ios::trunc);
  os.write(reinterpret_cast<const char*>(b.data()), std::streamsize(b.size()));
}
// Little-endian packing written out byte by byte, as Python's struct.pack("<...") does: independent of the
// writer's memcpy.
void le(std::vector<unsigned char>& out, std::uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<unsigned char>(v >> (8 * i)));
}
void write_docs(const std::string& prefix, int code, const std::vector<std::vector<std::uint32_t>>& docs) {
  IndexedDatasetWriter w(prefix, code);
  for (const auto& d : docs) w.add_document(d.data(), d.size());
  w.finish();
}
std::string error_of(const std::string& prefix) {
  try {
    IndexedDataset ds(prefix);
  } catch (const DataError& e) {
    return e.msg;
  }
  return "";
}
}  // namespace

TEST_CASE("indexed dataset: the .idx bytes follow Megatron's layout", "[data][indexed]") {
  TempDir t;
  const std::string p = t.prefix("a");
  write_docs(p, 8, {{5, 6, 7}, {}, {65535, 1}});
  std::vector<unsigned char> want = {'M', 'M', 'I', 'D', 'I', 'D', 'X', 0, 0};
  le(want, 1, 8);  // version
  le(want, 8, 1);  // uint16
  le(want, 3, 8);  // sequences
  le(want, 4, 8);  // document indices
  for (std::uint64_t len : {3, 0, 2}) le(want, len, 4);
  for (std::uint64_t ptr : {0, 6, 6}) le(want, ptr, 8);
  for (std::uint64_t d : {0, 1, 2, 3}) le(want, d, 8);
  CHECK(slurp(p + ".idx") == want);
  CHECK(slurp(p + ".bin") == std::vector<unsigned char>{5, 0, 6, 0, 7, 0, 0xFF, 0xFF, 1, 0});
  CHECK_FALSE(fs::exists(p + ".bin.tmp"));
  CHECK_FALSE(fs::exists(p + ".idx.tmp"));
}

TEST_CASE("indexed dataset: round trip in uint16 and int32, by prefix, .bin or .idx", "[data][indexed]") {
  TempDir t;
  for (int code : {8, 4}) {
    const std::string p = t.prefix("rt" + std::to_string(code));
    const std::uint32_t big = code == 4 ? 128255u : 65535u;
    const std::vector<std::vector<std::uint32_t>> docs = {{1, 2, 3, 0}, {big, 0}, {}, {9, 0}};
    write_docs(p, code, docs);
    for (const std::string& name : {p, p + ".bin", p + ".idx"}) {
      IndexedDataset ds(name);
      CHECK(ds.dtype_code() == code);
      CHECK(ds.sequences() == 4);
      CHECK(ds.documents() == 4);
      CHECK(ds.tokens() == 8);
      std::vector<std::uint32_t> flat;
      for (std::int64_t i = 0; i < ds.tokens(); ++i) flat.push_back(ds.token(i));
      CHECK(flat == std::vector<std::uint32_t>{1, 2, 3, 0, big, 0, 9, 0});
      CHECK(ds.sequence_start(1) == 4);
      CHECK(ds.sequence_length(1) == 2);
      CHECK(ds.sequence_start(3) == 6);
      CHECK(ds.sequence_length(2) == 0);
      CHECK_NOTHROW(ds.check_ids_below(big + 1));
      CHECK_THROWS_WITH(ds.check_ids_below(big), Catch::Contains("token 4 has id " + std::to_string(big) + " >= model.vocab"));
    }
  }
}

TEST_CASE("indexed dataset: writer refusals leave nothing behind", "[data][indexed]") {
  TempDir t;
  const std::string p = t.prefix("w");
  CHECK_THROWS_WITH(indexed_dtype_code("float32"), Catch::Contains("cannot be written"));
  CHECK(indexed_dtype_code("uint16") == 8);
  CHECK(indexed_dtype_code("uint32") == 4);
  CHECK_THROWS_WITH(IndexedDatasetWriter(p, 7), Catch::Contains("dtype code 7 cannot be written"));
  {
    IndexedDatasetWriter w(p, 8);
    const std::uint32_t ids[] = {1, 70000};
    CHECK_THROWS_WITH(w.add_document(ids, 2), Catch::Contains("does not fit uint16"));
    CHECK(fs::exists(p + ".bin.tmp"));
  }
  CHECK_FALSE(fs::exists(p + ".bin.tmp"));
  CHECK_FALSE(fs::exists(p + ".bin"));
  CHECK_FALSE(fs::exists(p + ".idx"));
}

TEST_CASE("indexed dataset: every broken dataset is one line naming what is wrong", "[data][indexed]") {
  TempDir t;
  const std::string p = t.prefix("good");
  write_docs(p, 8, {{1, 2, 3}, {4, 5}});
  const auto idx = slurp(p + ".idx"), bin = slurp(p + ".bin");
  REQUIRE(error_of(p).empty());
  auto variant = [&](const std::string& name, std::vector<unsigned char> i, std::vector<unsigned char> b) {
    const std::string q = t.prefix(name);
    spit(q + ".idx", i);
    spit(q + ".bin", b);
    return error_of(q);
  };
  auto poke = [](std::vector<unsigned char> v, std::size_t at, std::uint64_t value, int bytes) {
    for (int k = 0; k < bytes; ++k) v[at + k] = static_cast<unsigned char>(value >> (8 * k));
    return v;
  };
  CHECK_THAT(error_of(t.prefix("missing")), Catch::Contains("No such file") && Catch::Contains("meshrun-tokenize"));
  CHECK_THAT(variant("magic", poke(idx, 0, 'X', 1), bin), Catch::Contains("no MMIDIDX header"));
  CHECK_THAT(variant("version", poke(idx, 9, 2, 8), bin), Catch::Contains("index version 2 is not supported"));
  CHECK_THAT(variant("float", poke(idx, 17, 7, 1), bin), Catch::Contains("dtype code 7 is not an integer token type"));
  CHECK_THAT(variant("huge", poke(idx, 18, ~0ull, 8), bin), Catch::Contains("truncated: the header promises"));
  std::vector<unsigned char> cut(idx.begin(), idx.end() - 8);
  CHECK_THAT(variant("cut", cut, bin), Catch::Contains("truncated: the header promises 2 sequences and 3 document indices"));
  std::vector<unsigned char> longer = idx;
  longer.insert(longer.end(), 5, 0);
  CHECK_THAT(variant("long", longer, bin), Catch::Contains("where the header implies"));
  std::vector<unsigned char> modes = idx;
  modes.insert(modes.end(), {0, 0});
  CHECK_THAT(variant("modes", modes, bin), Catch::Contains("multimodal"));
  // Lengths at 34, pointers at 34 + 2·4, document indices at 34 + 2·12.
  CHECK_THAT(variant("gap", poke(idx, 42 + 8, 8, 8), bin), Catch::Contains("sequence 1 starts at byte 8, not right after"));
  CHECK_THAT(variant("neg", poke(idx, 34, 0xFFFFFFFFu, 4), bin), Catch::Contains("sequence 0 has a negative length"));
  CHECK_THAT(variant("docend", poke(idx, 58 + 16, 1, 8), bin), Catch::Contains("must run from 0 to the sequence count"));
  CHECK_THAT(variant("docdown", poke(idx, 58 + 8, 3, 8), bin), Catch::Contains("document index 2 decreases"));
  std::vector<unsigned char> short_bin(bin.begin(), bin.end() - 2);
  CHECK_THAT(variant("shortbin", idx, short_bin), Catch::Contains("truncated or mismatched"));
  CHECK_THAT(variant("int32", poke(idx, 17, 4, 1), bin), Catch::Contains("sequence 1 starts at byte 6, not right after the previous one (12)"));
}
