// The strict CPU backend, a test instrument: the CPU backend's kernels on memory that is addressable only
// while a backend call (or a communicator holding host access) runs, and the buffers of a communicator's
// outstanding requests until they complete (pin_host_access). Every buffer comes from one arena
// that is mprotect()ed PROT_NONE between calls, so trainer code that reads or writes tensor memory itself
// instead of through the seam dies with SIGSEGV at that line, as it would read device memory on a GPU.
// Selected with MESHRUN_STRICT_BACKEND=1 (docs/trainer.md); the numbers are the CPU backend's, bit for bit.
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <map>
#include <vector>
#include <stdexcept>
#include <string>

#include "meshrun/device/backend.hpp"

namespace meshrun::device {
namespace {

class StrictCpuBackend final : public Backend {
 public:
  explicit StrictCpuBackend(const std::string& dtype) : inner_(make_cpu_backend(dtype)) {
    // Address space only (MAP_NORESERVE, PROT_NONE): 1 GiB unless MESHRUN_STRICT_ARENA_GIB says more,
    // and at most a quarter of an address-space limit (the CLI tests run under prlimit --as).
    const char* gib = std::getenv("MESHRUN_STRICT_ARENA_GIB");
    reserved_ = static_cast<std::size_t>(gib ? std::max(1L, std::atol(gib)) : 1L) << 30;
    rlimit as{};
    if (getrlimit(RLIMIT_AS, &as) == 0 && as.rlim_cur != RLIM_INFINITY)
      reserved_ = std::min<std::size_t>(reserved_, static_cast<std::size_t>(as.rlim_cur) / 4 / page_ * page_);
    void* p = mmap(nullptr, reserved_, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED)
      throw std::runtime_error(std::string("strict cpu backend: cannot reserve its arena: ") + std::strerror(errno));
    base_ = static_cast<char*>(p);
  }
  ~StrictCpuBackend() override { munmap(base_, reserved_); }

  std::string name() const override { return "strict-" + inner_->name(); }
  Precision precision() const override { return inner_->precision(); }

  Buf alloc(std::int64_t n, DType t) override {
    const std::size_t bytes = round_up(static_cast<std::size_t>(std::max<std::int64_t>(n, 1)) * dtype_size(t));
    std::size_t offset;
    if (auto it = free_.find(bytes); it != free_.end()) {  // the same size again (ZeRO-3 gathers, MoE rows)
      offset = it->second;
      free_.erase(it);
    } else {
      if (used_ + bytes > reserved_)
        throw std::runtime_error("strict cpu backend: its arena of " + std::to_string(reserved_ >> 20) +
                                 " MiB is full; raise MESHRUN_STRICT_ARENA_GIB");
      offset = used_;
      used_ += bytes;
      if (all_depth_ > 0) protect_range(base_ + offset, bytes, PROT_READ | PROT_WRITE);  // joins the open arena
    }
    sizes_[offset] = bytes;
    return {base_ + offset, n, t};
  }
  void release(Buf& b) override {
    if (!b.p) return;
    const std::size_t offset = static_cast<std::size_t>(static_cast<char*>(b.p) - base_);
    const auto it = sizes_.find(offset);
    if (it == sizes_.end()) throw std::logic_error("strict cpu backend: release of a buffer it did not allocate");
    free_.emplace(it->second, offset);
    sizes_.erase(it);
    b = {};
  }
  void begin_host_access() override {
    if (all_depth_++ == 0) protect_all(PROT_READ | PROT_WRITE);
  }
  void end_host_access() override {
    if (--all_depth_ == 0) protect_all(PROT_NONE);
  }
  void pin_host_access(Buf b) override {
    const PageRange r = pages_of(b);
    if (r.lo == r.hi) return;
    pinned_.push_back(r);
    protect_range(r.lo, static_cast<std::size_t>(r.hi - r.lo), PROT_READ | PROT_WRITE);
  }
  void unpin_host_access(Buf b) override {
    const PageRange r = pages_of(b);
    if (r.lo == r.hi) return;
    const auto it = std::find_if(pinned_.begin(), pinned_.end(), [&](const PageRange& p) { return p.lo == r.lo && p.hi == r.hi; });
    if (it == pinned_.end()) throw std::logic_error("strict cpu backend: unpin of a buffer that is not pinned");
    pinned_.erase(it);
    close_range(r);
  }
  Event record(Stream) override { return {}; }
  void wait(Stream, Event) override {}
  void release(Event& e) override { e = {}; }
  std::vector<std::pair<std::string, double>> kernel_times() override { return inner_->kernel_times(); }
  std::string memory_report() override { return inner_->memory_report(); }

