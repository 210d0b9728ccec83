// Mixture of experts with expert parallelism (parallelism.md, EP), the module the MoE decoder layer calls
// for its MLP and nothing else: the router (linear h -> E, softmax, top-k with ties broken by expert
// index, the selected weights renormalised to sum to 1), the dropless dispatch over the EP group (local
// assignments sorted by expert, per-expert counts exchanged with an all-to-all, then the token rows with an
// all-to-all with counts), every local expert's SwiGLU on exactly its rows (the linear kernels on row
// segments: a grouped GEMM without padding or capacity), the results sent back and combined with the
// routing weights; the backward runs the same path in reverse. The load-balancing loss E·Σᵢ fᵢ·Pᵢ is
// computed over the whole micro-batch: its statistics are summed over the CP group, and every TP rank
// routes all n rows (gathered under sequence parallelism), so every layout computes the same number.
// Two conventions (model.router_aux): "meshrun" per layer (fᵢ = share of the T·k assignments, summed over
// layers); "hf" as Hugging Face Mixtral's load_balancing_loss_func (fᵢ = assignments / (L·T), i.e. summed
// over the k slots, and Pᵢ the mean probability, both pooled over the L layers' router outputs).
//
// Tensor parallelism inside the experts follows mesh's expert grid (ETP = TP): w1/w3 rows and w2 columns
// are split; the expert outputs (and input gradients) are all-reduced over TP right after the experts, so
// everything the router and the combine see is complete on every TP rank.
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include "meshrun/device/backend.hpp"
#include "meshrun/train/comm_names.hpp"
#include "meshrun/train/model/params.hpp"
#include "meshrun/train/parallel/tensor_parallel.hpp"

