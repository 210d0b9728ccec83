// Sample sources (samples.hpp): Megatron's blending rule against a transcription of build_blending_indices,
// resume at any sample index, indexed datasets and blends as the trainer reads them, and their refusals.
#include <catch2/catch.hpp>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "meshrun/train/data/indexed_dataset.hpp"
#include "meshrun/train/data/samples.hpp"
#include "meshrun/train/model/params.hpp"

using namespace meshrun;
using namespace meshrun::train;
namespace fs = std::filesystem;

namespace {
struct TempDir {
  fs::path p = fs::temp_directory_path() / ("meshrun-samples-" + std::to_string(::getpid()));
  TempDir() { fs::create_directories(p); }
  ~TempDir() { fs::remove_all(p); }
  std::string file(const std::string& name) const { return (p / name).string(); }
};

// megatron/core/datasets/helpers.cpp, build_blending_indices, over the whole range at once (the reference).
void megatron_blending(const std::vector<double>& weights, std::int64_t size, std::vector<int>& dataset,
                       std::vector<std::int64_t>& sample) {
  std::vector<std::int64_t> current(weights.size(), 0);
  for (std::int64_t sample_idx = 0; sample_idx < size; ++sample_idx) {
    const double sample_idx_double = std::max(static_cast<double>(sample_idx), 1.0);
    std::size_t max_error_index = 0;
    double max_error = weights[0] * sample_idx_double - static_cast<double>(current[0]);
    for (std::size_t d = 1; d < weights.size(); ++d) {
      const double error = weights[d] * sample_idx_double - static_cast<double>(current[d]);
      if (error > max_error) max_error = error, max_error_index = d;
    }
    dataset.push_back(static_cast<int>(max_error_index));
    sample.push_back(current[max_error_index]);
    current[max_error_index] += 1;
  }
}

// Documents of ids base, base+1, ... (mod vocab), each followed by EOS = 0, as one indexed dataset.
void write_indexed(const std::string& prefix, int docs, int doc_len, std::uint32_t base, std::uint32_t vocab) {
  IndexedDatasetWriter w(prefix, 8);
  std::uint32_t next = base;
  for (int d = 0; d < docs; ++d) {
    std::vector<std::uint32_t> ids;
    for (int i = 0; i < doc_len; ++i) ids.push_back(1 + (next++ % (vocab - 1)));
    ids.push_back(0);
    w.add_document(ids.data(), ids.size());
  }
  w.finish();
}

void write_raw(const std::string& path, int n, std::uint16_t vocab) {
  std::vector<std::uint16_t> v(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) v[static_cast<std::size_t>(i)] = static_cast<std::uint16_t>((7 * i + 3) % vocab);
  std::ofstream os(path, std::ios::binary);
  os.write(reinterpret_cast<const char*>(v.data()), std::streamsize(v.size() * 2));
}

SampleSpec spec_of(std::vector<BlendEntry> datasets, bool shuffle = false) {
  SampleSpec s;
  s.datasets = std::move(datasets);
  s.vocab = 100;
  s.seq_len = 8;
  s.global_batch = 4;
  s.shuffle = shuffle;
  s.seed = 11;
  return s;
}

std::vector<std::int32_t> sample_ids(const SampleSource& src, std::int64_t index, std::int64_t S = 8) {
  std::vector<std::int32_t> pos(static_cast<std::size_t>(S)), ids(pos.size()), tgt(pos.size());
  for (std::int64_t i = 0; i < S; ++i) pos[static_cast<std::size_t>(i)] = static_cast<std::int32_t>(i);
  src.tokens(index, pos.data(), S, ids.data(), tgt.data());
  ids.push_back(tgt.back());  // S + 1 tokens
  return ids;
}

std::string error_of(const SampleSpec& s) {
  try {
    (void)open_samples(s);
  } catch (const DataError& e) {
    return e.msg;
  }
  return "";
}
}  // namespace

