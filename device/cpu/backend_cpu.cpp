// The CPU backend: host memory and the reference kernels of meshrun/kernels/cpu.hpp, every tensor in
// one type T (training.dtype). It is the twin every CUDA kernel is checked against.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string_view>
#include <vector>

#include "meshrun/device/backend.hpp"

namespace meshrun::device {
namespace {

namespace k = meshrun::kernels::cpu;

template <class T>
constexpr DType dtype_of() {
  return std::is_same_v<T, double> ? DType::f64 : DType::f32;
}

// Host time per kernel kind (steady clock around each call), under the CUDA backend's kind names, so
// meshrun-train's metrics and the planner's calibration read both alike. Two clock reads per call (25 ns
// each on the project's VM, measured) and a scan of a dozen kinds, against kernels of µs to ms.
class KernelClock {
 public:
  class Scope {
   public:
    Scope(KernelClock& c, const char* kind) : c_(c), kind_(kind), t0_(std::chrono::steady_clock::now()) {}
    ~Scope() { c_.add(kind_, std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0_).count()); }
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    KernelClock& c_;
    const char* kind_;
    std::chrono::steady_clock::time_point t0_;
  };
  Scope time(const char* kind) { return Scope(*this, kind); }
  std::vector<std::pair<std::string, double>> totals() const {
    std::vector<std::pair<std::string, double>> v;
    for (const auto& [kind, ms] : totals_) v.emplace_back(kind, ms);
    std::sort(v.begin(), v.end(), [](const auto& a, const auto& b) { return a.second > b.second; });
    return v;
  }

 private:
  void add(const char* kind, double ms) {
    for (auto& [k, total] : totals_)  // a dozen kinds: a scan beats a map
      if (k == kind || std::string_view(k) == kind) {
        total += ms;
        return;
      }
    totals_.emplace_back(kind, ms);
  }
  std::vector<std::pair<const char*, double>> totals_;
};

template <class T>
class CpuBackend final : public Backend {
 public:
  std::string name() const override { return std::string("cpu-") + dtype_name(dtype_of<T>()); }
  bool host_addressable() const override { return true; }
  Precision precision() const override { return Precision::cpu(dtype_of<T>() == DType::f64 ? "fp64" : "fp32"); }

  Buf alloc(std::int64_t n, DType t) override {
    // The compute type, indices and counts, and fp64 statistics (MoE routing counts) in an fp32 run.
    if (t != dtype_of<T>() && t != DType::i32 && t != DType::i64 && t != DType::f64)
      throw std::logic_error(std::string("cpu backend: no ") + dtype_name(t) + " buffers");
    return {::operator new(static_cast<std::size_t>(std::max<std::int64_t>(n, 1)) * dtype_size(t)), n, t};
  }
  void release(Buf& b) override {
    ::operator delete(b.p);
    b = {};
  }
  void zero(Buf b) override { std::memset(b.p, 0, static_cast<std::size_t>(b.n) * dtype_size(b.t)); }
  void upload(Buf d, const float* s) override { std::copy(s, s + d.n, f(d)); }
  void upload(Buf d, const double* s) override { std::copy(s, s + d.n, f(d)); }
  void upload(Buf d, const std::int32_t* s) override { std::copy(s, s + d.n, i(d)); }
  void download(double* dst, Buf s) override {
    switch (s.t) {
      case DType::i32: std::copy(i(s), i(s) + s.n, dst); break;
      case DType::i64: std::copy(static_cast<const std::int64_t*>(s.p), static_cast<const std::int64_t*>(s.p) + s.n, dst); break;
      case DType::f64: std::copy(d(s), d(s) + s.n, dst); break;
      default: std::copy(f(s), f(s) + s.n, dst);
    }
  }
  void download(float* dst, Buf s) override {
    if (s.t == DType::f32 && dtype_of<T>() == DType::f32) {
      std::copy(f(s), f(s) + s.n, dst);
      return;
    }
    if (s.t != dtype_of<T>()) throw std::logic_error(std::string("cpu backend: no float download of ") + dtype_name(s.t));
    for (std::int64_t j = 0; j < s.n; ++j) dst[j] = static_cast<float>(f(s)[j]);
  }
  void copy(Buf d, Buf s) override { std::copy(f(s), f(s) + s.n, f(d)); }
  void add(Buf y, Buf x) override {
    const KernelClock::Scope timed = clock_.time("elementwise");
    for (std::int64_t j = 0; j < y.n; ++j) f(y)[j] += f(x)[j];
  }
  void synchronize() override {}

