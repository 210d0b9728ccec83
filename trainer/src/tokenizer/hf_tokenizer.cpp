// Hugging Face tokenizer.json with a BPE model. The pipeline and each component's behaviour follow Hugging
// Face's JavaScript implementation (@huggingface/tokenizers 0.2.0, src/core/Tokenizer.ts and the component
// files), which the oracle test runs on the same files (docs/data.md):
//   added tokens split out first (longest match, left to right; lstrip/rstrip trim the neighbours) ->
//   normalizer -> tokens whose `normalized` flag is set split out of the normalized text -> pre-tokenizer ->
//   BPE per pre-token (lowest merge rank first, leftmost on ties) -> post-processor.
// With a ByteLevel pre-tokenizer the model works on raw bytes: the vocabulary and merges are mapped back
// through GPT-2's byte<->unicode table once at load, so encoding never builds the mapped strings.
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <utf8proc.h>

#include <algorithm>
#include <array>
#include <filesystem>
#include <fstream>
#include <functional>
#include <queue>
#include <nlohmann/json.hpp>
#include <unordered_map>

#include "tokenizer_internal.hpp"

namespace meshrun::train {
namespace {

using json = nlohmann::json;

[[noreturn]] void refuse(const std::string& file, const std::string& what) { throw TokenizerError(file + ": " + what); }

// GPT-2's bytes_to_unicode (openai/gpt-2 encoder.py, used by ByteLevel): printable Latin-1 bytes map to
// themselves, the other 68 to U+0100.. in byte order.
struct ByteTable {
  static constexpr std::uint32_t kCodePoints = 324;  // the table's characters are all below U+0144
  std::array<std::uint32_t, 256> to_cp{};
  std::array<int, kCodePoints> to_byte{};  // -1: not a table character
  ByteTable() {
    to_byte.fill(-1);
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      to_cp[b] = printable ? static_cast<std::uint32_t>(b) : static_cast<std::uint32_t>(256 + n++);
      to_byte[to_cp[b]] = b;
    }
  }
  int byte_of(std::uint32_t cp) const { return cp < kCodePoints ? to_byte[cp] : -1; }
};
const ByteTable& byte_table() {
  static const ByteTable t;
  return t;
}

// The raw bytes a ByteLevel-mapped string stands for; nullopt when a character is outside the table.
std::optional<std::string> unmap_byte_level(const std::string& s) {
  std::string out;
  std::size_t i = 0;
  while (i < s.size()) {
    const int b = byte_table().byte_of(utf8_next(s, i));
    if (b < 0) return std::nullopt;
    out.push_back(static_cast<char>(b));
  }
  return out;
}

// A PCRE2 pattern with Unicode classes (PCRE2_UTF | PCRE2_UCP, as the Rust crate's Oniguruma reads \p{L},
// \s, ...), JIT-compiled when the JIT is available.
class Regex {
 public:
  Regex(const std::string& pattern, const std::string& file) {
    int err = 0;
    PCRE2_SIZE off = 0;
    code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), PCRE2_UTF | PCRE2_UCP, &err,
                          &off, nullptr);
    if (!code_) {
      PCRE2_UCHAR buf[256];
      pcre2_get_error_message(err, buf, sizeof buf);
      refuse(file, "regular expression does not compile at offset " + std::to_string(off) + ": " +
                       reinterpret_cast<char*>(buf));
    }
    jit_ = pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE) == 0;
    md_ = pcre2_match_data_create_from_pattern(code_, nullptr);
  }
  ~Regex() {
    pcre2_match_data_free(md_);
    pcre2_code_free(code_);
  }
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;
  // Calls on_match(begin, end) for each non-overlapping match of s in order (text already checked as UTF-8).
  template <class F>
  void for_each_match(std::string_view s, F&& on_match) const {
    std::size_t pos = 0;
    const auto subject = reinterpret_cast<PCRE2_SPTR>(s.data());
    while (pos <= s.size()) {
      const int rc = jit_ ? pcre2_jit_match(code_, subject, s.size(), pos, PCRE2_NO_UTF_CHECK, md_, nullptr)
                          : pcre2_match(code_, subject, s.size(), pos, PCRE2_NO_UTF_CHECK, md_, nullptr);
      if (rc == PCRE2_ERROR_NOMATCH) return;
      if (rc < 0) throw TokenizerError("regular expression match failed (PCRE2 error " + std::to_string(rc) + ")");
      const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md_);
      const std::size_t b = ov[0], e = ov[1];
      if (e > b) {
        on_match(b, e);
        pos = e;
      } else {  // an empty match yields nothing; step one character, as JavaScript's global matching does
        if (b >= s.size()) return;
        pos = b;
        utf8_next(s, pos);
      }
    }
  }

 private:
  pcre2_code* code_ = nullptr;
  pcre2_match_data* md_ = nullptr;
  bool jit_ = false;
};

