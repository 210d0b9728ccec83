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
  // Further special tokens the tokenizer defines (SentencePiece's pad and unk; none by default), and the text of
  // a special token's id (SentencePiece's piece; "" when unknown), for the export's config files.
  virtual std::optional<std::uint32_t> pad_id() const { return std::nullopt; }
  virtual std::optional<std::uint32_t> unk_id() const { return std::nullopt; }
  virtual std::string token_text(std::uint32_t /*id*/) const { return ""; }
};

// The files a tokenizer is made of, decided here only (load_tokenizer reads them, meshrun-train's token cache key
// hashes them, meshrun-ckpt export copies them). `path`: a model directory (its tokenizer.json, else its
// tokenizer.model) or a tokenizer file itself; the format is the file's content (JSON starts with '{'), not its
// name. A tokenizer.json comes with the tokenizer_config.json beside it when there is one.
struct TokenizerFiles {
  bool hf_json = false;  // a Hugging Face tokenizer.json, else a SentencePiece model
  std::string tokenizer;  // the tokenizer.json or the .model
  std::string config;     // tokenizer_config.json beside a tokenizer.json; "" when absent (or SentencePiece)
  std::vector<std::string> paths() const { return config.empty() ? std::vector{tokenizer} : std::vector{tokenizer, config}; }
};
// Throws TokenizerError (one line naming the path and the fix) for a directory without either file or an
// unreadable file.
TokenizerFiles tokenizer_files(const std::string& path);
// Whether directory `dir` holds a tokenizer tokenizer_files would take (its tokenizer.json or tokenizer.model).
bool dir_has_tokenizer(const std::string& dir);

// path as tokenizer_files takes it. Throws TokenizerError with one line naming the file and the problem.
std::unique_ptr<Tokenizer> load_tokenizer(const std::string& path);

}  // namespace meshrun::train
