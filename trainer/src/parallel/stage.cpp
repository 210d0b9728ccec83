#include "meshrun/train/parallel/stage.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace meshrun::train {

std::vector<ChunkUnits> chunk_units(const ParamTable& table, const std::vector<int>& layers_per_chunk) {
  std::vector<ChunkUnits> out;
  int layer = 0;
  const int chunks = static_cast<int>(layers_per_chunk.size());
  for (int c = 0; c < chunks; ++c) {
    ChunkUnits cu;
    cu.chunk = c;
    cu.first = c == 0;
    cu.last = c == chunks - 1;
    if (cu.first) cu.units.push_back(table.embed_unit());
    for (int i = 0; i < layers_per_chunk[c]; ++i) cu.units.push_back(table.layer_unit(layer++));
    if (cu.last) cu.units.push_back(table.head_unit());
    out.push_back(std::move(cu));
  }
  if (layer != table.layers)
    throw std::invalid_argument("chunk_units: the chunks hold " + std::to_string(layer) + " layers, the model has " +
                                std::to_string(table.layers));
  return out;
}

Stage::Stage(ChunkUnits units, const LayerDims& dims, const TensorParallel& tp, ContextParallel& cp,
             const ParamTable& table, ParamStore& store, LayerWorkspace& ws, Buf pos, const ExpertParallel* ep,
             Recompute recompute)
    : units_(std::move(units)), dims_(dims), tp_(tp), cp_(cp), table_(table), store_(store), be_(store.backend()),
      act_(be_.precision().param), stat_(be_.precision().stat), ws_(ws), pos_(pos),
      ep_(ep && table.experts > 0 ? ep : nullptr), keep_(recompute) {
  if (keep_ == Recompute::full && ws_.recompute != Recompute::full)
    throw std::logic_error("pipeline stage: recompute = full with a layer workspace that has no layer to rebuild into");
  if (keep_ == Recompute::full && ep_)
    throw std::logic_error("pipeline stage: recompute = full with experts reached the trainer (validate_trainer's recompute-full-experts refuses it)");
  for (int u : units_.units)
    if (u != table_.embed_unit() && u != table_.head_unit()) ++layer_count_;
  Slot probe;
  carve(probe);
  carve_backward(probe);
  // The largest single unit's backward part (a decoder layer, or the head) for fused backwards.
  Carver one{Buf{nullptr, 0, act_}, Buf{nullptr, 0, stat_}};
  if (layer_count_ > 0) probe.layers[0].carve_backward(one, dims_);
  Carver head{Buf{nullptr, 0, act_}, Buf{nullptr, 0, stat_}};
  if (units_.last) probe.head.carve_backward(head, dims_);
  unit_grads_ = device::DeviceBuffer(be_, std::max(one.used, head.used), act_);
}

void Stage::carve(Slot& s) {
  Carver c{s.flat.buf().p ? s.flat.buf() : Buf{nullptr, 0, act_},
           s.flat_stat.buf().p ? s.flat_stat.buf() : Buf{nullptr, 0, stat_}};
  s.x = c.take(dims_.nl * dims_.h);
  s.dy = c.take(dims_.nl * dims_.h);
  s.layers.resize(static_cast<std::size_t>(layer_count_));
  if (ep_) s.moe.resize(static_cast<std::size_t>(layer_count_));
  for (DecoderActs& a : s.layers) a.carve_forward(c, dims_, keep_);
  if (units_.last) s.head.carve_forward(c, dims_);
  slot_elems_ = c.used;
  slot_stat_elems_ = c.stat_used;
}

void Stage::carve_backward(Slot& s) {
  Carver c{s.grads ? s.grads->flat.buf() : Buf{nullptr, 0, act_}, Buf{nullptr, 0, stat_}};  // no statistics
  for (DecoderActs& a : s.layers) a.carve_backward(c, dims_);
  if (units_.last) s.head.carve_backward(c, dims_);
  grad_elems_ = c.used;
}

