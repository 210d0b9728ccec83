// meshrun-tokenize OUT INPUT... [--tokenizer FILE] [--format megatron|raw] [--json-key KEY] [--dtype uint16|uint32]
// Without --tokenizer: byte-level tokens (one per UTF-8 byte) in a raw token file, as before.
// With --tokenizer: a plain-text input file is one document, a JSONL file (*.jsonl, or every input when
// --json-key is given) one document per line; OUT is a Megatron .bin/.idx pair (EOS after each document) or,
// with --format raw, the bare id stream (no EOS added).
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include <unistd.h>

#include "meshrun/train/data/data.hpp"
#include "meshrun/train/data/indexed_dataset.hpp"
#include "meshrun/train/data/tokenize.hpp"
#include "meshrun/train/run/cli.hpp"
#include "meshrun/train/tokenizer/tokenizer.hpp"
#include "meshrun/version.hpp"

namespace meshrun::train {
namespace {

constexpr const char* kUsage =
    "usage: meshrun-tokenize OUT INPUT... [--tokenizer FILE] [--format megatron|raw] [--json-key KEY]\n"
    "                        [--dtype uint16|uint32]\n"
    "  INPUT is a UTF-8 text file or a directory (its files, sorted).\n"
    "  Without --tokenizer every byte becomes a token 0..255 in the raw token file OUT.\n"
    "  --tokenizer FILE  a Hugging Face tokenizer.json (tokenizer_config.json beside it gives BOS/EOS) or a\n"
    "                    SentencePiece .model; a plain-text file is one document, JSONL (*.jsonl, or any input\n"
    "                    with --json-key) one document per line, its KEY field (default \"text\").\n"
    "  --format megatron (default with --tokenizer) OUT.bin + OUT.idx, EOS after each document;\n"
    "           raw      OUT is the bare id stream, no EOS added.";

// The raw token file, written to a temporary and renamed into place when complete.
class RawWriter {
 public:
  RawWriter(std::string path, const std::string& dtype)
      : path_(std::move(path)), tmp_(path_ + ".tmp" + std::to_string(::getpid())), width_(dtype == "uint16" ? 2 : 4),
        os_(tmp_, std::ios::binary | std::ios::trunc) {
    if (!os_) throw DataError("cannot write token file " + path_ + "; check the directory exists and is writable");
  }
  ~RawWriter() {
    if (!done_) std::filesystem::remove(tmp_);
  }
  void add(const std::vector<std::uint32_t>& ids) {
    buf_.clear();
    for (auto id : ids)
      for (int b = 0; b < width_; ++b) buf_.push_back(static_cast<char>((id >> (8 * b)) & 0xFF));
    os_.write(buf_.data(), static_cast<std::streamsize>(buf_.size()));
  }
  void finish() {
    os_.close();
    if (!os_) throw DataError("writing token file " + path_ + " failed (disk full?)");
    std::filesystem::rename(tmp_, path_);
    done_ = true;
  }

