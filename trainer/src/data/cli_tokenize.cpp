// meshrun-tokenize OUT.bin INPUT... : byte-level tokens (one per UTF-8 byte) in a raw token file.
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "meshrun/train/run/cli.hpp"
#include "meshrun/train/data/data.hpp"
#include "meshrun/version.hpp"

namespace meshrun::train {

int tokenize_main(int argc, char** argv) {
  std::string out, dtype = "uint16";
  std::vector<std::string> inputs;
  for (int i = 1; i < argc; ++i) {
    const std::string s = argv[i];
    if (s == "--version") {
      std::printf("meshrun-tokenize %s\n", kVersion);
      return 0;
    }
    if (s == "-h" || s == "--help") {
      std::puts("usage: meshrun-tokenize OUT.bin INPUT... [--dtype uint16|uint32]\n"
                "  INPUT is a UTF-8 text file or a directory (its files, sorted); every byte becomes a token 0..255.");
      return 0;
    }
    if (s == "--dtype") {
      if (i + 1 >= argc) { std::fputs("meshrun-tokenize: --dtype needs uint16 or uint32\n", stderr); return 2; }
      dtype = argv[++i];
    } else if (!s.empty() && s[0] == '-') {
      std::fprintf(stderr, "meshrun-tokenize: unknown option %s; see --help\n", s.c_str());
      return 2;
    } else if (out.empty()) {
      out = s;
    } else {
      inputs.push_back(s);
    }
  }
  if (out.empty() || inputs.empty()) {
    std::fputs("meshrun-tokenize: give an output file and at least one input; usage: meshrun-tokenize OUT.bin INPUT...\n", stderr);
    return 2;
  }
  try {
    const auto n = tokenize_bytes(inputs, out, dtype);
    std::printf("meshrun-tokenize: wrote %lld tokens (%s) to %s\n", static_cast<long long>(n), dtype.c_str(), out.c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "meshrun-tokenize: %s\n", e.what());
    return 2;
  }
  return 0;
}

}  // namespace meshrun::train
