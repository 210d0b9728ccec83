// Backend selection and mixed-precision bookkeeping (no GPU needed).
#include <catch2/catch.hpp>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <vector>

#include "meshrun/device/backend.hpp"
#include "meshrun/device/bf16.hpp"

using namespace meshrun::device;

TEST_CASE("precision: the CUDA backend follows param/grad/optim dtypes", "[precision]") {
  const Precision p = Precision::cuda("bf16", "fp32", "fp32");
  CHECK(p.param == DType::bf16);
  CHECK(p.grad == DType::f32);
  CHECK(p.optim == DType::f32);
  CHECK(p.stat == DType::f32);
  CHECK(p.has_master());
  CHECK_FALSE(Precision::cuda("fp32", "fp32", "fp32").has_master());
  CHECK_THROWS_WITH(Precision::cuda("fp16", "fp32", "fp32"), Catch::Contains("training.param_dtype='fp16'"));
  CHECK_THROWS_WITH(Precision::cuda("fp8", "fp32", "fp32"), Catch::Contains("use bf16"));
  CHECK_THROWS_WITH(Precision::cuda("bf16", "bf16", "fp32"), Catch::Contains("training.grad_dtype='bf16'"));
  CHECK_THROWS_WITH(Precision::cuda("bf16", "fp32", "bf16"), Catch::Contains("training.optim_dtype='bf16'"));
}

TEST_CASE("precision: the CPU backend computes everything in training.dtype", "[precision]") {
  for (auto [name, t] : {std::pair<const char*, DType>{"fp32", DType::f32}, {"fp64", DType::f64}}) {
    const Precision p = Precision::cpu(name);
    CHECK((p.param == t && p.grad == t && p.optim == t && p.stat == t));
    CHECK_FALSE(p.has_master());
    CHECK(make_cpu_backend(name)->precision().param == t);
  }
  // bf16 is the CUDA backend's mixed precision: bf16 weights and activations, fp32 for the rest.
  const Precision b = Precision::cpu("bf16");
  CHECK((b.param == DType::bf16 && b.stat == DType::f32 && b.grad == DType::f32 && b.optim == DType::f32));
  CHECK(b.has_master());
  CHECK(make_cpu_backend("bf16")->precision().param == DType::bf16);
  CHECK_THROWS_WITH(Precision::cpu("fp16"), Catch::Contains("fp32, fp64 or bf16"));
  // One resolution for both backends from a run's keys.
  CHECK(Precision::for_run("cpu", "bf16", "fp32", "fp32", "fp32").param == DType::bf16);   // param_dtype: CUDA only
  CHECK(Precision::for_run("cpu", "fp64", "bf16", "fp32", "fp32").param == DType::f64);
  CHECK(Precision::for_run("cuda", "fp64", "bf16", "fp32", "fp32").param == DType::bf16);  // dtype: CPU only
  CHECK_THROWS_WITH(Precision::for_run("cuda", "fp32", "fp16", "fp32", "fp32"), Catch::Contains("param_dtype"));
  CHECK_THROWS_WITH(Precision::for_run("tpu", "fp32", "bf16", "fp32", "fp32"), Catch::Contains("training.device"));
  CHECK_THROWS(make_cpu_backend("fp16"));
}

