// Safetensors: save, load, identical bits; broken files fail with a message naming the tensor.
#include <catch2/catch.hpp>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "fixture.hpp"
#include "meshrun/train/safetensors.hpp"
#include "meshrun/train/trainer.hpp"

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
