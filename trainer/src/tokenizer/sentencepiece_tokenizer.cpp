// SentencePiece .model files (Llama 2, Mistral, Mixtral) through Debian's libsentencepiece: encoding,
// special pieces and byte fallback are the library's; meshrun adds BOS when add_special is set (the
// Llama 2 convention, add_bos_token=true, add_eos_token=false) and reads BOS/EOS ids from the model.
#include <sentencepiece_processor.h>

#include "tokenizer_internal.hpp"

namespace meshrun::train {
namespace {

class SentencePieceTokenizer final : public Tokenizer {
 public:
  explicit SentencePieceTokenizer(const std::string& path) {
    const auto status = sp_.Load(path);
    if (!status.ok())
      throw TokenizerError(path + ": not a tokenizer.json nor a SentencePiece model (libsentencepiece cannot parse it); "
                                  "give a tokenizer.json or a .model file");
  }
  std::vector<std::uint32_t> encode(std::string_view text, bool add_special) const override {
    check_utf8(text);
    std::vector<int> ids;
    const auto status = sp_.Encode(text, &ids);
    if (!status.ok()) throw TokenizerError("SentencePiece encode failed: " + status.ToString());
    std::vector<std::uint32_t> out;
    out.reserve(ids.size() + 1);
    if (add_special && bos_id()) out.push_back(*bos_id());
    for (int id : ids) out.push_back(static_cast<std::uint32_t>(id));
    return out;
  }
  std::string decode(const std::vector<std::uint32_t>& ids) const override {
    std::vector<int> v;
    v.reserve(ids.size());
    for (auto id : ids) {
      if (id >= vocab_size()) throw TokenizerError("token id " + std::to_string(id) + " is outside the vocabulary (" + std::to_string(vocab_size()) + ")");
      v.push_back(static_cast<int>(id));
    }
    std::string text;
    const auto status = sp_.Decode(v, &text);
    if (!status.ok()) throw TokenizerError("SentencePiece decode failed: " + status.ToString());
    return text;
  }
  std::optional<std::uint32_t> bos_id() const override { return id_or_none(sp_.bos_id()); }
  std::optional<std::uint32_t> eos_id() const override { return id_or_none(sp_.eos_id()); }
  std::size_t vocab_size() const override { return static_cast<std::size_t>(sp_.GetPieceSize()); }
  std::optional<std::uint32_t> pad_id() const override { return id_or_none(sp_.pad_id()); }
  std::optional<std::uint32_t> unk_id() const override { return id_or_none(sp_.unk_id()); }
  std::string token_text(std::uint32_t id) const override {
    return id < vocab_size() ? sp_.IdToPiece(static_cast<int>(id)) : std::string();
  }

 private:
  static std::optional<std::uint32_t> id_or_none(int id) {
    return id < 0 ? std::nullopt : std::optional<std::uint32_t>(static_cast<std::uint32_t>(id));  // -1: disabled in the model
  }
  sentencepiece::SentencePieceProcessor sp_;
};

}  // namespace

std::unique_ptr<Tokenizer> load_sentencepiece(const std::string& path) { return std::make_unique<SentencePieceTokenizer>(path); }

}  // namespace meshrun::train
