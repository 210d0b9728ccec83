// The tokenizer tests' checker (tests/tokenizer/*.sh), on meshrun_tokenizer and the indexed-dataset reader:
//   compare TOKENIZER GOT.u32 WANT.u32       ids equal? else the first mismatch with decoded context; exit 1
//   roundtrip TOKENIZER IDS.u32 TEXT          decode(ids) == TEXT's bytes? else the first differing byte; exit 1
//   encode TOKENIZER TEXT OUT.u32 [plain]     encode TEXT (add_special unless "plain") to little-endian uint32
//   bench TOKENIZER TEXT [REPEATS]            load CPU seconds, encode MB per CPU second (first run, best run)
//   idx PREFIX                                "documents D tokens T" and each document's ids, one line each
//   files TOKENIZER                           tokenizer_files: "tokenizer.json" or "sentencepiece", then each file
#include <algorithm>
#include <ctime>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "meshrun/train/data/indexed_dataset.hpp"
#include "meshrun/train/tokenizer/tokenizer.hpp"

namespace {

std::string slurp(const std::string& path) {
  std::ifstream is(path, std::ios::binary);
  if (!is) throw std::runtime_error("cannot read " + path);
  return std::string((std::istreambuf_iterator<char>(is)), std::istreambuf_iterator<char>());
}

std::vector<std::uint32_t> read_u32(const std::string& path) {
  const std::string b = slurp(path);
  if (b.size() % 4) throw std::runtime_error(path + " is not a whole number of uint32");
  std::vector<std::uint32_t> v(b.size() / 4);
  for (std::size_t i = 0; i < v.size(); ++i)
    v[i] = static_cast<std::uint32_t>(static_cast<unsigned char>(b[4 * i])) |
           static_cast<std::uint32_t>(static_cast<unsigned char>(b[4 * i + 1])) << 8 |
           static_cast<std::uint32_t>(static_cast<unsigned char>(b[4 * i + 2])) << 16 |
           static_cast<std::uint32_t>(static_cast<unsigned char>(b[4 * i + 3])) << 24;
  return v;
}

std::string ids_text(const std::vector<std::uint32_t>& v, std::size_t from, std::size_t to) {
  std::string s;
  for (std::size_t i = from; i < std::min(to, v.size()); ++i) s += (s.empty() ? "" : " ") + std::to_string(v[i]);
  return s;
}

std::string shown(const std::string& s) {  // control characters escaped so the report stays on its lines
  std::string out;
  for (unsigned char c : s) {
    if (c == '\n') out += "\\n";
    else if (c == '\t') out += "\\t";
    else if (c == '\r') out += "\\r";
    else out.push_back(static_cast<char>(c));
  }
  return out;
}

int compare(const meshrun::train::Tokenizer& tok, const std::string& got_path, const std::string& want_path) {
  const auto got = read_u32(got_path), want = read_u32(want_path);
  std::size_t i = 0;
  while (i < got.size() && i < want.size() && got[i] == want[i]) ++i;
  if (i == got.size() && i == want.size()) {
    std::printf("same ids: %zu\n", got.size());
    return 0;
  }
  const std::size_t from = i >= 8 ? i - 8 : 0;
  std::vector<std::uint32_t> before(want.begin() + static_cast<std::ptrdiff_t>(from), want.begin() + static_cast<std::ptrdiff_t>(i));
  std::printf("MISMATCH at id %zu of %zu (meshrun) / %zu (reference)\n", i, got.size(), want.size());
  std::printf("  context before: \"%s\"\n", shown(tok.decode(before)).c_str());
  std::printf("  meshrun:   %s\n  reference: %s\n", ids_text(got, i, i + 8).c_str(), ids_text(want, i, i + 8).c_str());
  std::vector<std::uint32_t> g(got.begin() + static_cast<std::ptrdiff_t>(std::min(i, got.size())), got.begin() + static_cast<std::ptrdiff_t>(std::min(i + 8, got.size())));
  std::vector<std::uint32_t> w(want.begin() + static_cast<std::ptrdiff_t>(std::min(i, want.size())), want.begin() + static_cast<std::ptrdiff_t>(std::min(i + 8, want.size())));
  std::printf("  meshrun text:   \"%s\"\n  reference text: \"%s\"\n", shown(tok.decode(g)).c_str(), shown(tok.decode(w)).c_str());
  return 1;
}

int roundtrip(const meshrun::train::Tokenizer& tok, const std::string& ids_path, const std::string& text_path) {
  const std::string got = tok.decode(read_u32(ids_path)), want = slurp(text_path);
  std::size_t i = 0;
  while (i < got.size() && i < want.size() && got[i] == want[i]) ++i;
  if (i == got.size() && i == want.size()) {
    std::printf("round trip equal: %zu bytes\n", got.size());
    return 0;
  }
  const std::size_t from = i >= 40 ? i - 40 : 0;
  std::printf("ROUND TRIP DIFFERS at byte %zu of %zu (decoded) / %zu (text)\n  decoded: \"%s\"\n  text:    \"%s\"\n", i,
              got.size(), want.size(), shown(got.substr(from, 80)).c_str(), shown(want.substr(from, 80)).c_str());
  return 1;
}

void write_u32(const std::string& path, const std::vector<std::uint32_t>& ids) {
  std::ofstream os(path, std::ios::binary);
  for (auto id : ids) {
    const unsigned char b[4] = {static_cast<unsigned char>(id), static_cast<unsigned char>(id >> 8),
                                static_cast<unsigned char>(id >> 16), static_cast<unsigned char>(id >> 24)};
    os.write(reinterpret_cast<const char*>(b), 4);
  }
}

}  // namespace

