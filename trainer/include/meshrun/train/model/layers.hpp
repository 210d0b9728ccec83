// The Llama model's units as stateless functions over flat buffers (llm.c style): the embedding, the
// decoder layer and the head (final norm, lm_head, vocab-parallel cross-entropy), each with a forward,
// a backward for the input gradient (B) and a backward for the weight gradient (W). B saves in the
// activation views exactly what W reads, so a pipeline schedule may run W later (zero-bubble) or right
// after B (fused BW) with identical numbers. Weights and gradients are the unit's flat buffer and its
// tensor table (offsets from params.hpp); activations are views into a stage's slot; all
// tensor-parallel communication goes through TensorParallel. Every tensor is a backend buffer (Buf) and
// every operation on one a Backend call or a collective: the layers never touch tensor memory.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "meshrun/device/backend.hpp"
#include "meshrun/geometry.hpp"
#include "meshrun/job.hpp"
#include "meshrun/train/parallel/context_parallel.hpp"
#include "meshrun/train/parallel/moe.hpp"
#include "meshrun/train/model/params.hpp"
#include "meshrun/train/parallel/tensor_parallel.hpp"

namespace meshrun::train {

// One rank's share of one micro-batch.
struct LayerDims {
  std::int64_t n = 0, nl = 0;      // rows of the micro-batch; rows kept in the residual stream (SP: n / tp)
  std::int64_t seq = 0, mbs = 0;   // tokens per sequence on this rank (S / cp); sequences per micro-batch
  std::int64_t h = 0, dh = 0;      // hidden size, head dimension
  std::int64_t hq = 0, hkv = 0;    // local query / key-value heads
  std::int64_t ffn = 0;            // local MLP width (0 in a mixture-of-experts layer: see ExpertParallel)
  std::int64_t vl = 0, v0 = 0;     // local vocabulary rows and the first one
  std::int64_t head_rows = 0;      // rows of one logits chunk of the fused head (mesh head_chunk_rows)
  double rope_theta = 0, norm_eps = 0;
  static LayerDims make(const ModelSpec& m, const BatchGeometry& g, int tp, int tp_rank);
};

// Hands out consecutive views of two buffers: activations (Precision::param) and per-row statistics
// (Precision::stat: RMSNorm rstd, attention lse, logits and the cross-entropy pieces). With a null base
// it only counts (sizing pass).
struct Carver {
  Buf base, stat_base;
  std::int64_t used = 0, stat_used = 0;
  Buf take(std::int64_t n) { return next(base, used, n); }
  Buf stat(std::int64_t n) { return next(stat_base, stat_used, n); }
  bool split_types() const { return base.t != stat_base.t; }

