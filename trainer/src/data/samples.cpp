#include "meshrun/train/data/samples.hpp"

#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <stdexcept>

#include "meshrun/layout.hpp"
#include "meshrun/train/model/params.hpp"

namespace meshrun::train {

namespace {

bool ends_with(const std::string& s, const char* suffix) {
  const std::string t(suffix);
  return s.size() > t.size() && s.compare(s.size() - t.size(), t.size(), t) == 0;
}

bool exists(const std::string& path) {
  struct stat st{};
  return ::stat(path.c_str(), &st) == 0;
}

// Tokens [begin, end) of another stream: one part of data.split (sequences are back to back in an indexed
// dataset's .bin, so a range of sequences is a range of tokens).
class TokenRange final : public TokenStream {
 public:
  TokenRange(std::unique_ptr<TokenStream> whole, std::int64_t begin, std::int64_t end)
      : whole_(std::move(whole)), begin_(begin), end_(end) {}
  std::int64_t tokens() const override { return end_ - begin_; }
  std::int32_t at(std::int64_t i) const override { return whole_->at(begin_ + i); }
  const TokenStream& whole() const { return *whole_; }

 private:
  std::unique_ptr<TokenStream> whole_;
  std::int64_t begin_, end_;
};

// One dataset's windows, owning its token stream.
class OneDataset final : public SampleSource {
 public:
  OneDataset(std::unique_ptr<TokenStream> stream, const SampleSpec& s, std::uint64_t seed, std::string part_range = "")
      : stream_(std::move(stream)), schedule_(*stream_, s.seq_len, s.global_batch, s.shuffle, seed),
        part_range_(std::move(part_range)) {}
  const std::string& part_range() const { return part_range_; }
  void tokens(std::int64_t index, const std::int32_t* positions, std::int64_t count, std::int32_t* ids,
              std::int32_t* targets) const override {
    schedule_.tokens(index, positions, count, ids, targets);
  }
  std::int64_t total_tokens() const override { return stream_->tokens(); }
  std::int64_t documents() const {  // -1 for a raw token file
    const auto* range = dynamic_cast<const TokenRange*>(stream_.get());
    const auto* indexed = dynamic_cast<const IndexedTokens*>(range ? &range->whole() : stream_.get());
    return indexed ? indexed->dataset().documents() : -1;
  }

 private:
  std::unique_ptr<TokenStream> stream_;
  BatchSchedule schedule_;
  std::string part_range_;  // what of the dataset data.split's part is ("" without a split)
};

class Blend final : public SampleSource {
 public:
  Blend(std::vector<std::unique_ptr<OneDataset>> parts, std::vector<double> weights)
      : parts_(std::move(parts)), index_(std::move(weights)) {}
  void tokens(std::int64_t index, const std::int32_t* positions, std::int64_t count, std::int32_t* ids,
              std::int32_t* targets) const override {
    const auto [d, k] = index_.locate(index);
    parts_[static_cast<std::size_t>(d)]->tokens(k, positions, count, ids, targets);
  }
  std::int64_t total_tokens() const override {
    std::int64_t n = 0;
    for (const auto& p : parts_) n += p->total_tokens();
    return n;
  }
  const OneDataset& part(std::size_t d) const { return *parts_[d]; }
  std::size_t size() const { return parts_.size(); }
  DataIdentity identity() const override {
    DataIdentity id{total_tokens(), {}};
    for (std::size_t d = 0; d < parts_.size(); ++d)
      id.blend.push_back({index_.weights()[d], parts_[d]->total_tokens(), parts_[d]->documents()});
    return id;
  }

