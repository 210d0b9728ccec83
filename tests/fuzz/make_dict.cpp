// Writes the libFuzzer dictionary of fuzz_config from the config key table (config_keys()), so it never
// drifts from the schema: every section header, key, "section.key=" for --set lines, and TOML tokens.
#include <cstdio>
#include <fstream>
#include <set>
#include <string>

#include "meshrun/config.hpp"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: meshrun-fuzz-dict OUT.dict\n");
    return 2;
  }
  std::ofstream out(argv[1]);
  std::set<std::string> words{"--set ", " = ", "\\x0A", "\"auto\"", "true", "false", "\"tp-cp-ep-dp-pp\"", "[[", "]]",
                              "{ ", " }", "\"\"\"", "1e400", "-1", "0", "2147483647", "9223372036854775807"};
  for (const meshrun::KeyInfo& k : meshrun::config_keys()) {
    const size_t dot = k.key.find('.');
    words.insert("[" + k.key.substr(0, dot) + "]");
    words.insert(k.key.substr(dot + 1));
    words.insert(k.key + "=");
  }
  for (const std::string& w : words) {
    std::string escaped;
    for (char c : w) escaped += c == '"' ? std::string("\\\"") : std::string(1, c);
    out << '"' << escaped << "\"\n";
  }
  return out ? 0 : 1;
}
