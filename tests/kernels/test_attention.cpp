// Attention: online-softmax kernel vs a naive full-softmax reference (fp32 and fp64), the ring-attention
// merge, gradient checks of the backward, and the per-key-block accumulation ring attention relies on.
#include <catch2/catch.hpp>
#include <cmath>
#include <limits>
#include <numeric>

#include "gradcheck.hpp"
#include "meshrun/kernels/cpu.hpp"

namespace k = meshrun::kernels::cpu;
using namespace meshrun::kernels::test;
using Pos = std::vector<std::int32_t>;

namespace {

// Full softmax per (query, head) in double, with HF repeat_kv head mapping; out [tq,hq,d], lse [tq,hq].
void naive_attention(Vec& out, Vec& lse, const Vec& q, const Vec& kk, const Vec& v, const Pos& qpos,
                     const Pos& kpos, const k::AttentionDims& dm, double scale) {
  out.assign(std::size_t(dm.tq * dm.hq * dm.d), 0.0);
  lse.assign(std::size_t(dm.tq * dm.hq), -std::numeric_limits<double>::infinity());
  for (std::int64_t i = 0; i < dm.tq; ++i)
    for (std::int64_t h = 0; h < dm.hq; ++h) {
      const std::int64_t g = h / (dm.hq / dm.hkv);
      Vec s(std::size_t(dm.tk), -std::numeric_limits<double>::infinity());
      double mx = -std::numeric_limits<double>::infinity();
      for (std::int64_t j = 0; j < dm.tk; ++j) {
        if (kpos[j] > qpos[i]) continue;
        double acc = 0;
        for (std::int64_t c = 0; c < dm.d; ++c)
          acc += q[(i * dm.hq + h) * dm.d + c] * kk[(j * dm.hkv + g) * dm.d + c];
        s[j] = acc * scale;
        mx = std::max(mx, s[j]);
      }
      if (mx == -std::numeric_limits<double>::infinity()) continue;
      double sum = 0;
      for (double& x : s) sum += (x = std::exp(x - mx));
      for (std::int64_t j = 0; j < dm.tk; ++j)
        for (std::int64_t c = 0; c < dm.d; ++c)
          out[(i * dm.hq + h) * dm.d + c] += s[j] / sum * v[(j * dm.hkv + g) * dm.d + c];
      lse[i * dm.hq + h] = mx + std::log(sum);
    }
}

Pos iota_pos(std::int64_t n, std::int32_t first = 0) {
  Pos p(static_cast<std::size_t>(n));
  std::iota(p.begin(), p.end(), first);
  return p;
}

struct Case {
  k::AttentionDims dm;
  Vec q, k, v;
  Pos qpos, kpos;
  double scale;
};

Case make_case(k::AttentionDims dm, std::uint64_t seed, double amp = 1.0) {
  Case c{dm,
         random_vec(std::size_t(dm.tq * dm.hq * dm.d), seed, -amp, amp),
         random_vec(std::size_t(dm.tk * dm.hkv * dm.d), seed + 1, -amp, amp),
         random_vec(std::size_t(dm.tk * dm.hkv * dm.d), seed + 2),
         iota_pos(dm.tq, std::int32_t(dm.tk - dm.tq)),  // queries are the last tq of tk tokens
         iota_pos(dm.tk),
         1.0 / std::sqrt(double(dm.d))};
  return c;
}

}  // namespace

TEST_CASE("attention equals the naive full softmax (fp64 and fp32)", "[kernels][attention]") {
  // 150 keys cross a key-block edge (BK=128) and 70 queries a query-block edge (BQ=48), GQA 6:2; the
  // 100-token self-attention has key blocks that are only partly in a query block's causal past.
  for (auto dm : {k::AttentionDims{70, 150, 6, 2, 16}, k::AttentionDims{5, 5, 2, 2, 4},
                  k::AttentionDims{33, 33, 4, 1, 8}, k::AttentionDims{100, 100, 2, 1, 8}}) {
    Case c = make_case(dm, 100, 3.0);
    Vec ref_out, ref_lse;
    naive_attention(ref_out, ref_lse, c.q, c.k, c.v, c.qpos, c.kpos, dm, c.scale);

    Vec out(ref_out.size()), lse(ref_lse.size());
    k::attention_forward(out.data(), lse.data(), c.q.data(), c.k.data(), c.v.data(), c.qpos.data(),
                         c.kpos.data(), dm, c.scale);
    CHECK(rel_error(out, ref_out) <= 1e-13);
    CHECK(rel_error(lse, ref_lse) <= 1e-13);

    auto qf = to_float(c.q), kf = to_float(c.k), vf = to_float(c.v);
    std::vector<float> outf(ref_out.size()), lsef(ref_lse.size());
    k::attention_forward(outf.data(), lsef.data(), qf.data(), kf.data(), vf.data(), c.qpos.data(),
                         c.kpos.data(), dm, c.scale);
    CHECK(rel_error(Vec(outf.begin(), outf.end()), ref_out) <= 1e-5);
    CHECK(rel_error(Vec(lsef.begin(), lsef.end()), ref_lse) <= 1e-6);
  }
}

