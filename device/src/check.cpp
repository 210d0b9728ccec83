// meshrun-gpu-check's GPU-independent parts (check.hpp).
#include "meshrun/device/check.hpp"
#include "meshrun/device/rng.hpp"

#include <cmath>
#include <functional>
#include <limits>
#include <stdexcept>

#include "meshrun/device/bf16.hpp"

namespace meshrun::device {

const char* const kCheckUsage =
    "usage: meshrun-gpu-check [--only kernels|tiny|perf] [--dry-run] [--tiny-steps N] [--perf-steps N] "
    "[--perf-batch N] [--perf-seq N] [--perf-layers N]";

CheckOptions parse_check_args(int argc, const char* const* argv) {
  CheckOptions o;
  auto number = [&](int& i, const std::string& flag, std::int64_t lo, std::int64_t hi) {
    if (i + 1 >= argc) throw std::invalid_argument(flag + " needs a value; " + kCheckUsage);
    const std::string v = argv[++i];
    std::size_t used = 0;
    long long x = 0;
    try {
      x = std::stoll(v, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != v.size() || x < lo || x > hi)
      throw std::invalid_argument(flag + " '" + v + "' must be an integer in [" + std::to_string(lo) + ", " +
                                  std::to_string(hi) + "]");
    return x;
  };
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--only") {
      if (i + 1 >= argc) throw std::invalid_argument("--only needs kernels, tiny or perf");
      const std::string w = argv[++i];
      if (w != "kernels" && w != "tiny" && w != "perf")
        throw std::invalid_argument("--only '" + w + "' is not kernels, tiny or perf");
      o.kernels = w == "kernels";
      o.tiny = w == "tiny";
      o.perf = w == "perf";
    } else if (a == "-h" || a == "--help") {
      o.help = true;
    } else if (a == "--dry-run") {
      o.dry_run = true;
    } else if (a == "--tiny-steps") {
      o.tiny_steps = static_cast<int>(number(i, a, 1, 1000));
    } else if (a == "--perf-steps") {
      o.perf_steps = static_cast<int>(number(i, a, 1, 10000));
    } else if (a == "--perf-batch") {
      o.perf_model.batch = number(i, a, 1, 4096);
    } else if (a == "--perf-seq") {
      o.perf_model.seq = number(i, a, 2, 1 << 20);
    } else if (a == "--perf-layers") {
      o.perf_model.layers = number(i, a, 1, 1024);
    } else {
      throw std::invalid_argument("unknown argument '" + a + "'; " + kCheckUsage);
    }
  }
  return o;
}

using Rng = SplitMix64;

ModelConfig tiny_model() { return ModelConfig{256, 128, 4, 4, 2, 352, 64, 4}; }

double kernel_bound(const Precision& p) { return p.param == DType::bf16 ? 2e-2 : 1e-4; }

