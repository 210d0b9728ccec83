// make_indexed PREFIX TEXT [FIRST_LINE LINES]: a Megatron indexed dataset of byte-level tokens (ids 0..255),
// one document per line of TEXT (its newline included), lines [FIRST_LINE, FIRST_LINE + LINES) (all without
// them), written with the trainer's own IndexedDatasetWriter. The data CLI test's datasets.
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "meshrun/train/data/data.hpp"
#include "meshrun/train/data/indexed_dataset.hpp"

int main(int argc, char** argv) {
  if (argc != 3 && argc != 5) {
    std::fputs("usage: make_indexed PREFIX TEXT [FIRST_LINE LINES]\n", stderr);
    return 2;
  }
  const long first = argc == 5 ? std::atol(argv[3]) : 0, count = argc == 5 ? std::atol(argv[4]) : -1;
  std::ifstream in(argv[2], std::ios::binary);
  if (!in) {
    std::fprintf(stderr, "make_indexed: cannot read %s\n", argv[2]);
    return 2;
  }
  try {
    meshrun::train::IndexedDatasetWriter w(argv[1], 8);
    std::string line;
    for (long i = 0; std::getline(in, line); ++i) {
      if (i < first || (count >= 0 && i >= first + count)) continue;
      line += '\n';
      std::vector<std::uint32_t> ids(line.begin(), line.end());
      for (auto& id : ids) id &= 0xff;
      w.add_document(ids.data(), ids.size());
    }
    w.finish();
  } catch (const meshrun::train::DataError& e) {
    std::fprintf(stderr, "make_indexed: %s\n", e.what());
    return 2;
  }
  return 0;
}