std::string escape_regex(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (std::string_view("\\^$.|?*+()[]{}").find(c) != std::string_view::npos) out.push_back('\\');
    out.push_back(c);
  }
  return out;
}

// A tokenizer.json "pattern": {"Regex": "..."} or {"String": "..."} (a literal).
std::unique_ptr<Regex> make_pattern(const json& p, const std::string& file, const std::string& where) {
  if (p.is_object() && p.contains("Regex")) return std::make_unique<Regex>(p["Regex"].get<std::string>(), file);
  if (p.is_object() && p.contains("String")) return std::make_unique<Regex>(escape_regex(p["String"].get<std::string>()), file);
  refuse(file, where + " has a pattern that is neither {\"Regex\": ...} nor {\"String\": ...}");
}

std::string type_of(const json& j) { return j.is_object() && j.contains("type") ? j["type"].get<std::string>() : ""; }

std::string replace_all(std::string_view s, const Regex& re, const std::string& content) {
  std::string out;
  std::size_t last = 0;
  re.for_each_match(s, [&](std::size_t b, std::size_t e) {
    out.append(s.substr(last, b - last));
    out += content;
    last = e;
  });
  out.append(s.substr(last));
  return out;
}

using Normalize = std::function<std::string(std::string)>;
// A pre-tokenizer turns one piece into pieces, appended to out; section is the index of the section the
// added tokens cut (Metaspace's prepend_scheme "first").
using PreTokenize = std::function<void(std::string_view piece, std::size_t section, std::vector<std::string>& out)>;
// A decoder step maps the token strings to new strings (the JS decode_chain).
using DecodeStep = std::function<std::vector<std::string>(std::vector<std::string>)>;

std::string unicode_normalize(const std::string& s, utf8proc_option_t options) {
  utf8proc_uint8_t* out = nullptr;
  const auto n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()), static_cast<utf8proc_ssize_t>(s.size()),
                              &out, static_cast<utf8proc_option_t>(options | UTF8PROC_STABLE));
  if (n < 0) throw TokenizerError(std::string("Unicode normalization failed: ") + utf8proc_errmsg(n));
  std::string r(reinterpret_cast<char*>(out), static_cast<std::size_t>(n));
  std::free(out);
  return r;
}

Normalize make_normalizer(const json& j, const std::string& file) {
  const std::string t = type_of(j);
  if (t == "NFC") return [](std::string s) { return unicode_normalize(s, UTF8PROC_COMPOSE); };
  if (t == "NFD") return [](std::string s) { return unicode_normalize(s, UTF8PROC_DECOMPOSE); };
  if (t == "NFKC") return [](std::string s) { return unicode_normalize(s, static_cast<utf8proc_option_t>(UTF8PROC_COMPOSE | UTF8PROC_COMPAT)); };
  if (t == "NFKD") return [](std::string s) { return unicode_normalize(s, static_cast<utf8proc_option_t>(UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT)); };
  if (t == "Prepend") {
    const std::string p = j.value("prepend", "");
    return [p](std::string s) { return p + s; };
  }
  if (t == "Replace") {
    std::shared_ptr<Regex> re = make_pattern(j.value("pattern", json()), file, "normalizer Replace");
    const std::string content = j.value("content", "");
    return [re, content](std::string s) { return replace_all(s, *re, content); };
  }
  if (t == "Sequence") {
    std::vector<Normalize> steps;
    for (const json& n : j.value("normalizers", json::array())) steps.push_back(make_normalizer(n, file));
    return [steps](std::string s) {
      for (const auto& f : steps) s = f(std::move(s));
      return s;
    };
  }
  refuse(file, "normalizer '" + t + "' is not implemented (implemented: NFC, NFD, NFKC, NFKD, Prepend, Replace, Sequence)");
}