std::int64_t Stage::allocated_bytes() const {
  std::int64_t n = unit_grads_.bytes();
  for (const auto& p : slots_) {
    n += p->flat.bytes() + p->flat_stat.bytes() + p->ids.bytes() + p->targets.bytes();
    for (const MoeActs& m : p->moe) n += m.bytes();
  }
  for (const auto& g : grad_buffers_) n += g->flat.bytes();
  return n;
}

Stage::Slot& Stage::slot(int mb) {
  if (auto it = live_.find(mb); it != live_.end()) return *it->second;
  Slot* s = nullptr;
  for (auto& p : slots_)
    if (p->free && p->reusable_from <= now_) {
      s = p.get();
      break;
    }
  if (!s) {
    slots_.push_back(std::make_unique<Slot>());
    s = slots_.back().get();
    s->flat = device::DeviceBuffer(be_, slot_elems_, act_);
    s->flat_stat = device::DeviceBuffer(be_, slot_stat_elems_, stat_);
    be_.zero(s->flat);
    be_.zero(s->flat_stat);
    if (units_.first || units_.last) {
      s->ids = device::DeviceBuffer(be_, dims_.n, DType::i32);
      s->targets = device::DeviceBuffer(be_, dims_.n, DType::i32);
      be_.zero(s->ids);
      be_.zero(s->targets);
    }
    carve(*s);
  }
  for (Request& r : s->sends) r.wait();
  s->sends.clear();
  s->free = s->weights_done = s->gradient_sent = false;
  for (MoeActs& m : s->moe) m.microbatch = mb;
  live_[mb] = s;
  return *s;
}

Stage::Slot& Stage::live(int mb, const char* what) {
  auto it = live_.find(mb);
  if (it == live_.end())
    throw std::logic_error(std::string("pipeline stage of chunk ") + std::to_string(units_.chunk) + ": " + what +
                           " of micro-batch " + std::to_string(mb) + " before its forward");
  return *it->second;
}

Buf Stage::activation(int mb) { return slot(mb).x; }
Buf Stage::gradient(int mb) { return slot(mb).dy; }
Buf Stage::ids(int mb) { return slot(mb).ids.at(0, dims_.n); }
Buf Stage::targets(int mb) { return slot(mb).targets.at(0, dims_.n); }

void Stage::hold(int mb, Request send, bool gradient, int known_done) {
  Slot& s = live(mb, "a send");
  s.sends.push_back(std::move(send));
  s.reusable_from = std::max(s.reusable_from, known_done);
  if (gradient) {
    s.gradient_sent = true;
    release_if_done(mb, s);
  }
}

void Stage::take_input(int mb, Stage& previous) {
  be_.copy(slot(mb).x, previous.live(mb, "handing over the output").x);
}

void Stage::take_output_gradient(int mb, Stage& next) {
  Slot& from = next.live(mb, "handing over the input gradient");
  be_.copy(live(mb, "taking the output gradient").dy, from.dy);
  from.gradient_sent = true;
  next.release_if_done(mb, from);
}

void Stage::release_if_done(int mb, Slot& s) {
  if (!s.weights_done || (!units_.first && !s.gradient_sent)) return;
  s.free = true;
  live_.erase(mb);
}

void Stage::finish() {
  for (auto& p : slots_) {
    for (Request& r : p->sends) r.wait();
    p->sends.clear();
    p->reusable_from = 0;
  }
  now_ = 0;
}

MoeLayer* Stage::moe_layer(Slot& s, int u, int layer, bool acquire) {
  if (!ep_) return nullptr;
  const int model_layer = u - table_.layer_unit(0);
  moe_args_.ep = ep_;
  moe_args_.layer = model_layer;
  moe_args_.acts = &s.moe[layer];
  moe_args_.ets = &table_.units[table_.expert_unit(model_layer, ep_->first_local())].tensors;
  moe_args_.experts.assign(static_cast<std::size_t>(ep_->local), Buf{});
  if (acquire)
    for (int j = 0; j < ep_->local; ++j)
      moe_args_.experts[j] = store_.acquire(table_.expert_unit(model_layer, ep_->first_local() + j));
  return &moe_args_;
}

