// Target 3: axis orders (parallel.order, --mesh-order, default_order=).
// Contracts: a parsed order is a permutation of the five axes; position() inverts it; str() parses back to
// the same order; a failure sets a one-line error.
#include "fuzz_common.hpp"
#include "meshrun/layout.hpp"

using namespace meshrun;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  std::string error;
  const auto order = parse_order(in, &error);
  if (!order) {
    FUZZ_CHECK(!error.empty() && (in.find('\n') != in.npos || error.find('\n') == error.npos), "error for a bad order");
    return 0;
  }
  bool seen[kAxes] = {};
  for (int i = 0; i < kAxes; ++i) {
    const int a = static_cast<int>(order->axes[static_cast<size_t>(i)]);
    FUZZ_CHECK(a >= 0 && a < kAxes && !seen[a], "not a permutation: " + order->str());
    seen[a] = true;
    FUZZ_CHECK(order->position(order->axes[static_cast<size_t>(i)]) == i, "position() of " + order->str());
  }
  std::string again_error;
  const auto again = parse_order(order->str(), &again_error);
  FUZZ_CHECK(again && *again == *order, "str() does not parse back: " + order->str() + " " + again_error);
  return 0;
}