// The Rust library's NormalizedString::split (tokenizers/src/tokenizer/normalizer.rs) under a Split
// pre-tokenizer (pre_tokenizers/split.rs): the pattern's matches and the text between them in order (the
// Pattern for a regex: an empty text is one empty non-match), each match's flag flipped by invert, then the
// behavior folds them: Removed drops the matches, Isolated keeps every piece, MergedWithPrevious appends a
// match to the piece before it (unless that was a match too), MergedWithNext prepends it to the piece after,
// Contiguous joins runs of pieces of the same kind. Empty pieces are dropped (PreTokenizedString::split).
// The JavaScript port treats every behavior but Removed as Isolated and, with invert, keeps the matches
// alone whatever the behavior; the Rust library is the reference (docs/data.md).
void split_pieces(std::string_view text, const Regex& re, bool invert, const std::string& behavior,
                  std::vector<std::string>& out) {
  struct Piece {
    std::size_t b, e;
    bool match;
  };
  std::vector<Piece> found;
  std::size_t prev = 0;
  re.for_each_match(text, [&](std::size_t b, std::size_t e) {
    if (b != prev) found.push_back({prev, b, invert});
    found.push_back({b, e, !invert});
    prev = e;
  });
  if (prev != text.size() || text.empty()) found.push_back({prev, text.size(), invert});
  std::vector<Piece> kept;  // the pieces that stay, match = false
  bool previous_match = false;
  if (behavior == "MergedWithNext") {
    for (auto it = found.rbegin(); it != found.rend(); ++it) {
      if (it->match && !previous_match && !kept.empty()) kept.back().b = it->b;
      else kept.push_back({it->b, it->e, false});
      previous_match = it->match;
    }
    std::reverse(kept.begin(), kept.end());
  } else {
    for (const Piece& p : found) {
      if (behavior == "Removed") {
        if (!p.match) kept.push_back(p);
        continue;
      }
      const bool merge = behavior == "MergedWithPrevious" ? p.match && !previous_match
                         : behavior == "Contiguous"       ? p.match == previous_match
                                                          : false;  // Isolated
      if (merge && !kept.empty()) kept.back().e = p.e;
      else kept.push_back({p.b, p.e, false});
      previous_match = p.match;
    }
  }
  for (const Piece& p : kept)
    if (p.e > p.b) out.emplace_back(text.substr(p.b, p.e - p.b));
}

// GPT-2's pre-tokenization regex, what ByteLevel with use_regex=true splits by (tokenizers' byte_level.rs).
const char* kGpt2Pattern = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

PreTokenize make_pre_tokenizer(const json& j, const std::string& file, bool& byte_level, bool last) {
  const std::string t = type_of(j);
  if (t == "Sequence") {
    const json list = j.value("pretokenizers", json::array());
    std::vector<PreTokenize> steps;
    for (std::size_t i = 0; i < list.size(); ++i)
      steps.push_back(make_pre_tokenizer(list[i], file, byte_level, last && i + 1 == list.size()));
    return [steps](std::string_view piece, std::size_t section, std::vector<std::string>& out) {
      std::vector<std::string> cur{std::string(piece)}, next;
      for (const auto& f : steps) {
        next.clear();
        for (const auto& p : cur) f(p, section, next);
        cur.swap(next);
      }
      for (auto& p : cur) out.push_back(std::move(p));
    };
  }
  if (t == "Split") {
    std::shared_ptr<Regex> re = make_pattern(j.value("pattern", json()), file, "pre-tokenizer Split");
    const bool invert = j.value("invert", false);
    const std::string behavior = j.value("behavior", "");
    static constexpr std::string_view kBehaviors[] = {"Removed", "Isolated", "MergedWithPrevious", "MergedWithNext",
                                                      "Contiguous"};
    if (std::find(std::begin(kBehaviors), std::end(kBehaviors), behavior) == std::end(kBehaviors))
      refuse(file, "pre-tokenizer Split behavior '" + behavior + "' is unknown (Removed, Isolated, MergedWithPrevious, "
                   "MergedWithNext, Contiguous)");
    return [re, invert, behavior](std::string_view piece, std::size_t, std::vector<std::string>& out) {
      split_pieces(piece, *re, invert, behavior, out);
    };
  }
  if (t == "ByteLevel") {
    if (!last) refuse(file, "a pre-tokenizer after ByteLevel is not implemented (ByteLevel must come last)");
    byte_level = true;
    const bool prefix = j.value("add_prefix_space", false);
    std::shared_ptr<Regex> re = j.value("use_regex", true) ? std::make_shared<Regex>(kGpt2Pattern, file) : nullptr;
    return [prefix, re](std::string_view piece, std::size_t, std::vector<std::string>& out) {
      std::string text = (prefix && (piece.empty() || piece[0] != ' ')) ? " " + std::string(piece) : std::string(piece);
      if (!re) {
        out.push_back(std::move(text));
        return;
      }
      re->for_each_match(text, [&](std::size_t b, std::size_t e) { out.push_back(text.substr(b, e - b)); });
    };
  }
  if (t == "Digits") {
    // JS: text.match(/[^\d]+|\d+/gu) (\d+ -> \d with individual_digits); JavaScript's \d is ASCII 0-9.
    const bool individual = j.value("individual_digits", false);
    return [individual](std::string_view piece, std::size_t, std::vector<std::string>& out) {
      std::size_t i = 0;
      while (i < piece.size()) {
        const bool digit = piece[i] >= '0' && piece[i] <= '9';
        std::size_t e = i + 1;
        if (!digit || !individual)
          while (e < piece.size() && ((piece[e] >= '0' && piece[e] <= '9') == digit)) ++e;
        out.emplace_back(piece.substr(i, e - i));
        i = e;
      }
    };
  }
  if (t == "Metaspace") {
    if (j.value("split", false))
      refuse(file, "pre-tokenizer Metaspace with split=true is not implemented (the JS reference does not split either)");
    const std::string rep = j.value("replacement", "\xE2\x96\x81");
    const std::string scheme = j.value("prepend_scheme", "always");
    if (scheme != "always" && scheme != "first" && scheme != "never")
      refuse(file, "pre-tokenizer Metaspace prepend_scheme '" + scheme + "' is unknown (always, first, never)");
    return [rep, scheme](std::string_view piece, std::size_t section, std::vector<std::string>& out) {
      std::string s;
      for (char c : piece) {
        if (c == ' ') s += rep;
        else s.push_back(c);
      }
      if (s.compare(0, rep.size(), rep) != 0 && (scheme == "always" || (scheme == "first" && section == 0))) s = rep + s;
      out.push_back(std::move(s));
    };
  }
  refuse(file, "pre-tokenizer '" + t + "' is not implemented (implemented: Split, ByteLevel, Digits, Metaspace, Sequence)");
}