TEST_CASE("cpu bf16 backend: each kernel is the fp32 kernel on the bf16 values, its output rounded once", "[precision]") {
  auto mixed = make_cpu_backend("bf16");
  auto plain = make_cpu_backend("fp32");
  const std::int64_t n = 3, in = 5, out = 4;
  std::vector<float> x(n * in), w(out * in);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = std::sin(0.7f * static_cast<float>(i) + 0.1f) * 3.1f;
  for (std::size_t i = 0; i < w.size(); ++i) w[i] = std::cos(1.3f * static_cast<float>(i)) * 0.37f;
  // The reference: the values bf16 holds, the fp32 kernel, one rounding of the result.
  std::vector<float> xr(x.size()), wr(w.size()), yr(n * out);
  for (std::size_t i = 0; i < x.size(); ++i) xr[i] = round_bf16(x[i]);
  for (std::size_t i = 0; i < w.size(); ++i) wr[i] = round_bf16(w[i]);
  plain->linear_forward(host_buf(yr.data(), n * out), host_buf(xr.data(), n * in), host_buf(wr.data(), out * in), n, in, out);
  Buf bx = mixed->alloc(n * in, DType::bf16), bw = mixed->alloc(out * in, DType::bf16), by = mixed->alloc(n * out, DType::bf16);
  mixed->upload(bx, x.data());
  mixed->upload(bw, w.data());
  mixed->linear_forward(by, bx, bw, n, in, out);
  std::vector<float> got(static_cast<std::size_t>(n * out));
  mixed->download(got.data(), by);
  for (std::size_t i = 0; i < got.size(); ++i) CHECK(got[i] == round_bf16(yr[i]));
  // Inputs come back unchanged, and a weight gradient stays fp32 (not rounded to bf16).
  std::vector<float> xb(x.size());
  mixed->download(xb.data(), bx);
  CHECK(xb == xr);
  Buf dw = mixed->alloc(out * in, DType::f32);
  mixed->zero(dw);
  mixed->linear_backward_weight(dw, by, bx, n, in, out);
  std::vector<float> dref(out * in, 0.f), dgot(out * in);
  std::vector<float> ybits(got.begin(), got.end());
  plain->linear_backward_weight(host_buf(dref.data(), out * in), host_buf(ybits.data(), n * out), host_buf(xr.data(), n * in), n, in, out);
  mixed->download(dgot.data(), dw);
  CHECK(dgot == dref);
  bool some_not_bf16 = false;
  for (float g : dgot) some_not_bf16 |= round_bf16(g) != g;
  CHECK(some_not_bf16);
  for (Buf* b : {&bx, &bw, &by, &dw}) mixed->release(*b);
}

TEST_CASE("device: MESHRUN_CUDA_DEVICE picks the task's device among the visible ones", "[device]") {
  ::unsetenv("MESHRUN_CUDA_DEVICE");
  CHECK(task_cuda_device(1) == 0);
  ::setenv("MESHRUN_CUDA_DEVICE", "3", 1);
  CHECK(task_cuda_device(4) == 3);
  CHECK_THROWS_WITH(task_cuda_device(3), Catch::Contains("MESHRUN_CUDA_DEVICE='3' is not a device index below 3"));
  ::setenv("MESHRUN_CUDA_DEVICE", "1x", 1);
  CHECK_THROWS(task_cuda_device(4));
  ::setenv("MESHRUN_CUDA_DEVICE", "-1", 1);
  CHECK_THROWS(task_cuda_device(4));
  ::unsetenv("MESHRUN_CUDA_DEVICE");
}

TEST_CASE("device: without a visible device the CUDA backend is refused with a reason", "[device]") {
  // This machine has no GPU (CUDA builds: the runtime says so; other builds: no backend compiled).
  std::string why;
  REQUIRE(cuda_device_count(&why) == 0);
  CHECK_FALSE(why.empty());
  if (!cuda_compiled()) CHECK_THROWS_WITH(make_cuda_backend(Precision::cuda("bf16", "fp32", "fp32"), 0),
                                          Catch::Contains("-DMESHRUN_CUDA=ON"));
}

TEST_CASE("cpu backend: the mixed AdamW bookkeeping is plain AdamW on the master copy", "[precision]") {
  // With param == master (CPU) the multi-tensor call is the reference adamw_update, bit for bit, per shard.
  auto be = make_cpu_backend("fp32");
  const std::int64_t n = 37;
  std::vector<float> p(n), m(n, 0.01f), v(n, 1e-4f), g(n);
  for (std::int64_t i = 0; i < n; ++i) {
    p[i] = 0.1f * static_cast<float>(i) - 1.0f;
    g[i] = 0.01f * static_cast<float>(i % 5) - 0.02f;
  }
  std::vector<float> rp = p, rm = m, rv = v;
  const AdamW hp{1e-2, 0.9, 0.95, 1e-8, 0.1, 2, 0.5};
  meshrun::kernels::cpu::adamw_update(rp.data(), rm.data(), rv.data(), g.data(), n, hp);

  Buf bp = be->alloc(n, DType::f32), bm = be->alloc(n, DType::f32), bv = be->alloc(n, DType::f32),
      bg = be->alloc(n, DType::f32);
  be->upload(bp, p.data());
  be->upload(bm, m.data());
  be->upload(bv, v.data());
  be->upload(bg, g.data());
  const AdamTensor ts[2] = {{bp.at(0, 20), bm.at(0, 20), bv.at(0, 20), bg.at(0, 20), bp.at(0, 20)},
                            {bp.at(20, n - 20), bm.at(20, n - 20), bv.at(20, n - 20), bg.at(20, n - 20), bp.at(20, n - 20)}};
  be->adamw(ts, hp);
  std::vector<double> out(n);
  be->download(out.data(), bp);
  for (std::int64_t i = 0; i < n; ++i) REQUIRE(out[i] == static_cast<double>(rp[i]));
  for (Buf* b : {&bp, &bm, &bv, &bg}) be->release(*b);
}