namespace meshrun::train {

// Per-step statistics of this rank (reset by the trainer each step).
struct MoeStats {
  std::vector<double> aux;                 // [layers]: Σ over its micro-batches (in order) of coef/M · E·Σ f·P
  std::vector<std::int64_t> expert_tokens; // [layers · E]: assignments per expert, summed over micro-batches
  std::int64_t a2a_bytes = 0;              // token bytes this rank sent to other EP ranks (all four exchanges)
  // router_aux = "hf": per micro-batch of this rank [microbatches · 2E], the assignments per expert, then the
  // router probabilities' sums, over every layer's router outputs (added by the forwards, read by the backward).
  std::vector<double> pooled;
  void reset(int layers, int experts, int pooled_microbatches = 0) {
    aux.assign(static_cast<std::size_t>(layers), 0.0);
    a2a_bytes = 0;
    expert_tokens.assign(static_cast<std::size_t>(layers) * experts, 0);
    pooled.assign(static_cast<std::size_t>(pooled_microbatches) * 2 * experts, 0.0);
  }
};

// A test instrument: (model layer, micro-batch, logits [n, E] of this rank's routed rows) of every router call.
using RouterLogitsObserver = std::function<void(int, int, const std::vector<double>&)>;

struct ExpertParallel {
  device::Backend* be = nullptr;  // every tensor operation
  Comm* ep = nullptr;  // the EP group: ranks of one pipeline stage and TP rank holding different experts
  Comm* cp = nullptr;  // the CP group: the load-balancing statistics span every CP shard of a sequence
  int experts = 0, top_k = 0;
  int local = 0;            // experts per EP rank (experts / ep)
  std::int64_t ffn = 0;     // local expert width (moe_ffn / tp)
  std::int64_t tokens = 0;  // T: tokens of one micro-batch over all CP shards (micro_batch_size · seq_len)
  double aux_coef = 0;      // router_aux_loss_coef / micro-batches per step (the mean over micro-batches)
  // router_aux = "hf": the statistics pooled over all `layers` layers (needs `stats` and every layer on this
  // rank: pp = 1), so the aux gradient is set in the backward, once every layer's forward has counted.
  bool pooled = false;
  int layers = 0;
  MoeStats* stats = nullptr;
  // recompute = selective: false, and the experts' SwiGLU output is not kept; their W recomputes it from gate
  // and up (the same bits).
  bool keep_hact = true;
  // Faults the equivalence tests inject (never set outside tests).
  bool fault_drop_token = false;   // the first routed assignment of each micro-batch is not dispatched
  bool fault_wrong_rank = false;   // one assignment goes to the next EP rank's first expert
  RouterLogitsObserver observe_logits;  // tests only: see RouterLogitsObserver
  int first_local() const { return ep->rank() * local; }
};

// What an MoE layer keeps of one micro-batch. The expert rows' count varies with the routing: the buffers
// grow to the largest seen and are viewed at this micro-batch's size.
struct MoeActs {
  std::int64_t n = 0;          // rows routed (all rows of the micro-batch)
  std::int64_t rows_in = 0;    // R: rows received for the local experts
  std::int64_t rows_sent = 0;  // assignments dispatched, in send order
  int microbatch = 0;          // which micro-batch of the step (the pooled statistics' index)
  // forward
  device::DeviceBuffer probs;      // [n, E]; becomes dlogits in B
  device::DeviceBuffer sel;        // [n, k] selected experts (int32)
  device::DeviceBuffer wts;        // [n, k] renormalised routing weights
  device::DeviceBuffer slot;       // [n, k] row of each assignment in the send order, -1 if dropped (int32)
  std::vector<std::int64_t> send_rows, recv_rows;  // per EP rank
  std::vector<std::int64_t> recv_counts;           // [ep · local]: rows from source s for local expert j
  device::DeviceBuffer aux_grad;   // [E]: ∂aux/∂p(r, i), the same for every row
  device::DeviceBuffer xin, gate, up, hact;  // received rows [R, h], expert activations [R, f] (hact: keep_hact)
  device::DeviceBuffer ret;        // expert outputs back in send order [sent, h]
  // backward (B for W)
  device::DeviceBuffer dout, dgate, dup;  // [R, h], [R, f]
  std::int64_t bytes() const;
};

// xn[nl, h] (this rank's rows of the normed input) -> out[nl, h]. experts[j]: local expert j's unit.
// xn_full, y_full: [n, h] scratch.
void moe_forward(const ExpertParallel& ep, const TensorParallel& tp, int layer, const std::vector<TensorSlot>& ts,
                 Buf w, const std::vector<Buf>& experts, const std::vector<TensorSlot>& ets, MoeActs& a, Buf xn,
                 Buf out, Buf xn_full, Buf y_full);
// dy_full[n, h] (gradient at the output, all rows) -> dxn[nl, h] (at the normed input, this rank's rows).
void moe_backward_input(const ExpertParallel& ep, const TensorParallel& tp, const std::vector<TensorSlot>& ts, Buf w,
                        const std::vector<Buf>& experts, const std::vector<TensorSlot>& ets, MoeActs& a, Buf dy_full,
                        Buf dxn, device::DeviceBuffer& scratch);
// Router gradient into dw (the layer unit's buffer). xn_full: all normed rows [n, h].
void moe_router_backward_weight(const ExpertParallel& ep, const std::vector<TensorSlot>& ts, Buf dw, MoeActs& a,
                                Buf xn_full, std::int64_t n, std::int64_t h);
// router_aux = "hf": Σ over this rank's micro-batches of aux_coef · E·Σᵢ (Cᵢ/(L·T))·(Pᵢ/(L·T)), with Cᵢ the
// assignments to expert i and Pᵢ its probabilities' sum over all L layers' router outputs of the micro-batch.
double pooled_aux_loss(const ExpertParallel& ep);
// Local expert j's gradient into de (its unit's buffer): every source's segment in source order.
void moe_expert_backward_weight(const ExpertParallel& ep, int j, Buf de, const std::vector<TensorSlot>& ets,
                                MoeActs& a, std::int64_t h);

}  // namespace meshrun::train
