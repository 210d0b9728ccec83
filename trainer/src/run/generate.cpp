#include "meshrun/train/run/generate.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <stdexcept>

#include "meshrun/train/comm_names.hpp"
#include "meshrun/train/model/layers.hpp"
#include "meshrun/train/model/params.hpp"
#include "meshrun/train/parallel/moe.hpp"

namespace meshrun::train {

std::string check_sample_options(const SampleOptions& o, std::size_t prompt_tokens) {
  if (prompt_tokens == 0) return "the prompt is empty; give --prompt TEXT with at least one character";
  if (o.max_new_tokens < 1) return "--max-new-tokens must be at least 1";
  if (!std::isfinite(o.temperature) || o.temperature < 0)
    return "--temperature must be a finite number >= 0 (0: greedy)";
  if (!std::isfinite(o.top_p) || o.top_p <= 0 || o.top_p > 1) return "--top-p must be in (0, 1] (1: no nucleus cut)";
  if (static_cast<std::int64_t>(prompt_tokens) + o.max_new_tokens > kMaxSampleContext)
    return "the prompt (" + std::to_string(prompt_tokens) + " tokens) and --max-new-tokens " + std::to_string(o.max_new_tokens) +
           " exceed " + std::to_string(kMaxSampleContext) + " tokens; shorten them";
  return "";
}

std::int32_t pick_token(const std::vector<float>& logits, const SampleOptions& o, std::uint64_t draw) {
  const std::size_t v = logits.size();
  if (o.temperature == 0) return static_cast<std::int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  const double top = *std::max_element(logits.begin(), logits.end());
  std::vector<double> p(v);
  for (std::size_t i = 0; i < v; ++i) p[i] = std::exp((static_cast<double>(logits[i]) - top) / o.temperature);
  const double z = std::accumulate(p.begin(), p.end(), 0.0);
  std::vector<std::int32_t> order(v);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](std::int32_t a, std::int32_t b) { return p[a] > p[b]; });
  std::size_t keep = 0;
  double mass = 0;
  while (keep < v && (keep == 0 || mass < o.top_p * z)) mass += p[order[keep++]];
  // The uniform number of (seed, draw): counter-based, as initialization's (params.cpp).
  const double u = static_cast<double>(mix64(o.seed ^ mix64(draw)) >> 11) * 0x1.0p-53 * mass;
  double acc = 0;
  for (std::size_t k = 0; k < keep; ++k) {
    acc += p[order[k]];
    if (u < acc) return order[k];
  }
  return order[keep - 1];
}

struct Generator::Impl {
  ModelSpec model;
  std::int64_t context = 0, length = 0;
  std::unique_ptr<device::Backend> be;
  ParamTable table;
  Groups groups = make_local_groups();
  std::vector<device::DeviceBuffer> units;            // every unit's parameters, tp = 1
  std::vector<device::DeviceBuffer> k_cache, v_cache; // per layer [context, kv_heads·head_dim]
  device::DeviceBuffer cache_pos;                     // 0, 1, ..., context - 1
  LayerWorkspace ws;
  ExpertParallel ep;
  MoeStats moe_stats;
  std::vector<MoeActs> moe_acts;                      // per layer

  LayerDims dims(std::int64_t n) const {
    BatchGeometry g;
    g.global_batch = g.micro_batch_size = 1;
    g.seq_len = g.tokens_per_cp_rank = g.rows_per_microbatch = g.rows_per_sp_rank = n;
    return LayerDims::make(model, g, 1, 0);
  }
};

Generator::Generator(const ModelSpec& m, std::int64_t context, const TensorSource& weights,
                     std::unique_ptr<device::Backend> backend)
    : s_(std::make_unique<Impl>()) {
  Impl& s = *s_;
  if (context < 1 || context > kMaxSampleContext)
    throw std::invalid_argument("the sampling context must hold 1 to " + std::to_string(kMaxSampleContext) + " tokens");
  s.model = m;
  s.context = context;
  s.be = std::move(backend);
  device::Backend& be = *s.be;
  s.table = build_param_table(m, 1, 0);
  const DType param = be.precision().param;
  for (const Unit& u : s.table.units) {
    std::vector<float> host(static_cast<std::size_t>(u.size));
    for (const TensorSlot& t : u.tensors) {
      const std::vector<float> v = weights(t.name, t.shape());
      std::copy(v.begin(), v.end(), host.begin() + t.offset);  // tp = 1: the slot is the whole tensor
    }
    s.units.emplace_back(be, u.size, param);
    be.upload(s.units.back(), host.data());
  }
  const std::int64_t kvd = static_cast<std::int64_t>(m.kv_heads) * m.head_dim();
  for (int l = 0; l < m.layers; ++l) {
    s.k_cache.emplace_back(be, context * kvd, param);
    s.v_cache.emplace_back(be, context * kvd, param);
  }
  std::vector<std::int32_t> pos(static_cast<std::size_t>(context));
  std::iota(pos.begin(), pos.end(), 0);
  s.cache_pos = device::DeviceBuffer(be, context, DType::i32);
  be.upload(s.cache_pos, pos.data());
  s.ws.resize(be, s.dims(context), false);
  if (m.experts > 0) {
    s.ep.be = &be;
    s.ep.ep = &s.groups[GroupKind::ep];
    s.ep.cp = &s.groups[GroupKind::cp];
    s.ep.experts = m.experts;
    s.ep.top_k = m.top_k;
    s.ep.local = m.experts;
    s.ep.ffn = m.expert_ffn();
    s.ep.aux_coef = 0;  // no training: the load-balancing loss is not wanted
    s.ep.stats = &s.moe_stats;
    s.moe_stats.reset(m.layers, m.experts);
    s.moe_acts.resize(static_cast<std::size_t>(m.layers));
  }
}