DecodeStep make_decoder(const json& j, const std::string& file, const std::unordered_map<std::string, std::uint32_t>& added) {
  const std::string t = type_of(j);
  if (t == "ByteLevel") {
    // Consecutive non-added tokens are joined and mapped back to bytes; added tokens pass as they are (JS
    // ByteLevel decoder). Characters outside the table are dropped, as its byte_decoder lookup does.
    return [&added](std::vector<std::string> toks) {
      std::vector<std::string> out;
      std::string bytes;
      auto flush = [&] {
        if (!bytes.empty()) out.push_back(std::move(bytes));
        bytes.clear();
      };
      for (const auto& tok : toks) {
        if (added.count(tok)) {
          flush();
          out.push_back(tok);
          continue;
        }
        std::size_t i = 0;
        while (i < tok.size()) {
          const int b = byte_table().byte_of(utf8_next(tok, i));
          if (b >= 0) bytes.push_back(static_cast<char>(b));
        }
      }
      flush();
      for (auto& s : out) s = utf8_sanitize(s);
      return out;
    };
  }
  if (t == "Metaspace") {
    const std::string rep = j.value("replacement", "\xE2\x96\x81");
    return [rep](std::vector<std::string> toks) {
      for (std::size_t i = 0; i < toks.size(); ++i) {
        std::string s;
        for (std::size_t p = 0; p < toks[i].size();) {
          if (toks[i].compare(p, rep.size(), rep) == 0) {
            s.push_back(' ');
            p += rep.size();
          } else {
            s.push_back(toks[i][p++]);
          }
        }
        if (i == 0 && !s.empty() && s[0] == ' ') s.erase(0, 1);
        toks[i] = std::move(s);
      }
      return toks;
    };
  }
  if (t == "ByteFallback") {
    return [](std::vector<std::string> toks) {
      std::vector<std::string> out;
      std::string bytes;
      auto flush = [&] {
        if (!bytes.empty()) out.push_back(utf8_sanitize(bytes));
        bytes.clear();
      };
      for (auto& tok : toks) {
        if (tok.size() == 6 && tok.compare(0, 3, "<0x") == 0 && tok[5] == '>' && std::isxdigit(static_cast<unsigned char>(tok[3])) &&
            std::isxdigit(static_cast<unsigned char>(tok[4]))) {
          bytes.push_back(static_cast<char>(std::stoi(tok.substr(3, 2), nullptr, 16)));
        } else {
          flush();
          out.push_back(std::move(tok));
        }
      }
      flush();
      return out;
    };
  }
  if (t == "Fuse") {
    return [](std::vector<std::string> toks) {
      std::string s;
      for (const auto& x : toks) s += x;
      return std::vector<std::string>{s};
    };
  }
  if (t == "Strip") {
    const std::string content = j.value("content", " ");
    const int start = j.value("start", 0), stop = j.value("stop", 0);
    if (content.size() != 1) refuse(file, "decoder Strip with a multi-byte content character is not implemented");
    return [c = content[0], start, stop](std::vector<std::string> toks) {
      for (auto& s : toks) {
        std::size_t b = 0, e = s.size();
        for (int i = 0; i < start && b < e && s[b] == c; ++i) ++b;
        for (int i = 0; i < stop && e > b && s[e - 1] == c; ++i) --e;
        s = s.substr(b, e - b);
      }
      return toks;
    };
  }
  if (t == "Replace") {
    std::shared_ptr<Regex> re = make_pattern(j.value("pattern", json()), file, "decoder Replace");
    const std::string content = j.value("content", "");
    return [re, content](std::vector<std::string> toks) {
      for (auto& s : toks) s = replace_all(s, *re, content);
      return toks;
    };
  }
  if (t == "Sequence") {
    std::vector<DecodeStep> steps;
    for (const json& d : j.value("decoders", json::array())) steps.push_back(make_decoder(d, file, added));
    return [steps](std::vector<std::string> toks) {
      for (const auto& f : steps) toks = f(std::move(toks));
      return toks;
    };
  }
  refuse(file, "decoder '" + t + "' is not implemented (implemented: ByteLevel, Metaspace, ByteFallback, Fuse, Strip, Replace, Sequence)");
}