TEST_CASE("cpu backend: a buffer of another type is refused", "[backend]") {
  auto be = make_cpu_backend("fp32");
  CHECK_THROWS_WITH(be->alloc(4, DType::bf16), Catch::Contains("no bf16 buffers"));
  Buf x = be->alloc(4, DType::f32), i = be->alloc(4, DType::i32);
  CHECK_THROWS_WITH(be->add(x, i), Catch::Contains("expected fp32, got int32"));
  be->release(x);
  be->release(i);
}

// ---- The operations without a kernels/cpu.hpp namesake (rows, MoE routing, events): the CPU twin's
// semantics as backend.hpp states them, checked by hand or by finite differences.
namespace {
// Buffers of one backend from host data, released at scope end.
struct Bufs {
  Backend& be;
  std::vector<Buf> all;
  ~Bufs() {
    for (Buf& b : all) be.release(b);
  }
  Buf f(const std::vector<double>& v) {
    const DType t = be.precision().param;
    all.push_back(be.alloc(static_cast<std::int64_t>(v.size()), t));
    be.upload(all.back(), v.data());
    return all.back();
  }
  Buf f64(const std::vector<double>& v) {   // statistics; an fp32 backend takes no fp64 upload: zeros only
    all.push_back(be.alloc(static_cast<std::int64_t>(v.size()), DType::f64));
    be.zero(all.back());
    if (std::any_of(v.begin(), v.end(), [](double x) { return x != 0; })) be.upload(all.back(), v.data());
    return all.back();
  }
  Buf i(const std::vector<std::int32_t>& v) {
    all.push_back(be.alloc(static_cast<std::int64_t>(v.size()), DType::i32));
    be.upload(all.back(), v.data());
    return all.back();
  }
  std::vector<double> get(Buf b) {
    std::vector<double> h(static_cast<std::size_t>(b.n));
    be.download(h.data(), b);
    return h;
  }
};
std::vector<double> seq(std::size_t n, double a, double b) {   // a deterministic spread of values
  std::vector<double> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = a + b * std::sin(1.7 * static_cast<double>(i) + 0.3);
  return v;
}
}  // namespace

TEST_CASE("cpu backend: the rmsnorm backward halves give the bits of rmsnorm_backward", "[backend][rmsnorm]") {
  auto be = make_cpu_backend("fp32");
  Bufs b{*be, {}};
  const std::int64_t rows = 7, dim = 33;
  Buf x = b.f(seq(rows * dim, 0, 1.5)), w = b.f(seq(dim, 1, 0.4)), dy = b.f(seq(rows * dim, 0.1, 0.9));
  Buf y = b.f(std::vector<double>(rows * dim)), rstd = b.f(std::vector<double>(rows));
  be->rmsnorm_forward(y, rstd, x, w, rows, dim, 1e-5);
  for (const bool acc : {false, true}) {
    INFO("accumulate " << acc);
    const std::vector<double> dx0 = seq(rows * dim, -0.2, 0.7), dw0 = seq(dim, 0.05, 0.3);
    Buf dx = b.f(dx0), dw = b.f(dw0), dx2 = b.f(dx0), dw2 = b.f(dw0);
    be->rmsnorm_backward(dx, dw, dy, x, w, rstd, rows, dim, acc);
    be->rmsnorm_backward_input(dx2, dy, x, w, rstd, rows, dim, acc);
    be->rmsnorm_backward_weight(dw2, dy, x, rstd, rows, dim);
    CHECK(b.get(dx2) == b.get(dx));
    CHECK(b.get(dw2) == b.get(dw));
    CHECK(b.get(dw) != dw0);   // dw += something nonzero
    // Negative: the input half with the other accumulate flag is not the whole call's dx.
    Buf dx3 = b.f(dx0);
    be->rmsnorm_backward_input(dx3, dy, x, w, rstd, rows, dim, !acc);
    CHECK(b.get(dx3) != b.get(dx));
  }
}

