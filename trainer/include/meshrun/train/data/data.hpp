// Token data: a raw little-endian token file (nanoGPT .bin: no header, uint16 or uint32 per token),
// memory-mapped, and the batch schedule that maps (step, sequence) to a window of it.
//
// Step s takes a global batch of B sequences of S+1 tokens. Without shuffle, sequence i of step s
// starts at token (s·B + i)·S (wrapping to the start when the file is used up); with shuffle, the
// k-th sequence of an epoch is window perm_epoch(k) of a seeded permutation (counter-based, so every
// rank computes the same one). Which global sequence index a (data-parallel rank, micro-batch, slot)
// reads comes from mesh's batch geometry (BatchGeometry::sequence_index).
#pragma once
#include <cstdint>
#include <exception>
#include <string>
#include <vector>

namespace meshrun::train {

struct DataError : std::exception {
  explicit DataError(std::string m) : msg(std::move(m)) {}
  const char* what() const noexcept override { return msg.c_str(); }
  std::string msg;
};

// A stream of token ids that samples are cut from: a raw token file, or the .bin of a Megatron indexed
// dataset (samples.hpp). Every id was checked to be in [0, model.vocab) when the stream was opened.
class TokenStream {
 public:
  virtual ~TokenStream() = default;
  virtual std::int64_t tokens() const = 0;
  virtual std::int32_t at(std::int64_t i) const = 0;  // token i (unchecked index)
};

// What a checkpoint records of the training data, so that a resume on other data is refused: the tokens of every
// dataset read together and, for a blend, each entry's normalised weight and its dataset's size (not its path,
// so that a moved dataset still resumes).
struct DataIdentity {
  struct Entry {
    double weight = 0;            // normalised: a blend's weights sum to 1
    std::int64_t tokens = 0;
    std::int64_t documents = -1;  // an indexed dataset's; -1: a raw token file, which has no documents
  };
  std::int64_t tokens = -1;  // < 0: not recorded, not checked
  std::vector<Entry> blend;  // empty: one dataset
};

// What the trainer draws samples from: global sample `index` (= step·B + i for training) is a sequence of
// S + 1 tokens. A pure function of the index and the seed, so every layout and every resume reads the same.
class SampleSource {
 public:
  virtual ~SampleSource() = default;
  // Only the tokens at `positions` (within the sequence, each < S) of global sample `index`: what a
  // context-parallel rank reads. ids[i] = token positions[i], targets[i] = the token after it.
  virtual void tokens(std::int64_t index, const std::int32_t* positions, std::int64_t count, std::int32_t* ids,
                      std::int32_t* targets) const = 0;
  virtual std::int64_t total_tokens() const = 0;  // of every dataset read
  // What a checkpoint records (a blend overrides it with its entries).
  virtual DataIdentity identity() const { return {total_tokens(), {}}; }
};

class TokenFile : public TokenStream {
 public:
  // Throws DataError naming the file and the fix when it is missing, empty, not a whole number of
  // tokens, holds an id outside [0, vocab) (vocab must be in [1, 2^31]), or is shorter than one batch (B·S + 1 tokens).
  TokenFile(const std::string& path, const std::string& token_dtype, std::int64_t vocab, std::int64_t seq_len,
            std::int64_t global_batch);
  ~TokenFile();
  TokenFile(const TokenFile&) = delete;
  TokenFile& operator=(const TokenFile&) = delete;

  std::int64_t tokens() const override { return n_; }
  std::int64_t windows() const { return windows_; }  // sequences of S+1 tokens that fit, stepping by S
  // Token i; the constructor checked every id is in [0, vocab), so it fits an int32.
  std::int32_t at(std::int64_t i) const override { return static_cast<std::int32_t>(raw(i)); }

 private:
  std::uint32_t raw(std::int64_t i) const;  // the stored value, unchecked
  void unmap();
  std::string path_;
  const unsigned char* data_ = nullptr;
  std::size_t bytes_ = 0;
  int width_ = 2;
  std::int64_t n_ = 0, windows_ = 0;
};

// The windows of one token stream (needs at least S + 1 tokens).
class BatchSchedule : public SampleSource {
 public:
  BatchSchedule(const TokenStream& file, std::int64_t seq_len, std::int64_t global_batch, bool shuffle,
                std::uint64_t seed);
  std::int64_t windows() const { return windows_; }  // sequences of S+1 tokens that fit, stepping by S
  // First token of global sequence `index` (= step·B + i).
  std::int64_t window_start(std::int64_t index) const;
  // ids[0..S) and targets[0..S) of global sequence `index`.
  void sequence(std::int64_t index, std::int32_t* ids, std::int32_t* targets) const;
  void tokens(std::int64_t index, const std::int32_t* positions, std::int64_t count, std::int32_t* ids,
              std::int32_t* targets) const override;
  std::int64_t total_tokens() const override { return file_.tokens(); }

 private:
  const TokenStream& file_;
  std::int64_t seq_, batch_, windows_;
  bool shuffle_;
  std::uint64_t seed_;
  mutable std::int64_t perm_epoch_ = -1;
  mutable std::vector<std::int64_t> perm_;
};

// The files tokenize_bytes reads for `inputs` (files, and the regular files of directories sorted by name), in
// order. Throws DataError for an input that is neither.
std::vector<std::string> text_files(const std::vector<std::string>& inputs);

// Byte-level tokenization: every byte of the UTF-8 input becomes one token (ids 0..255).
// Inputs are files or directories (their regular files, sorted by name). Returns the token count.
// Throws DataError on unreadable input or an empty result.
std::int64_t tokenize_bytes(const std::vector<std::string>& inputs, const std::string& out_path,
                            const std::string& token_dtype);

}  // namespace meshrun::train
