// bf16 conversion shared by host and device code: round to nearest-even, NaN, infinities, round trips.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <limits>

#include "meshrun/device/bf16.hpp"

using namespace meshrun::device;

TEST_CASE("bf16: every bf16 value survives the round trip", "[bf16]") {
  for (std::uint32_t b = 0; b < 0x10000u; ++b) {
    const float f = float_from_bf16(static_cast<std::uint16_t>(b));
    if (std::isnan(f)) {
      CHECK(std::isnan(float_from_bf16(bf16_from_float(f))));
    } else {
      REQUIRE(bf16_from_float(f) == b);
    }
  }
}

TEST_CASE("bf16: round to nearest, ties to even", "[bf16]") {
  // bf16 keeps 7 fraction bits: around 1 the spacing is 2^-7.
  CHECK(round_bf16(1.0f + 0x1p-8f) == 1.0f);                        // tie, 1 is even
  CHECK(round_bf16(1.0f + 3 * 0x1p-8f) == 1.0f + 0x1p-6f);          // tie, rounds up to the even neighbour
  CHECK(round_bf16(1.0f + 0x1p-8f + 0x1p-20f) == 1.0f + 0x1p-7f);   // just above the tie
  CHECK(round_bf16(1.0f + 0x1p-8f - 0x1p-20f) == 1.0f);             // just below
  CHECK(round_bf16(-(1.0f + 3 * 0x1p-8f)) == -(1.0f + 0x1p-6f));    // symmetric
  CHECK(round_bf16(0x1p-130f) == 0x1p-130f);                        // subnormals round like any value
  CHECK(std::signbit(round_bf16(-0.0f)));
}

TEST_CASE("bf16: infinities, overflow and NaN", "[bf16]") {
  const float inf = std::numeric_limits<float>::infinity();
  CHECK(round_bf16(inf) == inf);
  CHECK(round_bf16(-inf) == -inf);
  CHECK(round_bf16(std::numeric_limits<float>::max()) == inf);   // beyond bf16's max by more than half an ulp
  const float nan = std::numeric_limits<float>::quiet_NaN();
  CHECK(std::isnan(round_bf16(nan)));
  CHECK(std::isnan(round_bf16(-nan)));
  // a NaN whose payload sits only in the dropped low bits must not turn into infinity
  CHECK(std::isnan(float_from_bf16(bf16_from_float(bits_float(0x7f800001u)))));
}