Generator::~Generator() = default;

const device::Backend& Generator::backend() const { return *s_->be; }
std::int64_t Generator::length() const { return s_->length; }
void Generator::reset() { s_->length = 0; }

std::vector<float> Generator::append(const std::vector<std::int32_t>& tokens) {
  Impl& s = *s_;
  device::Backend& be = *s.be;
  const std::int64_t n = static_cast<std::int64_t>(tokens.size());
  if (n < 1 || s.length + n > s.context)
    throw std::invalid_argument("the KV cache holds " + std::to_string(s.context) + " tokens; " + std::to_string(s.length + n) +
                                " do not fit");
  for (std::int32_t t : tokens)
    if (t < 0 || t >= s.model.vocab)
      throw std::invalid_argument("token id " + std::to_string(t) + " is outside the vocabulary [0, " +
                                  std::to_string(s.model.vocab) + ")");
  const LayerDims d = s.dims(n);
  const TensorParallel tp{&s.groups[GroupKind::tp], false, n, n, d.h, &be};
  // This call's activations: the residual stream, every layer's forward part and the head's.
  std::vector<DecoderActs> acts(static_cast<std::size_t>(s.model.layers));
  HeadActs head;
  const DType act = be.precision().param, stat = be.precision().stat;
  auto carve = [&](Carver& c) {
    const Buf x = c.take(n * d.h);
    for (DecoderActs& a : acts) a.carve_forward(c, d);
    head.carve_forward(c, d);
    return x;
  };
  Carver count{Buf{nullptr, 0, act}, Buf{nullptr, 0, stat}};
  carve(count);
  device::DeviceBuffer flat(be, count.used, act), flat_stat(be, count.stat_used, stat);
  Carver c{flat.buf(), flat_stat.buf()};
  const Buf x = carve(c);
  std::vector<std::int32_t> pos(static_cast<std::size_t>(n));
  std::iota(pos.begin(), pos.end(), static_cast<std::int32_t>(s.length));
  device::DeviceBuffer ids(be, n, DType::i32), pos_buf(be, n, DType::i32);
  be.upload(ids, tokens.data());
  be.upload(pos_buf, pos.data());

  const ParamTable& t = s.table;
  embedding_forward(d, tp, t.units[t.embed_unit()].tensors, s.units[t.embed_unit()], ids, x, s.ws);
  s.ep.tokens = n;
  for (int l = 0; l < s.model.layers; ++l) {
    MoeLayer moe;
    if (s.model.experts > 0) {
      moe.ep = &s.ep;
      moe.layer = l;
      moe.acts = &s.moe_acts[static_cast<std::size_t>(l)];
      moe.ets = &t.units[t.expert_unit(l, 0)].tensors;
      for (int j = 0; j < s.model.experts; ++j) moe.experts.push_back(s.units[t.expert_unit(l, j)]);
    }
    decoder_forward_cached(d, tp, t.units[t.layer_unit(l)].tensors, s.units[t.layer_unit(l)], acts[static_cast<std::size_t>(l)], x,
                           pos_buf, s.ws, s.model.experts > 0 ? &moe : nullptr, s.k_cache[static_cast<std::size_t>(l)],
                           s.v_cache[static_cast<std::size_t>(l)], s.cache_pos, s.length);
  }
  device::DeviceBuffer logits_buf(be, n * d.vl, be.precision().stat);
  head_logits(d, tp, t.units[t.head_unit()].tensors, s.units[t.head_unit()], head, x, logits_buf, s.ws);
  std::vector<float> logits(static_cast<std::size_t>(n * d.vl));
  be.download(logits.data(), logits_buf);
  s.length += n;
  return logits;
}

std::vector<std::int32_t> Generator::generate(const std::vector<std::int32_t>& prompt, const SampleOptions& o,
                                              const std::function<void(std::int32_t)>& on_token) {
  if (const std::string why = check_sample_options(o, prompt.size()); !why.empty()) throw std::invalid_argument(why);
  reset();
  const std::size_t v = static_cast<std::size_t>(s_->model.vocab);
  std::vector<float> all = append(prompt), last(v);
  std::copy(all.end() - static_cast<std::ptrdiff_t>(v), all.end(), last.begin());
  std::vector<std::int32_t> out;
  for (int i = 0; i < o.max_new_tokens; ++i) {
    const std::int32_t next = pick_token(last, o, static_cast<std::uint64_t>(i));
    out.push_back(next);
    if (on_token) on_token(next);
    if (i + 1 < o.max_new_tokens) last = append({next});
  }
  return out;
}

}  // namespace meshrun::train
