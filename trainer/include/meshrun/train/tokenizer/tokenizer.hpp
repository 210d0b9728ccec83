// Tokenizers read from their files (docs/data.md): Hugging Face tokenizer.json (normalizer, pre-tokenizer,
// BPE model, added tokens, post-processor, decoder; tokenizer_config.json beside it gives BOS/EOS) and
// SentencePiece .model files (through Debian's libsentencepiece). A component that is not implemented is
// refused at load in one line naming it. One Tokenizer object is not safe for concurrent encode() calls
// (its BPE cache is shared); give each thread its own.
#pragma once
#include <cstdint>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace meshrun::train {

struct TokenizerError : std::exception {
  explicit TokenizerError(std::string m) : msg(std::move(m)) {}
  const char* what() const noexcept override { return msg.c_str(); }
  std::string msg;
};

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  // add_special: apply the post-processor's special tokens (tokenizer.json's TemplateProcessing; BOS for a
  // SentencePiece model that has one), as Hugging Face's encode(add_special_tokens=True) does.
  virtual std::vector<std::uint32_t> encode(std::string_view text, bool add_special) const = 0;
  // The text of ids through the decoder chain (special tokens kept); throws TokenizerError for an id >= vocab_size().
  virtual std::string decode(const std::vector<std::uint32_t>& ids) const = 0;
  virtual std::optional<std::uint32_t> bos_id() const = 0;
  virtual std::optional<std::uint32_t> eos_id() const = 0;
  virtual std::size_t vocab_size() const = 0;  // largest id + 1, added tokens included
};

// path: a tokenizer.json (tokenizer_config.json is read from the same directory when present), a
// SentencePiece .model file, or a model directory holding tokenizer.json (else tokenizer.model). Throws TokenizerError with one line naming the file and the problem.
std::unique_ptr<Tokenizer> load_tokenizer(const std::string& path);

}  // namespace meshrun::train