void Stage::release_experts(int u) {
  if (!ep_) return;
  const int model_layer = u - table_.layer_unit(0);
  for (int j = 0; j < ep_->local; ++j) store_.release(table_.expert_unit(model_layer, ep_->first_local() + j));
}

double Stage::forward(int mb) {
  Slot& s = slot(mb);
  double loss = 0;
  int l = 0;
  for (std::size_t i = 0; i < units_.units.size(); ++i) {
    const int u = units_.units[i];
    const auto& ts = table_.units[u].tensors;
    const Buf w = store_.acquire(u);
    if (i + 1 < units_.units.size()) store_.prefetch(units_.units[i + 1]);  // ZeRO-3: arrives meanwhile
    if (u == table_.embed_unit()) {
      embedding_forward(dims_, tp_, ts, w, s.ids.at(0, dims_.n), s.x, ws_);
    } else if (u == table_.head_unit()) {
      loss = head_forward(dims_, tp_, ts, w, s.head, s.x, s.targets.at(0, dims_.n), ws_);
    } else {
      MoeLayer* moe = moe_layer(s, u, l, true);
      decoder_forward(dims_, tp_, cp_, ts, w, s.layers[l++], s.x, pos_, ws_, moe);
      release_experts(u);
    }
    store_.release(u);
  }
  return loss;
}

void Stage::unit_backward_input(Slot& s, int u, int layer, double loss_scale, Buf head_dw) {
  if (u == table_.embed_unit()) return;  // no input gradient; its W reads s.dy
  const auto& ts = table_.units[u].tensors;
  const Buf w = store_.acquire(u);
  // ZeRO-3: the unit before this one has the next input backward (not the embedding: it has none).
  const auto it = std::find(units_.units.begin(), units_.units.end(), u);
  if (it != units_.units.begin() && *(it - 1) != table_.embed_unit()) store_.prefetch(*(it - 1));
  if (u == table_.head_unit()) {
    head_backward_input(dims_, tp_, ts, w, s.head, s.targets.at(0, dims_.n), loss_scale, s.dy, ws_, head_dw);
  } else {
    MoeLayer* moe = moe_layer(s, u, layer, true);
    DecoderActs* a = &s.layers[layer];
    DecoderActs rebuilt;
    if (keep_ == Recompute::full) {  // the layer's forward again, from its input
      rebuilt = decoder_recompute(dims_, tp_, cp_, ts, w, *a, pos_, ws_, moe);
      a = &rebuilt;
    }
    decoder_backward_input(dims_, tp_, cp_, ts, w, *a, s.dy, pos_, ws_, moe);
    release_experts(u);
  }
  store_.release(u);
}