 private:
  static Buf next(Buf b, std::int64_t& used, std::int64_t n) {
    const Buf v = b.p ? b.at(used, n) : Buf{nullptr, n, b.t};
    used += n;
    return v;
  }
};

// Activation recomputation (training.recompute): what a decoder layer keeps of its forward for the backward.
// none: everything below. selective: not the two norm outputs (xn1, xn2) nor the MLP activation's output
// (hact, the experts' too): W recomputes them from what is kept (rmsnorm of x_in / x2, SwiGLU of gate, up) —
// the planner's count (planner/src/model_math.cpp). full: only the layer's input x_in; the layer's forward
// runs again, into the workspace, before its B and again before a W that runs apart from its B (zero-bubble).
// The CPU backends recompute the same bits, so losses and gradients do not change.
enum class Recompute { none, selective, full };
Recompute parse_recompute(const std::string& name);  // "none" | "selective" | "full"

// What a decoder layer keeps of one micro-batch between its forward, B and W.
struct DecoderActs {
  // forward
  Buf x_in, rstd1, xn1, q, k, v, att, lse, x2, rstd2, xn2, gate, up, hact;
  // B, for W: gathered output gradients of the two row-parallel projections, the MLP gate/up gradients,
  // q/k/v gradients after RoPE, and the gradients at the two norms' outputs.
  Buf dmlp, dgate, dup, dattn, dq, dk, dv, dxn2, dxn1;
  Recompute kept = Recompute::none;  // what carve_forward kept
  // The two parts live in different buffers: the forward part from F until W, the backward part only
  // from B until W (a schedule that runs W right after B needs one of those at a time). The forward part
  // holds what `keep` keeps; the views of what it does not are empty.
  // input: x_in's view when it lives elsewhere (not carved).
  void carve_forward(Carver& c, const LayerDims& d, Recompute keep = Recompute::none, Buf input = {});
  void carve_backward(Carver& c, const LayerDims& d);
};

// No logits: the head computes them a chunk of rows at a time into the workspace (forward: the cross-entropy's
// row statistics; B: again, for the gradient), so a micro-batch keeps only its rows' statistics.
struct HeadActs {
  Buf xf_in, rstd, xf, ce_max, ce_sum, ce_tgt, ce_loss;
  Buf dxf;                  // backward part
  double loss_scale = 0;    // B's, for a W that runs later (zero-bubble) and recomputes the logits gradient
  bool weight_done = false; // B already accumulated the lm_head gradient (fused BW)
  void carve_forward(Carver& c, const LayerDims& d);
  void carve_backward(Carver& c, const LayerDims& d);
};

// Scratch shared by every unit of a rank (nothing in it lives from one call to the next).
struct LayerWorkspace {
  device::Backend* be = nullptr;  // every kernel call of the layers goes through it
  device::DeviceBuffer nh, nh_full, ff, att, xn_full, moe_scratch;
  // One chunk of the head's logits (statistics' type) and of their gradient (activations' type; the logits
  // buffer itself, overwritten, when the two types are one).
  device::DeviceBuffer logits, dlogits;
  // recompute = full: one decoder layer's forward part but its input (layer, layer_stat: activations and
  // statistics), which every forward of the rank writes into and decoder_recompute rebuilds before a
  // backward; the rebuilt forward's output (thrown away); the kept activations whose forward `layer` holds.
  // recompute = selective: the norm output a forward (or a W) computes and does not keep, [nl, h].
  Recompute recompute = Recompute::none;
  device::DeviceBuffer xn, layer, layer_stat, layer_out;
  const DecoderActs* layer_owner = nullptr;
  void resize(device::Backend& backend, const LayerDims& d, bool sequence_parallel,
              Recompute recompute = Recompute::none);
  std::int64_t bytes() const;
};

// ---- embedding (vocab-parallel) --------------------------------------------------------------------
// x[nl, h] = this rank's rows of the embedded ids[n].
void embedding_forward(const LayerDims& d, const TensorParallel& tp, const std::vector<TensorSlot>& ts, Buf w,
                       Buf ids, Buf x, LayerWorkspace& ws);
// dw += the table gradient from the gradient at the embedding's output dx[nl, h].
void embedding_backward_weight(const LayerDims& d, const TensorParallel& tp, const std::vector<TensorSlot>& ts,
                               Buf dw, Buf ids, Buf dx, LayerWorkspace& ws);

// ---- decoder layer -----------------------------------------------------------------------------------
// What a mixture-of-experts decoder layer gets besides its own unit (null for a dense layer): the EP
// module, its activations of this micro-batch and its local experts' units (moe.hpp).
struct MoeLayer {
  const ExpertParallel* ep = nullptr;
  int layer = 0;
  MoeActs* acts = nullptr;
  const std::vector<TensorSlot>* ets = nullptr;  // an expert unit's tensors (the same offsets for every expert)
  std::vector<Buf> experts;                      // local experts' parameters (forward, B)
};

// x[nl, h] in place: input -> output. pos[n]: global positions of the rows. Attention goes through the
// context-parallel module (plain causal attention when cp = 1).
void decoder_forward(const LayerDims& d, const TensorParallel& tp, ContextParallel& cp,
                     const std::vector<TensorSlot>& ts, Buf w, DecoderActs& a, Buf x, Buf pos, LayerWorkspace& ws,
                     MoeLayer* moe = nullptr);
// The same layer for decoding with a KV cache (sampling; one sequence, tp = cp = 1): x[n, h] in place for n
// new tokens at positions pos[n] = cached, cached+1, ...; their keys and values are stored in rows
// [cached, cached + n) of k_cache / v_cache ([capacity, kv_heads·head_dim]) and every new token attends to
// the cache's rows [0, cached + n) (cache_pos: their positions 0, 1, ...), causally by position.
void decoder_forward_cached(const LayerDims& d, const TensorParallel& tp, const std::vector<TensorSlot>& ts, Buf w,
                            DecoderActs& a, Buf x, Buf pos, LayerWorkspace& ws, MoeLayer* moe, Buf k_cache,
                            Buf v_cache, Buf cache_pos, std::int64_t cached);
// dy[nl, h] in place: gradient at the output -> gradient at the input.
void decoder_backward_input(const LayerDims& d, const TensorParallel& tp, ContextParallel& cp,
                            const std::vector<TensorSlot>& ts, Buf w, DecoderActs& a, Buf dy, Buf pos,
                            LayerWorkspace& ws, MoeLayer* moe = nullptr);
// w: the layer's weights, read only to recompute what a selective forward did not keep (else may be empty).
void decoder_backward_weight(const LayerDims& d, const TensorParallel& tp, const std::vector<TensorSlot>& ts, Buf dw,
                             DecoderActs& a, LayerWorkspace& ws, MoeLayer* moe = nullptr, Buf w = {});
// recompute = full: the layer's forward part rebuilt in the workspace (ws.layer) from kept.x_in, the same bits as
// a forward that kept everything; its x_in and backward part are kept's. The forward runs again unless the
// workspace holds kept's already (a W right after its B: ws.layer_owner).
DecoderActs decoder_recompute(const LayerDims& d, const TensorParallel& tp, ContextParallel& cp,
                              const std::vector<TensorSlot>& ts, Buf w, const DecoderActs& kept, Buf pos,
                              LayerWorkspace& ws, MoeLayer* moe = nullptr);

// ---- head: final norm, lm_head fused with the cross-entropy ------------------------------------------
// The logits exist one chunk of d.head_rows rows at a time (ws.logits); every kernel is row by row and every
// matrix product's inner sums run in the same order whatever the rows (kernels/cpu.hpp), so the chunks change
// no bit on the CPU backends. The backward recomputes each chunk's logits (one more lm_head product).
// Returns Σ over the micro-batch's rows of the cross-entropy (double, rows in order).
double head_forward(const LayerDims& d, const TensorParallel& tp, const std::vector<TensorSlot>& ts, Buf w,
                    HeadActs& a, Buf x, Buf targets, LayerWorkspace& ws);
// dx[nl, h] = gradient of loss_scale · Σ CE at the head's input. With dw, also the lm_head's weight gradient
// (dw += ..., the fused BW: no second recomputation in W).
void head_backward_input(const LayerDims& d, const TensorParallel& tp, const std::vector<TensorSlot>& ts, Buf w,
                         HeadActs& a, Buf targets, double loss_scale, Buf dx, LayerWorkspace& ws, Buf dw = {});
// dw += the head's weight gradients; recomputes the logits chunks (w: the head's weights) unless B did the
// lm_head part already.
void head_backward_weight(const LayerDims& d, const TensorParallel& tp, const std::vector<TensorSlot>& ts, Buf w,
                          Buf dw, HeadActs& a, Buf targets, LayerWorkspace& ws);
// logits[n, vl] of the rows of x (sampling: no cross-entropy).
void head_logits(const LayerDims& d, const TensorParallel& tp, const std::vector<TensorSlot>& ts, Buf w, HeadActs& a,
                 Buf x, Buf logits, LayerWorkspace& ws);

}  // namespace meshrun::train
