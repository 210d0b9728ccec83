// The kernel backend seam: one interface the trainer's layers, stages, parameter store and axes (trainer/) call for every tensor operation, with
// a CPU implementation (the reference kernels of kernels/cpu.hpp, in fp32 or fp64) and a CUDA one
// (device buffers, one compute stream, cuBLASLt GEMMs and hand-written fused kernels; device/cuda/).
// Every function has the semantics of its namesake in meshrun/kernels/cpu.hpp (shapes, overwrite vs
// ACCUMULATE, causal GQA, vocab-shard pieces); only the element types differ, as Precision says. The
// operations without a namesake there (rows, mixture-of-experts routing, streams) say theirs below; the
// CPU backend's implementation of each is the reference its CUDA twin is checked against.
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "meshrun/device/buffer.hpp"
#include "meshrun/kernels/cpu.hpp"

namespace meshrun::device {

// What a backend stores where (mixed precision). The CPU backend uses one type for everything
// (training.dtype: fp32 or fp64), or with training.dtype = "bf16" the CUDA backend's mixed precision; the CUDA backend follows training.param_dtype / grad_dtype /
// optim_dtype: bf16 weights and activations, fp32 gradients, fp32 master weights and Adam moments.
struct Precision {
  DType param = DType::f32;   // weights the kernels read, and activations
  DType stat = DType::f32;    // per-row statistics: RMSNorm rstd, attention lse, cross-entropy pieces, logits
  DType grad = DType::f32;    // weight gradients (accumulated over micro-batches, reduced, clipped)
  DType optim = DType::f32;   // master weights and both Adam moments
  // A separate master copy exists when the kernels' weights are narrower than the optimizer's.
  bool has_master() const { return param != optim; }
  static Precision cpu(const std::string& dtype);   // "fp32" | "fp64" | "bf16" (training.dtype)
  // From the config names; throws std::invalid_argument with one line naming the key and the fix.
  static Precision cuda(const std::string& param_dtype, const std::string& grad_dtype,
                        const std::string& optim_dtype);
  // The one resolution from a run's keys (training.device, training.dtype, training.param_dtype,
  // grad_dtype, optim_dtype): cpu(dtype) on "cpu", cuda(param, grad, optim) on "cuda".
  static Precision for_run(const std::string& device, const std::string& dtype, const std::string& param_dtype,
                           const std::string& grad_dtype, const std::string& optim_dtype);
};

// One flat shard for the multi-tensor AdamW: master (optim dtype) and moments m, v updated in place from
// grad (grad dtype, times hp.grad_scale); param, when it is not the master itself, receives the rounded
// copy of the new master.
struct AdamTensor {
  Buf master, m, v, grad, param;
};

using kernels::cpu::AdamW;
using kernels::cpu::AttentionDims;

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  virtual Precision precision() const = 0;

  // memory
  virtual Buf alloc(std::int64_t n, DType t) = 0;
  virtual void release(Buf& b) = 0;
  virtual void zero(Buf b) = 0;
  // host float/double/int32 data in or out, converting to/from the buffer's type (bf16: round to nearest-even)
  virtual void upload(Buf dst, const float* src) = 0;
  virtual void upload(Buf dst, const double* src) = 0;
  virtual void upload(Buf dst, const std::int32_t* src) = 0;
  virtual void download(double* dst, Buf src) = 0;
  virtual void download(float* dst, Buf src) = 0;   // float buffers (or narrower) out at full size
  virtual void copy(Buf dst, Buf src) = 0;   // same n, converting (e.g. fp32 master → bf16 weights)
  virtual void add(Buf y, Buf x) = 0;        // y += x, same n and type (residual stream)
  virtual void synchronize() = 0;

