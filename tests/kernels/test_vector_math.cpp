// The kernels' vectorized float exp and lane reductions (internal header vector_math.hpp).
#include <catch2/catch.hpp>
#include <cmath>
#include <limits>
#include <vector>

#include "vector_math.hpp"

using meshrun::kernels::detail::exp_approx;
using meshrun::kernels::detail::max_lanes;
using meshrun::kernels::detail::sum_lanes;

TEST_CASE("exp_approx is within 2 ulp of exp over the float range", "[kernels][vector_math]") {
  double worst = 0;
  int samples = 0;
  for (double x = -87.3; x < 88.7; x += 0.000731) {  // ~240k points, not aligned to any grid
    const float xf = float(x);
    const double ref = std::exp(double(xf));
    const float rf = float(ref);
    const double ulp = double(std::nextafter(rf, std::numeric_limits<float>::infinity())) - double(rf);
    worst = std::max(worst, std::abs(double(exp_approx(xf)) - ref) / ulp);
    ++samples;
  }
  INFO("worst error " << worst << " ulp over " << samples << " samples");
  CHECK(worst <= 2.0);
  CHECK(exp_approx(0.0f) == 1.0f);
  CHECK(exp_approx(-std::numeric_limits<float>::infinity()) == 0.0f);  // the causal mask relies on it
  CHECK(exp_approx(-100.0f) == 0.0f);
  CHECK(exp_approx(1.0) == std::exp(1.0));  // double path is std::exp
}

TEST_CASE("lane sums and maxima", "[kernels][vector_math]") {
  for (int n : {0, 1, 15, 16, 17, 100, 1000}) {
    std::vector<float> x(static_cast<std::size_t>(n));
    double ref = 0;
    for (int i = 0; i < n; ++i)
      ref += (x[std::size_t(i)] = float(i % 7) - 2.5f);  // exactly representable sums
    CHECK(sum_lanes(x.data(), n) == float(ref));
    float mx = -1e30f;
    for (float v : x) mx = std::max(mx, v);
    CHECK(max_lanes(x.data(), n, -1e30f) == mx);
  }
  // Rounding-sensitive data: lanes differ from a serial sum only within rounding.
  std::vector<float> y(777);
  for (std::size_t i = 0; i < y.size(); ++i) y[i] = 1.0f / float(i + 1);
  double ref = 0;
  for (float v : y) ref += v;
  CHECK(sum_lanes(y.data(), 777) == Approx(ref).epsilon(1e-6));
}