  void zero(Buf b) override {
    const Open open(*this, {b});
    inner_->zero(b);
  }
  void upload(Buf dst, const float* src) override {
    const Open open(*this, {dst});
    inner_->upload(dst, src);
  }
  void upload(Buf dst, const double* src) override {
    const Open open(*this, {dst});
    inner_->upload(dst, src);
  }
  void upload(Buf dst, const std::int32_t* src) override {
    const Open open(*this, {dst});
    inner_->upload(dst, src);
  }
  void download(double* dst, Buf src) override {
    const Open open(*this, {src});
    inner_->download(dst, src);
  }
  void download(float* dst, Buf src) override {
    const Open open(*this, {src});
    inner_->download(dst, src);
  }
  void copy(Buf dst, Buf src) override {
    const Open open(*this, {dst, src});
    inner_->copy(dst, src);
  }
  void add(Buf y, Buf x) override {
    const Open open(*this, {y, x});
    inner_->add(y, x);
  }
  void synchronize() override {
    const Open open(*this, {});
    inner_->synchronize();
  }
  void linear_forward(Buf y, Buf x, Buf w, std::int64_t n, std::int64_t in, std::int64_t out) override {
    const Open open(*this, {y, x, w});
    inner_->linear_forward(y, x, w, n, in, out);
  }
  void linear_backward_input(Buf dx, Buf dy, Buf w, std::int64_t n, std::int64_t in, std::int64_t out, bool accumulate) override {
    const Open open(*this, {dx, dy, w});
    inner_->linear_backward_input(dx, dy, w, n, in, out, accumulate);
  }
  void linear_backward_weight(Buf dw, Buf dy, Buf x, std::int64_t n, std::int64_t in, std::int64_t out) override {
    const Open open(*this, {dw, dy, x});
    inner_->linear_backward_weight(dw, dy, x, n, in, out);
  }
  void rmsnorm_forward(Buf y, Buf rstd, Buf x, Buf w, std::int64_t rows, std::int64_t dim, double eps) override {
    const Open open(*this, {y, rstd, x, w});
    inner_->rmsnorm_forward(y, rstd, x, w, rows, dim, eps);
  }
  void rmsnorm_backward(Buf dx, Buf dw, Buf dy, Buf x, Buf w, Buf rstd, std::int64_t rows, std::int64_t dim, bool accumulate) override {
    const Open open(*this, {dx, dw, dy, x, w, rstd});
    inner_->rmsnorm_backward(dx, dw, dy, x, w, rstd, rows, dim, accumulate);
  }
  void rmsnorm_backward_input(Buf dx, Buf dy, Buf x, Buf w, Buf rstd, std::int64_t rows, std::int64_t dim, bool accumulate) override {
    const Open open(*this, {dx, dy, x, w, rstd});
    inner_->rmsnorm_backward_input(dx, dy, x, w, rstd, rows, dim, accumulate);
  }
  void rmsnorm_backward_weight(Buf dw, Buf dy, Buf x, Buf rstd, std::int64_t rows, std::int64_t dim) override {
    const Open open(*this, {dw, dy, x, rstd});
    inner_->rmsnorm_backward_weight(dw, dy, x, rstd, rows, dim);
  }
  void rope_forward(Buf x, Buf pos, std::int64_t tokens, std::int64_t heads, std::int64_t head_dim, double theta) override {
    const Open open(*this, {x, pos});
    inner_->rope_forward(x, pos, tokens, heads, head_dim, theta);
  }
  void rope_backward(Buf dx, Buf pos, std::int64_t tokens, std::int64_t heads, std::int64_t head_dim, double theta) override {
    const Open open(*this, {dx, pos});
    inner_->rope_backward(dx, pos, tokens, heads, head_dim, theta);
  }
  void attention_forward(Buf out, Buf lse, Buf q, Buf k, Buf v, Buf qpos, Buf kpos, const AttentionDims& dims, double scale) override {
    const Open open(*this, {out, lse, q, k, v, qpos, kpos});
    inner_->attention_forward(out, lse, q, k, v, qpos, kpos, dims, scale);
  }
  void attention_merge(Buf out, Buf lse, Buf out2, Buf lse2, std::int64_t rows, std::int64_t d) override {
    const Open open(*this, {out, lse, out2, lse2});
    inner_->attention_merge(out, lse, out2, lse2, rows, d);
  }
  void attention_backward(Buf dq, Buf dk, Buf dv, Buf dout, Buf out, Buf lse, Buf q, Buf k, Buf v, Buf qpos, Buf kpos, const AttentionDims& dims, double scale) override {
    const Open open(*this, {dq, dk, dv, dout, out, lse, q, k, v, qpos, kpos});
    inner_->attention_backward(dq, dk, dv, dout, out, lse, q, k, v, qpos, kpos, dims, scale);
  }
  void swiglu_forward(Buf h, Buf gate, Buf up, std::int64_t n) override {
    const Open open(*this, {h, gate, up});
    inner_->swiglu_forward(h, gate, up, n);
  }
  void swiglu_backward(Buf dgate, Buf dup, Buf dh, Buf gate, Buf up, std::int64_t n) override {
    const Open open(*this, {dgate, dup, dh, gate, up});
    inner_->swiglu_backward(dgate, dup, dh, gate, up, n);
  }
  void embedding_forward(Buf out, Buf table, Buf ids, std::int64_t n, std::int64_t dim, std::int64_t v0, std::int64_t vl) override {
    const Open open(*this, {out, table, ids});
    inner_->embedding_forward(out, table, ids, n, dim, v0, vl);
  }
  void embedding_backward(Buf dtable, Buf dout, Buf ids, std::int64_t n, std::int64_t dim, std::int64_t v0, std::int64_t vl) override {
    const Open open(*this, {dtable, dout, ids});
    inner_->embedding_backward(dtable, dout, ids, n, dim, v0, vl);
  }
  void ce_row_max(Buf row_max, Buf logits, std::int64_t rows, std::int64_t vl) override {
    const Open open(*this, {row_max, logits});
    inner_->ce_row_max(row_max, logits, rows, vl);
  }
  void ce_row_sumexp(Buf sumexp, Buf logits, Buf row_max, std::int64_t rows, std::int64_t vl) override {
    const Open open(*this, {sumexp, logits, row_max});
    inner_->ce_row_sumexp(sumexp, logits, row_max, rows, vl);
  }
  void ce_target_logit(Buf tgt, Buf logits, Buf targets, std::int64_t rows, std::int64_t vl, std::int64_t v0) override {
    const Open open(*this, {tgt, logits, targets});
    inner_->ce_target_logit(tgt, logits, targets, rows, vl, v0);
  }
  void ce_row_loss(Buf loss, Buf row_max, Buf sumexp, Buf tgt, Buf targets, std::int64_t rows) override {
    const Open open(*this, {loss, row_max, sumexp, tgt, targets});
    inner_->ce_row_loss(loss, row_max, sumexp, tgt, targets, rows);
  }
  void ce_backward(Buf dlogits, Buf logits, Buf row_max, Buf sumexp, Buf targets, std::int64_t rows, std::int64_t vl, std::int64_t v0, double scale) override {
    const Open open(*this, {dlogits, logits, row_max, sumexp, targets});
    inner_->ce_backward(dlogits, logits, row_max, sumexp, targets, rows, vl, v0, scale);
  }
  void gather_rows(Buf dst, Buf src, Buf index, std::int64_t rows, std::int64_t width) override {
    const Open open(*this, {dst, src, index});
    inner_->gather_rows(dst, src, index, rows, width);
  }
  void moe_route(Buf probs, Buf sel, Buf wts, Buf stat, std::int64_t n, int experts, int top_k) override {
    const Open open(*this, {probs, sel, wts, stat});
    inner_->moe_route(probs, sel, wts, stat, n, experts, top_k);
  }
  void moe_combine(Buf y, Buf rows, Buf wts, Buf slot, std::int64_t n, int top_k, std::int64_t h) override {
    const Open open(*this, {y, rows, wts, slot});
    inner_->moe_combine(y, rows, wts, slot, n, top_k, h);
  }
  void moe_combine_backward(Buf drows, Buf dwts, Buf dy, Buf rows, Buf wts, Buf slot, std::int64_t n, int top_k, std::int64_t h) override {
    const Open open(*this, {drows, dwts, dy, rows, wts, slot});
    inner_->moe_combine_backward(drows, dwts, dy, rows, wts, slot, n, top_k, h);
  }
  void moe_router_backward(Buf probs, Buf sel, Buf wts, Buf dwts, Buf aux_grad, std::int64_t n, int experts, int top_k) override {
    const Open open(*this, {probs, sel, wts, dwts, aux_grad});
    inner_->moe_router_backward(probs, sel, wts, dwts, aux_grad, n, experts, top_k);
  }
  void adamw(std::span<const AdamTensor> tensors, const AdamW& hp) override {
    const HostAccess all(*this);  // many buffers: the whole arena
    inner_->adamw(tensors, hp);
  }
  double sum_squares(std::span<const Buf> xs) override {
    const HostAccess all(*this);  // many buffers: the whole arena
    return inner_->sum_squares(xs);
  }

