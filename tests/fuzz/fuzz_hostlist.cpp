// Target 2: Slurm hostlist expressions (cluster.hosts, SLURM_JOB_NODELIST).
// Contracts: expansion either succeeds or returns nullopt with a one-line error; every expanded name is a
// plain host name (non-empty, no ',', '[' or ']'); printing the names comma-separated and parsing that again
// gives the same list (parse -> print -> parse round trip); "A,B" expands to A's names followed by B's, so
// the count of a list is the sum of its parts.
#include "fuzz_common.hpp"
#include "meshrun/hostlist.hpp"

using namespace meshrun;

namespace {

// Lists above this are not expanded here: 4M names take > 10 s under ASan (the time limit would measure the
// sanitizer's allocator). hostlist_size is computed without expanding; tests/mesh/test_limits checks it
// against real expansions up to the cap.
constexpr int64_t kExpandLimit = int64_t(1) << 16;
constexpr int64_t kExpandBytes = int64_t(1) << 20;  // 51,112 names of 130 bytes: 1.1 s alone under ASan

std::optional<std::vector<std::string>> expand(std::string_view expr, bool input_had_newline) {
  std::string error;
  const auto size = hostlist_size(expr, &error);
  if (size && (size->hosts > kExpandLimit || size->bytes > kExpandBytes)) return std::nullopt;
  auto names = expand_hostlist(expr, &error);
  if (size && names) FUZZ_CHECK(static_cast<int64_t>(names->size()) == size->hosts, "hostlist_size of '" + std::string(expr) + "'");
  // Raw messages echo the expression; ConfigError cuts long values when the config layer wraps them.
  if (!names)
    FUZZ_CHECK(!error.empty() && (input_had_newline || error.find('\n') == error.npos), "error for '" + std::string(expr) + "'");
  return names;
}

std::string print(const std::vector<std::string>& names) {
  std::string s;
  for (const auto& n : names) s += (s.empty() ? "" : ",") + n;
  return s;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  const bool nl = in.find('\n') != in.npos;
  // An optional second expression after a NUL byte, for the concatenation check.
  const size_t nul = in.find('\0');
  const std::string_view a = in.substr(0, nul), b = nul == in.npos ? std::string_view() : in.substr(nul + 1);
  const auto names = expand(a, nl);
  if (!names) return 0;
  for (const auto& n : *names)
    FUZZ_CHECK(!n.empty() && n.find_first_of(",[]") == n.npos, "expanded name '" + n + "'");
  // The round trips re-parse every name: bounded so that the time limit measures the code, not the checks.
  if (names->empty()) return 0;
  const auto again = expand(print(*names), nl);
  FUZZ_CHECK(again && *again == *names, "parse -> print -> parse of '" + std::string(a) + "'");
  if (b.empty() || b.find('\0') != b.npos) return 0;
  const auto second = expand(b, nl);
  if (!second || second->empty() || int64_t(names->size() + second->size()) > kExpandLimit ||
      int64_t(print(*names).size() + print(*second).size()) + 1 > kExpandBytes)
    return 0;
  const auto both = expand(std::string(a) + "," + std::string(b), nl);
  FUZZ_CHECK(both && both->size() == names->size() + second->size(), "count of 'A,B' != count of A + count of B");
  FUZZ_CHECK(std::equal(names->begin(), names->end(), both->begin()) &&
                 std::equal(second->begin(), second->end(), both->begin() + static_cast<long>(names->size())),
             "'A,B' is not A's names followed by B's");
  return 0;
}