TEST_CASE("cpu backend: gather_rows applies a permutation and its inverse undoes it", "[backend][moe]") {
  auto be = make_cpu_backend("fp32");
  Bufs b{*be, {}};
  const std::int64_t rows = 5, width = 3;
  std::vector<double> src(rows * width);
  for (std::size_t i = 0; i < src.size(); ++i) src[i] = static_cast<double>(10 * (i / width) + i % width);
  const std::vector<std::int32_t> perm{3, 0, 4, 1, 2}, inv{1, 3, 4, 0, 2};
  Buf s = b.f(src), d = b.f(std::vector<double>(rows * width, -1)), back = b.f(std::vector<double>(rows * width));
  be->gather_rows(d, s, b.i(perm), rows, width);
  const std::vector<double> got = b.get(d);
  for (std::int64_t q = 0; q < rows; ++q)
    for (std::int64_t c = 0; c < width; ++c) CHECK(got[q * width + c] == 10.0 * perm[q] + c);
  be->gather_rows(back, d, b.i(inv), rows, width);
  CHECK(b.get(back) == src);
  // Fewer rows than the source, repeated indices: rows < src rows is allowed.
  Buf two = b.f(std::vector<double>(2 * width));
  be->gather_rows(two, s, b.i({4, 4}), 2, width);
  CHECK(b.get(two) == std::vector<double>{40, 41, 42, 40, 41, 42});
}

TEST_CASE("cpu backend: moe_route by hand (softmax, top-2 with ties to the lower index, stat +=)", "[backend][moe]") {
  auto be = make_cpu_backend("fp64");
  Bufs b{*be, {}};
  const int E = 4, K = 2;
  // Row 0: expert 0 first, then a tie between 1 and 2 -> 1. Row 1: expert 2, then a three-way tie -> 0.
  Buf probs = b.f({2, 1, 1, 0, 0, 0, 3, 0});
  Buf sel = b.i(std::vector<std::int32_t>(2 * K, -7)), wts = b.f(std::vector<double>(2 * K));
  Buf stat = b.f64({1, 1, 1, 1, 0.5, 0.5, 0.5, 0.5});
  be->moe_route(probs, sel, wts, stat, 2, E, K);
  const double e = std::exp(1.0), e2 = std::exp(2.0), e3 = std::exp(3.0);
  const double s0 = e2 + 2 * e + 1, s1 = e3 + 3;
  const std::vector<double> p{e2 / s0, e / s0, e / s0, 1 / s0, 1 / s1, 1 / s1, e3 / s1, 1 / s1};
  const std::vector<double> got = b.get(probs);
  for (int j = 0; j < 8; ++j) CHECK(got[j] == Approx(p[j]).epsilon(1e-15));
  CHECK(b.get(sel) == std::vector<double>{0, 1, 2, 0});
  const std::vector<double> w = b.get(wts);
  CHECK(w[0] == Approx(e / (e + 1)).epsilon(1e-15));
  CHECK(w[1] == Approx(1 / (e + 1)).epsilon(1e-15));
  CHECK(w[2] == Approx(e3 / (e3 + 1)).epsilon(1e-15));
  CHECK(w[3] == Approx(1 / (e3 + 1)).epsilon(1e-15));
  const std::vector<double> st = b.get(stat);
  CHECK(std::vector<double>(st.begin(), st.begin() + E) == std::vector<double>{3, 2, 2, 1});
  for (int c = 0; c < E; ++c) CHECK(st[E + c] == Approx(0.5 + p[c] + p[E + c]).epsilon(1e-15));
  // The fp32 twin takes the same experts (the ties are exact in any precision) and fp64 statistics.
  auto b32 = make_cpu_backend("fp32");
  Bufs c{*b32, {}};
  Buf p32 = c.f({2, 1, 1, 0, 0, 0, 3, 0}), s32 = c.i(std::vector<std::int32_t>(2 * K)),
      w32 = c.f(std::vector<double>(2 * K)), st32 = c.f64(std::vector<double>(2 * E));
  b32->moe_route(p32, s32, w32, st32, 2, E, K);
  CHECK(c.get(s32) == std::vector<double>{0, 1, 2, 0});
  CHECK(c.get(st32)[0] == 2);
}