 private:
  // The pages of the buffers one call reads or writes are addressable during that call only.
  struct Open {
    Open(StrictCpuBackend& b, std::initializer_list<Buf> bufs) : be(b), list(bufs) {
      for (const Buf& x : list) be.protect(x, PROT_READ | PROT_WRITE);
    }
    ~Open() {
      for (const Buf& x : list) be.protect(x, PROT_NONE);
    }
    StrictCpuBackend& be;
    std::vector<Buf> list;
  };
  struct HostAccess {
    explicit HostAccess(StrictCpuBackend& b) : be(b) { be.begin_host_access(); }
    ~HostAccess() { be.end_host_access(); }
    StrictCpuBackend& be;
  };
  std::size_t page() const { return page_; }
  std::size_t round_up(std::size_t bytes) const { return (bytes + page_ - 1) / page_ * page_; }
  void protect_range(char* from, std::size_t len, int prot) {
    if (len > 0 && mprotect(from, len, prot) != 0)
      throw std::runtime_error(std::string("strict cpu backend: mprotect: ") + std::strerror(errno));
  }
  // Page-aligned [lo, hi); empty for host memory passed as a Buf (not the arena's) and for empty buffers.
  struct PageRange {
    char* lo = nullptr;
    char* hi = nullptr;
  };
  PageRange pages_of(const Buf& b) const {
    if (!b.p || b.n <= 0) return {};
    char* p = static_cast<char*>(b.p);
    if (p < base_ || p >= base_ + used_) return {};
    return {base_ + (static_cast<std::size_t>(p - base_) / page_) * page_,
            base_ + round_up(static_cast<std::size_t>(p - base_) + static_cast<std::size_t>(b.bytes()))};
  }
  // One buffer's pages (a view's: every allocation is page-aligned, so no other buffer shares them);
  // nothing while host access holds the whole arena open.
  void protect(const Buf& b, int prot) {
    if (all_depth_ > 0) return;
    const PageRange r = pages_of(b);
    if (r.lo == r.hi) return;
    if (prot == PROT_NONE) return close_range(r);
    protect_range(r.lo, static_cast<std::size_t>(r.hi - r.lo), prot);
  }
  void protect_all(int prot) {
    if (prot == PROT_NONE) return close_range({base_, base_ + used_});
    protect_range(base_, used_, prot);
  }
  // PROT_NONE over r, except the pages pinned for outstanding requests: only the gaps between pins are
  // touched, never a pinned page, since a peer may be reading one at this very moment (protecting it and
  // opening it again would leave a window in which that read fails).
  void close_range(PageRange r) {
    if (all_depth_ > 0 || r.lo == r.hi) return;
    std::vector<PageRange> pins;
    for (const PageRange& p : pinned_)
      if (p.lo < r.hi && p.hi > r.lo) pins.push_back(p);
    std::sort(pins.begin(), pins.end(), [](const PageRange& a, const PageRange& b) { return a.lo < b.lo; });
    char* from = r.lo;
    for (const PageRange& p : pins) {
      if (p.lo > from) protect_range(from, static_cast<std::size_t>(p.lo - from), PROT_NONE);
      from = std::max(from, p.hi);
    }
    if (from < r.hi) protect_range(from, static_cast<std::size_t>(r.hi - from), PROT_NONE);
  }

  std::unique_ptr<Backend> inner_;
  char* base_ = nullptr;
  std::size_t reserved_ = 0, used_ = 0;
  std::size_t page_ = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
  int all_depth_ = 0;  // nested host-access windows (the whole arena addressable)
  std::vector<PageRange> pinned_;  // one entry per pin: the buffers of outstanding requests (few at a time)
  std::map<std::size_t, std::size_t> sizes_;         // offset -> bytes of each live buffer
  std::multimap<std::size_t, std::size_t> free_;     // bytes -> offset of released buffers
};

}  // namespace

std::unique_ptr<Backend> make_strict_cpu_backend(const std::string& dtype) {
  return std::make_unique<StrictCpuBackend>(dtype);
}

bool strict_backend_requested() {
  const char* v = std::getenv("MESHRUN_STRICT_BACKEND");
  return v && std::string(v) == "1";
}

}  // namespace meshrun::device