  // linear: y[n,out] = x·Wᵀ ; dx = dy·W (overwrite/accumulate) ; dW[out,in] += dyᵀ·x (dW in grad dtype)
  virtual void linear_forward(Buf y, Buf x, Buf w, std::int64_t n, std::int64_t in, std::int64_t out) = 0;
  // y[n, out] += x · Wᵀ: a residual add folded into the product. The CUDA backend runs one cuBLASLt product with
  // beta = 1 and C = D = y (one rounding of the sum); this default, the CPU backends', is linear_forward into
  // scratch ([n·out] of y's type) then add: the bits of those two calls.
  virtual void linear_forward_residual(Buf y, Buf x, Buf w, std::int64_t n, std::int64_t in, std::int64_t out,
                                       Buf scratch) {
    linear_forward(scratch.at(0, n * out), x, w, n, in, out);
    add(y.at(0, n * out), scratch.at(0, n * out));
  }
  virtual void linear_backward_input(Buf dx, Buf dy, Buf w, std::int64_t n, std::int64_t in, std::int64_t out,
                                     bool accumulate) = 0;
  virtual void linear_backward_weight(Buf dw, Buf dy, Buf x, std::int64_t n, std::int64_t in,
                                      std::int64_t out) = 0;
  virtual void rmsnorm_forward(Buf y, Buf rstd, Buf x, Buf w, std::int64_t rows, std::int64_t dim, double eps) = 0;
  // dx (overwrite/accumulate), dw += (grad dtype)
  virtual void rmsnorm_backward(Buf dx, Buf dw, Buf dy, Buf x, Buf w, Buf rstd, std::int64_t rows,
                                std::int64_t dim, bool accumulate) = 0;
  // The same in two halves for the zero-bubble split: B (the input gradient) and W (dw +=, grad dtype),
  // each with the bits of the corresponding half of rmsnorm_backward.
  virtual void rmsnorm_backward_input(Buf dx, Buf dy, Buf x, Buf w, Buf rstd, std::int64_t rows, std::int64_t dim,
                                      bool accumulate) = 0;
  virtual void rmsnorm_backward_weight(Buf dw, Buf dy, Buf x, Buf rstd, std::int64_t rows, std::int64_t dim) = 0;
  virtual void rope_forward(Buf x, Buf pos, std::int64_t tokens, std::int64_t heads, std::int64_t head_dim,
                            double theta) = 0;
  virtual void rope_backward(Buf dx, Buf pos, std::int64_t tokens, std::int64_t heads, std::int64_t head_dim,
                             double theta) = 0;
  virtual void attention_forward(Buf out, Buf lse, Buf q, Buf k, Buf v, Buf qpos, Buf kpos,
                                 const AttentionDims& dims, double scale) = 0;
  virtual void attention_merge(Buf out, Buf lse, Buf out2, Buf lse2, std::int64_t rows, std::int64_t d) = 0;
  virtual void attention_backward(Buf dq, Buf dk, Buf dv, Buf dout, Buf out, Buf lse, Buf q, Buf k, Buf v,
                                  Buf qpos, Buf kpos, const AttentionDims& dims, double scale) = 0;
  virtual void swiglu_forward(Buf h, Buf gate, Buf up, std::int64_t n) = 0;
  virtual void swiglu_backward(Buf dgate, Buf dup, Buf dh, Buf gate, Buf up, std::int64_t n) = 0;
  virtual void embedding_forward(Buf out, Buf table, Buf ids, std::int64_t n, std::int64_t dim, std::int64_t v0,
                                 std::int64_t vl) = 0;
  virtual void embedding_backward(Buf dtable, Buf dout, Buf ids, std::int64_t n, std::int64_t dim,
                                  std::int64_t v0, std::int64_t vl) = 0;
  // vocab-parallel cross-entropy pieces (cpu.hpp); logits and the row statistics are in the stat dtype
  virtual void ce_row_max(Buf row_max, Buf logits, std::int64_t rows, std::int64_t vl) = 0;
  virtual void ce_row_sumexp(Buf sumexp, Buf logits, Buf row_max, std::int64_t rows, std::int64_t vl) = 0;
  virtual void ce_target_logit(Buf tgt, Buf logits, Buf targets, std::int64_t rows, std::int64_t vl,
                               std::int64_t v0) = 0;
  virtual void ce_row_loss(Buf loss, Buf row_max, Buf sumexp, Buf tgt, Buf targets, std::int64_t rows) = 0;
  // dlogits (param dtype, feeds the lm_head GEMMs) from logits (stat dtype)
  virtual void ce_backward(Buf dlogits, Buf logits, Buf row_max, Buf sumexp, Buf targets, std::int64_t rows,
                           std::int64_t vl, std::int64_t v0, double scale) = 0;
  // Rows of `width` elements: dst[i] = src[index[i]] for i < rows (index: int32).
  virtual void gather_rows(Buf dst, Buf src, Buf index, std::int64_t rows, std::int64_t width) = 0;

