// The CPU backend: host memory and the reference kernels of meshrun/kernels/cpu.hpp, every tensor in
// one type T (training.dtype). It is the twin every CUDA kernel is checked against.
#include <algorithm>
#include <cstring>
#include <stdexcept>

#include "meshrun/device/backend.hpp"

namespace meshrun::device {
namespace {

namespace k = meshrun::kernels::cpu;

template <class T>
constexpr DType dtype_of() {
  return std::is_same_v<T, double> ? DType::f64 : DType::f32;
}

template <class T>
class CpuBackend final : public Backend {
 public:
  std::string name() const override { return std::string("cpu-") + dtype_name(dtype_of<T>()); }
  Precision precision() const override { return Precision::cpu(dtype_of<T>() == DType::f64 ? "fp64" : "fp32"); }

  Buf alloc(std::int64_t n, DType t) override {
    if (t != dtype_of<T>() && t != DType::i32)
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
  void download(double* d, Buf s) override {
    if (s.t == DType::i32)
      std::copy(i(s), i(s) + s.n, d);
    else
      std::copy(f(s), f(s) + s.n, d);
  }
  void copy(Buf d, Buf s) override { std::copy(f(s), f(s) + s.n, f(d)); }
  void add(Buf y, Buf x) override {
    for (std::int64_t j = 0; j < y.n; ++j) f(y)[j] += f(x)[j];
  }
  void synchronize() override {}

  void linear_forward(Buf y, Buf x, Buf w, std::int64_t n, std::int64_t in, std::int64_t out) override {
    k::linear_forward(f(y), f(x), f(w), n, in, out);
  }
  void linear_backward_input(Buf dx, Buf dy, Buf w, std::int64_t n, std::int64_t in, std::int64_t out,
                             bool acc) override {
    k::linear_backward_input(f(dx), f(dy), f(w), n, in, out, store(acc));
  }
  void linear_backward_weight(Buf dw, Buf dy, Buf x, std::int64_t n, std::int64_t in, std::int64_t out) override {
    k::linear_backward_weight(f(dw), f(dy), f(x), n, in, out);
  }
  void rmsnorm_forward(Buf y, Buf rstd, Buf x, Buf w, std::int64_t rows, std::int64_t dim, double eps) override {
    k::rmsnorm_forward(f(y), f(rstd), f(x), f(w), rows, dim, eps);
  }
  void rmsnorm_backward(Buf dx, Buf dw, Buf dy, Buf x, Buf w, Buf rstd, std::int64_t rows, std::int64_t dim,
                        bool acc) override {
    k::rmsnorm_backward(f(dx), f(dw), f(dy), f(x), f(w), f(rstd), rows, dim, store(acc));
  }
  void rope_forward(Buf x, Buf pos, std::int64_t t, std::int64_t h, std::int64_t d, double theta) override {
    k::rope_forward(f(x), i(pos), t, h, d, theta);
  }
  void rope_backward(Buf dx, Buf pos, std::int64_t t, std::int64_t h, std::int64_t d, double theta) override {
    k::rope_backward(f(dx), i(pos), t, h, d, theta);
  }
  void attention_forward(Buf out, Buf lse, Buf q, Buf kk, Buf v, Buf qpos, Buf kpos, const AttentionDims& dims,
                         double scale) override {
    k::attention_forward(f(out), f(lse), f(q), f(kk), f(v), i(qpos), i(kpos), dims, scale);
  }
  void attention_merge(Buf out, Buf lse, Buf out2, Buf lse2, std::int64_t rows, std::int64_t d) override {
    k::attention_merge(f(out), f(lse), f(out2), f(lse2), rows, d);
  }
  void attention_backward(Buf dq, Buf dk, Buf dv, Buf dout, Buf out, Buf lse, Buf q, Buf kk, Buf v, Buf qpos,
                          Buf kpos, const AttentionDims& dims, double scale) override {
    k::attention_backward(f(dq), f(dk), f(dv), f(dout), f(out), f(lse), f(q), f(kk), f(v), i(qpos), i(kpos), dims,
                          scale);
  }
  void swiglu_forward(Buf h, Buf gate, Buf up, std::int64_t n) override { k::swiglu_forward(f(h), f(gate), f(up), n); }
  void swiglu_backward(Buf dgate, Buf dup, Buf dh, Buf gate, Buf up, std::int64_t n) override {
    k::swiglu_backward(f(dgate), f(dup), f(dh), f(gate), f(up), n);
  }
  void embedding_forward(Buf out, Buf table, Buf ids, std::int64_t n, std::int64_t dim, std::int64_t v0,
                         std::int64_t vl) override {
    k::embedding_forward(f(out), f(table), i(ids), n, dim, v0, vl);
  }
  void embedding_backward(Buf dtable, Buf dout, Buf ids, std::int64_t n, std::int64_t dim, std::int64_t v0,
                          std::int64_t vl) override {
    k::embedding_backward(f(dtable), f(dout), i(ids), n, dim, v0, vl);
  }
  void ce_row_max(Buf m, Buf logits, std::int64_t rows, std::int64_t vl) override {
    k::ce_row_max(f(m), f(logits), rows, vl);
  }
  void ce_row_sumexp(Buf s, Buf logits, Buf m, std::int64_t rows, std::int64_t vl) override {
    k::ce_row_sumexp(f(s), f(logits), f(m), rows, vl);
  }
  void ce_target_logit(Buf z, Buf logits, Buf tg, std::int64_t rows, std::int64_t vl, std::int64_t v0) override {
    k::ce_target_logit(f(z), f(logits), i(tg), rows, vl, v0);
  }
  void ce_row_loss(Buf loss, Buf m, Buf s, Buf z, Buf tg, std::int64_t rows) override {
    k::ce_row_loss(f(loss), f(m), f(s), f(z), i(tg), rows);
  }
  void ce_backward(Buf dl, Buf logits, Buf m, Buf s, Buf tg, std::int64_t rows, std::int64_t vl, std::int64_t v0,
                   double scale) override {
    k::ce_backward(f(dl), f(logits), f(m), f(s), i(tg), rows, vl, v0, scale);
  }
  void adamw(std::span<const AdamTensor> ts, const AdamW& hp) override {
    for (const AdamTensor& a : ts) {
      k::adamw_update(f(a.master), f(a.m), f(a.v), f(a.grad), a.master.n, hp);
      if (a.param.p && a.param.p != a.master.p) copy(a.param, a.master);
    }
  }
  double sum_squares(std::span<const Buf> xs) override {
    double s = 0;
    for (const Buf& x : xs) s += k::sum_squares(f(x), x.n);
    return s;
  }

 private:
  static T* f(Buf b) {
    if (b.t != dtype_of<T>()) throw std::logic_error(std::string("cpu backend: expected ") + dtype_name(dtype_of<T>()) +
                                                     ", got " + dtype_name(b.t));
    return static_cast<T*>(b.p);
  }
  static std::int32_t* i(Buf b) {
    if (b.t != DType::i32) throw std::logic_error("cpu backend: expected an int32 buffer");
    return static_cast<std::int32_t*>(b.p);
  }
  static k::Store store(bool acc) { return acc ? k::Store::accumulate : k::Store::overwrite; }
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(const std::string& dtype) {
  if (Precision::cpu(dtype).param == DType::f64) return std::make_unique<CpuBackend<double>>();
  return std::make_unique<CpuBackend<float>>();
}

}  // namespace meshrun::device
