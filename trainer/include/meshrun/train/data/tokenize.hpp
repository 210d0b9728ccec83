// Text to token ids through a tokenizer (docs/data.md): what meshrun-tokenize --tokenizer writes, and what
// meshrun-train builds from data.text when data.tokenizer is set.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "meshrun/train/tokenizer/tokenizer.hpp"

namespace meshrun::train {

struct TokenizeCounts {
  std::int64_t tokens = 0, documents = 0, bytes = 0;
};

// The documents of `inputs` (files, or the regular files of directories sorted by name: a plain-text file is one
// document; JSONL, *.jsonl or every input when json_key is given, one per line) through `tok`, with its special
// tokens, into `out`: a Megatron PREFIX.bin/.idx (OUT or OUT.bin/.idx) with EOS after each document, or with
// `raw` the bare id stream (no EOS). DataError with one line naming the file (and line) on bad input.
TokenizeCounts tokenize_documents(const Tokenizer& tok, const std::vector<std::string>& inputs, const std::string& out,
                                  const std::string& dtype, bool raw, const std::string& json_key);

}  // namespace meshrun::train