TEST_CASE("the blend index is Megatron's build_blending_indices, sample for sample", "[trainer][data][blend]") {
  for (const std::vector<double>& raw : {std::vector<double>{3, 5, 2}, std::vector<double>{0.7, 0.3},
                                         std::vector<double>{1, 0, 1e-3, 4}}) {
    double sum = 0;
    for (double w : raw) sum += w;
    std::vector<double> norm;
    for (double w : raw) norm.push_back(w / sum);
    const std::int64_t n = 3 * BlendIndex::kBlock + 17;
    std::vector<int> dataset;
    std::vector<std::int64_t> sample;
    megatron_blending(norm, n, dataset, sample);
    const BlendIndex index(raw);
    std::int64_t mismatches = 0;
    for (std::int64_t i = 0; i < n; ++i) {
      const auto [d, k] = index.locate(i);
      mismatches += d != dataset[static_cast<std::size_t>(i)] || k != sample[static_cast<std::size_t>(i)];
    }
    CHECK(mismatches == 0);
    // The realised shares follow the weights (within two samples: samples 0 and 1 both use max(i, 1) = 1).
    std::vector<std::int64_t> counts(raw.size(), 0);
    for (int d : dataset) ++counts[static_cast<std::size_t>(d)];
    for (std::size_t d = 0; d < raw.size(); ++d) CHECK(std::abs(double(counts[d]) - norm[d] * double(n)) <= 2.0);
  }
  // Equal weights alternate, starting with the first dataset (ties go to the lower index).
  const BlendIndex even({1, 1});
  CHECK(even.locate(0) == std::pair<int, std::int64_t>{0, 0});
  CHECK(even.locate(1) == std::pair<int, std::int64_t>{1, 0});
  CHECK(even.locate(2) == std::pair<int, std::int64_t>{0, 1});
  CHECK(even.locate(5) == std::pair<int, std::int64_t>{1, 2});
}

TEST_CASE("a resumed blend starts at sample N with the counts a run from 0 reached", "[trainer][data][blend]") {
  const std::vector<double> w{0.45, 0.35, 0.2};
  const std::int64_t start = 10 * BlendIndex::kBlock + 123;  // a resume mid-block
  const BlendIndex walked(w), resumed(w);
  for (std::int64_t i = 0; i < start; i += 997) (void)walked.locate(i);  // a run that went there step by step
  std::int64_t mismatches = 0;
  for (std::int64_t i = start; i < start + 2 * BlendIndex::kBlock; ++i) mismatches += walked.locate(i) != resumed.locate(i);
  CHECK(mismatches == 0);
  // Going back (a validation set read again, or a test) recomputes the block from its stored counts.
  std::vector<int> dataset;
  std::vector<std::int64_t> sample;
  megatron_blending({0.45, 0.35, 0.2}, 50, dataset, sample);
  CHECK(resumed.locate(49) == std::pair<int, std::int64_t>{dataset[49], sample[49]});
}

TEST_CASE("indexed datasets are recognised by their .idx; raw token files are not", "[trainer][data][blend]") {
  TempDir d;
  write_indexed(d.file("web"), 3, 20, 0, 100);
  write_raw(d.file("raw.bin"), 100, 100);
  CHECK(is_indexed_dataset(d.file("web")));
  CHECK(is_indexed_dataset(d.file("web.bin")));
  CHECK(is_indexed_dataset(d.file("web.idx")));
  CHECK_FALSE(is_indexed_dataset(d.file("raw.bin")));
  CHECK_FALSE(is_indexed_dataset(d.file("missing")));
}

TEST_CASE("one indexed dataset: windows of S + 1 tokens over its documents back to back", "[trainer][data][blend]") {
  TempDir d;
  write_indexed(d.file("web"), 5, 20, 0, 100);  // 5 documents of 20 ids + EOS = 105 tokens
  const IndexedDataset ds(d.file("web"));
  const auto src = open_samples(spec_of({{1.0, d.file("web.bin")}}));
  CHECK(src->total_tokens() == 105);
  for (std::int64_t index : {0, 1, 7, 12, 13, 30}) {  // 13 windows of 8 + 1: index 13 wraps to window 0
    const std::vector<std::int32_t> ids = sample_ids(*src, index);
    const std::int64_t start = (index % 13) * 8;
    for (std::int64_t t = 0; t <= 8; ++t) CHECK(ids[static_cast<std::size_t>(t)] == std::int32_t(ds.token(start + t)));
  }
  CHECK(ds.token(20) == 0);  // the EOS after the first document is part of the stream
}

