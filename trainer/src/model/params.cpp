#include "meshrun/train/model/params.hpp"

#include <cmath>
#include <stdexcept>

namespace meshrun::train {

std::vector<std::int64_t> TensorSlot::shape() const {
  if (is_vector) return {rows};
  return {rows, cols};
}

std::int64_t TensorSlot::global_index(std::int64_t i) const {
  const std::int64_t r = i / local_cols, c = i % local_cols;
  return (row0 + r) * cols + (col0 + c);
}

std::int64_t ParamTable::local_size() const {
  std::int64_t n = 0;
  for (const Unit& u : units) n += u.size;
  return n;
}
std::int64_t ParamTable::global_size() const {
  std::int64_t n = 0;
  for (const Unit& u : units)
    for (const TensorSlot& t : u.tensors) n += t.rows * t.cols;
  return n;
}

namespace {
void add(Unit& u, std::string name, std::int64_t rows, std::int64_t cols, bool vec, Split split, int tp,
         int tp_rank) {
  TensorSlot t;
  t.name = std::move(name);
  t.rows = rows;
  t.cols = cols;
  t.is_vector = vec;
  t.split = split;
  t.local_rows = split == Split::rows ? rows / tp : rows;
  t.local_cols = split == Split::cols ? cols / tp : cols;
  t.row0 = split == Split::rows ? t.local_rows * tp_rank : 0;
  t.col0 = split == Split::cols ? t.local_cols * tp_rank : 0;
  t.offset = u.size;
  u.size += t.numel();
  u.tensors.push_back(std::move(t));
}
void require(bool ok, const std::string& msg) {
  if (!ok) throw std::invalid_argument(msg);
}
}  // namespace

ParamTable build_param_table(const ModelSpec& m, int tp, int tp_rank) {
  require(m.hidden > 0 && m.heads > 0 && m.kv_heads > 0 && m.layers > 0 && m.ffn_hidden > 0 && m.vocab > 0,
          "model sizes must be positive; check [model] layers, hidden, heads, kv_heads, ffn_hidden, vocab");
  require(m.hidden % m.heads == 0, "model.hidden must be a multiple of model.heads");
  require(m.head_dim() % 2 == 0, "the head dimension (hidden/heads) must be even for rotary embeddings");
  require(m.heads % m.kv_heads == 0, "model.heads must be a multiple of model.kv_heads (grouped-query attention)");
  require(m.kv_heads % tp == 0, "model.kv_heads (" + std::to_string(m.kv_heads) + ") must be a multiple of parallel.tp (" +
                                    std::to_string(tp) + "); lower parallel.tp");
  require(m.ffn_hidden % tp == 0, "model.ffn_hidden must be a multiple of parallel.tp; lower parallel.tp");
  require(m.vocab % tp == 0, "model.vocab (" + std::to_string(m.vocab) + ") must be a multiple of parallel.tp (" +
                                 std::to_string(tp) + ") for the vocab-parallel embedding; pad the vocabulary");
  const bool moe = m.experts > 0;
  const std::int64_t fe = m.moe_ffn_hidden > 0 ? m.moe_ffn_hidden : m.ffn_hidden;
  require(!moe || m.top_k <= m.experts, "model.top_k must be between 1 and model.experts; lower model.top_k");
  require(!moe || fe % tp == 0, "the expert width (model.moe_ffn_hidden, or ffn_hidden when 0) must be a multiple of parallel.tp; lower parallel.tp");
  const std::int64_t h = m.hidden, d = m.head_dim(), f = m.ffn_hidden;
  ParamTable t;
  t.layers = m.layers;
  t.experts = m.experts;
  t.top_k = m.top_k;
  Unit emb{"embed", {}, 0};
  add(emb, "model.embed_tokens.weight", m.vocab, h, false, Split::rows, tp, tp_rank);
  t.units.push_back(std::move(emb));
  for (int l = 0; l < m.layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    Unit u{"layer" + std::to_string(l), {}, 0};
    add(u, p + "input_layernorm.weight", h, 1, true, Split::replicated, tp, tp_rank);
    add(u, p + "self_attn.q_proj.weight", m.heads * d, h, false, Split::rows, tp, tp_rank);
    add(u, p + "self_attn.k_proj.weight", m.kv_heads * d, h, false, Split::rows, tp, tp_rank);
    add(u, p + "self_attn.v_proj.weight", m.kv_heads * d, h, false, Split::rows, tp, tp_rank);
    add(u, p + "self_attn.o_proj.weight", h, m.heads * d, false, Split::cols, tp, tp_rank);
    add(u, p + "post_attention_layernorm.weight", h, 1, true, Split::replicated, tp, tp_rank);
    if (moe) {
      // The router is replicated over TP: every TP rank routes the same (gathered) rows identically.
      add(u, p + "block_sparse_moe.gate.weight", m.experts, h, false, Split::replicated, tp, tp_rank);
    } else {
      add(u, p + "mlp.gate_proj.weight", f, h, false, Split::rows, tp, tp_rank);
      add(u, p + "mlp.up_proj.weight", f, h, false, Split::rows, tp, tp_rank);
      add(u, p + "mlp.down_proj.weight", h, f, false, Split::cols, tp, tp_rank);
    }
    t.units.push_back(std::move(u));
  }
  Unit head{"head", {}, 0};
  add(head, "model.norm.weight", h, 1, true, Split::replicated, tp, tp_rank);
  add(head, "lm_head.weight", m.vocab, h, false, Split::rows, tp, tp_rank);
  t.units.push_back(std::move(head));
  // Experts: one unit per (layer, expert), after the head, so the table is the same on every EP rank
  // (a rank holds only its local experts' units). ETP = TP: w1/w3 split by rows, w2 by columns.
  for (int l = 0; l < m.layers && moe; ++l)
    for (int j = 0; j < m.experts; ++j) {
      const std::string p = "model.layers." + std::to_string(l) + ".block_sparse_moe.experts." + std::to_string(j) + ".";
      Unit u{"layer" + std::to_string(l) + ".expert" + std::to_string(j), {}, 0};
      add(u, p + "w1.weight", fe, h, false, Split::rows, tp, tp_rank);
      add(u, p + "w3.weight", fe, h, false, Split::rows, tp, tp_rank);
      add(u, p + "w2.weight", h, fe, false, Split::cols, tp, tp_rank);
      t.units.push_back(std::move(u));
    }
  return t;
}

std::uint64_t mix64(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

std::uint64_t hash_name(const std::string& s) {
  std::uint64_t h = 0xcbf29ce484222325ULL;  // FNV-1a
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ULL;
  return h;
}

namespace {
bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}
}  // namespace

TensorInit tensor_init(std::uint64_t seed, const std::string& name, int layers) {
  TensorInit t;
  t.ones = ends_with(name, "norm.weight");
  t.stddev = 0.02;
  if (ends_with(name, "o_proj.weight") || ends_with(name, "down_proj.weight") || ends_with(name, ".w2.weight"))
    t.stddev /= std::sqrt(2.0 * layers);
  t.key = mix64(seed ^ hash_name(name));
  return t;
}

double init_value(const TensorInit& t, std::int64_t index) {
  if (t.ones) return 1.0;
  // Two uniforms from a counter-based hash of (seed, name, index), then Box-Muller.
  const std::uint64_t a = mix64(t.key ^ mix64(static_cast<std::uint64_t>(index)));
  const std::uint64_t b = mix64(a);
  const double u1 = (static_cast<double>(a >> 11) + 1.0) * 0x1.0p-53;  // (0, 1]
  const double u2 = static_cast<double>(b >> 11) * 0x1.0p-53;          // [0, 1)
  return t.stddev * std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
}

double init_value(std::uint64_t seed, const std::string& name, std::int64_t index, int layers) {
  return init_value(tensor_init(seed, name, layers), index);
}

template <class T>
void init_unit(T* buf, const Unit& unit, std::uint64_t seed, int layers) {
  for (const TensorSlot& t : unit.tensors) {
    const TensorInit ti = tensor_init(seed, t.name, layers);  // the name's work once per tensor
    T* out = buf + t.offset;
    for (std::int64_t r = 0; r < t.local_rows; ++r) {
      const std::int64_t g0 = (t.row0 + r) * t.cols + t.col0;  // global index of the row's first element
      for (std::int64_t c = 0; c < t.local_cols; ++c) *out++ = static_cast<T>(init_value(ti, g0 + c));
    }
  }
}
template void init_unit<float>(float*, const Unit&, std::uint64_t, int);
template void init_unit<double>(double*, const Unit&, std::uint64_t, int);

}  // namespace meshrun::train
