// Safetensors: save, load, identical bits; broken files fail with a message naming the tensor.
#include <catch2/catch.hpp>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "fixture.hpp"
#include "meshrun/train/checkpoint/safetensors.hpp"
#include "meshrun/train/run/trainer.hpp"

using namespace meshrun;
using namespace meshrun::train;
namespace fs = std::filesystem;

namespace {
struct Tmp {
  fs::path dir = fs::temp_directory_path() / ("meshrun-st-" + std::to_string(::getpid()));
  Tmp() { fs::create_directories(dir); }
  ~Tmp() { fs::remove_all(dir); }
  std::string file(const std::string& n) const { return (dir / n).string(); }
};

Layout one_rank() { return Layout{}; }

// Rewrites `src` through write_safetensors with one tensor dropped or reshaped.
void rewrite(const std::string& src, const std::string& dst, const std::string& victim, bool drop) {
  const SafetensorsFile f(src);
  std::vector<std::vector<float>> keep;
  std::vector<TensorToWrite> out;
  for (const std::string& n : f.names()) {
    if (drop && n == victim) continue;
    const TensorEntry* e = f.find(n);
    keep.push_back(f.read<float>(n, e->shape));
    std::vector<std::int64_t> shape = e->shape;
    if (!drop && n == victim) std::swap(shape.front(), shape.back());
    out.push_back({n, "F32", shape, keep.back().data(), keep.back().size() * 4});
  }
  write_safetensors(dst, out, {});
}
}  // namespace

TEST_CASE("safetensors round trip: save, load, identical bits", "[trainer][safetensors]") {
  Tmp t;
  const JobConfig cfg = test::small_config("");
  const RankGrid grid(one_rank());
  Groups g1 = make_local_groups(), g2 = make_local_groups();
  Trainer<float> a(cfg, grid, 0, g1);
  a.init_params();
  a.save(t.file("a.safetensors"));

  JobConfig other = cfg;
  other.training.seed = cfg.training.seed + 1;
  Trainer<float> b(other, grid, 0, g2);
  b.init_params();
  const auto before = b.gather_params();
  const auto pa = a.gather_params();
  CHECK(std::memcmp(before[0].second.data(), pa[0].second.data(), 4) != 0);  // really different to start with
  b.load(t.file("a.safetensors"));
  const auto pb = b.gather_params();
  REQUIRE(pa.size() == pb.size());
  for (std::size_t i = 0; i < pa.size(); ++i) {
    INFO(pa[i].first);
    CHECK(pa[i].first == pb[i].first);
    CHECK(std::memcmp(pa[i].second.data(), pb[i].second.data(), pa[i].second.size() * 4) == 0);
  }
  // Standard layout: Hugging Face names, global shapes, F32.
  const SafetensorsFile f(t.file("a.safetensors"));
  const TensorEntry* q = f.find("model.layers.1.self_attn.q_proj.weight");
  REQUIRE(q != nullptr);
  CHECK(q->dtype == "F32");
  CHECK(q->shape == std::vector<std::int64_t>{32, 32});
  CHECK(f.find("lm_head.weight") != nullptr);
  CHECK(f.metadata().at("format") == "pt");
}

