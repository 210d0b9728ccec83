// The CPU backend in the CUDA backend's mixed precision (training.dtype = "bf16"): weights and activations
// stored as bf16 (rounded to nearest-even), row statistics, gradients, master weights and Adam moments in
// fp32. Each call computes with the fp32 reference kernels: its bf16 buffers are widened to fp32 copies
// first and rounded back to bf16 after (inputs come back unchanged: bf16 -> fp32 -> bf16 is exact), so a
// kernel's output is its fp32 result rounded once, as a CUDA kernel that accumulates in fp32 and stores
// bf16 gives. A test and reference instrument, not a fast path.
#include <cstring>
#include <map>
#include <stdexcept>
#include <utility>
#include <vector>

#include "meshrun/device/backend.hpp"
#include "meshrun/device/bf16.hpp"

namespace meshrun::device {
namespace {

class CpuBf16Backend final : public Backend {
 public:
  CpuBf16Backend() : inner_(make_cpu_backend("fp32")) {}
  std::string name() const override { return "cpu-bf16"; }
  bool host_addressable() const override { return true; }
  Precision precision() const override { return Precision::cpu("bf16"); }

  Buf alloc(std::int64_t n, DType t) override {
    if (t != DType::bf16) return inner_->alloc(n, t);
    return {::operator new(static_cast<std::size_t>(std::max<std::int64_t>(n, 1)) * 2), n, t};
  }
  void release(Buf& b) override {
    if (b.t != DType::bf16) return inner_->release(b);
    ::operator delete(b.p);
    b = {};
  }
  void zero(Buf b) override {
    if (b.t != DType::bf16) return inner_->zero(b);
    std::memset(b.p, 0, static_cast<std::size_t>(b.n) * 2);
  }
  void upload(Buf d, const float* s) override { upload_as(d, s); }
  void upload(Buf d, const double* s) override { upload_as(d, s); }
  void upload(Buf d, const std::int32_t* s) override { inner_->upload(d, s); }
  void download(double* d, Buf s) override { download_as(d, s); }
  void download(float* d, Buf s) override { download_as(d, s); }
  void synchronize() override {}
  // The fp32 kernels' times (the widening and rounding around them are not counted).
  std::vector<std::pair<std::string, double>> kernel_times() override { return inner_->kernel_times(); }
  Event record(Stream) override { return {}; }
  void wait(Stream, Event) override {}
  void release(Event& e) override { e = {}; }

  void adamw(std::span<const AdamTensor> ts, const AdamW& hp) override {
    Staging st(*this);
    std::vector<AdamTensor> wide;
    for (const AdamTensor& a : ts) wide.push_back({st(a.master), st(a.m), st(a.v), st(a.grad), st(a.param)});
    inner_->adamw(wide, hp);
  }
  double sum_squares(std::span<const Buf> xs) override {
    Staging st(*this);
    std::vector<Buf> wide;
    for (const Buf& x : xs) wide.push_back(st(x));
    return inner_->sum_squares(wide);
  }