struct AddedToken {
  std::string content;
  std::uint32_t id;
  bool lstrip, rstrip, normalized;
};

// Longest-match splitting by a set of strings (the JS DictionarySplitter): pieces in order, with a flag for
// the pieces that are one of the strings.
class Splitter {
 public:
  void add(const std::string& s) {
    if (!s.empty()) by_first_[static_cast<unsigned char>(s[0])].push_back(s);
  }
  void finish() {
    for (auto& v : by_first_)
      std::sort(v.begin(), v.end(), [](const std::string& a, const std::string& b) { return a.size() > b.size(); });
  }
  bool empty() const {
    return std::all_of(by_first_.begin(), by_first_.end(), [](const auto& v) { return v.empty(); });
  }
  std::vector<std::pair<std::string, bool>> split(const std::string& text) const {
    std::vector<std::pair<std::string, bool>> out;
    std::size_t start = 0, i = 0;
    while (i < text.size()) {
      const std::string* hit = nullptr;
      for (const auto& s : by_first_[static_cast<unsigned char>(text[i])])
        if (text.compare(i, s.size(), s) == 0) {
          hit = &s;
          break;
        }
      if (!hit) {
        ++i;
        continue;
      }
      if (i > start) out.emplace_back(text.substr(start, i - start), false);
      out.emplace_back(*hit, true);
      i += hit->size();
      start = i;
    }
    if (start < text.size()) out.emplace_back(text.substr(start), false);
    return out;
  }

 private:
  std::array<std::vector<std::string>, 256> by_first_;
};