TEST_CASE("loading a file with a missing tensor, a wrong shape or a truncated payload names the tensor",
          "[trainer][safetensors]") {
  Tmp t;
  const JobConfig cfg = test::small_config("");
  const RankGrid grid(one_rank());
  Groups g = make_local_groups();
  Trainer<float> a(cfg, grid, 0, g);
  a.init_params();
  a.save(t.file("ok.safetensors"));

  const std::string k = "model.layers.0.self_attn.k_proj.weight";
  rewrite(t.file("ok.safetensors"), t.file("missing.safetensors"), k, true);
  CHECK_THROWS_WITH(a.load(t.file("missing.safetensors")), Catch::Contains(k) && Catch::Contains("missing"));

  rewrite(t.file("ok.safetensors"), t.file("shape.safetensors"), k, false);
  CHECK_THROWS_WITH(a.load(t.file("shape.safetensors")), Catch::Contains(k) && Catch::Contains("[32, 16]"));

  // Truncate: the last tensor in payload order loses its tail.
  const auto size = fs::file_size(t.file("ok.safetensors"));
  fs::copy_file(t.file("ok.safetensors"), t.file("trunc.safetensors"));
  fs::resize_file(t.file("trunc.safetensors"), size - 10);
  const SafetensorsFile intact(t.file("ok.safetensors"));
  std::string last;
  std::uint64_t end = 0;
  for (const std::string& n : intact.names())
    if (intact.find(n)->end > end) { end = intact.find(n)->end; last = n; }
  CHECK_THROWS_WITH(SafetensorsFile(t.file("trunc.safetensors")), Catch::Contains(last) && Catch::Contains("truncated"));
  CHECK_THROWS_AS(a.load(t.file("trunc.safetensors")), SafetensorsError);

  { std::ofstream(t.file("junk.safetensors")) << "abc"; }
  CHECK_THROWS_WITH(SafetensorsFile(t.file("junk.safetensors")), Catch::Contains("truncated"));
  CHECK_THROWS_WITH(SafetensorsFile(t.file("none.safetensors")), Catch::Contains("no such file"));
}

TEST_CASE("BF16 tensors (released checkpoints) load as their float values", "[trainer][safetensors]") {
  Tmp t;
  const std::uint16_t bf[3] = {0x3F80, 0xC000, 0x3E80};  // 1.0, -2.0, 0.25
  write_safetensors(t.file("bf.safetensors"), {{"w", "BF16", {3}, bf, sizeof bf}}, {});
  const SafetensorsFile f(t.file("bf.safetensors"));
  CHECK(f.read<double>("w", {3}) == std::vector<double>{1.0, -2.0, 0.25});
  CHECK_THROWS_WITH(f.read<float>("w", {4}), Catch::Contains("w has shape [3]"));
}

namespace {
// A safetensors file's bytes: the 8-byte little-endian header length, the header, the payload.
std::string st_bytes(const std::string& header, std::size_t payload = 0) {
  std::string b(8, '\0');
  for (int i = 0; i < 8; ++i) b[i] = static_cast<char>((header.size() >> (8 * i)) & 0xff);
  return b + header + std::string(payload, '\0');
}
std::string entry(const std::string& dtype, const std::string& shape, const std::string& offsets) {
  return R"({"w":{"dtype":")" + dtype + R"(","shape":)" + shape + R"(,"data_offsets":)" + offsets + "}}";
}
// What a file with this header and payload size throws (empty: it loads).
std::string error_of(const std::string& header, std::size_t payload = 0) {
  try {
    SafetensorsFile(st_bytes(header, payload), "t.safetensors");
  } catch (const SafetensorsError& e) {
    return e.what();
  }
  return "";
}
}  // namespace

