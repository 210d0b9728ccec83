// The sample sources meshrun-train draws from (data.path, data.blend, data.valid): one raw token file, one
// Megatron indexed dataset, or a blend of several, each behind SampleSource (data.hpp).
//
// One dataset: windows of S + 1 tokens over its token stream (an indexed dataset's documents back to back, as
// in its .bin), window k starting at token k·S, in order or, with data.shuffle, permuted per epoch
// (BatchSchedule). Megatron's GPTDataset shuffles documents per epoch and cuts samples from the shuffled
// stream; this order is not Megatron's (docs/trainer.md, "Data").
// A blend: Megatron's BlendedDataset rule (megatron/core/datasets/blended_dataset.py and the C++ helper
// build_blending_indices in megatron/core/datasets/helpers.cpp): the weights are normalised to sum 1, and global
// sample i comes from the dataset d whose error weight_d · max(i, 1) − (samples drawn from d before i) is
// largest (the first on a tie), as that dataset's next sample. The result depends on i alone.
#pragma once
#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "meshrun/job.hpp"
#include "meshrun/train/data/data.hpp"
#include "meshrun/train/data/indexed_dataset.hpp"

namespace meshrun::train {

// True when `path` names a Megatron indexed dataset: PREFIX.idx, or PREFIX / PREFIX.bin with PREFIX.idx beside it.
bool is_indexed_dataset(const std::string& path);

// An indexed dataset's .bin as a token stream; every id checked against the vocabulary at open.
class IndexedTokens : public TokenStream {
 public:
  IndexedTokens(const std::string& prefix, std::int64_t vocab);
  std::int64_t tokens() const override { return data_.tokens(); }
  std::int32_t at(std::int64_t i) const override { return static_cast<std::int32_t>(data_.token(i)); }
  const IndexedDataset& dataset() const { return data_; }

 private:
  IndexedDataset data_;
};

// Megatron's blending index as a function of the global sample index: which dataset sample i comes from, and
// which of that dataset's samples it is. Walking the rule from 0 is O(i · datasets); the counts are kept every
// kBlock samples, so the first call for sample N (a resume) walks to N once and later ones walk at most one block.
class BlendIndex {
 public:
  static constexpr std::int64_t kBlock = 4096;
  explicit BlendIndex(std::vector<double> weights);  // normalised here; finite, >= 0, positive sum (checked)
  std::pair<int, std::int64_t> locate(std::int64_t index) const;
  const std::vector<double>& weights() const { return weights_; }

 private:
  void fill_block(std::int64_t block) const;
  std::vector<double> weights_;
  mutable std::vector<std::vector<std::int64_t>> counts_;  // [b]: samples per dataset before sample b·kBlock
  mutable std::int64_t block_ = -1;                         // the block whose entries are cached
  mutable std::vector<std::int32_t> dataset_;
  mutable std::vector<std::int64_t> sample_;
};

// What open_samples needs of the job.
struct SampleSpec {
  std::vector<BlendEntry> datasets;  // one entry: that dataset alone (its weight unused)
  std::string token_dtype = "uint16";  // of raw token files
  std::int64_t vocab = 0, seq_len = 0, global_batch = 0;
  bool shuffle = false;
  std::uint64_t seed = 0;
  std::string key = "data.path";  // the config key named in errors
  // No data.tokenizer: meshrun-ckpt sample and export read the ids as bytes, so an id >= 256 (with a model.vocab
  // above 256) is refused at open, naming data.tokenizer as the fix.
  bool byte_level = false;
  // data.split: every dataset cut into Megatron's parts (mesh's data_split_range over an indexed dataset's
  // sequences, a raw file's tokens) and part `split_part` (0 train, 1 valid) read. split_text = data.split.
  std::string split_text;
  std::array<double, 3> split{0, 0, 0};
  int split_part = 0;
};

// The sample source of `spec`: its files opened (DataError in one line naming the file and the fix).
std::unique_ptr<SampleSource> open_samples(const SampleSpec& spec);

// The training and validation datasets of a job (data.path or data.blend; data.valid), for open_samples.
// With data.split, validation reads the second part of the training datasets (token_file is data.path's).
SampleSpec training_samples(const JobConfig& cfg, const std::string& token_file);
SampleSpec validation_samples(const JobConfig& cfg, const std::string& token_file);

// With data.split: which part a source read, for the run's first lines ("" without data.split), e.g.
// "the training part of data.split \"969,30,1\": sequences 0..968 of 1000 (12345 tokens)".
std::string split_description(const SampleSpec& spec, const SampleSource& source);

}  // namespace meshrun::train