namespace {

using Host = std::vector<double>;

// Buffers of one backend, released when the case ends.
struct Scope {
  Backend& be;
  bool round_bf16_inputs;
  std::vector<Buf> bufs;
  ~Scope() {
    for (Buf& b : bufs) be.release(b);
  }
  Buf make(std::int64_t n, DType t) {
    bufs.push_back(be.alloc(n, t));
    return bufs.back();
  }
  // Host values in a buffer of type t (rounded to bf16 first when the test backend stores bf16, so both
  // backends see the same numbers).
  Buf in(const Host& h, DType t) {
    Buf b = make(static_cast<std::int64_t>(h.size()), t);
    Host v = h;
    if (round_bf16_inputs)
      for (double& x : v) x = round_bf16(static_cast<float>(x));
    be.upload(b, v.data());
    return b;
  }
  Buf ids(const std::vector<std::int32_t>& h) {
    Buf b = make(static_cast<std::int64_t>(h.size()), DType::i32);
    be.upload(b, h.data());
    return b;
  }
  Host out(Buf b) {
    Host h(static_cast<std::size_t>(b.n));
    be.download(h.data(), b);
    return h;
  }
};

Host rnd(std::size_t n, std::uint64_t seed, double lo = -1, double hi = 1) {
  Rng rng{seed};
  Host v(n);
  for (double& x : v) x = lo + (hi - lo) * rng.uniform();
  return v;
}

using Outputs = std::vector<std::pair<std::string, Host>>;
using Case = std::function<Outputs(Scope&)>;

std::vector<std::pair<std::string, Case>> cases() {
  std::vector<std::pair<std::string, Case>> c;
  const std::int64_t n = 192, in = 320, out = 256;   // not multiples of every tile
  c.emplace_back("linear_forward", [=](Scope& s) {
    const Precision p = s.be.precision();
    Buf y = s.make(n * out, p.param);
    s.be.linear_forward(y, s.in(rnd(n * in, 1), p.param), s.in(rnd(out * in, 2, -0.1, 0.1), p.param), n, in, out);
    return Outputs{{"y", s.out(y)}};
  });
  c.emplace_back("linear_forward(fp32 out)", [=](Scope& s) {
    const Precision p = s.be.precision();
    Buf y = s.make(n * out, p.stat);
    s.be.linear_forward(y, s.in(rnd(n * in, 1), p.param), s.in(rnd(out * in, 2, -0.1, 0.1), p.param), n, in, out);
    return Outputs{{"logits", s.out(y)}};
  });
  c.emplace_back("linear_forward_residual", [=](Scope& s) {
    const Precision p = s.be.precision();
    Buf y = s.in(rnd(n * out, 9), p.param), scratch = s.make(n * out, p.param);
    s.be.linear_forward_residual(y, s.in(rnd(n * in, 1), p.param), s.in(rnd(out * in, 2, -0.1, 0.1), p.param), n, in,
                                 out, scratch);
    return Outputs{{"y(+residual)", s.out(y)}};
  });
  c.emplace_back("linear_backward_input(+accumulate)", [=](Scope& s) {
    const Precision p = s.be.precision();
    Buf dx = s.in(rnd(n * in, 3), p.param);
    Buf dy = s.in(rnd(n * out, 4), p.param), w = s.in(rnd(out * in, 5, -0.1, 0.1), p.param);
    s.be.linear_backward_input(dx, dy, w, n, in, out, true);
    Buf dx2 = s.make(n * in, p.param);
    s.be.linear_backward_input(dx2, dy, w, n, in, out, false);
    return Outputs{{"dx(acc)", s.out(dx)}, {"dx", s.out(dx2)}};
  });
  c.emplace_back("linear_backward_weight", [=](Scope& s) {
    const Precision p = s.be.precision();
    Buf dw = s.in(rnd(out * in, 6), p.grad);
    s.be.linear_backward_weight(dw, s.in(rnd(n * out, 7), p.param), s.in(rnd(n * in, 8), p.param), n, in, out);
    return Outputs{{"dw", s.out(dw)}};
  });
  const std::int64_t rows = 96, dim = 320;
  c.emplace_back("rmsnorm_forward", [=](Scope& s) {
    const Precision p = s.be.precision();
    Buf y = s.make(rows * dim, p.param), r = s.make(rows, p.stat);
    s.be.rmsnorm_forward(y, r, s.in(rnd(rows * dim, 9), p.param), s.in(rnd(dim, 10, 0.5, 1.5), p.param), rows, dim,
                         1e-5);
    return Outputs{{"y", s.out(y)}, {"rstd", s.out(r)}};
  });
  c.emplace_back("rmsnorm_backward", [=](Scope& s) {
    const Precision p = s.be.precision();
    Buf x = s.in(rnd(rows * dim, 9), p.param), w = s.in(rnd(dim, 10, 0.5, 1.5), p.param);
    Buf y = s.make(rows * dim, p.param), r = s.make(rows, p.stat);
    s.be.rmsnorm_forward(y, r, x, w, rows, dim, 1e-5);
    Buf dx = s.in(rnd(rows * dim, 11), p.param), dw = s.in(rnd(dim, 12), p.grad);
    s.be.rmsnorm_backward(dx, dw, s.in(rnd(rows * dim, 13), p.param), x, w, r, rows, dim, true);
    return Outputs{{"dx(acc)", s.out(dx)}, {"dw", s.out(dw)}};
  });
  const std::int64_t tok = 80, heads = 6, hd = 64;
  std::vector<std::int32_t> pos(tok);
  for (std::int64_t i = 0; i < tok; ++i) pos[i] = static_cast<std::int32_t>(3 * i + 1);
  c.emplace_back("rope_forward/backward", [=](Scope& s) {
    const Precision p = s.be.precision();
    Buf x = s.in(rnd(tok * heads * hd, 14), p.param), dx = s.in(rnd(tok * heads * hd, 15), p.param);
    Buf ps = s.ids(pos);
    s.be.rope_forward(x, ps, tok, heads, hd, 10000.0);
    s.be.rope_backward(dx, ps, tok, heads, hd, 10000.0);
    return Outputs{{"x", s.out(x)}, {"dx", s.out(dx)}};
  });
  // Attention: one sequence of 200 queries (positions 0..199) over keys split in two halves for the merge.
  const AttentionDims ad{200, 200, 8, 2, 64};
  std::vector<std::int32_t> apos(200);
  for (int i = 0; i < 200; ++i) apos[i] = i;
  const std::int64_t nq = ad.tq * ad.hq * ad.d, nkv = ad.tk * ad.hkv * ad.d;
  const double sc = 1.0 / 8.0;
  c.emplace_back("attention_forward", [=](Scope& s) {
    const Precision p = s.be.precision();
    Buf o = s.make(nq, p.param), l = s.make(ad.tq * ad.hq, p.stat), ps = s.ids(apos);
    s.be.attention_forward(o, l, s.in(rnd(nq, 16), p.param), s.in(rnd(nkv, 17), p.param), s.in(rnd(nkv, 18), p.param),
                           ps, ps, ad, sc);
    return Outputs{{"out", s.out(o)}, {"lse", s.out(l)}};
  });
  c.emplace_back("attention_merge", [=](Scope& s) {
    const Precision p = s.be.precision();
    Buf q = s.in(rnd(nq, 16), p.param), k = s.in(rnd(nkv, 17), p.param), v = s.in(rnd(nkv, 18), p.param);
    Buf qp = s.ids(apos);
    const std::vector<std::int32_t> lo(apos.begin(), apos.begin() + 100), hi(apos.begin() + 100, apos.end());
    Buf kp1 = s.ids(lo), kp2 = s.ids(hi);
    AttentionDims half = ad;
    half.tk = 100;
    const std::int64_t hk = 100 * ad.hkv * ad.d;
    Buf o = s.make(nq, p.param), l = s.make(ad.tq * ad.hq, p.stat);
    Buf o2 = s.make(nq, p.param), l2 = s.make(ad.tq * ad.hq, p.stat);
    s.be.attention_forward(o, l, q, k.at(0, hk), v.at(0, hk), qp, kp1, half, sc);
    s.be.attention_forward(o2, l2, q, k.at(hk, hk), v.at(hk, hk), qp, kp2, half, sc);
    s.be.attention_merge(o, l, o2, l2, ad.tq * ad.hq, ad.d);
    // Rows 0..99 see no key of the second half (lse2 = −inf): the merge must leave them alone.
    return Outputs{{"out", s.out(o)}, {"lse", s.out(l)}};
  });
  c.emplace_back("attention_backward", [=](Scope& s) {
    const Precision p = s.be.precision();
    Buf q = s.in(rnd(nq, 16), p.param), k = s.in(rnd(nkv, 17), p.param), v = s.in(rnd(nkv, 18), p.param);
    Buf ps = s.ids(apos);
    Buf o = s.make(nq, p.param), l = s.make(ad.tq * ad.hq, p.stat);
    s.be.attention_forward(o, l, q, k, v, ps, ps, ad, sc);
    Buf dq = s.in(rnd(nq, 19), p.param), dk = s.in(rnd(nkv, 20), p.param), dv = s.in(rnd(nkv, 21), p.param);
    s.be.attention_backward(dq, dk, dv, s.in(rnd(nq, 22), p.param), o, l, q, k, v, ps, ps, ad, sc);
    return Outputs{{"dq(acc)", s.out(dq)}, {"dk(acc)", s.out(dk)}, {"dv(acc)", s.out(dv)}};
  });
  const std::int64_t ne = 5000;
  c.emplace_back("swiglu_forward/backward", [=](Scope& s) {
    const Precision p = s.be.precision();
    Buf g = s.in(rnd(ne, 23, -4, 4), p.param), u = s.in(rnd(ne, 24), p.param);
    Buf h = s.make(ne, p.param), dg = s.make(ne, p.param), du = s.make(ne, p.param);
    s.be.swiglu_forward(h, g, u, ne);
    s.be.swiglu_backward(dg, du, s.in(rnd(ne, 25), p.param), g, u, ne);
    return Outputs{{"h", s.out(h)}, {"dgate", s.out(dg)}, {"dup", s.out(du)}};
  });
  const std::int64_t en = 300, edim = 96, ev0 = 40, evl = 100;
  std::vector<std::int32_t> eids(en);
  for (std::int64_t i = 0; i < en; ++i) eids[i] = static_cast<std::int32_t>((i * 37) % 160);   // some outside
  c.emplace_back("embedding_forward/backward", [=](Scope& s) {
    const Precision p = s.be.precision();
    Buf ids = s.ids(eids), o = s.make(en * edim, p.param);
    s.be.embedding_forward(o, s.in(rnd(evl * edim, 26), p.param), ids, en, edim, ev0, evl);
    Buf dt = s.in(rnd(evl * edim, 27), p.grad);
    s.be.embedding_backward(dt, s.in(rnd(en * edim, 28), p.param), ids, en, edim, ev0, evl);
    return Outputs{{"out", s.out(o)}, {"dtable(acc)", s.out(dt)}};
  });
  const std::int64_t cr = 64, cv = 1000, cv0 = 500;
  std::vector<std::int32_t> tg(cr);
  for (std::int64_t r = 0; r < cr; ++r) tg[r] = r % 7 == 0 ? -1 : static_cast<std::int32_t>((r * 131) % 2000);
  c.emplace_back("cross_entropy (vocab shard)", [=](Scope& s) {
    const Precision p = s.be.precision();
    Buf lg = s.in(rnd(cr * cv, 29, -8, 8), p.stat), t = s.ids(tg);
    Buf m = s.make(cr, p.stat), se = s.make(cr, p.stat), z = s.make(cr, p.stat), loss = s.make(cr, p.stat);
    s.be.ce_row_max(m, lg, cr, cv);
    s.be.ce_row_sumexp(se, lg, m, cr, cv);
    s.be.ce_target_logit(z, lg, t, cr, cv, cv0);
    s.be.ce_row_loss(loss, m, se, z, t, cr);
    Buf dl = s.make(cr * cv, p.param);
    s.be.ce_backward(dl, lg, m, se, t, cr, cv, cv0, 1.0 / 50);
    return Outputs{{"row_max", s.out(m)}, {"sumexp", s.out(se)}, {"target", s.out(z)}, {"loss", s.out(loss)},
                   {"dlogits", s.out(dl)}};
  });
  const std::int64_t na = 10007, nb = 333;
  c.emplace_back("adamw (2 tensors) + sum_squares", [=](Scope& s) {
    const Precision p = s.be.precision();
    std::vector<AdamTensor> ts;
    for (auto [len, seed] : {std::pair<std::int64_t, int>{na, 30}, {nb, 40}}) {
      AdamTensor t;
      t.master = s.in(rnd(len, seed), p.optim);
      t.m = s.in(rnd(len, seed + 1, -0.01, 0.01), p.optim);
      t.v = s.in(rnd(len, seed + 2, 0, 1e-4), p.optim);
      t.grad = s.in(rnd(len, seed + 3, -0.1, 0.1), p.grad);
      t.param = p.has_master() ? s.make(len, p.param) : t.master;
      ts.push_back(t);
    }
    AdamW hp{1e-3, 0.9, 0.95, 1e-8, 0.1, 3, 0.5};
    s.be.adamw(ts, hp);
    const std::vector<Buf> gs{ts[0].grad, ts[1].grad};
    Outputs o{{"sum_squares", Host{s.be.sum_squares(gs)}}};
    for (std::size_t i = 0; i < ts.size(); ++i) {
      o.emplace_back("master" + std::to_string(i), s.out(ts[i].master));
      o.emplace_back("m" + std::to_string(i), s.out(ts[i].m));
      o.emplace_back("v" + std::to_string(i), s.out(ts[i].v));
      o.emplace_back("param" + std::to_string(i), s.out(ts[i].param));
    }
    return o;
  });
  // The rmsnorm backward halves: the same inputs as "rmsnorm_backward", B and W launched apart.
  c.emplace_back("rmsnorm_backward halves (B +accumulate, W)", [=](Scope& s) {
    const Precision p = s.be.precision();
    Buf x = s.in(rnd(rows * dim, 9), p.param), w = s.in(rnd(dim, 10, 0.5, 1.5), p.param);
    Buf y = s.make(rows * dim, p.param), r = s.make(rows, p.stat);
    s.be.rmsnorm_forward(y, r, x, w, rows, dim, 1e-5);
    Buf dx = s.in(rnd(rows * dim, 11), p.param), dw = s.in(rnd(dim, 12), p.grad), dy = s.in(rnd(rows * dim, 13), p.param);
    s.be.rmsnorm_backward_input(dx, dy, x, w, r, rows, dim, true);
    s.be.rmsnorm_backward_weight(dw, dy, x, r, rows, dim);
    return Outputs{{"dx(acc)", s.out(dx)}, {"dw", s.out(dw)}};
  });
  // Mixture of experts: 240 tokens, 8 experts, top-2, hidden 96; 480 expert rows (slots) of which a few
  // are dropped (slot −1). Router logits are multiples of 1/4 with gaps between ranks (no near-ties
  // that bf16 could flip), plus rows of exact ties (every precision breaks them to the lower index).
  const std::int64_t mn = 240, mh = 96;
  const int mE = 8, mK = 2;
  Host mlogits(static_cast<std::size_t>(mn * mE));
  for (std::int64_t r = 0; r < mn; ++r)
    for (int e = 0; e < mE; ++e)
      mlogits[r * mE + e] = r % 7 == 0 ? (e < 3 ? 1.0 : 0.0)   // a three-way tie for the top two
                                       : 0.25 * static_cast<double>(2 + r % 3) * static_cast<double>((3 * e + r) % mE) - 2.0;
  std::vector<std::int32_t> perm(static_cast<std::size_t>(mn * mK)), mslot(perm.size());
  for (std::size_t i = 0; i < perm.size(); ++i) perm[i] = static_cast<std::int32_t>((i * 97 + 13) % perm.size());
  for (std::size_t i = 0; i < mslot.size(); ++i) mslot[i] = i % 11 == 5 ? -1 : perm[i];
  c.emplace_back("gather_rows", [=](Scope& s) {
    const Precision p = s.be.precision();
    Buf d = s.make(mn * mK * mh, p.param);
    s.be.gather_rows(d, s.in(rnd(mn * mK * mh, 50), p.param), s.ids(perm), mn * mK, mh);
    return Outputs{{"rows", s.out(d)}};
  });
  c.emplace_back("moe_route (twice: stat +=)", [=](Scope& s) {
    const Precision p = s.be.precision();
    Buf pr = s.in(mlogits, p.param), pr2 = s.in(mlogits, p.param), sel = s.make(mn * mK, DType::i32);
    Buf wts = s.make(mn * mK, p.param), stat = s.make(2 * mE, DType::f64);
    s.be.zero(stat);
    s.be.moe_route(pr2, sel, wts, stat, mn, mE, mK);
    s.be.moe_route(pr, sel, wts, stat, mn, mE, mK);
    return Outputs{{"probs", s.out(pr)}, {"sel", s.out(sel)}, {"wts", s.out(wts)}, {"stat", s.out(stat)}};
  });
  c.emplace_back("moe_combine (weighted, unweighted)", [=](Scope& s) {
    const Precision p = s.be.precision();
    Buf rws = s.in(rnd(mn * mK * mh, 51), p.param), sl = s.ids(mslot), w = s.in(rnd(mn * mK, 52, 0, 1), p.param);
    Buf y = s.in(rnd(mn * mh, 53), p.param), y1 = s.in(rnd(mn * mh, 54), p.param);
    s.be.moe_combine(y, rws, w, sl, mn, mK, mh);
    s.be.moe_combine(y1, rws, Buf{}, sl, mn, mK, mh);
    return Outputs{{"y", s.out(y)}, {"y(no wts)", s.out(y1)}};
  });
  c.emplace_back("moe_combine_backward", [=](Scope& s) {
    const Precision p = s.be.precision();
    Buf rws = s.in(rnd(mn * mK * mh, 51), p.param), sl = s.ids(mslot), w = s.in(rnd(mn * mK, 52, 0, 1), p.param);
    Buf drows = s.in(rnd(mn * mK * mh, 55), p.param), dwts = s.in(rnd(mn * mK, 56), p.param);   // dropped keep these
    s.be.moe_combine_backward(drows, dwts, s.in(rnd(mn * mh, 57), p.param), rws, w, sl, mn, mK, mh);
    return Outputs{{"drows", s.out(drows)}, {"dwts", s.out(dwts)}};
  });
  c.emplace_back("moe_router_backward", [=](Scope& s) {
    const Precision p = s.be.precision();
    Buf pr = s.in(mlogits, p.param), sel = s.make(mn * mK, DType::i32), wts = s.make(mn * mK, p.param);
    Buf stat = s.make(2 * mE, DType::f64);
    s.be.zero(stat);
    s.be.moe_route(pr, sel, wts, stat, mn, mE, mK);
    s.be.moe_router_backward(pr, sel, wts, s.in(rnd(mn * mK, 58), p.param), s.in(rnd(mE, 59, -0.1, 0.1), p.param), mn,
                             mE, mK);
    return Outputs{{"dlogits", s.out(pr)}};
  });
  // Events: work handed from the compute stream to the comm stream and back (no-ops on the CPU twin).
  c.emplace_back("events (compute -> comm -> compute)", [=](Scope& s) {
    const Precision p = s.be.precision();
    Buf y = s.in(rnd(ne, 60), p.param), x = s.in(rnd(ne, 61), p.param);
    s.be.add(y, x);
    Backend::Event e = s.be.record(Backend::Stream::compute);
    s.be.wait(Backend::Stream::comm, e);
    Backend::Event e2 = s.be.record(Backend::Stream::comm);
    s.be.wait(Backend::Stream::compute, e2);
    s.be.add(y, x);
    s.be.release(e);
    s.be.release(e2);
    return Outputs{{"y", s.out(y)}};
  });
  return c;
}

}  // namespace

