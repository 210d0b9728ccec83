// A pipeline stage: one chunk of the model (a contiguous range of units: the embedding on chunk 0, then
// its decoder layers, the head on the last chunk) and one activation slot per micro-batch in flight.
// The runtime (pipeline.hpp) calls forward, backward_input (B) and backward_weight (W) per micro-batch in
// the order of the schedule table; a slot is taken at a micro-batch's first use on this chunk and given
// back once its W is done and its input gradient has been handed to a send (chunks after the first);
// a freed slot's sends complete before it is used again, and all of them at finish().
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "meshrun/train/comm_names.hpp"
#include "meshrun/train/model/layers.hpp"
#include "meshrun/train/model/params.hpp"
#include "meshrun/train/parallel/zero.hpp"

namespace meshrun::train {

// The units of each of the pp·V chunks, from mesh's chunk_layers (layers per chunk).
struct ChunkUnits {
  int chunk = 0;
  std::vector<int> units;  // unit indices of the parameter table, in forward order
  bool first = false, last = false;
};
std::vector<ChunkUnits> chunk_units(const ParamTable& table, const std::vector<int>& layers_per_chunk);

class Stage {
 public:
  // pos: global positions of the micro-batch's rows [n] (sequences back to back).
  // pos: [n] int32 backend buffer. Activations are allocated on the store's backend.
  Stage(ChunkUnits units, const LayerDims& dims, const TensorParallel& tp, ContextParallel& cp,
        const ParamTable& table, ParamStore& store, LayerWorkspace& ws, Buf pos,
        const ExpertParallel* ep = nullptr,  // ep: mixture-of-experts layers (nullptr: dense)
        Recompute recompute = Recompute::none);  // what the decoder layers keep (full: ws was resized for it)

  const ChunkUnits& units() const { return units_; }
  // Buffers of micro-batch mb's slot (taken on first use):
  Buf activation(int mb);          // [nl, h]: the chunk's input (received), the output after forward (sent)
  Buf gradient(int mb);            // [nl, h]: at the output before B (received), at the input after B (sent)
  Buf ids(int mb);                 // [n] int32, read by chunk 0
  Buf targets(int mb);             // [n] int32, read by the last chunk
  std::int64_t rows_times_hidden() const { return dims_.nl * dims_.h; }

  double forward(int mb);          // Σ cross-entropy of the micro-batch on the last chunk, else 0
  void backward_input(int mb, double loss_scale);
  void backward_weight(int mb);    // gradients into the store; frees the slot
  void backward_fused(int mb, double loss_scale);  // BW: B and W unit by unit, same numbers as B then W
  // A send from this slot (of its input gradient when `gradient`), completed before the slot is reused.
  // known_done: the index in the rank's action list from which the transfer is known to be done
  // (sends_known_received); a freed slot is reused only from the last such index of its sends on, so
  // reusing it never waits on a peer, and a new slot is taken before that.
  void hold(int mb, Request send, bool gradient, int known_done);
  void at_action(int index) { now_ = index; }  // the runtime's position in the list, for the rule above
  // Hand-overs between consecutive chunks of one rank (the turn of a V), in place of a send and a receive:
  // this chunk's input is the previous chunk's output, or this chunk's output gradient is the next chunk's
  // input gradient (which then counts as sent).
  void take_input(int mb, Stage& previous);
  void take_output_gradient(int mb, Stage& next);
  void discard(int mb);            // forward only (evaluation): free the slot without a backward
  void finish();                   // completes every pending send (end of a step)

  int live_slots() const { return static_cast<int>(live_.size()); }
  int peak_slots() const { return static_cast<int>(slots_.size()); }
  // Bytes of every buffer allocated so far: activation slots (F until W) and backward buffers (B until W:
  // one when every W follows its B, more when a schedule defers W).
  std::int64_t allocated_bytes() const;

 private:
  struct GradBuffer {
    device::DeviceBuffer flat;
    bool free = true;
  };
  struct Slot {
    device::DeviceBuffer flat, flat_stat;  // activations; per-row statistics (Carver)
    GradBuffer* grads = nullptr;  // taken at B, given back at W
    device::DeviceBuffer ids, targets;
    Buf x, dy;
    std::vector<DecoderActs> layers;
    std::vector<MoeActs> moe;  // per decoder layer of a mixture-of-experts model
    HeadActs head{};
    std::vector<Request> sends;
    int reusable_from = 0;  // action index from which every send in `sends` is known to be done
    bool free = true, weights_done = false, gradient_sent = false;
  };
  Slot& slot(int mb);
  Slot& live(int mb, const char* what);
  void release_if_done(int mb, Slot& s);
  void carve(Slot& s);
  void carve_backward(Slot& s);
  // head_dw: the head's gradient buffer when B and W run back to back (fused BW), else empty.
  void unit_backward_input(Slot& s, int unit, int layer, double loss_scale, Buf head_dw = {});
  void unit_backward_weight(Slot& s, int unit, int layer, Buf head_dw = {});
  template <class F> void for_units_reversed(F&& f);
  // The MoE arguments of decoder unit u (its local experts acquired when `acquire`), or nullptr if dense.
  MoeLayer* moe_layer(Slot& s, int u, int layer, bool acquire);
  void release_experts(int u);

  ChunkUnits units_;
  LayerDims dims_;
  TensorParallel tp_;
  ContextParallel& cp_;
  const ParamTable& table_;
  ParamStore& store_;
  device::Backend& be_;
  DType act_, stat_;  // activations' and row statistics' types (Precision::param, ::stat)
  LayerWorkspace& ws_;
  Buf pos_;
  const ExpertParallel* ep_ = nullptr;
  Recompute keep_ = Recompute::none;
  MoeLayer moe_args_;
  int layer_count_ = 0;
  std::int64_t slot_elems_ = 0, slot_stat_elems_ = 0, grad_elems_ = 0;
  std::vector<std::unique_ptr<Slot>> slots_;
  std::vector<std::unique_ptr<GradBuffer>> grad_buffers_;
  device::DeviceBuffer unit_grads_;  // one unit's backward part, for fused backwards
  std::map<int, Slot*> live_;
  int now_ = 0;
};

}  // namespace meshrun::train
