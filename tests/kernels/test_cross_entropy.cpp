// Cross-entropy (unsharded and vocab-sharded) and the vocab-shard-aware embedding.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>

#include "gradcheck.hpp"
#include "meshrun/kernels/cpu.hpp"

namespace k = meshrun::kernels::cpu;
using namespace meshrun::kernels::test;
using Ids = std::vector<std::int32_t>;

namespace {

// −log softmax(z)[t] in double, straight from the definition.
double naive_ce(const double* z, int vocab, int t) {
  double mx = *std::max_element(z, z + vocab), s = 0;
  for (int j = 0; j < vocab; ++j) s += std::exp(z[j] - mx);
  return std::log(s) + mx - z[t];
}

// The trainer's combination of the per-shard pieces (MAX, SUM, SUM all-reduces written out as loops).
template <class T>
std::vector<T> sharded_loss(const std::vector<T>& logits, const Ids& targets, int rows, int vocab,
                            const std::vector<int>& bounds, std::vector<T>& m, std::vector<T>& s) {
  const std::size_t nshard = bounds.size() - 1;
  std::vector<std::vector<T>> shard(nshard);
  for (std::size_t p = 0; p < nshard; ++p) {
    const int v0 = bounds[p], vl = bounds[p + 1] - v0;
    for (int r = 0; r < rows; ++r)
      shard[p].insert(shard[p].end(), logits.begin() + r * vocab + v0, logits.begin() + r * vocab + v0 + vl);
  }
  m.assign(rows, -INFINITY);
  s.assign(rows, T(0));
  std::vector<T> z(rows, T(0)), part(rows);
  for (std::size_t p = 0; p < nshard; ++p) {
    k::ce_row_max(part.data(), shard[p].data(), rows, bounds[p + 1] - bounds[p]);
    for (int r = 0; r < rows; ++r) m[r] = std::max(m[r], part[r]);
  }
  for (std::size_t p = 0; p < nshard; ++p) {
    const int v0 = bounds[p], vl = bounds[p + 1] - v0;
    k::ce_row_sumexp(part.data(), shard[p].data(), m.data(), rows, vl);
    for (int r = 0; r < rows; ++r) s[r] += part[r];
    k::ce_target_logit(part.data(), shard[p].data(), targets.data(), rows, vl, v0);
    for (int r = 0; r < rows; ++r) z[r] += part[r];
  }
  std::vector<T> loss(rows);
  k::ce_row_loss(loss.data(), m.data(), s.data(), z.data(), targets.data(), rows);
  return loss;
}

}  // namespace

TEST_CASE("cross-entropy equals -log softmax and ignores negative targets", "[kernels][ce]") {
  const int rows = 4, vocab = 37;
  const Vec logits = random_vec(rows * vocab, 1, -8, 8);
  const Ids targets{5, 0, -100, 36};
  Vec loss(rows), m(rows), s(rows);
  const double total =
      k::cross_entropy_forward(loss.data(), m.data(), s.data(), logits.data(), targets.data(), rows, vocab);
  double expect = 0;
  for (int r = 0; r < rows; ++r) {
    const double ref = targets[r] < 0 ? 0.0 : naive_ce(logits.data() + r * vocab, vocab, targets[r]);
    CHECK(loss[r] == Approx(ref).epsilon(1e-14));
    expect += ref;
  }
  CHECK(total == Approx(expect).epsilon(1e-14));
}

TEST_CASE("vocab-sharded cross-entropy pieces combine to the unsharded loss", "[kernels][ce]") {
  const int rows = 6, vocab = 50;
  const Vec ld = random_vec(rows * vocab, 2, -10, 10);
  const Ids targets{0, 16, 17, 33, 49, -1};  // targets on shard edges, and one ignored row
  const auto lf = to_float(ld);
  std::vector<float> loss(rows), m(rows), s(rows);
  k::cross_entropy_forward(loss.data(), m.data(), s.data(), lf.data(), targets.data(), rows, vocab);
  std::vector<float> dfull(lf.size());
  k::cross_entropy_backward(dfull.data(), lf.data(), m.data(), s.data(), targets.data(), rows, vocab, 0.25);

  for (const std::vector<int>& bounds :
       {std::vector<int>{0, 17, 34, 50}, std::vector<int>{0, 25, 50}, std::vector<int>{0, 50}}) {
    std::vector<float> ms, ss;
    const auto ls = sharded_loss(lf, targets, rows, vocab, bounds, ms, ss);
    for (int r = 0; r < rows; ++r) CHECK(ls[r] == Approx(loss[r]).epsilon(1e-6));
    for (std::size_t p = 0; p + 1 < bounds.size(); ++p) {  // each shard's dlogits = its slice of the full one
      const int v0 = bounds[p], vl = bounds[p + 1] - v0;
      std::vector<float> shard, d(std::size_t(rows) * vl);
      for (int r = 0; r < rows; ++r)
        shard.insert(shard.end(), lf.begin() + r * vocab + v0, lf.begin() + r * vocab + v0 + vl);
      k::ce_backward(d.data(), shard.data(), ms.data(), ss.data(), targets.data(), rows, vl, v0, 0.25);
      for (int r = 0; r < rows; ++r)
        for (int j = 0; j < vl; ++j) CHECK(d[r * vl + j] == Approx(dfull[r * vocab + v0 + j]).margin(1e-7));
    }
  }
  // Negative: skipping the SUM of target logits across shards (keeping shard 0's piece) is detected.
  const Ids t40(rows, 40);
  std::vector<float> ms, ss;
  const auto right = sharded_loss(lf, t40, rows, vocab, {0, 17, 34, 50}, ms, ss);
  std::vector<float> shard0, z0(rows), bad(rows);
  for (int r = 0; r < rows; ++r)
    shard0.insert(shard0.end(), lf.begin() + r * vocab, lf.begin() + r * vocab + 17);
  k::ce_target_logit(z0.data(), shard0.data(), t40.data(), rows, 17, 0);
  CHECK(z0[0] == 0.0f);  // target 40 is outside [0, 17): shard 0 contributes nothing
  k::ce_row_loss(bad.data(), ms.data(), ss.data(), z0.data(), t40.data(), rows);
  CHECK(std::abs(bad[0] - right[0]) > 1e-3f);
}