  void linear_forward(Buf y, Buf x, Buf w, std::int64_t n, std::int64_t in, std::int64_t out) override {
    const KernelClock::Scope timed = clock_.time("linear_forward");
    k::linear_forward(f(y), f(x), f(w), n, in, out);
  }
  void linear_backward_input(Buf dx, Buf dy, Buf w, std::int64_t n, std::int64_t in, std::int64_t out,
                             bool acc) override {
    const KernelClock::Scope timed = clock_.time("linear_backward_input");
    k::linear_backward_input(f(dx), f(dy), f(w), n, in, out, store(acc));
  }
  void linear_backward_weight(Buf dw, Buf dy, Buf x, std::int64_t n, std::int64_t in, std::int64_t out) override {
    const KernelClock::Scope timed = clock_.time("linear_backward_weight");
    k::linear_backward_weight(f(dw), f(dy), f(x), n, in, out);
  }
  void rmsnorm_forward(Buf y, Buf rstd, Buf x, Buf w, std::int64_t rows, std::int64_t dim, double eps) override {
    const KernelClock::Scope timed = clock_.time("rmsnorm");
    k::rmsnorm_forward(f(y), f(rstd), f(x), f(w), rows, dim, eps);
  }
  void rmsnorm_backward(Buf dx, Buf dw, Buf dy, Buf x, Buf w, Buf rstd, std::int64_t rows, std::int64_t dim,
                        bool acc) override {
    const KernelClock::Scope timed = clock_.time("rmsnorm");
    k::rmsnorm_backward(f(dx), f(dw), f(dy), f(x), f(w), f(rstd), rows, dim, store(acc));
  }
  void rmsnorm_backward_input(Buf dx, Buf dy, Buf x, Buf w, Buf rstd, std::int64_t rows, std::int64_t dim,
                              bool acc) override {
    const KernelClock::Scope timed = clock_.time("rmsnorm");
    k::rmsnorm_backward_input(f(dx), f(dy), f(x), f(w), f(rstd), rows, dim, store(acc));
  }
  void rmsnorm_backward_weight(Buf dw, Buf dy, Buf x, Buf rstd, std::int64_t rows, std::int64_t dim) override {
    const KernelClock::Scope timed = clock_.time("rmsnorm");
    k::rmsnorm_backward_weight(f(dw), f(dy), f(x), f(rstd), rows, dim);
  }
  void rope_forward(Buf x, Buf pos, std::int64_t t, std::int64_t h, std::int64_t d, double theta) override {
    const KernelClock::Scope timed = clock_.time("rope");
    k::rope_forward(f(x), i(pos), t, h, d, theta);
  }
  void rope_backward(Buf dx, Buf pos, std::int64_t t, std::int64_t h, std::int64_t d, double theta) override {
    const KernelClock::Scope timed = clock_.time("rope");
    k::rope_backward(f(dx), i(pos), t, h, d, theta);
  }
  void attention_forward(Buf out, Buf lse, Buf q, Buf kk, Buf v, Buf qpos, Buf kpos, const AttentionDims& dims,
                         double scale) override {
    const KernelClock::Scope timed = clock_.time("attention_forward");
    k::attention_forward(f(out), f(lse), f(q), f(kk), f(v), i(qpos), i(kpos), dims, scale);
  }
  void attention_merge(Buf out, Buf lse, Buf out2, Buf lse2, std::int64_t rows, std::int64_t d) override {
    const KernelClock::Scope timed = clock_.time("attention_forward");
    k::attention_merge(f(out), f(lse), f(out2), f(lse2), rows, d);
  }
  void attention_backward(Buf dq, Buf dk, Buf dv, Buf dout, Buf out, Buf lse, Buf q, Buf kk, Buf v, Buf qpos,
                          Buf kpos, const AttentionDims& dims, double scale) override {
    const KernelClock::Scope timed = clock_.time("attention_backward");
    k::attention_backward(f(dq), f(dk), f(dv), f(dout), f(out), f(lse), f(q), f(kk), f(v), i(qpos), i(kpos), dims,
                          scale);
  }
  void swiglu_forward(Buf h, Buf gate, Buf up, std::int64_t n) override {
    const KernelClock::Scope timed = clock_.time("swiglu"); k::swiglu_forward(f(h), f(gate), f(up), n); }
  void swiglu_backward(Buf dgate, Buf dup, Buf dh, Buf gate, Buf up, std::int64_t n) override {
    const KernelClock::Scope timed = clock_.time("swiglu");
    k::swiglu_backward(f(dgate), f(dup), f(dh), f(gate), f(up), n);
  }
  void embedding_forward(Buf out, Buf table, Buf ids, std::int64_t n, std::int64_t dim, std::int64_t v0,
                         std::int64_t vl) override {
    const KernelClock::Scope timed = clock_.time("embedding");
    k::embedding_forward(f(out), f(table), i(ids), n, dim, v0, vl);
  }
  void embedding_backward(Buf dtable, Buf dout, Buf ids, std::int64_t n, std::int64_t dim, std::int64_t v0,
                          std::int64_t vl) override {
    const KernelClock::Scope timed = clock_.time("embedding");
    k::embedding_backward(f(dtable), f(dout), i(ids), n, dim, v0, vl);
  }
  void ce_row_max(Buf m, Buf logits, std::int64_t rows, std::int64_t vl) override {
    const KernelClock::Scope timed = clock_.time("cross_entropy");
    k::ce_row_max(f(m), f(logits), rows, vl);
  }
  void ce_row_sumexp(Buf s, Buf logits, Buf m, std::int64_t rows, std::int64_t vl) override {
    const KernelClock::Scope timed = clock_.time("cross_entropy");
    k::ce_row_sumexp(f(s), f(logits), f(m), rows, vl);
  }
  void ce_target_logit(Buf z, Buf logits, Buf tg, std::int64_t rows, std::int64_t vl, std::int64_t v0) override {
    const KernelClock::Scope timed = clock_.time("cross_entropy");
    k::ce_target_logit(f(z), f(logits), i(tg), rows, vl, v0);
  }
  void ce_row_loss(Buf loss, Buf m, Buf s, Buf z, Buf tg, std::int64_t rows) override {
    const KernelClock::Scope timed = clock_.time("cross_entropy");
    k::ce_row_loss(f(loss), f(m), f(s), f(z), i(tg), rows);
  }
  void ce_backward(Buf dl, Buf logits, Buf m, Buf s, Buf tg, std::int64_t rows, std::int64_t vl, std::int64_t v0,
                   double scale) override {
    const KernelClock::Scope timed = clock_.time("cross_entropy");
    k::ce_backward(f(dl), f(logits), f(m), f(s), i(tg), rows, vl, v0, scale);
  }
  void gather_rows(Buf dst, Buf src, Buf index, std::int64_t rows, std::int64_t width) override {
    const KernelClock::Scope timed = clock_.time("gather_rows");
    const std::int32_t* ix = i(index);
    for (std::int64_t q = 0; q < rows; ++q) {
      const T* from = f(src) + static_cast<std::int64_t>(ix[q]) * width;
      std::copy(from, from + width, f(dst) + q * width);
    }
  }