int main(int argc, char** argv) {
  const std::vector<std::string> a(argv + 1, argv + argc);
  try {
    if (a.size() == 4 && a[0] == "compare") return compare(*meshrun::train::load_tokenizer(a[1]), a[2], a[3]);
    if (a.size() == 4 && a[0] == "roundtrip") return roundtrip(*meshrun::train::load_tokenizer(a[1]), a[2], a[3]);
    if ((a.size() == 4 || a.size() == 5) && a[0] == "encode") {
      const auto tok = meshrun::train::load_tokenizer(a[1]);
      write_u32(a[3], tok->encode(slurp(a[2]), !(a.size() == 5 && a[4] == "plain")));
      return 0;
    }
    if ((a.size() == 3 || a.size() == 4) && a[0] == "bench") {
      // Process CPU seconds (one thread), so that other load on a shared machine does not count.
      auto cpu = [] { return static_cast<double>(std::clock()) / CLOCKS_PER_SEC; };
      const double c0 = cpu();
      const auto tok = meshrun::train::load_tokenizer(a[1]);
      const double load = cpu() - c0;
      const std::string text = slurp(a[2]);
      const int repeats = a.size() == 4 ? std::stoi(a[3]) : 3;
      double first = 0, best = 1e30;
      std::size_t n = 0;
      for (int r = 0; r < repeats; ++r) {  // the first run starts with an empty BPE cache, as meshrun-tokenize does
        const double c1 = cpu();
        n = tok->encode(text, true).size();
        const double s = cpu() - c1;
        if (r == 0) first = s;
        best = std::min(best, s);
      }
      const double mb = static_cast<double>(text.size()) / 1e6;
      std::printf("load cpu s: %.2f\nids: %zu\nencode MB/s: %.2f\nencode MB/s, warm cache: %.2f\n", load, n, mb / first, mb / best);
      return 0;
    }
    if (a.size() == 2 && a[0] == "files") {
      const meshrun::train::TokenizerFiles files = meshrun::train::tokenizer_files(a[1]);
      std::printf("%s\n", files.hf_json ? "tokenizer.json" : "sentencepiece");
      for (const std::string& f : files.paths()) std::printf("%s\n", f.c_str());
      return 0;
    }
    if (a.size() == 2 && a[0] == "idx") {
      const meshrun::train::IndexedDataset ds(a[1]);
      std::printf("documents %lld tokens %lld dtype %d\n", static_cast<long long>(ds.documents()),
                  static_cast<long long>(ds.tokens()), ds.dtype_code());
      for (std::int64_t s = 0; s < ds.sequences(); ++s) {
        std::string line;
        for (std::int64_t k = 0; k < ds.sequence_length(s); ++k)
          line += (k ? " " : "") + std::to_string(ds.token(ds.sequence_start(s) + k));
        std::printf("%s\n", line.c_str());
      }
      return 0;
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tokenizer_check: %s\n", e.what());
    return 2;
  }
  std::fputs("usage: tokenizer_check compare|roundtrip|encode|bench|idx|files ... (see the source's header)\n", stderr);
  return 2;
}