 private:
  std::string path_, tmp_;
  int width_;
  std::ofstream os_;
  std::string buf_;
  bool done_ = false;
};

std::string read_file(const std::string& path) {
  std::ifstream is(path, std::ios::binary);
  if (!is) throw DataError("cannot read text file " + path);
  return std::string((std::istreambuf_iterator<char>(is)), std::istreambuf_iterator<char>());
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

struct Options {
  std::string out, dtype = "uint16", tokenizer, format, json_key;
  std::vector<std::string> inputs;
};

}  // namespace

TokenizeCounts tokenize_documents(const Tokenizer& tok, const std::vector<std::string>& inputs, const std::string& out,
                                  const std::string& dtype, bool raw, const std::string& json_key) {
  if (dtype != "uint16" && dtype != "uint32") throw DataError("--dtype " + dtype + " is not supported; use uint16 or uint32");
  if (dtype == "uint16" && tok.vocab_size() > 65536)
    throw DataError("the tokenizer has " + std::to_string(tok.vocab_size()) + " ids, more than uint16 holds; use --dtype uint32");
  if (!raw && !tok.eos_id())
    throw DataError("the tokenizer has no EOS token (tokenizer_config.json eos_token, or the .model's eos_id) to end "
                    "documents with; give one or use --format raw");
  std::unique_ptr<RawWriter> raw_out;
  std::unique_ptr<IndexedDatasetWriter> mega_out;
  if (raw) {
    raw_out = std::make_unique<RawWriter>(out, dtype);
  } else {
    std::string prefix = out;
    if (ends_with(prefix, ".bin") || ends_with(prefix, ".idx")) prefix.resize(prefix.size() - 4);
    mega_out = std::make_unique<IndexedDatasetWriter>(prefix, indexed_dtype_code(dtype));
  }
  TokenizeCounts n;
  auto add_document = [&](const std::string& text, const std::string& where) {
    std::vector<std::uint32_t> ids;
    try {
      ids = tok.encode(text, true);
    } catch (const TokenizerError& e) {
      throw DataError(where + ": " + e.what());
    }
    if (raw) {
      raw_out->add(ids);
    } else {
      ids.push_back(*tok.eos_id());
      mega_out->add_document(ids.data(), ids.size());
    }
    n.tokens += static_cast<std::int64_t>(ids.size());
    n.bytes += static_cast<std::int64_t>(text.size());
    ++n.documents;
  };
  for (const std::string& f : text_files(inputs)) {
    const bool jsonl = !json_key.empty() || ends_with(f, ".jsonl");
    if (!jsonl) {
      add_document(read_file(f), f);
      continue;
    }
    const std::string key = json_key.empty() ? "text" : json_key;
    std::ifstream is(f, std::ios::binary);
    if (!is) throw DataError("cannot read text file " + f);
    std::string line;
    for (std::int64_t l = 1; std::getline(is, line); ++l) {
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
      const std::string where = f + " line " + std::to_string(l);
      nlohmann::json j;
      try {
        j = nlohmann::json::parse(line);
      } catch (const nlohmann::json::exception&) {
        throw DataError(where + " is not a JSON object; JSONL input needs one object per line");
      }
      if (!j.is_object() || !j.contains(key) || !j[key].is_string())
        throw DataError(where + " has no string field \"" + key + "\"; name the text field with --json-key");
      add_document(j[key].get<std::string>(), where);
    }
  }
  if (n.documents == 0) throw DataError("the inputs hold no documents; give a non-empty text or JSONL file");
  if (raw) raw_out->finish();
  else mega_out->finish();
  return n;
}

namespace {

int tokenize_with(const Options& o) {
  const auto t0 = std::chrono::steady_clock::now();
  const auto tok = load_tokenizer(o.tokenizer);
  const bool raw = o.format == "raw";
  const TokenizeCounts n = tokenize_documents(*tok, o.inputs, o.out, o.dtype, raw, o.json_key);
  std::string prefix = o.out;
  if (ends_with(prefix, ".bin") || ends_with(prefix, ".idx")) prefix.resize(prefix.size() - 4);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("meshrun-tokenize: wrote %lld tokens in %lld documents (%s) to %s (%.1f MB in %.2f s, load included)\n",
              static_cast<long long>(n.tokens), static_cast<long long>(n.documents), o.dtype.c_str(),
              raw ? o.out.c_str() : (prefix + ".bin/.idx").c_str(), static_cast<double>(n.bytes) / 1e6, s);
  return 0;
}

}  // namespace

int tokenize_main(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string s = argv[i];
    if (s == "--version") {
      std::printf("meshrun-tokenize %s\n", kVersion);
      return 0;
    }
    if (s == "-h" || s == "--help") {
      std::puts(kUsage);
      return 0;
    }
    if (s == "--dtype" || s == "--tokenizer" || s == "--format" || s == "--json-key") {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "meshrun-tokenize: %s needs a value; see --help\n", s.c_str());
        return 2;
      }
      std::string& v = s == "--dtype" ? o.dtype : s == "--tokenizer" ? o.tokenizer : s == "--format" ? o.format : o.json_key;
      v = argv[++i];
    } else if (!s.empty() && s[0] == '-') {
      std::fprintf(stderr, "meshrun-tokenize: unknown option %s; see --help\n", s.c_str());
      return 2;
    } else if (o.out.empty()) {
      o.out = s;
    } else {
      o.inputs.push_back(s);
    }
  }
  if (o.out.empty() || o.inputs.empty()) {
    std::fputs("meshrun-tokenize: give an output file and at least one input; usage: meshrun-tokenize OUT INPUT... [--tokenizer FILE]\n", stderr);
    return 2;
  }
  if (!o.format.empty() && o.format != "raw" && o.format != "megatron") {
    std::fprintf(stderr, "meshrun-tokenize: --format %s is unknown; use megatron or raw\n", o.format.c_str());
    return 2;
  }
  if (o.tokenizer.empty() && (o.format == "megatron" || !o.json_key.empty())) {
    std::fputs("meshrun-tokenize: --format megatron and --json-key need --tokenizer FILE (byte-level mode writes a raw file)\n", stderr);
    return 2;
  }
  try {
    if (!o.tokenizer.empty()) return tokenize_with(o);
    const auto n = tokenize_bytes(o.inputs, o.out, o.dtype);
    std::printf("meshrun-tokenize: wrote %lld tokens (%s) to %s\n", static_cast<long long>(n), o.dtype.c_str(), o.out.c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "meshrun-tokenize: %s\n", e.what());
    return 2;
  }
  return 0;
}

}  // namespace meshrun::train