  void moe_route(Buf probs, Buf sel, Buf wts, Buf stat, std::int64_t n, int E, int K) override {
    const KernelClock::Scope timed = clock_.time("moe");
    T* pr = f(probs);
    std::int32_t* sl = i(sel);
    T* wt = f(wts);
    double* st = d(stat);
    std::vector<double> e(static_cast<std::size_t>(E));
    std::vector<char> taken(static_cast<std::size_t>(E));
    for (std::int64_t r = 0; r < n; ++r) {
      T* p = pr + r * E;
      double mx = static_cast<double>(p[0]);
      for (int c = 1; c < E; ++c) mx = std::max(mx, static_cast<double>(p[c]));
      double sum = 0;
      for (int c = 0; c < E; ++c) sum += (e[c] = std::exp(static_cast<double>(p[c]) - mx));
      for (int c = 0; c < E; ++c) p[c] = static_cast<T>(e[c] / sum);
      std::fill(taken.begin(), taken.end(), 0);
      T wsum = T(0);
      for (int kk = 0; kk < K; ++kk) {
        int best = -1;
        for (int c = 0; c < E; ++c)
          if (!taken[c] && (best < 0 || p[c] > p[best])) best = c;  // strict: ties keep the lower index
        taken[best] = 1;
        sl[r * K + kk] = best;
        wt[r * K + kk] = p[best];
        wsum += p[best];
        st[best] += 1.0;
      }
      for (int kk = 0; kk < K; ++kk) wt[r * K + kk] /= wsum;
      for (int c = 0; c < E; ++c) st[E + c] += static_cast<double>(p[c]);
    }
  }
  void moe_combine(Buf y, Buf rows, Buf wts, Buf slot, std::int64_t n, int K, std::int64_t h) override {
    const KernelClock::Scope timed = clock_.time("moe");
    const std::int32_t* sl = i(slot);
    const T* wt = wts.p ? f(wts) : nullptr;
    for (std::int64_t r = 0; r < n; ++r) {
      T* yr = f(y) + r * h;
      std::fill(yr, yr + h, T(0));
      for (int kk = 0; kk < K; ++kk) {
        const std::int32_t q = sl[r * K + kk];
        if (q < 0) continue;
        const T* e = f(rows) + static_cast<std::int64_t>(q) * h;
        if (wt) {
          const T wk = wt[r * K + kk];
          for (std::int64_t c = 0; c < h; ++c) yr[c] += wk * e[c];
        } else {
          for (std::int64_t c = 0; c < h; ++c) yr[c] += e[c];
        }
      }
    }
  }
  void moe_combine_backward(Buf drows, Buf dwts, Buf dy, Buf rows, Buf wts, Buf slot, std::int64_t n, int K,
                            std::int64_t h) override {
    const KernelClock::Scope timed = clock_.time("moe");
    const std::int32_t* sl = i(slot);
    for (std::int64_t r = 0; r < n; ++r)
      for (int kk = 0; kk < K; ++kk) {
        const std::int32_t q = sl[r * K + kk];
        if (q < 0) continue;
        const T wk = f(wts)[r * K + kk];
        const T* g = f(dy) + r * h;
        const T* e = f(rows) + static_cast<std::int64_t>(q) * h;
        T* dr = f(drows) + static_cast<std::int64_t>(q) * h;
        double dot = 0;
        for (std::int64_t c = 0; c < h; ++c) {
          dr[c] = wk * g[c];
          dot += static_cast<double>(g[c]) * static_cast<double>(e[c]);
        }
        f(dwts)[r * K + kk] = static_cast<T>(dot);
      }
  }
  void moe_router_backward(Buf probs, Buf sel, Buf wts, Buf dwts, Buf aux_grad, std::int64_t n, int E,
                           int K) override {
    const KernelClock::Scope timed = clock_.time("moe");
    const std::int32_t* sl = i(sel);
    const T *wt = f(wts), *dw = f(dwts), *ag = f(aux_grad);
    std::vector<double> dp(static_cast<std::size_t>(E));
    for (std::int64_t r = 0; r < n; ++r) {
      T* p = f(probs) + r * E;
      double ssum = 0, wdw = 0;
      for (int kk = 0; kk < K; ++kk) {
        ssum += static_cast<double>(p[sl[r * K + kk]]);
        wdw += static_cast<double>(wt[r * K + kk]) * static_cast<double>(dw[r * K + kk]);
      }
      for (int c = 0; c < E; ++c) dp[c] = static_cast<double>(ag[c]);
      for (int kk = 0; kk < K; ++kk) dp[sl[r * K + kk]] += (static_cast<double>(dw[r * K + kk]) - wdw) / ssum;
      double pdp = 0;
      for (int c = 0; c < E; ++c) pdp += static_cast<double>(p[c]) * dp[c];
      for (int c = 0; c < E; ++c) p[c] = static_cast<T>(static_cast<double>(p[c]) * (dp[c] - pdp));
    }
  }