void Stage::unit_backward_weight(Slot& s, int u, int layer, Buf head_dw) {
  const auto& ts = table_.units[u].tensors;
  if (u == table_.head_unit()) {
    // A W after B (zero-bubble) recomputes the logits gradient: the head's weights again. The fused BW's B
    // did that part into head_dw, begun before it.
    const bool recompute = !s.head.weight_done;
    const Buf w = recompute ? store_.acquire(u) : Buf{};
    const Buf dw = head_dw.p ? head_dw : store_.grad_begin(u);
    head_backward_weight(dims_, tp_, ts, w, dw, s.head, s.targets.at(0, dims_.n), ws_);
    if (recompute) store_.release(u);
    store_.grad_end(u);
    return;
  }
  // What the forward did not keep is recomputed from the layer's weights: the norm outputs and the MLP
  // activation (selective), or the whole forward unless this W follows its B (full).
  const bool rebuild = keep_ != Recompute::none && u != table_.embed_unit();
  const Buf w = rebuild ? store_.acquire(u) : Buf{};
  const Buf dw = store_.grad_begin(u);
  if (u == table_.embed_unit()) {
    embedding_backward_weight(dims_, tp_, ts, dw, s.ids.at(0, dims_.n), s.dy, ws_);
  } else if (keep_ == Recompute::full) {
    DecoderActs rebuilt = decoder_recompute(dims_, tp_, cp_, ts, w, s.layers[layer], pos_, ws_, nullptr);
    decoder_backward_weight(dims_, tp_, ts, dw, rebuilt, ws_, nullptr);
  } else {
    decoder_backward_weight(dims_, tp_, ts, dw, s.layers[layer], ws_, moe_layer(s, u, layer, false), w);
  }
  if (rebuild) store_.release(u);
  store_.grad_end(u);
  if (ep_ && layer >= 0) {  // the layer's local experts, each its own unit (replica group edp)
    const int model_layer = u - table_.layer_unit(0);
    for (int j = 0; j < ep_->local; ++j) {
      const int eu = table_.expert_unit(model_layer, ep_->first_local() + j);
      const Buf de = store_.grad_begin(eu);
      moe_expert_backward_weight(*ep_, j, de, table_.units[eu].tensors, s.moe[layer], dims_.h);
      store_.grad_end(eu);
    }
  }
}

// Layer index (into the slot's decoder activations) of each unit, in reverse unit order.
template <class F>
void Stage::for_units_reversed(F&& f) {
  int l = layer_count_;
  for (auto it = units_.units.rbegin(); it != units_.units.rend(); ++it) {
    const int u = *it;
    const bool decoder = u != table_.embed_unit() && u != table_.head_unit();
    f(u, decoder ? --l : -1);
  }
}

void Stage::backward_input(int mb, double loss_scale) {
  Slot& s = live(mb, "B");
  if (!s.grads) {
    for (auto& g : grad_buffers_)
      if (g->free) {
        s.grads = g.get();
        break;
      }
    if (!s.grads) {
      grad_buffers_.push_back(std::make_unique<GradBuffer>());
      s.grads = grad_buffers_.back().get();
      s.grads->flat = device::DeviceBuffer(be_, grad_elems_, act_);
      be_.zero(s.grads->flat);
    }
    s.grads->free = false;
    carve_backward(s);
  }
  for_units_reversed([&](int u, int layer) { unit_backward_input(s, u, layer, loss_scale); });
}

void Stage::backward_weight(int mb) {
  Slot& s = live(mb, "W");
  if (!s.grads && grad_elems_ > 0) throw std::logic_error("pipeline stage: W of micro-batch " + std::to_string(mb) + " before its B");
  for_units_reversed([&](int u, int layer) { unit_backward_weight(s, u, layer); });
  if (s.grads) s.grads->free = true;
  s.grads = nullptr;
  s.weights_done = true;
  release_if_done(mb, s);
}

void Stage::backward_fused(int mb, double loss_scale) {
  Slot& s = live(mb, "BW");
  // W follows B unit by unit, so one unit's backward buffer is enough (the same operations as B then W).
  for_units_reversed([&](int u, int layer) {
    Carver c{unit_grads_.buf(), Buf{nullptr, 0, stat_}};
    if (layer >= 0) s.layers[layer].carve_backward(c, dims_);
    if (u == table_.head_unit()) {
      s.head.carve_backward(c, dims_);
      const Buf dw = store_.grad_begin(u);   // the lm_head gradient accumulates chunk by chunk in B
      unit_backward_input(s, u, layer, loss_scale, dw);
      unit_backward_weight(s, u, layer, dw);
      return;
    }
    unit_backward_input(s, u, layer, loss_scale);
    unit_backward_weight(s, u, layer);
  });
  s.weights_done = true;
  release_if_done(mb, s);
}

void Stage::discard(int mb) {
  Slot& s = live(mb, "freeing the slot");
  if (s.grads) s.grads->free = true;
  s.grads = nullptr;
  s.weights_done = s.gradient_sent = true;
  release_if_done(mb, s);
}

}  // namespace meshrun::train