  // Mixture of experts (token choice, top-k). Index buffers are int32; stat is fp64.
  // Router: logits[n, E] become the softmax probabilities in place (computed in double); sel[n, K] the
  // top-k experts by probability (ties to the lower index), wts[n, K] their probabilities renormalised
  // to sum 1; stat[0..E) += tokens per expert, stat[E..2E) += Σ probabilities per expert.
  virtual void moe_route(Buf probs, Buf sel, Buf wts, Buf stat, std::int64_t n, int experts, int top_k) = 0;
  // Combine: y[r] = Σ_k wts[r, k]·rows[slot[r, k]] (k in order, from 0; slot < 0 skipped) for r < n;
  // without wts (an empty Buf) every weight is 1. y is overwritten.
  virtual void moe_combine(Buf y, Buf rows, Buf wts, Buf slot, std::int64_t n, int top_k, std::int64_t h) = 0;
  // Its backward: drows[slot[r, k]] = wts[r, k]·dy[r] and dwts[r, k] = <dy[r], rows[slot[r, k]]> (the dot
  // in double); entries with slot < 0 are left as they are.
  virtual void moe_combine_backward(Buf drows, Buf dwts, Buf dy, Buf rows, Buf wts, Buf slot, std::int64_t n,
                                    int top_k, std::int64_t h) = 0;
  // Router backward, in place: probs[n, E] becomes dlogits from the routing weights' gradients dwts[n, K]
  // (through the renormalisation), the load-balancing loss's constant gradient aux_grad[E] and the softmax.
  virtual void moe_router_backward(Buf probs, Buf sel, Buf wts, Buf dwts, Buf aux_grad, std::int64_t n, int experts,
                                   int top_k) = 0;

  // Streams and events. Kernels run in order on the compute stream; a communicator with a stream of its
  // own (NCCL) runs on `comm`. record(s) marks what s has been given so far; wait(s, e) makes s wait for
  // that mark before what it is given next. The CPU backend runs every call to completion before it
  // returns, so there each is already ordered and these do nothing.
  enum class Stream : std::uint8_t { compute, comm };
  struct Event {
    void* handle = nullptr;
  };
  virtual Event record(Stream s) = 0;
  virtual void wait(Stream s, Event e) = 0;
  virtual void release(Event& e) = 0;
  // The backend's own handle of `s` (CUDA: its cudaStream_t), for a communicator that enqueues on it (NCCL);
  // nullptr where calls complete on return (the CPU backends).
  virtual void* native_stream(Stream s) { (void)s; return nullptr; }

  virtual void adamw(std::span<const AdamTensor> tensors, const AdamW& hp) = 0;
  virtual double sum_squares(std::span<const Buf> xs) = 0;   // Σ over all tensors, in double on the host