TEST_CASE("a blend of an indexed dataset and a raw file draws each sample from the dataset the index names",
          "[trainer][data][blend]") {
  TempDir d;
  write_indexed(d.file("web"), 20, 30, 0, 100);
  write_raw(d.file("code.bin"), 400, 100);
  for (bool shuffle : {false, true}) {
    const auto blend = open_samples(spec_of({{0.75, d.file("web")}, {0.25, d.file("code.bin")}}, shuffle));
    const auto web = open_samples(spec_of({{1.0, d.file("web")}}, shuffle));
    SampleSpec code_spec = spec_of({{1.0, d.file("code.bin")}}, shuffle);
    code_spec.seed = mix64(code_spec.seed ^ mix64(0x424c454e44ULL + 1));  // the second dataset's own key
    const auto code = open_samples(code_spec);
    const BlendIndex index({0.75, 0.25});
    int from_web = 0, mismatches = 0;
    for (std::int64_t i = 0; i < 200; ++i) {
      const auto [dataset, k] = index.locate(i);
      from_web += dataset == 0;
      mismatches += sample_ids(*blend, i) != sample_ids(dataset == 0 ? *web : *code, k);
    }
    CHECK(mismatches == 0);
    CHECK(from_web == 150);
    CHECK(blend->total_tokens() == 20 * 31 + 400);
  }
  // What a checkpoint records (DataIdentity): each entry's normalised weight and size, documents for the indexed
  // one only; one dataset records its tokens and no entries.
  const DataIdentity id = open_samples(spec_of({{3, d.file("web")}, {1, d.file("code.bin")}}))->identity();
  CHECK(id.tokens == 20 * 31 + 400);
  REQUIRE(id.blend.size() == 2);
  CHECK((id.blend[0].weight == 0.75 && id.blend[0].tokens == 20 * 31 && id.blend[0].documents == 20));
  CHECK((id.blend[1].weight == 0.25 && id.blend[1].tokens == 400 && id.blend[1].documents == -1));
  const DataIdentity one = open_samples(spec_of({{1.0, d.file("web")}}))->identity();
  CHECK((one.tokens == 20 * 31 && one.blend.empty()));
  // Another weight, another sequence.
  const auto a = open_samples(spec_of({{0.75, d.file("web")}, {0.25, d.file("code.bin")}}));
  const auto b = open_samples(spec_of({{0.25, d.file("web")}, {0.75, d.file("code.bin")}}));
  bool differs = false;
  for (std::int64_t i = 0; i < 8; ++i) differs = differs || sample_ids(*a, i) != sample_ids(*b, i);
  CHECK(differs);
}

TEST_CASE("broken datasets and blends are refused in one line naming the problem", "[trainer][data][blend]") {
  TempDir d;
  write_indexed(d.file("web"), 5, 20, 0, 100);
  write_raw(d.file("code.bin"), 400, 100);
  // An id >= model.vocab.
  SampleSpec small_vocab = spec_of({{1.0, d.file("web")}});
  small_vocab.vocab = 50;
  CHECK_THAT(error_of(small_vocab), Catch::Contains(">= model.vocab (50)"));
  // Fewer tokens than one sample of a blend, one batch of a single dataset.
  write_indexed(d.file("tiny"), 1, 4, 0, 100);
  CHECK_THAT(error_of(spec_of({{1.0, d.file("web")}, {1.0, d.file("tiny")}})), Catch::Contains("fewer than one sample needs (9"));
  CHECK_THAT(error_of(spec_of({{1.0, d.file("tiny")}})), Catch::Contains("fewer than one batch needs (33"));
  // A truncated .bin (the reader's own check).
  fs::copy_file(d.file("web.idx"), d.file("cut.idx"));
  fs::copy_file(d.file("web.bin"), d.file("cut.bin"));
  fs::resize_file(d.file("cut.bin"), fs::file_size(d.file("cut.bin")) - 2);
  CHECK_THAT(error_of(spec_of({{1.0, d.file("cut")}})), Catch::Contains("cut"));
  CHECK_FALSE(error_of(spec_of({{1.0, d.file("cut")}})).empty());
  // A missing .bin beside its .idx.
  fs::copy_file(d.file("web.idx"), d.file("lone.idx"));
  CHECK_THAT(error_of(spec_of({{1.0, d.file("lone")}})), Catch::Contains("lone.bin"));
  // Weights that do not sum to a positive number; a negative weight.
  SampleSpec zero = spec_of({{0.0, d.file("web")}, {0.0, d.file("code.bin")}});
  zero.key = "data.blend";
  CHECK_THAT(error_of(zero), Catch::Contains("data.blend: the blend's weights do not sum to a positive number"));
  CHECK_THAT(error_of(spec_of({{-1.0, d.file("web")}, {2.0, d.file("code.bin")}})), Catch::Contains("negative"));
  // A vocabulary that does not fit int32 ids.
  SampleSpec huge = spec_of({{1.0, d.file("web")}});
  huge.vocab = (std::int64_t{1} << 31) + 1;
  CHECK_THAT(error_of(huge), Catch::Contains("2^31"));
  // The same files, well-formed, open.
  CHECK(error_of(spec_of({{1.0, d.file("web")}, {1.0, d.file("code.bin")}})).empty());
}