  // Every call above has completed when it returns: streams are already in order.
  Event record(Stream) override { return {}; }
  void wait(Stream, Event) override {}
  void release(Event& e) override { e = {}; }

  void adamw(std::span<const AdamTensor> ts, const AdamW& hp) override {
    const KernelClock::Scope timed = clock_.time("adamw");
    for (const AdamTensor& a : ts) {
      k::adamw_update(f(a.master), f(a.m), f(a.v), f(a.grad), a.master.n, hp);
      if (a.param.p && a.param.p != a.master.p) copy(a.param, a.master);
    }
  }
  double sum_squares(std::span<const Buf> xs) override {
    const KernelClock::Scope timed = clock_.time("sum_squares");
    double s = 0;
    for (const Buf& x : xs) s += k::sum_squares(f(x), x.n);
    return s;
  }

  std::vector<std::pair<std::string, double>> kernel_times() override { return clock_.totals(); }

 private:
  KernelClock clock_;
  static T* f(Buf b) {
    if (b.t != dtype_of<T>()) throw std::logic_error(std::string("cpu backend: expected ") + dtype_name(dtype_of<T>()) +
                                                     ", got " + dtype_name(b.t));
    return static_cast<T*>(b.p);
  }
  static double* d(Buf b) {
    if (b.t != DType::f64) throw std::logic_error("cpu backend: expected an fp64 buffer");
    return static_cast<double*>(b.p);
  }
  static std::int32_t* i(Buf b) {
    if (b.t != DType::i32) throw std::logic_error("cpu backend: expected an int32 buffer");
    return static_cast<std::int32_t*>(b.p);
  }
  static k::Store store(bool acc) { return acc ? k::Store::accumulate : k::Store::overwrite; }
};

}  // namespace

std::unique_ptr<Backend> make_cpu_bf16_backend();  // backend_cpu_bf16.cpp

std::unique_ptr<Backend> make_cpu_backend(const std::string& dtype) {
  const Precision p = Precision::cpu(dtype);
  if (p.param == DType::bf16) return make_cpu_bf16_backend();
  if (p.param == DType::f64) return std::make_unique<CpuBackend<double>>();
  return std::make_unique<CpuBackend<float>>();
}

}  // namespace meshrun::device
