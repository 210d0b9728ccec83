// Shared by the tokenizer implementations: UTF-8 helpers and the per-format loaders.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "meshrun/train/tokenizer/tokenizer.hpp"

namespace meshrun::train {

// The code point at s[i] (advancing i); the input was checked by check_utf8, so no validation here.
inline std::uint32_t utf8_next(std::string_view s, std::size_t& i) {
  const auto c = static_cast<unsigned char>(s[i]);
  int len = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
  if (i + static_cast<std::size_t>(len) > s.size()) len = static_cast<int>(s.size() - i);
  std::uint32_t cp = len == 1 ? c : len == 2 ? (c & 0x1F) : len == 3 ? (c & 0x0F) : (c & 0x07);
  for (int k = 1; k < len; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + static_cast<std::size_t>(k)]) & 0x3F);
  i += static_cast<std::size_t>(len);
  return cp;
}

// Throws TokenizerError naming the byte offset of the first invalid UTF-8 sequence.
void check_utf8(std::string_view s);
// s with every invalid UTF-8 sequence replaced by U+FFFD (what a decoder gives for a cut multi-byte character).
std::string utf8_sanitize(std::string_view s);

// config_path: the tokenizer_config.json tokenizer_files found ("": none).
std::unique_ptr<Tokenizer> load_hf_tokenizer(const std::string& path, const std::string& config_path);
std::unique_ptr<Tokenizer> load_sentencepiece(const std::string& path);

}  // namespace meshrun::train
