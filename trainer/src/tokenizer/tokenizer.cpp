// load_tokenizer: the format by the file's name and content, and the UTF-8 helpers both formats use.
#include <filesystem>
#include <fstream>

#include "tokenizer_internal.hpp"

namespace meshrun::train {

namespace {
// Length of the valid UTF-8 sequence at s[i], or 0 (overlong forms, surrogates and > U+10FFFF are invalid).
std::size_t utf8_valid_length(std::string_view s, std::size_t i) {
  const auto c = static_cast<unsigned char>(s[i]);
  if (c < 0x80) return 1;
  std::size_t len;
  std::uint32_t min;
  if (c >= 0xC2 && c <= 0xDF) len = 2, min = 0x80;
  else if (c >= 0xE0 && c <= 0xEF) len = 3, min = 0x800;
  else if (c >= 0xF0 && c <= 0xF4) len = 4, min = 0x10000;
  else return 0;
  if (i + len > s.size()) return 0;
  std::uint32_t cp = c & (0x7F >> len);
  for (std::size_t k = 1; k < len; ++k) {
    const auto d = static_cast<unsigned char>(s[i + k]);
    if ((d & 0xC0) != 0x80) return 0;
    cp = (cp << 6) | (d & 0x3F);
  }
  if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
  return len;
}
}  // namespace

void check_utf8(std::string_view s) {
  for (std::size_t i = 0; i < s.size();) {
    const std::size_t n = utf8_valid_length(s, i);
    if (n == 0) throw TokenizerError("input is not valid UTF-8 at byte " + std::to_string(i) + "; convert it to UTF-8 first");
    i += n;
  }
}

std::string utf8_sanitize(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (std::size_t i = 0; i < s.size();) {
    const std::size_t n = utf8_valid_length(s, i);
    if (n == 0) {
      out += "\xEF\xBF\xBD";
      ++i;
    } else {
      out.append(s.substr(i, n));
      i += n;
    }
  }
  return out;
}

namespace {
// A model directory's (Hugging Face's layout) tokenizer file: the first of these that exists.
std::string dir_tokenizer(const std::string& dir) {
  for (const char* name : {"tokenizer.json", "tokenizer.model"})
    if (const auto f = std::filesystem::path(dir) / name; std::filesystem::exists(f)) return f.string();
  return "";
}
}  // namespace

bool dir_has_tokenizer(const std::string& dir) { return !dir_tokenizer(dir).empty(); }

TokenizerFiles tokenizer_files(const std::string& given) {
  namespace fs = std::filesystem;
  TokenizerFiles files;
  files.tokenizer = fs::is_directory(given) ? dir_tokenizer(given) : given;
  if (files.tokenizer.empty())
    throw TokenizerError("directory " + given + " holds no tokenizer.json nor tokenizer.model; give the tokenizer file");
  std::ifstream is(files.tokenizer, std::ios::binary);
  if (!is) throw TokenizerError("cannot read tokenizer file " + files.tokenizer + "; give a tokenizer.json or a SentencePiece .model");
  char first = 0;
  is >> first;  // skips whitespace: a JSON file starts with '{'
  files.hf_json = first == '{';
  const fs::path config = fs::path(files.tokenizer).parent_path() / "tokenizer_config.json";
  if (files.hf_json && fs::exists(config)) files.config = config.string();
  return files;
}

std::unique_ptr<Tokenizer> load_tokenizer(const std::string& path) {
  const TokenizerFiles files = tokenizer_files(path);
  return files.hf_json ? load_hf_tokenizer(files.tokenizer, files.config) : load_sentencepiece(files.tokenizer);
}

}  // namespace meshrun::train
