// The CUDA backend: device buffers, a compute stream (every kernel) and a comm stream (a communicator's,
// ordered against compute by record/wait events), cuBLASLt for every matrix product (bf16 or fp32
// inputs, CUBLAS_COMPUTE_32F accumulation, C/D in bf16 or fp32 with beta = 1 for accumulating outputs),
// the hand-written kernels of kernels.cu for the rest, and CUDA-event timers per kernel kind.
#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cmath>
#include <cstdio>
#include <map>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "kernels.hpp"
#include "meshrun/device/backend.hpp"
#include "meshrun/device/bf16.hpp"

namespace meshrun::device {
namespace {

namespace ck = meshrun::device::cuda;

void cu(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}
void lt(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS) throw std::runtime_error(std::string("cuBLASLt ") + what + ": status " + std::to_string(int(s)));
}

ck::St st(DType t) {
  if (t == DType::bf16) return ck::St::bf16;
  if (t == DType::f32) return ck::St::f32;
  throw std::logic_error(std::string("cuda backend: no kernels for ") + dtype_name(t));
}
cudaDataType_t cuda_type(DType t) { return t == DType::bf16 ? CUDA_R_16BF : CUDA_R_32F; }
float* f32(Buf b) {
  if (b.t != DType::f32) throw std::logic_error(std::string("cuda backend: expected fp32, got ") + dtype_name(b.t));
  return static_cast<float*>(b.p);
}
const std::int32_t* i32(Buf b) {
  if (b.t != DType::i32) throw std::logic_error("cuda backend: expected an int32 buffer");
  return static_cast<const std::int32_t*>(b.p);
}
void same(Buf a, Buf b, const char* what) {
  if (a.t != b.t) throw std::logic_error(std::string("cuda backend: ") + what + ": mixed " + dtype_name(a.t) + "/" + dtype_name(b.t));
}
std::int32_t* i32w(Buf b) { return const_cast<std::int32_t*>(i32(b)); }
// The storage of an operation's float operand that must be fp32 or bf16, refused otherwise naming the op.
ck::St st_of(Buf b, const char* op, const char* what) {
  if (b.t != DType::f32 && b.t != DType::bf16)
    throw std::logic_error(std::string("cuda backend: ") + op + ": " + what + " must be fp32 or bf16, got " +
                           dtype_name(b.t));
  return st(b.t);
}
const std::int32_t* i32_of(Buf b, const char* op, const char* what) {
  if (b.t != DType::i32)
    throw std::logic_error(std::string("cuda backend: ") + op + ": " + what + " must be int32, got " + dtype_name(b.t));
  return static_cast<const std::int32_t*>(b.p);
}

// A column-major product D = alpha·op(A)·op(B) + beta·C (C = D), batched with strides, as cuBLASLt takes it.
struct Gemm {
  bool ta = false, tb = false;
  std::int64_t m = 0, n = 0, k = 0;
  const void* a = nullptr;
  std::int64_t lda = 0, sa = 0;
  const void* b = nullptr;
  std::int64_t ldb = 0, sb = 0;
  void* d = nullptr;
  std::int64_t ldd = 0, sd = 0;
  DType ab = DType::bf16, dt = DType::bf16;
  float alpha = 1, beta = 0;
  int batch = 1;
};

class CudaBackend final : public Backend {
 public:
  CudaBackend(const Precision& p, int device) : pr_(p) {
    cu(cudaSetDevice(device), "cudaSetDevice");
    cudaDeviceProp prop{};
    cu(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties");
    name_ = std::string("cuda:") + std::to_string(device) + " " + prop.name + " (" + dtype_name(p.param) +
            " weights/activations, " + dtype_name(p.grad) + " grads, " + dtype_name(p.optim) + " master/moments)";
    cu(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
    cu(cudaStreamCreateWithFlags(&comm_, cudaStreamNonBlocking), "cudaStreamCreate comm");
    lt(cublasLtCreate(&lt_), "create");
    cu(cudaMalloc(&lt_ws_, kLtWorkspace), "cudaMalloc workspace");
    cu(cudaMalloc(reinterpret_cast<void**>(&sumsq_partial_), ck::kSumSquaresBlocks * sizeof(double)), "cudaMalloc");
    cu(cudaMalloc(reinterpret_cast<void**>(&sumsq_result_), sizeof(double)), "cudaMalloc");
  }
  ~CudaBackend() override {
    cudaStreamSynchronize(comm_);
    cudaStreamSynchronize(stream_);
    for (auto& [key, ev] : pending_) {
      cudaEventDestroy(ev.first);
      cudaEventDestroy(ev.second);
    }
    for (cudaEvent_t e : pool_) cudaEventDestroy(e);
    for (void* p : {lt_ws_, static_cast<void*>(sumsq_partial_), static_cast<void*>(sumsq_result_),
                    attn_d_, norm_partial_, mix_a_, mix_b_, mix_c_})
      cudaFree(p);
    cublasLtDestroy(lt_);
    cudaStreamDestroy(comm_);
    cudaStreamDestroy(stream_);
  }

  std::string name() const override { return name_; }
  bool is_device_memory(const void* p) const override {
    cudaPointerAttributes a{};
    return cudaPointerGetAttributes(&a, p) == cudaSuccess && a.type == cudaMemoryTypeDevice;
  }
  Precision precision() const override { return pr_; }

  // Any DType: the kernels take fp32/bf16 (and int32 indices); fp64 holds the MoE routing statistics.
  Buf alloc(std::int64_t n, DType t) override {
    void* p = nullptr;
    cu(cudaMalloc(&p, static_cast<std::size_t>(std::max<std::int64_t>(n, 1)) * dtype_size(t)), "cudaMalloc");
    return {p, n, t};
  }
  void release(Buf& b) override {
    cudaStreamSynchronize(comm_);
    cudaStreamSynchronize(stream_);
    cudaFree(b.p);
    b = {};
  }
  void zero(Buf b) override {
    cu(cudaMemsetAsync(b.p, 0, static_cast<std::size_t>(b.n) * dtype_size(b.t), stream_), "cudaMemset");
  }
  template <class H>
  void upload_as(Buf d, const H* s) {
    if (d.t != DType::f32 && d.t != DType::bf16 && d.t != DType::f64)
      throw std::logic_error(std::string("cuda backend: float data into an ") + dtype_name(d.t) + " buffer");
    std::vector<char> host(static_cast<std::size_t>(d.n) * dtype_size(d.t));
    if (d.t == DType::bf16) {
      auto* h = reinterpret_cast<std::uint16_t*>(host.data());
      for (std::int64_t i = 0; i < d.n; ++i) h[i] = bf16_from_float(static_cast<float>(s[i]));
    } else if (d.t == DType::f64) {
      auto* h = reinterpret_cast<double*>(host.data());
      for (std::int64_t i = 0; i < d.n; ++i) h[i] = static_cast<double>(s[i]);
    } else {
      auto* h = reinterpret_cast<float*>(host.data());
      for (std::int64_t i = 0; i < d.n; ++i) h[i] = static_cast<float>(s[i]);
    }
    cu(cudaMemcpyAsync(d.p, host.data(), host.size(), cudaMemcpyHostToDevice, stream_), "upload");
    cu(cudaStreamSynchronize(stream_), "upload");
  }
  void upload(Buf d, const float* s) override {
    if (d.t == DType::f32) {   // the common large case (initial master weights): no host copy
      cu(cudaMemcpyAsync(d.p, s, static_cast<std::size_t>(d.n) * 4, cudaMemcpyHostToDevice, stream_), "upload");
      cu(cudaStreamSynchronize(stream_), "upload");
      return;
    }
    upload_as(d, s);
  }
  void upload(Buf d, const double* s) override { upload_as(d, s); }
  void upload(Buf d, const std::int32_t* s) override {
    if (d.t != DType::i32) throw std::logic_error("cuda backend: int32 data into a float buffer");
    cu(cudaMemcpyAsync(d.p, s, static_cast<std::size_t>(d.n) * 4, cudaMemcpyHostToDevice, stream_), "upload");
    cu(cudaStreamSynchronize(stream_), "upload");
  }
  template <class H>
  void download_as(H* d, Buf s) {
    std::vector<char> host(static_cast<std::size_t>(s.n) * dtype_size(s.t));
    cu(cudaMemcpyAsync(host.data(), s.p, host.size(), cudaMemcpyDeviceToHost, stream_), "download");
    cu(cudaStreamSynchronize(stream_), "download");
    for (std::int64_t i = 0; i < s.n; ++i) {
      switch (s.t) {
        case DType::bf16: d[i] = static_cast<H>(float_from_bf16(reinterpret_cast<const std::uint16_t*>(host.data())[i])); break;
        case DType::i32: d[i] = static_cast<H>(reinterpret_cast<const std::int32_t*>(host.data())[i]); break;
        case DType::i64: d[i] = static_cast<H>(reinterpret_cast<const std::int64_t*>(host.data())[i]); break;
        case DType::f64: d[i] = static_cast<H>(reinterpret_cast<const double*>(host.data())[i]); break;
        default: d[i] = static_cast<H>(reinterpret_cast<const float*>(host.data())[i]);
      }
    }
  }
  void download(double* d, Buf s) override { download_as(d, s); }
  void download(float* d, Buf s) override { download_as(d, s); }
  void copy(Buf d, Buf s) override {
    Timer t(*this, "elementwise");
    ck::convert(d.p, st(d.t), s.p, st(s.t), d.n, stream_);
  }
  void add(Buf y, Buf x) override {
    same(y, x, "add");
    Timer t(*this, "elementwise");
    ck::add(y.p, x.p, st(y.t), y.n, stream_);
  }
  void synchronize() override {
    cu(cudaStreamSynchronize(comm_), "synchronize comm");
    cu(cudaStreamSynchronize(stream_), "synchronize");
  }

  // Row-major C[M,N] = op(A)·op(B) (+ beta·C) on whole buffers; see rm_batched.
  void rm_gemm(bool ta, bool tb, std::int64_t M, std::int64_t N, std::int64_t K, Buf A, std::int64_t lda, Buf B,
               std::int64_t ldb, Buf C, std::int64_t ldc, float alpha, float beta) {
    if (A.t != B.t) {
      // Mixed fp32/bf16 operands (the MoE router's fp32 logit gradients against bf16 weights): cuBLASLt takes
      // one input type, so every bf16 operand is widened to fp32 (exact) and the product runs in fp32, with C
      // widened when it accumulates and rounded back once: what the CPU bf16 backend's staging computes.
      st_of(A, "gemm", "A");
      st_of(B, "gemm", "B");
      st_of(C, "gemm", "C");
      auto widen = [&](Buf b, void*& p, std::size_t& have, bool needed) {
        if (b.t == DType::f32) return b;
        Buf w{scratch(p, have, b.n * 4), b.n, DType::f32};
        if (needed) ck::convert(w.p, ck::St::f32, b.p, st(b.t), b.n, stream_);
        return w;
      };
      const Buf a = widen(A, mix_a_, mix_a_bytes_, true), b = widen(B, mix_b_, mix_b_bytes_, true),
                c = widen(C, mix_c_, mix_c_bytes_, beta != 0);
      gemm(rm_batched(ta, tb, M, N, K, a.p, lda, 0, 0, b.p, ldb, 0, 0, c.p, ldc, 0, 0, DType::f32, DType::f32, alpha,
                      beta, 1));
      if (C.t != DType::f32) ck::convert(C.p, st(C.t), c.p, ck::St::f32, C.n, stream_);
      return;
    }
    gemm(rm_batched(ta, tb, M, N, K, A.p, lda, 0, 0, B.p, ldb, 0, 0, C.p, ldc, 0, 0, A.t, C.t, alpha, beta, 1));
  }

  void linear_forward(Buf y, Buf x, Buf w, std::int64_t n, std::int64_t in, std::int64_t out) override {
    Timer t(*this, "linear_forward");
    rm_gemm(false, true, n, out, in, x, in, w, in, y, out, 1, 0);
  }
  // cuBLASLt: D = alpha·op(A)·op(B) + beta·C with C = D (in place; Cdesc = Ddesc), one rounding (docs/gpu.md).
  void linear_forward_residual(Buf y, Buf x, Buf w, std::int64_t n, std::int64_t in, std::int64_t out, Buf) override {
    Timer t(*this, "linear_forward_residual");
    rm_gemm(false, true, n, out, in, x, in, w, in, y, out, 1, 1);
  }
  void linear_backward_input(Buf dx, Buf dy, Buf w, std::int64_t n, std::int64_t in, std::int64_t out,
                             bool acc) override {
    Timer t(*this, "linear_backward_input");
    rm_gemm(false, false, n, in, out, dy, out, w, in, dx, in, 1, acc ? 1 : 0);
  }
  void linear_backward_weight(Buf dw, Buf dy, Buf x, std::int64_t n, std::int64_t in, std::int64_t out) override {
    Timer t(*this, "linear_backward_weight");
    rm_gemm(true, false, out, in, n, dy, out, x, in, dw, in, 1, 1);
  }
  void rmsnorm_forward(Buf y, Buf rstd, Buf x, Buf w, std::int64_t rows, std::int64_t dim, double eps) override {
    same(y, x, "rmsnorm");
    same(x, w, "rmsnorm");
    Timer t(*this, "rmsnorm");
    ck::rmsnorm_forward(y.p, f32(rstd), x.p, w.p, st(x.t), rows, dim, static_cast<float>(eps), stream_);
  }
  void rmsnorm_backward(Buf dx, Buf dw, Buf dy, Buf x, Buf w, Buf rstd, std::int64_t rows, std::int64_t dim,
                        bool acc) override {
    same(dx, x, "rmsnorm_backward");
    same(dy, x, "rmsnorm_backward");
    Timer t(*this, "rmsnorm");
    float* partial = scratch(norm_partial_, norm_partial_bytes_, ck::rmsnorm_partial_rows(rows) * dim * 4);
    ck::rmsnorm_backward(dx.p, f32(dw), dy.p, x.p, w.p, f32(rstd), st(x.t), rows, dim, acc, partial, stream_);
  }
  // The halves launch the same kernels as the whole call (the other half's pointer null): the same bits.
  void rmsnorm_backward_input(Buf dx, Buf dy, Buf x, Buf w, Buf rstd, std::int64_t rows, std::int64_t dim,
                              bool acc) override {
    same(dx, x, "rmsnorm_backward_input");
    same(dy, x, "rmsnorm_backward_input");
    same(w, x, "rmsnorm_backward_input");
    Timer t(*this, "rmsnorm");
    ck::rmsnorm_backward(dx.p, nullptr, dy.p, x.p, w.p, f32(rstd), st(x.t), rows, dim, acc, nullptr, stream_);
  }
  void rmsnorm_backward_weight(Buf dw, Buf dy, Buf x, Buf rstd, std::int64_t rows, std::int64_t dim) override {
    same(dy, x, "rmsnorm_backward_weight");
    Timer t(*this, "rmsnorm");
    float* partial = scratch(norm_partial_, norm_partial_bytes_, ck::rmsnorm_partial_rows(rows) * dim * 4);
    ck::rmsnorm_backward(nullptr, f32(dw), dy.p, x.p, nullptr, f32(rstd), st(x.t), rows, dim, false, partial, stream_);
  }
  void rope_forward(Buf x, Buf pos, std::int64_t tk, std::int64_t h, std::int64_t d, double theta) override {
    Timer t(*this, "rope");
    ck::rope(x.p, i32(pos), st(x.t), tk, h, d, theta, false, stream_);
  }
  void rope_backward(Buf dx, Buf pos, std::int64_t tk, std::int64_t h, std::int64_t d, double theta) override {
    Timer t(*this, "rope");
    ck::rope(dx.p, i32(pos), st(dx.t), tk, h, d, theta, true, stream_);
  }

  // Attention as one fused kernel each way (kernels.cu, flash style): no score matrix is ever stored, so the
  // memory is that of q, k, v, out, lse and the backward's row term D ([tq][hq] fp32).
  void attention_forward(Buf out, Buf lse, Buf q, Buf k, Buf v, Buf qpos, Buf kpos, const AttentionDims& a,
                         double scale) override {
    same(q, k, "attention");
    Timer t(*this, "attention_forward");
    ck::flash_attention_forward(out.p, f32(lse), q.p, k.p, v.p, i32(qpos), i32(kpos), st(q.t), a.tq, a.tk, a.hq, a.hkv,
                                a.d, static_cast<float>(scale), stream_);
  }
  void attention_merge(Buf out, Buf lse, Buf out2, Buf lse2, std::int64_t rows, std::int64_t d) override {
    same(out, out2, "attention_merge");
    Timer t(*this, "attention_forward");
    ck::attn_merge(out.p, f32(lse), out2.p, f32(lse2), st(out.t), rows, d, stream_);
  }
  void attention_backward(Buf dq, Buf dk, Buf dv, Buf dout, Buf out, Buf lse, Buf q, Buf k, Buf v, Buf qpos, Buf kpos,
                          const AttentionDims& a, double scale) override {
    same(q, k, "attention");
    Timer t(*this, "attention_backward");
    float* D = scratch(attn_d_, attn_d_bytes_, a.tq * a.hq * 4);
    ck::attn_rowdot(D, dout.p, out.p, st(out.t), a.tq * a.hq, a.d, stream_);
    ck::flash_attention_backward(dq.p, dk.p, dv.p, dout.p, q.p, k.p, v.p, f32(lse), D, i32(qpos), i32(kpos), st(q.t),
                                 a.tq, a.tk, a.hq, a.hkv, a.d, static_cast<float>(scale), stream_);
  }
  void swiglu_forward(Buf h, Buf g, Buf u, std::int64_t n) override {
    same(h, g, "swiglu");
    Timer t(*this, "swiglu");
    ck::swiglu_forward(h.p, g.p, u.p, st(g.t), n, stream_);
  }
  void swiglu_backward(Buf dg, Buf du, Buf dh, Buf g, Buf u, std::int64_t n) override {
    same(dg, g, "swiglu_backward");
    Timer t(*this, "swiglu");
    ck::swiglu_backward(dg.p, du.p, dh.p, g.p, u.p, st(g.t), n, stream_);
  }
  void embedding_forward(Buf out, Buf table, Buf ids, std::int64_t n, std::int64_t dim, std::int64_t v0,
                         std::int64_t vl) override {
    same(out, table, "embedding");
    Timer t(*this, "embedding");
    ck::embedding_forward(out.p, table.p, i32(ids), st(out.t), n, dim, v0, vl, stream_);
  }
  void embedding_backward(Buf dtable, Buf dout, Buf ids, std::int64_t n, std::int64_t dim, std::int64_t v0,
                          std::int64_t vl) override {
    Timer t(*this, "embedding");
    ck::embedding_backward(f32(dtable), dout.p, i32(ids), st(dout.t), n, dim, v0, vl, stream_);
  }
  void ce_row_max(Buf m, Buf lg, std::int64_t rows, std::int64_t vl) override {
    Timer t(*this, "cross_entropy");
    ck::ce_row_max(f32(m), f32(lg), rows, vl, stream_);
  }
  void ce_row_sumexp(Buf s, Buf lg, Buf m, std::int64_t rows, std::int64_t vl) override {
    Timer t(*this, "cross_entropy");
    ck::ce_row_sumexp(f32(s), f32(lg), f32(m), rows, vl, stream_);
  }
  void ce_target_logit(Buf z, Buf lg, Buf tg, std::int64_t rows, std::int64_t vl, std::int64_t v0) override {
    Timer t(*this, "cross_entropy");
    ck::ce_target_logit(f32(z), f32(lg), i32(tg), rows, vl, v0, stream_);
  }
  void ce_row_loss(Buf loss, Buf m, Buf s, Buf z, Buf tg, std::int64_t rows) override {
    Timer t(*this, "cross_entropy");
    ck::ce_row_loss(f32(loss), f32(m), f32(s), f32(z), i32(tg), rows, stream_);
  }
  void ce_backward(Buf dl, Buf lg, Buf m, Buf s, Buf tg, std::int64_t rows, std::int64_t vl, std::int64_t v0,
                   double scale) override {
    Timer t(*this, "cross_entropy");
    ck::ce_backward(dl.p, st(dl.t), f32(lg), f32(m), f32(s), i32(tg), rows, vl, v0, static_cast<float>(scale), stream_);
  }
  void gather_rows(Buf dst, Buf src, Buf index, std::int64_t rows, std::int64_t width) override {
    same(dst, src, "gather_rows");
    Timer t(*this, "gather_rows");
    ck::gather_rows(dst.p, src.p, i32_of(index, "gather_rows", "index"), static_cast<int>(dtype_size(dst.t)), rows,
                    width, stream_);
  }

  // MoE: probs, wts, dwts and aux_grad in one type (fp32 or bf16; the param dtype); rows, y, dy and
  // drows in the activations' (fp32 or bf16); sel/slot int32; stat fp64 (alloc gives fp64 buffers).
  void moe_route(Buf probs, Buf sel, Buf wts, Buf stat, std::int64_t n, int E, int K) override {
    const ck::St p = st_of(probs, "moe_route", "probs");
    same(wts, probs, "moe_route");
    if (stat.t != DType::f64)
      throw std::logic_error(std::string("cuda backend: moe_route: stat must be fp64, got ") + dtype_name(stat.t));
    Timer t(*this, "moe");
    ck::moe_route(probs.p, p, i32w(sel), wts.p, static_cast<double*>(stat.p), n, E, K, stream_);
  }
  void moe_combine(Buf y, Buf rows, Buf wts, Buf slot, std::int64_t n, int K, std::int64_t h) override {
    same(y, rows, "moe_combine");
    const ck::St tt = st_of(rows, "moe_combine", "rows");
    const ck::St p = wts.p ? st_of(wts, "moe_combine", "wts") : ck::St::f32;
    Timer t(*this, "moe");
    ck::moe_combine(y.p, rows.p, tt, wts.p, p, i32_of(slot, "moe_combine", "slot"), n, K, h, stream_);
  }
  void moe_combine_backward(Buf drows, Buf dwts, Buf dy, Buf rows, Buf wts, Buf slot, std::int64_t n, int K,
                            std::int64_t h) override {
    same(drows, rows, "moe_combine_backward");
    same(dy, rows, "moe_combine_backward");
    same(dwts, wts, "moe_combine_backward");
    const ck::St tt = st_of(rows, "moe_combine_backward", "rows");
    const ck::St p = st_of(wts, "moe_combine_backward", "wts");
    Timer t(*this, "moe");
    ck::moe_combine_backward(drows.p, dwts.p, p, dy.p, rows.p, tt, wts.p, i32_of(slot, "moe_combine_backward", "slot"),
                             n, K, h, stream_);
  }
  void moe_router_backward(Buf probs, Buf sel, Buf wts, Buf dwts, Buf aux_grad, std::int64_t n, int E,
                           int K) override {
    const ck::St p = st_of(probs, "moe_router_backward", "probs");
    same(wts, probs, "moe_router_backward");
    same(dwts, probs, "moe_router_backward");
    same(aux_grad, probs, "moe_router_backward");
    Timer t(*this, "moe");
    ck::moe_router_backward(probs.p, p, i32_of(sel, "moe_router_backward", "sel"), wts.p, dwts.p, aux_grad.p, n, E, K,
                            stream_);
  }

  // Events: one cudaEvent (no timing) per record, recorded on the stream; wait is cudaStreamWaitEvent
  // (the device waits, the host does not); release destroys it (safe while still pending).
  Event record(Stream s) override {
    cudaEvent_t e = nullptr;
    cu(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate");
    cu(cudaEventRecord(e, stream(s)), "cudaEventRecord");
    return {static_cast<void*>(e)};
  }
  void wait(Stream s, Event e) override {
    if (!e.handle) return;   // an empty event marks nothing
    cu(cudaStreamWaitEvent(stream(s), static_cast<cudaEvent_t>(e.handle), 0), "cudaStreamWaitEvent");
  }
  void release(Event& e) override {
    if (e.handle) cudaEventDestroy(static_cast<cudaEvent_t>(e.handle));
    e = {};
  }
  // The stream behind Stream::compute / Stream::comm (a communicator issues its work on the comm one).
  cudaStream_t stream(Stream s) const { return s == Stream::comm ? comm_ : stream_; }
  void* native_stream(Stream s) override { return static_cast<void*>(stream(s)); }

  void adamw(std::span<const AdamTensor> ts, const AdamW& hp) override {
    Timer t(*this, "adamw");
    // The scalars exactly as the CPU twin forms them (kernels/src/optimizer.cpp), in fp32.
    const double bc1 = 1.0 - std::pow(hp.beta1, double(hp.step)), bc2 = 1.0 - std::pow(hp.beta2, double(hp.step));
    const ck::AdamScalars a{float(1.0 - hp.lr * hp.weight_decay), float(hp.lr / bc1), float(std::sqrt(bc2)),
                            float(hp.beta1), float(hp.beta2), float(1.0 - hp.beta1), float(1.0 - hp.beta2),
                            float(hp.eps), float(hp.grad_scale)};
    std::vector<ck::AdamDesc> d;
    DType param_t = pr_.param;
    for (const AdamTensor& x : ts) {
      const bool copy = x.param.p && x.param.p != x.master.p;
      if (copy) param_t = x.param.t;
      d.push_back({f32(x.master), f32(x.m), f32(x.v), f32(x.grad), copy ? x.param.p : nullptr, x.master.n});
    }
    ck::adamw(d.data(), static_cast<int>(d.size()), st(param_t), a, stream_);
  }
  double sum_squares(std::span<const Buf> xs) override {
    double total = 0;
    for (std::size_t first = 0; first < xs.size(); first += ck::kSumSquaresMaxTensors) {
      std::vector<const float*> p;
      std::vector<std::int64_t> n;
      for (std::size_t i = first; i < std::min(xs.size(), first + ck::kSumSquaresMaxTensors); ++i) {
        p.push_back(f32(xs[i]));
        n.push_back(xs[i].n);
      }
      {
        Timer t(*this, "sum_squares");
        ck::sum_squares(sumsq_result_, sumsq_partial_, p.data(), n.data(), static_cast<int>(p.size()), stream_);
      }
      double s = 0;
      cu(cudaMemcpyAsync(&s, sumsq_result_, sizeof s, cudaMemcpyDeviceToHost, stream_), "sum_squares");
      cu(cudaStreamSynchronize(stream_), "sum_squares");
      total += s;
    }
    return total;
  }

  std::string memory_report() override {
    std::size_t free = 0, total = 0;
    if (cudaMemGetInfo(&free, &total) != cudaSuccess) return "device memory: unknown";
    char line[128];
    std::snprintf(line, sizeof line, "device memory in use %.1f GiB of %.1f GiB", double(total - free) / (1u << 30),
                  double(total) / (1u << 30));
    return line;
  }
  std::vector<std::pair<std::string, double>> kernel_times() override {
    resolve_timers();
    std::vector<std::pair<std::string, double>> v(totals_.begin(), totals_.end());
    std::sort(v.begin(), v.end(), [](const auto& a, const auto& b) { return a.second > b.second; });
    return v;
  }

 private:
  static constexpr std::size_t kLtWorkspace = 64u << 20;

  // CUDA events around one call on the compute stream; resolved in batches (kernel_times, or when many).
  struct Timer {
    CudaBackend& be;
    const char* kind;
    cudaEvent_t start;
    Timer(CudaBackend& b, const char* k) : be(b), kind(k), start(b.event()) { cudaEventRecord(start, b.stream_); }
    ~Timer() {
      cudaEvent_t stop = nullptr;
      if (!be.pool_.empty()) {
        stop = be.pool_.back();
        be.pool_.pop_back();
      } else if (cudaEventCreate(&stop) != cudaSuccess) {
        return;   // no timing for this call rather than an exception from a destructor
      }
      cudaEventRecord(stop, be.stream_);
      be.pending_.push_back({kind, {start, stop}});
      if (be.pending_.size() > 8192) be.resolve_timers();
    }
  };
  cudaEvent_t event() {
    if (!pool_.empty()) {
      cudaEvent_t e = pool_.back();
      pool_.pop_back();
      return e;
    }
    cudaEvent_t e;
    cu(cudaEventCreate(&e), "cudaEventCreate");
    return e;
  }
  void resolve_timers() {
    cudaStreamSynchronize(stream_);
    for (auto& [kind, ev] : pending_) {
      float ms = 0;
      if (cudaEventElapsedTime(&ms, ev.first, ev.second) == cudaSuccess) totals_[kind] += ms;
      pool_.push_back(ev.first);
      pool_.push_back(ev.second);
    }
    pending_.clear();
  }

  float* scratch(void*& p, std::size_t& have, std::int64_t bytes) {
    if (static_cast<std::size_t>(bytes) > have) {
      cudaStreamSynchronize(stream_);
      cudaFree(p);
      p = nullptr;
      cu(cudaMalloc(&p, static_cast<std::size_t>(bytes)), "cudaMalloc scratch");
      have = static_cast<std::size_t>(bytes);
    }
    return static_cast<float*>(p);
  }
  // A batched row-major product with per-operand (base offset, batch stride) in elements. Row-major
  // C = op(A)·op(B) is column-major Cᵀ = op(B)ᵀ·op(A)ᵀ: the operands swap, each keeps its transpose flag.
  static Gemm rm_batched(bool ta, bool tb, std::int64_t M, std::int64_t N, std::int64_t K, const void* A,
                         std::int64_t lda, std::int64_t sa, std::int64_t oa, const void* B, std::int64_t ldb,
                         std::int64_t sb, std::int64_t ob, void* C, std::int64_t ldc, std::int64_t sc, std::int64_t oc,
                         DType ab, DType ct, float alpha, float beta, std::int64_t batch) {
    const std::size_t es = dtype_size(ab), cs = dtype_size(ct);
    Gemm g;
    g.ta = tb;
    g.tb = ta;
    g.m = N;
    g.n = M;
    g.k = K;
    g.a = static_cast<const char*>(B) + ob * es;
    g.lda = ldb;
    g.sa = sb;
    g.b = static_cast<const char*>(A) + oa * es;
    g.ldb = lda;
    g.sb = sa;
    g.d = static_cast<char*>(C) + oc * cs;
    g.ldd = ldc;
    g.sd = sc;
    g.ab = ab;
    g.dt = ct;
    g.alpha = alpha;
    g.beta = beta;
    g.batch = static_cast<int>(batch);
    return g;
  }

  using Key = std::tuple<bool, bool, std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t,
                         std::int64_t, std::int64_t, std::int64_t, int, int, int, std::uint32_t, std::uint32_t,
                         std::uint32_t>;
  struct Plan {
    cublasLtMatmulDesc_t op = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
    cublasLtMatmulAlgo_t algo{};
  };
  static void layout(cublasLtMatrixLayout_t* l, DType t, std::int64_t rows, std::int64_t cols, std::int64_t ld,
                     int batch, std::int64_t stride) {
    lt(cublasLtMatrixLayoutCreate(l, cuda_type(t), static_cast<std::uint64_t>(rows), static_cast<std::uint64_t>(cols), ld),
       "layout");
    if (batch > 1) {
      lt(cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &batch, sizeof batch), "batch");
      lt(cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof stride),
         "stride");
    }
  }
  // The alignment (bytes, ≤ 256) every batch of an operand keeps: views into a buffer (a head, a sequence)
  // are less aligned than cudaMalloc's 256 bytes, and cuBLASLt may only pick algorithms that allow it.
  static std::uint32_t alignment(const void* p, std::int64_t stride_elems, DType t, int batch) {
    std::uint64_t a = reinterpret_cast<std::uintptr_t>(p) | 256u;
    if (batch > 1) a |= static_cast<std::uint64_t>(stride_elems) * dtype_size(t);
    return static_cast<std::uint32_t>(a & (~a + 1));   // lowest set bit
  }
  // One cuBLASLt matmul; the descriptors and the heuristic's first algorithm are cached per shape and alignment.
  void gemm(const Gemm& g) {
    const std::uint32_t aa = alignment(g.a, g.sa, g.ab, g.batch), ab = alignment(g.b, g.sb, g.ab, g.batch),
                        ad = alignment(g.d, g.sd, g.dt, g.batch);
    const Key key{g.ta, g.tb, g.m, g.n, g.k, g.lda, g.ldb, g.ldd, g.sa, g.sb, g.sd, g.batch, int(g.ab),
                  int(g.dt) * 2 + (g.beta != 0), aa, ab, ad};
    auto it = plans_.find(key);
    if (it == plans_.end()) {
      Plan p;
      lt(cublasLtMatmulDescCreate(&p.op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "desc");
      const cublasOperation_t opa = g.ta ? CUBLAS_OP_T : CUBLAS_OP_N, opb = g.tb ? CUBLAS_OP_T : CUBLAS_OP_N;
      lt(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa), "transa");
      lt(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb), "transb");
      layout(&p.a, g.ab, g.ta ? g.k : g.m, g.ta ? g.m : g.k, g.lda, g.batch, g.sa);
      layout(&p.b, g.ab, g.tb ? g.n : g.k, g.tb ? g.k : g.n, g.ldb, g.batch, g.sb);
      layout(&p.d, g.dt, g.m, g.n, g.ldd, g.batch, g.sd);
      cublasLtMatmulPreference_t pref;
      lt(cublasLtMatmulPreferenceCreate(&pref), "preference");
      const std::size_t ws = kLtWorkspace;
      lt(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws), "pref");
      lt(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &aa, sizeof aa), "pref");
      lt(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &ab, sizeof ab), "pref");
      lt(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &ad, sizeof ad), "pref");
      lt(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &ad, sizeof ad), "pref");
      cublasLtMatmulHeuristicResult_t h{};
      int found = 0;
      lt(cublasLtMatmulAlgoGetHeuristic(lt_, p.op, p.a, p.b, p.d, p.d, pref, 1, &h, &found), "heuristic");
      cublasLtMatmulPreferenceDestroy(pref);
      if (found == 0)
        throw std::runtime_error("cuBLASLt has no algorithm for a " + std::to_string(g.m) + "x" + std::to_string(g.n) +
                                 "x" + std::to_string(g.k) + " " + dtype_name(g.ab) + " product");
      p.algo = h.algo;
      it = plans_.emplace(key, p).first;
    }
    const Plan& p = it->second;
    lt(cublasLtMatmul(lt_, p.op, &g.alpha, g.a, p.a, g.b, p.b, &g.beta, g.d, p.d, g.d, p.d, &p.algo, lt_ws_,
                      kLtWorkspace, stream_),
       "matmul");
  }

  Precision pr_;
  std::string name_;
  cudaStream_t stream_ = nullptr;   // compute: every kernel, copy and transfer
  cudaStream_t comm_ = nullptr;     // Stream::comm, for a communicator with a stream of its own
  cublasLtHandle_t lt_ = nullptr;
  void* lt_ws_ = nullptr;
  double *sumsq_partial_ = nullptr, *sumsq_result_ = nullptr;
  void *attn_d_ = nullptr, *norm_partial_ = nullptr;
  std::size_t attn_d_bytes_ = 0, norm_partial_bytes_ = 0;
  void *mix_a_ = nullptr, *mix_b_ = nullptr, *mix_c_ = nullptr;   // rm_gemm's fp32 copies of mixed operands
  std::size_t mix_a_bytes_ = 0, mix_b_bytes_ = 0, mix_c_bytes_ = 0;
  std::map<Key, Plan> plans_;
  std::vector<std::pair<const char*, std::pair<cudaEvent_t, cudaEvent_t>>> pending_;
  std::vector<cudaEvent_t> pool_;
  std::map<std::string, double> totals_;
};

}  // namespace

std::unique_ptr<Backend> make_cuda_backend(const Precision& p, int device) {
  std::string why;
  const int n = cuda_device_count(&why);
  if (n == 0) throw std::invalid_argument("no CUDA device: " + why);
  if (device < 0 || device >= n)
    throw std::invalid_argument("CUDA device " + std::to_string(device) + " is not below the " + std::to_string(n) +
                                " visible devices");
  return std::make_unique<CudaBackend>(p, device);
}

}  // namespace meshrun::device
