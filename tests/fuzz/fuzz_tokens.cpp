// Target 7: token files (data.path) and the batch schedule that reads them.
// Input: byte 0 = dtype (bit 0: uint16/uint32) and shuffle (bit 1); bytes 1-4 = model.vocab (little endian,
// at least 1); byte 5 = seq_len - 1 (mod 16); byte 6 = global batch - 1 (mod 4); the rest is the file.
// Contracts: only DataError escapes; an accepted file has every token id in [0, vocab) and holds one batch;
// every sequence's ids and targets are in [0, vocab) and the targets are the ids shifted by one.
#include "fuzz_common.hpp"
#include "meshrun/train/data/data.hpp"

using namespace meshrun::train;

static meshrun::fuzz::ScratchCleanup cleanup;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 7) return 0;
  const std::string dtype = data[0] & 1 ? "uint32" : "uint16";
  const bool shuffle = data[0] & 2;
  std::int64_t vocab = std::int64_t(data[1]) | std::int64_t(data[2]) << 8 | std::int64_t(data[3]) << 16 |
                       std::int64_t(data[4]) << 24;
  if (vocab < 1) vocab = 1;
  const std::int64_t seq = 1 + data[5] % 16, batch = 1 + data[6] % 4;
  const std::string path = meshrun::fuzz::write_scratch("tokens.bin", data + 7, size - 7);
  try {
    TokenFile f(path, dtype, vocab, seq, batch);
    FUZZ_CHECK(f.tokens() >= batch * seq + 1 && f.windows() >= 1, "an accepted file shorter than one batch");
    for (std::int64_t i = 0; i < f.tokens(); ++i)
      FUZZ_CHECK(f.at(i) >= 0 && f.at(i) < vocab, "token " + std::to_string(i) + " = " + std::to_string(f.at(i)) +
                                                         " outside [0, " + std::to_string(vocab) + ")");
    const BatchSchedule sched(f, seq, batch, shuffle, data[0]);
    std::vector<std::int32_t> ids(static_cast<size_t>(seq)), targets(static_cast<size_t>(seq));
    for (std::int64_t index : {std::int64_t(0), batch - 1, f.windows(), 3 * f.windows() + 1}) {
      sched.sequence(index, ids.data(), targets.data());
      for (std::int64_t t = 0; t < seq; ++t) {
        FUZZ_CHECK(ids[t] >= 0 && ids[t] < vocab && targets[t] >= 0 && targets[t] < vocab, "id outside the vocabulary");
        if (t + 1 < seq) FUZZ_CHECK(targets[t] == ids[t + 1], "targets are not the ids shifted by one");
      }
    }
  } catch (const DataError& e) {
    FUZZ_CHECK(!std::string(e.what()).empty(), "DataError message");
  }
  return 0;
}