  void copy(Buf dst, Buf src) override {
    Staging st(*this);
    inner_->copy(st(dst), st(src));
  }
  void add(Buf y, Buf x) override {
    Staging st(*this);
    inner_->add(st(y), st(x));
  }
  void linear_forward(Buf y, Buf x, Buf w, std::int64_t n, std::int64_t in, std::int64_t out) override {
    Staging st(*this);
    inner_->linear_forward(st(y), st(x), st(w), n, in, out);
  }
  void linear_backward_input(Buf dx, Buf dy, Buf w, std::int64_t n, std::int64_t in, std::int64_t out, bool accumulate) override {
    Staging st(*this);
    inner_->linear_backward_input(st(dx), st(dy), st(w), n, in, out, accumulate);
  }
  void linear_backward_weight(Buf dw, Buf dy, Buf x, std::int64_t n, std::int64_t in, std::int64_t out) override {
    Staging st(*this);
    inner_->linear_backward_weight(st(dw), st(dy), st(x), n, in, out);
  }
  void rmsnorm_forward(Buf y, Buf rstd, Buf x, Buf w, std::int64_t rows, std::int64_t dim, double eps) override {
    Staging st(*this);
    inner_->rmsnorm_forward(st(y), st(rstd), st(x), st(w), rows, dim, eps);
  }
  void rmsnorm_backward(Buf dx, Buf dw, Buf dy, Buf x, Buf w, Buf rstd, std::int64_t rows, std::int64_t dim, bool accumulate) override {
    Staging st(*this);
    inner_->rmsnorm_backward(st(dx), st(dw), st(dy), st(x), st(w), st(rstd), rows, dim, accumulate);
  }
  void rmsnorm_backward_input(Buf dx, Buf dy, Buf x, Buf w, Buf rstd, std::int64_t rows, std::int64_t dim, bool accumulate) override {
    Staging st(*this);
    inner_->rmsnorm_backward_input(st(dx), st(dy), st(x), st(w), st(rstd), rows, dim, accumulate);
  }
  void rmsnorm_backward_weight(Buf dw, Buf dy, Buf x, Buf rstd, std::int64_t rows, std::int64_t dim) override {
    Staging st(*this);
    inner_->rmsnorm_backward_weight(st(dw), st(dy), st(x), st(rstd), rows, dim);
  }
  void rope_forward(Buf x, Buf pos, std::int64_t tokens, std::int64_t heads, std::int64_t head_dim, double theta) override {
    Staging st(*this);
    inner_->rope_forward(st(x), st(pos), tokens, heads, head_dim, theta);
  }
  void rope_backward(Buf dx, Buf pos, std::int64_t tokens, std::int64_t heads, std::int64_t head_dim, double theta) override {
    Staging st(*this);
    inner_->rope_backward(st(dx), st(pos), tokens, heads, head_dim, theta);
  }
  void attention_forward(Buf out, Buf lse, Buf q, Buf k, Buf v, Buf qpos, Buf kpos, const AttentionDims& dims, double scale) override {
    Staging st(*this);
    inner_->attention_forward(st(out), st(lse), st(q), st(k), st(v), st(qpos), st(kpos), dims, scale);
  }
  void attention_merge(Buf out, Buf lse, Buf out2, Buf lse2, std::int64_t rows, std::int64_t d) override {
    Staging st(*this);
    inner_->attention_merge(st(out), st(lse), st(out2), st(lse2), rows, d);
  }
  void attention_backward(Buf dq, Buf dk, Buf dv, Buf dout, Buf out, Buf lse, Buf q, Buf k, Buf v, Buf qpos, Buf kpos, const AttentionDims& dims, double scale) override {
    Staging st(*this);
    inner_->attention_backward(st(dq), st(dk), st(dv), st(dout), st(out), st(lse), st(q), st(k), st(v), st(qpos), st(kpos), dims, scale);
  }
  void swiglu_forward(Buf h, Buf gate, Buf up, std::int64_t n) override {
    Staging st(*this);
    inner_->swiglu_forward(st(h), st(gate), st(up), n);
  }
  void swiglu_backward(Buf dgate, Buf dup, Buf dh, Buf gate, Buf up, std::int64_t n) override {
    Staging st(*this);
    inner_->swiglu_backward(st(dgate), st(dup), st(dh), st(gate), st(up), n);
  }
  void embedding_forward(Buf out, Buf table, Buf ids, std::int64_t n, std::int64_t dim, std::int64_t v0, std::int64_t vl) override {
    Staging st(*this);
    inner_->embedding_forward(st(out), st(table), st(ids), n, dim, v0, vl);
  }
  void embedding_backward(Buf dtable, Buf dout, Buf ids, std::int64_t n, std::int64_t dim, std::int64_t v0, std::int64_t vl) override {
    Staging st(*this);
    inner_->embedding_backward(st(dtable), st(dout), st(ids), n, dim, v0, vl);
  }
  void ce_row_max(Buf row_max, Buf logits, std::int64_t rows, std::int64_t vl) override {
    Staging st(*this);
    inner_->ce_row_max(st(row_max), st(logits), rows, vl);
  }
  void ce_row_sumexp(Buf sumexp, Buf logits, Buf row_max, std::int64_t rows, std::int64_t vl) override {
    Staging st(*this);
    inner_->ce_row_sumexp(st(sumexp), st(logits), st(row_max), rows, vl);
  }
  void ce_target_logit(Buf tgt, Buf logits, Buf targets, std::int64_t rows, std::int64_t vl, std::int64_t v0) override {
    Staging st(*this);
    inner_->ce_target_logit(st(tgt), st(logits), st(targets), rows, vl, v0);
  }
  void ce_row_loss(Buf loss, Buf row_max, Buf sumexp, Buf tgt, Buf targets, std::int64_t rows) override {
    Staging st(*this);
    inner_->ce_row_loss(st(loss), st(row_max), st(sumexp), st(tgt), st(targets), rows);
  }
  void ce_backward(Buf dlogits, Buf logits, Buf row_max, Buf sumexp, Buf targets, std::int64_t rows, std::int64_t vl, std::int64_t v0, double scale) override {
    Staging st(*this);
    inner_->ce_backward(st(dlogits), st(logits), st(row_max), st(sumexp), st(targets), rows, vl, v0, scale);
  }
  void gather_rows(Buf dst, Buf src, Buf index, std::int64_t rows, std::int64_t width) override {
    Staging st(*this);
    inner_->gather_rows(st(dst), st(src), st(index), rows, width);
  }
  void moe_route(Buf probs, Buf sel, Buf wts, Buf stat, std::int64_t n, int experts, int top_k) override {
    Staging st(*this);
    inner_->moe_route(st(probs), st(sel), st(wts), st(stat), n, experts, top_k);
  }
  void moe_combine(Buf y, Buf rows, Buf wts, Buf slot, std::int64_t n, int top_k, std::int64_t h) override {
    Staging st(*this);
    inner_->moe_combine(st(y), st(rows), st(wts), st(slot), n, top_k, h);
  }
  void moe_combine_backward(Buf drows, Buf dwts, Buf dy, Buf rows, Buf wts, Buf slot, std::int64_t n, int top_k, std::int64_t h) override {
    Staging st(*this);
    inner_->moe_combine_backward(st(drows), st(dwts), st(dy), st(rows), st(wts), st(slot), n, top_k, h);
  }
  void moe_router_backward(Buf probs, Buf sel, Buf wts, Buf dwts, Buf aux_grad, std::int64_t n, int experts, int top_k) override {
    Staging st(*this);
    inner_->moe_router_backward(st(probs), st(sel), st(wts), st(dwts), st(aux_grad), n, experts, top_k);
  }