TEST_CASE("hostile safetensors headers: the reader's own located error, nothing else escapes", "[trainer][safetensors]") {
  // The audit's reproducer, byte for byte: std::stoll used to escape as std::invalid_argument.
  const std::string repro("6\x00\x00\x00\x00\x00\x00\x00{\"w\":{\"dtype\":\"F32\",\"shape\":[-],\"data_offsets\":[0,0]}}", 62);
  CHECK_THROWS_WITH(SafetensorsFile(repro, "r.safetensors"), Catch::Contains("r.safetensors: safetensors header: malformed JSON"));
  CHECK(error_of(entry("F32", "[2,3]", "[0,24]"), 24).empty());  // the control: a valid one loads
  CHECK(error_of(entry("F32", "[]", "[0,4]"), 4).empty());        // a scalar
  CHECK(error_of(entry("F32", "[0,5]", "[0,0]")).empty());        // an empty tensor
  // Products that overflowed or wrapped past the size check.
  CHECK_THAT(error_of(entry("F32", "[4294967296,4294967296]", "[0,0]")), Catch::Contains("tensor w: shape") && Catch::Contains("more than 2^64 bytes"));
  CHECK_THAT(error_of(entry("F32", "[4611686018427387905]", "[0,4]"), 4), Catch::Contains("more than 2^64 bytes"));
  CHECK_THAT(error_of(entry("F32", "[18446744073709551615]", "[0,4]"), 4), Catch::Contains("not a non-negative integer"));
  // Negative, fractional, string and overflowing dimensions and offsets.
  for (const char* shape : {"[-1,-4]", "[1.0]", "[2e0]", "[\"4\"]", "[true]", "[99999999999999999999]", "3"}) {
    INFO(shape);
    CHECK_THAT(error_of(entry("F32", shape, "[0,16]"), 16), Catch::Contains("t.safetensors: tensor w: shape"));
  }
  for (const char* off : {"[0,-4]", "[-4,0]", "[0]", "[0,4,8]", "[0,4.0]", "{}", "[0,18446744073709551616]"}) {
    INFO(off);
    CHECK_THAT(error_of(entry("F32", "[1]", off), 4), Catch::Contains("tensor w: data_offsets"));
  }
  CHECK_THAT(error_of(entry("F32", "[1]", "[4,0]"), 4), Catch::Contains("end before they begin"));
  // Size checks: an unknown dtype is refused (it used to skip the check), the span must equal the size.
  CHECK_THAT(error_of(entry("X9", "[1000]", "[0,0]")), Catch::Contains("tensor w: unknown dtype \"X9\""));
  CHECK_THAT(error_of(entry("F32", "[2]", "[0,4]"), 4), Catch::Contains("4 bytes do not hold F32 [2] (8 bytes)"));
  CHECK_THAT(error_of(entry("F32", "[1]", "[0,4]"), 2), Catch::Contains("payload truncated"));
  // Spans must tile the payload: overlap, hole, trailing bytes.
  CHECK_THAT(error_of(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", 8),
             Catch::Contains("overlaps at payload byte 4"));
  CHECK_THAT(error_of(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})", 12),
             Catch::Contains("leaves a hole at payload byte 4"));
  CHECK_THAT(error_of(entry("F32", "[1]", "[0,4]"), 6), Catch::Contains("2 payload bytes after the last tensor"));
  // Structure: not an object, entries lacking fields, metadata values that are not strings.
  CHECK_THAT(error_of("[1,2]"), Catch::Contains("header is not a JSON object"));
  CHECK_THAT(error_of(R"({"w":{"dtype":"F32","shape":[1]}})", 4), Catch::Contains("lacks dtype, shape or data_offsets"));
  CHECK_THAT(error_of(R"({"w":7})"), Catch::Contains("lacks dtype, shape or data_offsets"));
  CHECK_THAT(error_of(R"({"w":{"dtype":5,"shape":[1],"data_offsets":[0,4]}})", 4), Catch::Contains("dtype is 5, not a string"));
  CHECK_THAT(error_of(R"({"__metadata__":{"k":1}})"), Catch::Contains("__metadata__.k is 1, not a string"));
  CHECK_THAT(error_of("{\"w\":\"\xff\"}"), Catch::Contains("malformed JSON"));  // not UTF-8
}

TEST_CASE("a deeply nested safetensors header is refused at the depth limit, not by a stack overflow", "[trainer][safetensors]") {
  // The audit's case: {"w": then 200,000 '[' (the old recursive parser overflowed the stack).
  const std::string deep = "{\"w\":" + std::string(200000, '[') + std::string(200000, ']') + "}";
  CHECK_THAT(error_of(deep), Catch::Contains("t.safetensors: safetensors header: JSON nested deeper than 32 levels"));
  CHECK_THAT(error_of("{\"w\":" + std::string(200000, '[')), Catch::Contains("nested deeper than 32 levels"));
  // 32 levels parse (and fail later, on the meaning); 33 do not.
  CHECK_THAT(error_of("{\"w\":" + std::string(31, '[') + std::string(31, ']') + "}"), Catch::Contains("lacks dtype"));
  CHECK_THAT(error_of("{\"w\":" + std::string(32, '[') + std::string(32, ']') + "}"), Catch::Contains("nested deeper"));
}