TEST_CASE("attention honours arbitrary global positions (context-parallel chunks)", "[kernels][attention]") {
  // Load-balanced CP chunks: this rank holds chunks 0 and 3 of 4 (positions 0-9 and 30-39) as queries
  // and all 40 keys. Each query row must equal the same row of the full causal run.
  const k::AttentionDims full{40, 40, 2, 1, 8}, part{20, 40, 2, 1, 8};
  Case c = make_case(full, 200);
  Vec out_full(40 * 2 * 8), lse_full(40 * 2);
  k::attention_forward(out_full.data(), lse_full.data(), c.q.data(), c.k.data(), c.v.data(), c.qpos.data(),
                       c.kpos.data(), full, c.scale);
  Pos qpos;
  Vec qpart;
  for (int t : {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39}) {
    qpos.push_back(t);
    qpart.insert(qpart.end(), c.q.begin() + t * 16, c.q.begin() + (t + 1) * 16);
  }
  Vec out(20 * 16), lse(20 * 2);
  k::attention_forward(out.data(), lse.data(), qpart.data(), c.k.data(), c.v.data(), qpos.data(),
                       c.kpos.data(), part, c.scale);
  for (std::size_t r = 0; r < qpos.size(); ++r)
    for (int e = 0; e < 16; ++e) CHECK(out[r * 16 + e] == Approx(out_full[qpos[r] * 16 + e]).epsilon(1e-13));
}

TEST_CASE("merging attention over two key halves equals attention over all keys", "[kernels][attention]") {
  const k::AttentionDims dm{48, 96, 4, 2, 8};
  Case c = make_case(dm, 300, 2.0);
  Vec out(48 * 4 * 8), lse(48 * 4);
  k::attention_forward(out.data(), lse.data(), c.q.data(), c.k.data(), c.v.data(), c.qpos.data(),
                       c.kpos.data(), dm, c.scale);
  // Keys split in halves as ring attention sees them. The queries (positions 48..95) see all of the first
  // half and the causal part of the second; both partial results merge into the full one.
  const k::AttentionDims half{48, 48, 4, 2, 8};
  const std::size_t kv_half = 48 * 2 * 8;
  Vec o1(out.size()), l1(lse.size()), o2(out.size()), l2(lse.size());
  k::attention_forward(o1.data(), l1.data(), c.q.data(), c.k.data(), c.v.data(), c.qpos.data(), c.kpos.data(),
                       half, c.scale);
  Pos qpos_early = iota_pos(48, 0);  // queries at positions 0..47 see no key of the second half
  k::attention_forward(o2.data(), l2.data(), c.q.data(), c.k.data() + kv_half, c.v.data() + kv_half,
                       c.qpos.data(), c.kpos.data() + 48, half, c.scale);
  k::attention_merge(o1.data(), l1.data(), o2.data(), l2.data(), 48 * 4, 8);
  CHECK(rel_error(o1, out) <= 1e-14);
  CHECK(rel_error(l1, lse) <= 1e-14);

  // Rows that saw no key: out 0, lse −inf, and merging them is a no-op in either direction.
  Vec oe(out.size()), le(lse.size());
  k::attention_forward(oe.data(), le.data(), c.q.data(), c.k.data() + kv_half, c.v.data() + kv_half,
                       qpos_early.data(), c.kpos.data() + 48, half, c.scale);
  CHECK(std::isinf(le[0]));
  CHECK(le[0] < 0);
  CHECK(oe[0] == 0.0);
  Vec keep = out, keep_lse = lse;
  k::attention_merge(keep.data(), keep_lse.data(), oe.data(), le.data(), 48 * 4, 8);
  CHECK(keep == out);
  k::attention_merge(oe.data(), le.data(), out.data(), lse.data(), 48 * 4, 8);
  CHECK(oe == out);
  CHECK(le == lse);

  // A wrong merge (plain average) is caught by the same comparison.
  Vec avg(out.size());
  for (std::size_t i = 0; i < avg.size(); ++i) avg[i] = 0.5 * (o1[i] + o2[i]);
  CHECK(rel_error(avg, out) > 1e-3);
}