std::string trim_end(const std::string& s) {
  std::size_t e = s.size();
  while (e > 0 && std::isspace(static_cast<unsigned char>(s[e - 1]))) --e;
  return s.substr(0, e);
}
std::string trim_start(const std::string& s) {
  std::size_t b = 0;
  while (b < s.size() && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  return s.substr(b);
}

class HfTokenizer final : public Tokenizer {
 public:
  HfTokenizer(const HfTokenizer&) = delete;  // the decoder holds a reference to added_ids_
  HfTokenizer& operator=(const HfTokenizer&) = delete;
  HfTokenizer(const json& tj, const json* config, const std::string& file) {
    const json& model = tj.at("model");
    const std::string mt = type_of(model);
    if (mt != "BPE" && !(mt.empty() && model.contains("merges")))
      refuse(file, "model '" + mt + "' is not implemented (implemented: BPE)");
    if (model.contains("dropout") && !model["dropout"].is_null() && model["dropout"].get<double>() != 0.0)
      refuse(file, "BPE dropout is not implemented (set \"dropout\": null)");
    for (const char* k : {"continuing_subword_prefix", "end_of_word_suffix"})
      if (model.contains(k) && model[k].is_string() && !model[k].get<std::string>().empty())
        refuse(file, std::string("BPE ") + k + " is not implemented");
    byte_fallback_ = model.value("byte_fallback", false);
    ignore_merges_ = model.value("ignore_merges", false);

    if (tj.contains("normalizer") && !tj["normalizer"].is_null()) normalizer_ = make_normalizer(tj["normalizer"], file);
    if (tj.contains("pre_tokenizer") && !tj["pre_tokenizer"].is_null())
      pre_tokenizer_ = make_pre_tokenizer(tj["pre_tokenizer"], file, byte_level_, true);

    // Vocabulary: id -> token string (for decoding), model key -> id (raw bytes under ByteLevel).
    for (const auto& [tok, idj] : model.at("vocab").items()) {
      const auto id = idj.get<std::uint32_t>();
      if (id >= id_to_token_.size()) id_to_token_.resize(id + 1);
      id_to_token_[id] = tok;
      if (byte_level_) {
        if (auto raw = unmap_byte_level(tok)) token_to_id_[*raw] = id;
      } else {
        token_to_id_[tok] = id;
      }
    }
    if (model.contains("unk_token") && model["unk_token"].is_string()) {
      auto it = token_to_id_.find(model_key(model["unk_token"].get<std::string>()));
      if (it == token_to_id_.end()) refuse(file, "BPE unk_token is not in the vocabulary");
      unk_ = it->second;
    }
    if (byte_level_)
      for (int b = 0; b < 256; ++b) {
        auto it = token_to_id_.find(std::string(1, static_cast<char>(b)));
        if (it != token_to_id_.end()) byte_unit_ids_[b] = it->second;
      }
    if (byte_fallback_)
      for (int b = 0; b < 256; ++b) {
        char name[8];
        std::snprintf(name, sizeof name, "<0x%02X>", b);
        auto it = token_to_id_.find(model_key(name));
        if (it != token_to_id_.end()) byte_ids_[b] = it->second;
      }
    // Merges, as "a b" strings or ["a", "b"] pairs (both forms exist); the rank is the position.
    const json& merges = model.at("merges");
    merges_.reserve(merges.size() * 2);
    for (std::size_t r = 0; r < merges.size(); ++r) {
      std::string a, b;
      if (merges[r].is_array() && merges[r].size() == 2) {
        a = merges[r][0].get<std::string>();
        b = merges[r][1].get<std::string>();
      } else if (merges[r].is_string()) {
        const std::string m = merges[r].get<std::string>();
        const auto sp = m.find(' ', 1);
        if (sp == std::string::npos) refuse(file, "merge " + std::to_string(r) + " '" + m + "' is not two tokens separated by a space");
        a = m.substr(0, sp);
        b = m.substr(sp + 1);
      } else {
        refuse(file, "merge " + std::to_string(r) + " is neither a \"a b\" string nor an [a, b] pair");
      }
      const auto ia = token_to_id_.find(model_key(a)), ib = token_to_id_.find(model_key(b)),
                 ic = token_to_id_.find(model_key(a + b));
      if (ia == token_to_id_.end() || ib == token_to_id_.end() || ic == token_to_id_.end())
        refuse(file, "merge " + std::to_string(r) + " ('" + a + "' '" + b + "') names a token not in the vocabulary");
      merges_.emplace(pair_key(ia->second, ib->second), Merge{static_cast<std::uint32_t>(r), ic->second});
    }

    for (const json& a : tj.value("added_tokens", json::array())) {
      AddedToken t{a.at("content").get<std::string>(), a.at("id").get<std::uint32_t>(), a.value("lstrip", false),
                   a.value("rstrip", false), a.value("normalized", false)};
      if (a.value("single_word", false)) refuse(file, "added token '" + t.content + "' with single_word=true is not implemented");
      if (t.id >= id_to_token_.size()) id_to_token_.resize(t.id + 1);
      id_to_token_[t.id] = t.content;
      added_ids_[t.content] = t.id;
      added_[t.content] = t;
      if (t.normalized && normalizer_) {
        const std::string n = normalizer_(t.content);
        added_[n] = t;
        added_ids_[n] = t.id;
        normalized_splitter_.add(n);
      } else {
        raw_splitter_.add(t.content);
      }
    }
    raw_splitter_.finish();
    normalized_splitter_.finish();

    if (tj.contains("post_processor") && !tj["post_processor"].is_null()) read_post_processor(tj["post_processor"], file);
    if (tj.contains("decoder") && !tj["decoder"].is_null()) decoder_ = make_decoder(tj["decoder"], file, added_ids_);

    if (config) {
      bos_ = special_from_config(*config, "bos_token", file);
      eos_ = special_from_config(*config, "eos_token", file);
    }
  }

  std::vector<std::uint32_t> encode(std::string_view text, bool add_special) const override {
    check_utf8(text);
    std::vector<std::uint32_t> ids;
    if (add_special) ids.insert(ids.end(), prefix_.begin(), prefix_.end());
    auto sections = raw_splitter_.split(std::string(text));
    strip_neighbours(sections);
    for (std::size_t si = 0; si < sections.size(); ++si) {
      auto& [sec, is_added] = sections[si];
      if (sec.empty()) continue;
      if (is_added) {
        ids.push_back(added_.at(sec).id);
        continue;
      }
      std::string norm = normalizer_ ? normalizer_(std::move(sec)) : std::move(sec);
      auto subs = normalized_splitter_.empty() ? std::vector<std::pair<std::string, bool>>{{std::move(norm), false}}
                                               : normalized_splitter_.split(norm);
      strip_neighbours(subs);
      for (auto& [sub, sub_added] : subs) {
        if (sub.empty()) continue;
        if (sub_added) {
          ids.push_back(added_.at(sub).id);
          continue;
        }
        if (!pre_tokenizer_) {
          encode_word(sub, ids);
          continue;
        }
        pieces_.clear();
        pre_tokenizer_(sub, si, pieces_);
        for (const auto& p : pieces_) encode_word(p, ids);
      }
    }
    if (add_special) ids.insert(ids.end(), suffix_.begin(), suffix_.end());
    return ids;
  }

  std::string decode(const std::vector<std::uint32_t>& ids) const override {
    std::vector<std::string> toks;
    toks.reserve(ids.size());
    for (auto id : ids) {
      if (id >= id_to_token_.size()) throw TokenizerError("token id " + std::to_string(id) + " is outside the vocabulary (" + std::to_string(id_to_token_.size()) + ")");
      toks.push_back(id_to_token_[id]);
    }
    if (decoder_) toks = decoder_(std::move(toks));
    std::string out;
    for (const auto& t : toks) out += t;
    return out;
  }
  std::optional<std::uint32_t> bos_id() const override { return bos_; }
  std::optional<std::uint32_t> eos_id() const override { return eos_; }
  std::size_t vocab_size() const override { return id_to_token_.size(); }

 private:
  struct Merge {
    std::uint32_t rank, result;
  };
  static std::uint64_t pair_key(std::uint32_t a, std::uint32_t b) { return (std::uint64_t{a} << 32) | b; }
  // The key a token string has in token_to_id_: its raw bytes under ByteLevel.
  std::string model_key(const std::string& tok) const {
    if (!byte_level_) return tok;
    auto raw = unmap_byte_level(tok);
    return raw ? *raw : std::string("\xFF\xFE") + tok;  // cannot match any input piece
  }

  void strip_neighbours(std::vector<std::pair<std::string, bool>>& secs) const {
    for (std::size_t i = 0; i < secs.size(); ++i) {
      if (!secs[i].second) continue;
      const AddedToken& t = added_.at(secs[i].first);
      if (t.lstrip && i > 0 && !secs[i - 1].second) secs[i - 1].first = trim_end(secs[i - 1].first);
      if (t.rstrip && i + 1 < secs.size() && !secs[i + 1].second) secs[i + 1].first = trim_start(secs[i + 1].first);
    }
  }

  // BPE of one pre-token, appended to out. Units are bytes (ByteLevel) or code points.
  void encode_word(const std::string& word, std::vector<std::uint32_t>& out) const {
    if (word.empty()) return;
    if (ignore_merges_) {
      auto it = token_to_id_.find(word);
      if (it != token_to_id_.end()) {
        out.push_back(it->second);
        return;
      }
    }
    auto hit = cache_.find(word);
    if (hit != cache_.end()) {
      out.insert(out.end(), hit->second.begin(), hit->second.end());
      return;
    }
    // Symbols: a vocabulary id, or kUnknown with the unit's bytes kept for byte fallback.
    constexpr std::uint32_t kUnknown = 0xFFFFFFFFu, kDead = 0xFFFFFFFEu;
    std::vector<std::uint32_t> sym;
    std::vector<std::string> unknown_text;
    std::size_t i = 0;
    std::string unit;
    while (i < word.size()) {
      const std::size_t b = i;
      std::optional<std::uint32_t> id;
      if (byte_level_) {
        id = byte_unit_ids_[static_cast<unsigned char>(word[i++])];
      } else {
        utf8_next(word, i);
        unit.assign(word, b, i - b);
        auto it = token_to_id_.find(unit);
        if (it != token_to_id_.end()) id = it->second;
      }
      if (id) {
        sym.push_back(*id);
      } else {
        unit.assign(word, b, i - b);
        sym.push_back(kUnknown);
        unknown_text.push_back(unit);
      }
    }
    // Lowest rank first, leftmost on ties (JS BPE: score = rank + position/length), with a heap of candidate
    // pairs keyed by (rank, left symbol's original position): O(n log n), so a long pre-token (a text with no
    // pre-tokenizer is one) stays linear-ish. A popped candidate whose pair has changed since is skipped.
    const std::size_t n = sym.size();
    if (n > 1) {
      constexpr std::size_t kNone = static_cast<std::size_t>(-1);
      std::vector<std::size_t> prev(n), next(n);
      for (std::size_t k = 0; k < n; ++k) {
        prev[k] = k == 0 ? kNone : k - 1;
        next[k] = k + 1 == n ? kNone : k + 1;
      }
      using Candidate = std::pair<std::uint32_t, std::size_t>;  // (rank, position)
      std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> heap;
      auto push = [&](std::size_t k) {
        if (k == kNone || next[k] == kNone || sym[k] == kUnknown || sym[next[k]] == kUnknown) return;
        auto m = merges_.find(pair_key(sym[k], sym[next[k]]));
        if (m != merges_.end()) heap.emplace(m->second.rank, k);
      };
      for (std::size_t k = 0; k + 1 < n; ++k) push(k);
      while (!heap.empty()) {
        const auto [rank, k] = heap.top();
        heap.pop();
        if (sym[k] == kDead || next[k] == kNone || sym[k] == kUnknown || sym[next[k]] == kUnknown) continue;
        auto m = merges_.find(pair_key(sym[k], sym[next[k]]));
        if (m == merges_.end() || m->second.rank != rank) continue;  // stale: the pair changed
        const std::size_t r = next[k];
        sym[k] = m->second.result;
        sym[r] = kDead;
        next[k] = next[r];
        if (next[r] != kNone) prev[next[r]] = k;
        push(prev[k]);
        push(k);
      }
      std::size_t w = 0;
      for (std::size_t k = 0; k < n; ++k)
        if (sym[k] != kDead) sym[w++] = sym[k];
      sym.resize(w);
    }
    std::vector<std::uint32_t> ids;
    std::size_t u = 0;
    for (auto s : sym) {
      if (s != kUnknown) {
        ids.push_back(s);
        continue;
      }
      const std::string& text = unknown_text[u++];
      bool all = byte_fallback_;
      for (unsigned char c : text) all = all && byte_ids_[c].has_value();
      if (all) {
        for (unsigned char c : text) ids.push_back(*byte_ids_[c]);
      } else if (unk_) {
        ids.push_back(*unk_);
      }  // else dropped, as the JS BPE does without unk_token
    }
    out.insert(out.end(), ids.begin(), ids.end());
    if (word.size() < 256) {
      if (cache_.size() >= kCacheEntries) cache_.clear();  // bounded memory: start over rather than evict one by one
      cache_.emplace(word, std::move(ids));
    }
  }

  void read_post_processor(const json& j, const std::string& file) {
    const std::string t = type_of(j);
    if (t == "ByteLevel") return;  // offsets only: ids unchanged
    if (t == "Sequence") {
      for (const json& p : j.value("processors", json::array())) read_post_processor(p, file);
      return;
    }
    if (t == "TemplateProcessing") {
      bool after = false;
      for (const json& item : j.at("single")) {
        if (item.contains("Sequence")) {
          after = true;
        } else if (item.contains("SpecialToken")) {
          const std::string name = item["SpecialToken"].at("id").get<std::string>();
          const json& sp = j.at("special_tokens");
          if (!sp.contains(name)) refuse(file, "TemplateProcessing names special token '" + name + "' missing from its special_tokens");
          for (const json& id : sp[name].at("ids")) (after ? suffix_ : prefix_).push_back(id.get<std::uint32_t>());
        }
      }
      return;
    }
    refuse(file, "post-processor '" + t + "' is not implemented (implemented: ByteLevel, TemplateProcessing, Sequence)");
  }

  std::optional<std::uint32_t> special_from_config(const json& config, const char* key, const std::string& file) const {
    if (!config.contains(key) || config[key].is_null()) return std::nullopt;
    const json& v = config[key];
    const std::string content = v.is_object() ? v.value("content", "") : v.get<std::string>();
    auto a = added_ids_.find(content);
    if (a != added_ids_.end()) return a->second;
    auto it = token_to_id_.find(model_key(content));
    if (it != token_to_id_.end()) return it->second;
    refuse(file, std::string("tokenizer_config.json ") + key + " '" + content + "' is not a token of tokenizer.json");
  }

  static constexpr std::size_t kCacheEntries = 1 << 16;
  Normalize normalizer_;
  PreTokenize pre_tokenizer_;
  DecodeStep decoder_;
  bool byte_level_ = false, byte_fallback_ = false, ignore_merges_ = false;
  std::vector<std::string> id_to_token_;
  std::unordered_map<std::string, std::uint32_t> token_to_id_;
  std::unordered_map<std::uint64_t, Merge> merges_;
  std::array<std::optional<std::uint32_t>, 256> byte_ids_{};       // <0xXX> tokens (byte fallback)
  std::array<std::optional<std::uint32_t>, 256> byte_unit_ids_{};  // single-byte tokens (ByteLevel's units)
  std::optional<std::uint32_t> unk_, bos_, eos_;
  std::unordered_map<std::string, AddedToken> added_;
  std::unordered_map<std::string, std::uint32_t> added_ids_;
  Splitter raw_splitter_, normalized_splitter_;
  std::vector<std::uint32_t> prefix_, suffix_;
  mutable std::unordered_map<std::string, std::vector<std::uint32_t>> cache_;
  mutable std::vector<std::string> pieces_;
};

json read_json(const std::string& path) {
  std::ifstream is(path);
  if (!is) throw TokenizerError("cannot read " + path + "; check the path");
  try {
    return json::parse(is);
  } catch (const json::exception& e) {
    throw TokenizerError(path + " is not valid JSON: " + e.what());
  }
}

}  // namespace

std::unique_ptr<Tokenizer> load_hf_tokenizer(const std::string& path, const std::string& config_path) {
  const json tj = read_json(path);
  if (!tj.is_object() || !tj.contains("model")) refuse(path, "no \"model\" object; give a Hugging Face tokenizer.json");
  std::optional<json> config;
  if (!config_path.empty()) config = read_json(config_path);
  try {
    return std::make_unique<HfTokenizer>(tj, config ? &*config : nullptr, path);
  } catch (const json::exception& e) {
    refuse(path, std::string("unexpected structure: ") + e.what());
  }
}

}  // namespace meshrun::train