  // Host access for a communicator that reads and writes this backend's memory from the host (MPI on a
  // CPU backend): the buffers are addressable from begin_host_access until the matching end (calls
  // nest). Only the strict CPU backend, whose memory is unaddressable between its calls, does anything.
  virtual void begin_host_access() {}
  virtual void end_host_access() {}
  // One buffer held addressable from pin until the matching unpin, across calls and host-access windows:
  // a communicator's non-blocking operation pins its buffers until its request completes, because a peer
  // may read or write them from its own process at any time in between (Open MPI's single-copy transfers
  // over shared memory: process_vm_readv/writev on this process's pages). Pins of one range nest.
  virtual void pin_host_access(Buf) {}
  virtual void unpin_host_access(Buf) {}
  // True where a Buf's memory is ordinary host memory the caller may read and write at any time (the CPU
  // backends): a checkpoint load then reads straight into it instead of staging and uploading.
  virtual bool host_addressable() const { return false; }
  // Whether `p` is in this backend's device memory (not host memory): a host-addressable backend's never is.
  virtual bool is_device_memory(const void* p) const {
    (void)p;
    return false;
  }

  // Time spent per kernel kind so far (ms; CUDA: CUDA events on the compute stream), largest first.
  virtual std::vector<std::pair<std::string, double>> kernel_times() { return {}; }
  // One line on memory use (CUDA: device memory in use and total), "" where there is nothing to say.
  virtual std::string memory_report() { return ""; }
};

std::unique_ptr<Backend> make_cpu_backend(const std::string& dtype);   // training.dtype
// The CPU backend with its memory unaddressable (PROT_NONE) between calls: a test instrument that makes
// any tensor access outside the seam fault (backend_strict.cpp). MESHRUN_STRICT_BACKEND=1 asks for it.
std::unique_ptr<Backend> make_strict_cpu_backend(const std::string& dtype);
bool strict_backend_requested();

// One allocation of a backend, released with its owner. ensure() grows it (contents not kept) for
// buffers whose size changes from call to call (expert rows), so a steady state allocates nothing.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(Backend& be, std::int64_t n, DType t) : be_(&be), b_(be.alloc(n, t)) {}
  DeviceBuffer(DeviceBuffer&& o) noexcept : be_(o.be_), b_(o.b_) { o.b_ = {}; }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
      reset();
      be_ = o.be_;
      b_ = o.b_;
      o.b_ = {};
    }
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() { reset(); }

  // A view of the first n elements, reallocated first when the buffer holds fewer (or another type).
  Buf ensure(Backend& be, std::int64_t n, DType t) {
    if (!b_.p || b_.n < n || b_.t != t || be_ != &be) {
      reset();
      be_ = &be;
      b_ = be.alloc(n, t);
    }
    return b_.at(0, n);
  }
  void reset() {
    if (be_ && b_.p) be_->release(b_);
    b_ = {};
  }
  const Buf& buf() const { return b_; }
  operator Buf() const { return b_; }
  Buf at(std::int64_t offset, std::int64_t count) const { return b_.at(offset, count); }
  std::int64_t bytes() const { return b_.p ? b_.bytes() : 0; }

 private:
  Backend* be_ = nullptr;
  Buf b_;
};

// CUDA: whether this build has the backend, how many devices are visible (0 with the runtime's reason),
// and the backend on device `device` (an index among the visible ones).
bool cuda_compiled();
int cuda_device_count(std::string* why);
// The runtime's name of the calling thread's current device (cudaGetDeviceProperties: "NVIDIA H100 80GB
// HBM3"); "" without a device or a CUDA backend.
std::string cuda_current_device_name();
std::unique_ptr<Backend> make_cuda_backend(const Precision& p, int device);

// The device index a task uses: MESHRUN_CUDA_DEVICE (set by the launcher: the task's index in
// CUDA_VISIBLE_DEVICES), else default_device (meshrun-train at world > 1 passes the node-local rank, as
// torchrun's LOCAL_RANK picks a GPU). Throws std::invalid_argument with one line when it is not an index below
// `visible`.
int task_cuda_device(int visible, int default_device = 0);

}  // namespace meshrun::device