 private:
  static std::uint16_t* bits(Buf b) { return static_cast<std::uint16_t*>(b.p); }
  template <class H>
  void upload_as(Buf d, const H* s) {
    if (d.t != DType::bf16) return inner_->upload(d, s);
    for (std::int64_t i = 0; i < d.n; ++i) bits(d)[i] = bf16_from_float(static_cast<float>(s[i]));
  }
  template <class H>
  void download_as(H* d, Buf s) {
    if (s.t != DType::bf16) return inner_->download(d, s);
    for (std::int64_t i = 0; i < s.n; ++i) d[i] = static_cast<H>(float_from_bf16(bits(s)[i]));
  }
  // fp32 copies of one call's bf16 buffers (one per distinct buffer, so an in-place call stays in
  // place), written back rounded when the call is done.
  class Staging {
   public:
    explicit Staging(CpuBf16Backend&) {}
    Staging(const Staging&) = delete;
    Staging& operator=(const Staging&) = delete;
    ~Staging() {
      for (auto& [key, wide] : wide_) {
        auto* dst = static_cast<std::uint16_t*>(key.first);
        for (std::size_t i = 0; i < wide.size(); ++i) dst[i] = bf16_from_float(wide[i]);
      }
    }
    Buf operator()(Buf b) {
      if (b.t != DType::bf16 || !b.p) return b;
      auto [it, fresh] = wide_.try_emplace({b.p, b.n});
      if (fresh) {
        it->second.resize(static_cast<std::size_t>(b.n));
        const auto* src = static_cast<const std::uint16_t*>(b.p);
        for (std::int64_t i = 0; i < b.n; ++i) it->second[static_cast<std::size_t>(i)] = float_from_bf16(src[i]);
      }
      return {it->second.data(), b.n, DType::f32};
    }

   private:
    std::map<std::pair<void*, std::int64_t>, std::vector<float>> wide_;
  };

  std::unique_ptr<Backend> inner_;
};

}  // namespace

std::unique_ptr<Backend> make_cpu_bf16_backend() { return std::make_unique<CpuBf16Backend>(); }

}  // namespace meshrun::device