TEST_CASE("cpu backend: moe_combine with and without weights, and its backward by hand", "[backend][moe]") {
  auto be = make_cpu_backend("fp32");
  Bufs b{*be, {}};
  const int K = 2;
  const std::int64_t n = 2, h = 3;
  const std::vector<double> rows{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};   // 4 rows of 3
  const std::vector<std::int32_t> slot{2, -1, 0, 3};                      // row 0: one expert dropped
  Buf r = b.f(rows), sl = b.i(slot), wts = b.f({0.5, 0.25, 2, -1});
  Buf y = b.f(std::vector<double>(n * h, 99));                             // overwritten
  be->moe_combine(y, r, wts, sl, n, K, h);
  CHECK(b.get(y) == std::vector<double>{3.5, 4, 4.5, 2 * 1 - 10, 2 * 2 - 11, 2 * 3 - 12});
  be->moe_combine(y, r, Buf{}, sl, n, K, h);
  CHECK(b.get(y) == std::vector<double>{7, 8, 9, 1 + 10, 2 + 11, 3 + 12});

  Buf dy = b.f({1, -1, 2, 0.5, 1, -2});
  Buf drows = b.f(std::vector<double>(4 * h, 7)), dwts = b.f(std::vector<double>(n * K, 7));
  be->moe_combine_backward(drows, dwts, dy, r, wts, sl, n, K, h);
  // drows[slot[r,k]] = wts[r,k]·dy[r]; row 1 of the expert rows is no slot's and keeps its 7s.
  CHECK(b.get(drows) == std::vector<double>{1, 2, -4, 7, 7, 7, 0.5, -0.5, 1, -0.5, -1, 2});
  // dwts[r,k] = <dy[r], rows[slot[r,k]]>; the dropped (0,1) keeps its 7.
  CHECK(b.get(dwts) == std::vector<double>{7 - 8 + 18, 7, 0.5 + 2 - 6, 5 + 11 - 24});
}

TEST_CASE("cpu backend: moe_router_backward is the gradient through softmax, top-k and renormalisation",
          "[backend][moe]") {
  // L = Σ_{r,k} gw[r,k]·wts[r,k] + Σ_{r,c} aux[c]·probs[r,c]: dwts = gw, aux_grad = aux, and
  // moe_router_backward must give dL/dlogits, compared with central differences (fp64, h = 1e-6).
  auto be = make_cpu_backend("fp64");
  Bufs b{*be, {}};
  const int E = 5, K = 2;
  const std::int64_t n = 3;
  // Logits with clear gaps between ranks, so that ±h never changes the selection.
  const std::vector<double> logits{0.3, 1.9, -0.8, 1.1, 0.0, 2.2, -0.4, 0.9, 0.2, 1.6, -1.0, 0.5, 0.1, 1.3, 2.4};
  const std::vector<double> gw{0.7, -1.3, 0.4, 0.9, -0.6, 1.8}, aux{0.2, -0.1, 0.35, 0.0, -0.25};
  auto loss = [&](const std::vector<double>& lg) {
    Bufs t{*be, {}};
    Buf p = t.f(lg), s = t.i(std::vector<std::int32_t>(n * K)), w = t.f(std::vector<double>(n * K)),
        st = t.f64(std::vector<double>(2 * E));
    be->moe_route(p, s, w, st, n, E, K);
    const std::vector<double> ph = t.get(p), wh = t.get(w);
    double l = 0;
    for (std::int64_t i = 0; i < n * K; ++i) l += gw[i] * wh[i];
    for (std::int64_t i = 0; i < n * E; ++i) l += aux[i % E] * ph[i];
    return l;
  };
  Buf p = b.f(logits), s = b.i(std::vector<std::int32_t>(n * K)), w = b.f(std::vector<double>(n * K)),
      st = b.f64(std::vector<double>(2 * E));
  be->moe_route(p, s, w, st, n, E, K);
  be->moe_router_backward(p, s, w, b.f(gw), b.f(aux), n, E, K);
  const std::vector<double> analytic = b.get(p);
  std::vector<double> numeric(logits.size());
  for (std::size_t i = 0; i < logits.size(); ++i) {
    std::vector<double> a = logits, c = logits;
    a[i] += 1e-6;
    c[i] -= 1e-6;
    numeric[i] = (loss(a) - loss(c)) / 2e-6;
  }
  double diff = 0, norm = 0;
  for (std::size_t i = 0; i < numeric.size(); ++i) {
    diff += (analytic[i] - numeric[i]) * (analytic[i] - numeric[i]);
    norm += numeric[i] * numeric[i];
  }
  INFO("relative error " << std::sqrt(diff / norm));
  CHECK(norm > 0.1);
  CHECK(std::sqrt(diff / norm) < 1e-7);
  // Negative: without the renormalisation term (dwts taken as the gradient of the raw probabilities)
  // the result is not the gradient.
  Buf p2 = b.f(logits);
  be->moe_route(p2, s, w, st, n, E, K);
  Buf zero_w = b.f(std::vector<double>(n * K, 0.0));   // <w, dw> = 0: drops the renormalisation's coupling
  be->moe_router_backward(p2, s, zero_w, b.f(gw), b.f(aux), n, E, K);
  const std::vector<double> wrong = b.get(p2);
  double d2 = 0;
  for (std::size_t i = 0; i < numeric.size(); ++i) d2 += (wrong[i] - numeric[i]) * (wrong[i] - numeric[i]);
  CHECK(std::sqrt(d2 / norm) > 1e-3);
}

