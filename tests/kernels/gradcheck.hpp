// Test helpers for the kernels: deterministic random tensors, central finite differences and the
// relative-error metric every gradient check uses.
#pragma once

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

namespace meshrun::kernels::test {

using Vec = std::vector<double>;

// Uniform values in [lo, hi) from a fixed seed (reproducible within one standard library).
inline Vec random_vec(std::size_t n, std::uint64_t seed, double lo = -1.0, double hi = 1.0) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> dist(lo, hi);
  Vec v(n);
  for (double& x : v) x = dist(rng);
  return v;
}

inline std::vector<float> to_float(const Vec& v) { return {v.begin(), v.end()}; }

inline double dot(const Vec& a, const Vec& b) {
  double s = 0;
  for (std::size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

// The metric of every gradient check, over a whole gradient tensor:
//   rel(a, n) = ‖a − n‖₂ / max(‖a‖₂, ‖n‖₂),   0 when both are exactly zero.
// It is scale-free and, unlike an elementwise ratio, not blown up by entries that are near zero.
inline double rel_error(const Vec& a, const Vec& n) {
  double diff = 0, na = 0, nn = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    diff += (a[i] - n[i]) * (a[i] - n[i]);
    na += a[i] * a[i];
    nn += n[i] * n[i];
  }
  const double denom = std::sqrt(std::max(na, nn));
  return denom == 0 ? 0.0 : std::sqrt(diff) / denom;
}

// Central finite differences of the scalar function f() with respect to every element of x, which f
// reads by reference: g_i = (f(x + h·e_i) − f(x − h·e_i)) / 2h. x is restored afterwards.
template <class F>
Vec numeric_grad(Vec& x, F&& f, double h = 1e-6) {
  Vec g(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double x0 = x[i];
    x[i] = x0 + h;
    const double fp = f();
    x[i] = x0 - h;
    const double fm = f();
    x[i] = x0;
    g[i] = (fp - fm) / (2 * h);
  }
  return g;
}

// Difference of two accumulating gradient buffers (after − before): the contribution of one call.
inline Vec minus(const Vec& after, const Vec& before) {
  Vec d(after.size());
  for (std::size_t i = 0; i < d.size(); ++i) d[i] = after[i] - before[i];
  return d;
}

constexpr double kGradTol = 1e-6;  // the bound for float64 gradient checks

}  // namespace meshrun::kernels::test