 private:
  std::vector<std::unique_ptr<OneDataset>> parts_;
  BlendIndex index_;
};

// The token stream of one dataset, holding at least `min_tokens`.
// Without a tokenizer the ids are bytes (sample and export decode them so): one >= 256 means the data was made
// with a tokenizer that the run does not name.
void check_byte_ids(const TokenStream& t, const std::string& path, const SampleSpec& s) {
  if (!s.byte_level || s.vocab <= 256) return;
  for (std::int64_t i = 0; i < t.tokens(); ++i)
    if (const std::int32_t id = t.at(i); id >= 256)
      throw DataError(path + ": token " + std::to_string(i) + " has id " + std::to_string(id) +
                      " >= 256 but data.tokenizer is not set, so the run would be byte-level (sample and export read "
                      "ids as bytes); set data.tokenizer to the tokenizer that made this data");
}

std::unique_ptr<TokenStream> open_stream(const std::string& path, const SampleSpec& s, std::int64_t batch) {
  if (!is_indexed_dataset(path)) {
    auto file = std::make_unique<TokenFile>(path, s.token_dtype, s.vocab, s.seq_len, batch);
    check_byte_ids(*file, path, s);
    return file;
  }
  auto stream = std::make_unique<IndexedTokens>(path, s.vocab);
  check_byte_ids(*stream, stream->dataset().prefix() + ".bin", s);
  const std::int64_t need = batch * s.seq_len + 1;
  if (stream->tokens() < need)
    throw DataError("indexed dataset " + stream->dataset().prefix() + " holds " + std::to_string(stream->tokens()) +
                    " tokens, fewer than " + (batch == 1 ? "one sample" : "one batch") + " needs (" +
                    std::to_string(need) + (batch == 1 ? " = seq_len + 1" : " = global_batch_size·seq_len + 1") +
                    "); use a larger dataset or a shorter training.seq_len");
  return stream;
}

std::string split_part_name(const SampleSpec& s) {
  static const char* const kPartName[] = {"training", "validation", "test"};
  return std::string("the ") + kPartName[s.split_part] + " part of data.split \"" + s.split_text + "\"";
}

// data.split's part of one opened dataset (`stream` returned whole without a split), holding at least `need`
// tokens; `part` receives what was cut, for the run's first lines.
std::unique_ptr<TokenStream> split_part(std::unique_ptr<TokenStream> stream, const std::string& name, const SampleSpec& s,
                                        std::int64_t need, std::string* part) {
  if (s.split_text.empty()) return stream;
  const auto* indexed = dynamic_cast<const IndexedTokens*>(stream.get());
  const std::int64_t n = indexed ? indexed->dataset().sequences() : stream->tokens();
  const auto [a, b] = meshrun::data_split_range(s.split, s.split_part, n);
  const auto token_at = [&](std::int64_t k) -> std::int64_t {
    if (!indexed) return k;
    return k < n ? indexed->dataset().sequence_start(k) : stream->tokens();
  };
  const std::int64_t t0 = token_at(a), t1 = token_at(b);
  const std::string unit = indexed ? "sequences" : "tokens";
  *part = unit + " " + std::to_string(a) + ".." + std::to_string(b - 1) + " of " + std::to_string(n) +
          (indexed ? " (" + std::to_string(t1 - t0) + " tokens)" : "");
  const std::string head = split_part_name(s);
  if (t1 - t0 < need)
    throw DataError(name + ": " + head + (b > a ? ": " + *part + ", holds fewer tokens than "
                                                : " is empty (0 of its " + std::to_string(n) + " " + unit + "), while ") +
                    (need == s.seq_len + 1 ? "one sample needs (" : "one batch needs (") + std::to_string(need) +
                    (need == s.seq_len + 1 ? " = seq_len + 1" : " = global_batch_size·seq_len + 1") +
                    "); give that part a larger weight, use more data, or a shorter training.seq_len");
  return std::make_unique<TokenRange>(std::move(stream), t0, t1);
}

}  // namespace

std::string split_description(const SampleSpec& spec, const SampleSource& source) {
  if (spec.split_text.empty()) return "";
  if (const auto* one = dynamic_cast<const OneDataset*>(&source)) return split_part_name(spec) + ": " + one->part_range();
  const auto* blend = dynamic_cast<const Blend*>(&source);
  if (!blend) return "";
  std::string text = split_part_name(spec) + " of each dataset: ";
  for (std::size_t d = 0; d < blend->size(); ++d) text += (d ? "; " : "") + blend->part(d).part_range();
  return text;
}

bool is_indexed_dataset(const std::string& path) {
  if (ends_with(path, ".idx")) return true;
  if (ends_with(path, ".bin")) return exists(path.substr(0, path.size() - 4) + ".idx");
  return exists(path + ".idx");
}

IndexedTokens::IndexedTokens(const std::string& prefix, std::int64_t vocab) : data_(prefix) {
  data_.check_ids_below(vocab);
}

BlendIndex::BlendIndex(std::vector<double> weights) : weights_(std::move(weights)) {
  double sum = 0;
  for (double w : weights_) {
    if (!std::isfinite(w) || w < 0) throw DataError("a blend weight is negative or not finite; weights are finite and >= 0");
    sum += w;
  }
  if (weights_.empty() || !(sum > 0) || !std::isfinite(sum))
    throw DataError("the blend's weights do not sum to a positive number; give at least one dataset a positive weight");
  for (double& w : weights_) w /= sum;  // Megatron's normalize(): w / sum(w)
  counts_.push_back(std::vector<std::int64_t>(weights_.size(), 0));
}

void BlendIndex::fill_block(std::int64_t block) const {
  // build_blending_indices, from the counts at the block's start.
  auto walk = [&](std::int64_t first, std::vector<std::int64_t>& counts, bool record) {
    for (std::int64_t i = first; i < first + kBlock; ++i) {
      const double x = std::max(static_cast<double>(i), 1.0);
      std::size_t best = 0;
      double best_error = weights_[0] * x - static_cast<double>(counts[0]);
      for (std::size_t d = 1; d < weights_.size(); ++d) {
        const double error = weights_[d] * x - static_cast<double>(counts[d]);
        if (error > best_error) best_error = error, best = d;
      }
      if (record) {
        dataset_[static_cast<std::size_t>(i - first)] = static_cast<std::int32_t>(best);
        sample_[static_cast<std::size_t>(i - first)] = counts[best];
      }
      ++counts[best];
    }
  };
  while (static_cast<std::int64_t>(counts_.size()) <= block) {
    std::vector<std::int64_t> next = counts_.back();
    walk((static_cast<std::int64_t>(counts_.size()) - 1) * kBlock, next, false);
    counts_.push_back(std::move(next));
  }
  dataset_.resize(kBlock);
  sample_.resize(kBlock);
  std::vector<std::int64_t> counts = counts_[static_cast<std::size_t>(block)];
  walk(block * kBlock, counts, true);
  block_ = block;
}

std::pair<int, std::int64_t> BlendIndex::locate(std::int64_t index) const {
  const std::int64_t block = index / kBlock;
  if (block != block_) fill_block(block);
  const auto i = static_cast<std::size_t>(index - block * kBlock);
  return {dataset_[i], sample_[i]};
}

std::unique_ptr<SampleSource> open_samples(const SampleSpec& s) {
  // Ids travel as int32 in the batches: a larger vocabulary could not be represented.
  if (s.vocab <= 0 || s.vocab > std::int64_t{INT32_MAX} + 1)
    throw DataError("model.vocab = " + std::to_string(s.vocab) + " is outside [1, 2^31]; token ids are int32 in the batches");
  if (s.datasets.empty()) throw DataError(s.key + " names no dataset; set it to a token file or an indexed dataset");
  if (s.datasets.size() == 1) {
    // Training reads batches of the part; evaluation needs one sample.
    const std::int64_t need = (s.split_part == 0 ? s.global_batch : 1) * s.seq_len + 1;
    std::string part;
    auto stream = split_part(open_stream(s.datasets[0].path, s, s.global_batch), s.datasets[0].path, s, need, &part);
    return std::make_unique<OneDataset>(std::move(stream), s, s.seed, part);
  }
  // A blend: each dataset needs one sample; dataset d > 0 is shuffled with its own key (d = 0 keeps the seed).
  std::vector<std::unique_ptr<OneDataset>> parts;
  std::vector<double> weights;
  for (std::size_t d = 0; d < s.datasets.size(); ++d) {
    const std::uint64_t seed = d == 0 ? s.seed : mix64(s.seed ^ mix64(0x424c454e44ULL + d));
    try {
      std::string part;
      auto stream = split_part(open_stream(s.datasets[d].path, s, 1), s.datasets[d].path, s, s.seq_len + 1, &part);
      parts.push_back(std::make_unique<OneDataset>(std::move(stream), s, seed, part));
    } catch (const DataError& e) {
      throw DataError(s.key + " entry " + std::to_string(d) + ": " + e.msg);
    }
    weights.push_back(s.datasets[d].weight);
  }
  try {
    return std::make_unique<Blend>(std::move(parts), std::move(weights));
  } catch (const DataError& e) {
    throw DataError(s.key + ": " + e.msg);
  }
}

SampleSpec training_samples(const JobConfig& cfg, const std::string& token_file) {
  SampleSpec s;
  s.datasets = cfg.data.blend.empty() ? std::vector<BlendEntry>{{1.0, token_file}} : cfg.data.blend;
  s.key = cfg.data.blend.empty() ? "data.path" : "data.blend";
  s.token_dtype = cfg.data.token_dtype;
  s.vocab = cfg.model.vocab;
  s.seq_len = cfg.training.seq_len;
  s.global_batch = cfg.training.global_batch_size;
  s.shuffle = cfg.data.shuffle;
  s.seed = cfg.training.seed;
  s.byte_level = cfg.data.tokenizer.empty();
  if (!cfg.data.split.empty()) {
    if (const std::string why = meshrun::parse_data_split(cfg.data.split, &s.split); !why.empty()) throw DataError(why);
    s.split_text = cfg.data.split;
  }
  return s;
}

SampleSpec validation_samples(const JobConfig& cfg, const std::string& token_file) {
  SampleSpec s = training_samples(cfg, token_file);
  if (!s.split_text.empty()) {
    s.split_part = 1;
    return s;
  }
  s.datasets = cfg.data.valid;
  s.key = "data.valid";
  return s;
}

}  // namespace meshrun::train