TEST_CASE("attention backward matches float64 central differences", "[kernels][attention][gradcheck]") {
  // 50 queries and 130 keys cross the query (48) and key (128) block edges; GQA 4:2 so dk/dv sum over
  // two query heads.
  const k::AttentionDims dm{50, 130, 4, 2, 4};
  Case c = make_case(dm, 400, 1.5);
  const Vec r = random_vec(std::size_t(dm.tq * dm.hq * dm.d), 401);
  Vec out(r.size()), lse(std::size_t(dm.tq * dm.hq));
  auto loss = [&] {
    k::attention_forward(out.data(), lse.data(), c.q.data(), c.k.data(), c.v.data(), c.qpos.data(),
                         c.kpos.data(), dm, c.scale);
    return dot(out, r);
  };
  const Vec gq = numeric_grad(c.q, loss), gk = numeric_grad(c.k, loss), gv = numeric_grad(c.v, loss);
  loss();
  const Vec pq = random_vec(c.q.size(), 402), pk = random_vec(c.k.size(), 403),
            pv = random_vec(c.v.size(), 404);
  Vec dq = pq, dk = pk, dv = pv;  // ACCUMULATE semantics: start from non-zero buffers
  k::attention_backward(dq.data(), dk.data(), dv.data(), r.data(), out.data(), lse.data(), c.q.data(),
                        c.k.data(), c.v.data(), c.qpos.data(), c.kpos.data(), dm, c.scale);
  CHECK(rel_error(minus(dq, pq), gq) <= kGradTol);
  CHECK(rel_error(minus(dk, pk), gk) <= kGradTol);
  CHECK(rel_error(minus(dv, pv), gv) <= kGradTol);
}

TEST_CASE("attention backward per key block sums to the full backward (ring attention)",
          "[kernels][attention]") {
  const k::AttentionDims dm{64, 128, 2, 2, 8};
  Case c = make_case(dm, 500);
  const Vec dout = random_vec(std::size_t(dm.tq * dm.hq * dm.d), 501);
  Vec out(dout.size()), lse(std::size_t(dm.tq * dm.hq));
  k::attention_forward(out.data(), lse.data(), c.q.data(), c.k.data(), c.v.data(), c.qpos.data(),
                       c.kpos.data(), dm, c.scale);
  Vec dq(c.q.size(), 0.0), dk(c.k.size(), 0.0), dv(c.v.size(), 0.0);
  k::attention_backward(dq.data(), dk.data(), dv.data(), dout.data(), out.data(), lse.data(), c.q.data(),
                        c.k.data(), c.v.data(), c.qpos.data(), c.kpos.data(), dm, c.scale);
  // Same backward, one key block of 32 at a time, using the final out/lse as ring attention does.
  Vec dq2(c.q.size(), 0.0), dk2(c.k.size(), 0.0), dv2(c.v.size(), 0.0);
  const k::AttentionDims blk{64, 32, 2, 2, 8};
  const std::size_t stride = 32 * 2 * 8;
  for (int b = 0; b < 4; ++b)
    k::attention_backward(dq2.data(), dk2.data() + b * stride, dv2.data() + b * stride, dout.data(),
                          out.data(), lse.data(), c.q.data(), c.k.data() + b * stride,
                          c.v.data() + b * stride, c.qpos.data(), c.kpos.data() + b * 32, blk, c.scale);
  CHECK(rel_error(dq2, dq) <= 1e-13);
  CHECK(rel_error(dk2, dk) <= 1e-13);
  CHECK(rel_error(dv2, dv) <= 1e-13);
}