std::vector<KernelResult> compare_kernels(Backend& test, Backend& ref, double bound) {
  const bool round = test.precision().param == DType::bf16;
  std::vector<KernelResult> res;
  for (auto& [name, run] : cases()) {
    Outputs a, r;
    {
      Scope s{test, round, {}};
      a = run(s);
    }
    {
      Scope s{ref, round, {}};
      r = run(s);
    }
    for (std::size_t i = 0; i < a.size(); ++i) {
      KernelResult k{name + " " + a[i].first, 0, 0, bound};
      double diff = 0, norm = 0;
      for (std::size_t j = 0; j < a[i].second.size(); ++j) {
        const double x = a[i].second[j], y = r[i].second[j];
        // equal infinities (lse = −inf for a row that sees no key) are no error
        const double e = (std::isinf(x) && x == y) ? 0.0 : std::abs(x - y);
        k.max_abs = std::max(k.max_abs, std::isnan(e) ? std::numeric_limits<double>::infinity() : e);
        diff += e * e;
        if (std::isfinite(y)) norm += y * y;
      }
      k.rel = std::sqrt(diff) / std::max(std::sqrt(norm), 1e-30);
      if (std::isnan(k.rel)) k.rel = std::numeric_limits<double>::infinity();
      res.push_back(k);
    }
  }
  return res;
}

}  // namespace meshrun::device