TEST_CASE("cpu backend: streams and events are no-ops (every call has completed)", "[backend]") {
  auto be = make_cpu_backend("fp32");
  Bufs b{*be, {}};
  Buf y = b.f({1, 2}), x = b.f({10, 20});
  be->add(y, x);
  Backend::Event e = be->record(Backend::Stream::compute);
  CHECK(e.handle == nullptr);
  be->wait(Backend::Stream::comm, e);
  Backend::Event e2 = be->record(Backend::Stream::comm);
  be->wait(Backend::Stream::compute, e2);
  be->release(e);
  be->release(e2);
  CHECK(e.handle == nullptr);
  CHECK(b.get(y) == std::vector<double>{11, 22});
}

namespace {
// Runs f in a child process; returns the signal that ended it (0: it exited normally).
template <class F>
int signal_of(F&& f) {
  const pid_t pid = fork();
  if (pid == 0) {
    std::signal(SIGSEGV, SIG_DFL);  // not the test framework's handler: the child just dies
    f();
    _exit(0);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFSIGNALED(status) ? WTERMSIG(status) : 0;
}
}  // namespace

TEST_CASE("strict cpu backend: tensor memory is addressable only inside backend calls", "[device]") {
  auto strict = make_strict_cpu_backend("fp32");
  auto plain = make_cpu_backend("fp32");
  const std::vector<float> x{1.f, -2.f, 3.f, 0.5f};
  Buf a = strict->alloc(4, DType::f32), b = strict->alloc(4, DType::f32);
  strict->upload(a, x.data());
  strict->copy(b, a);
  strict->add(b, a);
  std::vector<double> got(4);
  strict->download(got.data(), b.at(1, 3));
  CHECK(got[0] == -4.0);
  CHECK(got[2] == 1.0);
  // The same numbers as the plain CPU backend (it runs the same kernels).
  CHECK(strict->sum_squares(std::vector<Buf>{a}) == plain->sum_squares(std::vector<Buf>{host_buf(x.data(), 4)}));
  // A host read or write of the buffer between calls faults, as it would on device memory.
  CHECK(signal_of([&] { volatile float v = static_cast<float*>(a.p)[0]; (void)v; }) == SIGSEGV);
  CHECK(signal_of([&] { static_cast<float*>(b.p)[3] = 1.f; }) == SIGSEGV);
  // Host access (a communicator's window) opens the whole arena, and closes it again.
  CHECK(signal_of([&] {
          strict->begin_host_access();
          volatile float v = static_cast<float*>(a.p)[0];
          (void)v;
          strict->end_host_access();
        }) == 0);
  CHECK(signal_of([&] {
          strict->begin_host_access();
          strict->end_host_access();
          volatile float v = static_cast<float*>(a.p)[0];
          (void)v;
        }) == SIGSEGV);
  // The plain backend's memory is host memory: the same read is fine there (the control).
  Buf c = plain->alloc(4, DType::f32);
  plain->upload(c, x.data());
  CHECK(signal_of([&] { volatile float v = static_cast<float*>(c.p)[0]; (void)v; }) == 0);
  plain->release(c);
  strict->release(a);
  strict->release(b);
}