TEST_CASE("cross-entropy backward matches float64 central differences", "[kernels][ce][gradcheck]") {
  const int rows = 3, vocab = 11;
  Vec z = random_vec(rows * vocab, 3, -4, 4);
  const Ids targets{2, 10, 0};
  Vec loss(rows), m(rows), s(rows);
  auto f = [&] {
    return 0.5 *
           k::cross_entropy_forward(loss.data(), m.data(), s.data(), z.data(), targets.data(), rows, vocab);
  };
  const Vec gz = numeric_grad(z, f);
  f();
  Vec dz(z.size());
  k::cross_entropy_backward(dz.data(), z.data(), m.data(), s.data(), targets.data(), rows, vocab, 0.5);
  CHECK(rel_error(dz, gz) <= kGradTol);
  // in place (dlogits aliasing logits) is allowed
  Vec zz = z;
  k::cross_entropy_backward(zz.data(), zz.data(), m.data(), s.data(), targets.data(), rows, vocab, 0.5);
  CHECK(zz == dz);
}

TEST_CASE("embedding lookup and gradient, whole and vocab-sharded", "[kernels][embedding][gradcheck]") {
  const int vocab = 10, dim = 4, n = 8;
  const Ids ids{3, 9, 3, 0, 5, 9, 3, 6};  // repeated ids accumulate; 6 is the first id of shard 2
  Vec table = random_vec(vocab * dim, 4), r = random_vec(n * dim, 5), out(n * dim);
  auto loss = [&] {
    k::embedding_forward(out.data(), table.data(), ids.data(), n, dim, 0, vocab);
    return dot(out, r);
  };
  const Vec gt = numeric_grad(table, loss);
  const Vec prior = random_vec(vocab * dim, 6);
  Vec dt = prior;
  k::embedding_backward(dt.data(), r.data(), ids.data(), n, dim, 0, vocab);
  CHECK(rel_error(minus(dt, prior), gt) <= kGradTol);

  // Two shards [0, 6) and [6, 10): forward outputs sum to the full lookup; gradients are the slices.
  // Gradient buffers are full-size so a write past a shard's last row would show up in the comparison.
  loss();
  Vec o1(n * dim), o2(n * dim), g1(vocab * dim, 0.0), g2(vocab * dim, 0.0), gfull(vocab * dim, 0.0);
  k::embedding_forward(o1.data(), table.data(), ids.data(), n, dim, 0, 6);
  k::embedding_forward(o2.data(), table.data() + 6 * dim, ids.data(), n, dim, 6, 4);
  for (int i = 0; i < n * dim; ++i) CHECK(o1[i] + o2[i] == out[i]);
  CHECK(o1[1 * dim] == 0.0);  // id 9 lives on shard 2
  CHECK(o1[7 * dim] == 0.0);  // id 6 too
  k::embedding_backward(g1.data(), r.data(), ids.data(), n, dim, 0, 6);
  k::embedding_backward(g2.data(), r.data(), ids.data(), n, dim, 6, 4);
  k::embedding_backward(gfull.data(), r.data(), ids.data(), n, dim, 0, vocab);
  Vec joined(g1.begin(), g1.begin() + 6 * dim);
  joined.insert(joined.end(), g2.begin(), g2.begin() + 4 * dim);
  CHECK(joined == gfull);
  CHECK(std::all_of(g1.begin() + 6 * dim, g1.end(), [](double x) { return x == 0.0; }));
  CHECK(std::all_of(g2.begin() + 4 * dim, g2.end(), [](double x) { return x == 0.0; }));
}
