// The parameter table: every tensor of the Llama model with its Hugging Face name, global shape, this
// rank's tensor-parallel block and its offset in a flat per-unit buffer (llm.c style).
//
// A "unit" is what ZeRO-3 gathers at once: the embedding, each decoder layer, the head (final norm +
// lm_head), and for mixture-of-experts models each (layer, expert) after those. Units keep their tensors back to back; the data-parallel shards cut across tensors.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "meshrun/job.hpp"

namespace meshrun::train {

// How tensor parallelism splits a [rows, cols] weight: rows = output features / vocabulary
// (column-parallel linear, vocab-parallel embedding and head), cols = input features (row-parallel).
enum class Split { replicated, rows, cols };

struct TensorSlot {
  std::string name;             // "model.layers.0.self_attn.q_proj.weight"
  std::int64_t rows = 0, cols = 1;  // global shape; a vector has cols = 1 and is_vector
  bool is_vector = false;
  Split split = Split::replicated;
  std::int64_t row0 = 0, col0 = 0;  // this rank's block
  std::int64_t local_rows = 0, local_cols = 0;
  std::int64_t offset = 0;      // in the unit's flat buffer
  std::int64_t numel() const { return local_rows * local_cols; }
  std::vector<std::int64_t> shape() const;  // global, as safetensors writes it
  // Global row-major element index of local element i.
  std::int64_t global_index(std::int64_t i) const;
};

struct Unit {
  std::string name;  // "embed", "layer3", "head"
  std::vector<TensorSlot> tensors;
  std::int64_t size = 0;  // elements (unpadded)
};

// Tensor order inside a decoder-layer unit (the model indexes by these).
enum LayerTensor { kLn1, kQ, kK, kV, kO, kLn2, kGate, kUp, kDown, kLayerTensors };
// A mixture-of-experts layer unit has the router in place of the MLP; each expert is a unit of its own.
inline constexpr int kRouter = kGate;
enum ExpertTensor { kW1, kW3, kW2 };  // gate, up, down (Mixtral's w1, w3, w2)

struct ParamTable {
  std::vector<Unit> units;  // embed, layer0..layerL-1, head
  int layers = 0;
  int embed_unit() const { return 0; }
  int layer_unit(int l) const { return 1 + l; }
  int head_unit() const { return layers + 1; }
  // Mixture of experts: experts per layer (0 = dense), experts per token; expert j of layer l is a unit.
  int experts = 0, top_k = 0;
  int expert_unit(int l, int j) const { return layers + 2 + l * experts + j; }
  bool is_expert_unit(int u) const { return experts > 0 && u >= layers + 2; }
  int expert_layer(int u) const { return (u - layers - 2) / experts; }
  std::int64_t local_size() const;
  std::int64_t global_size() const;  // parameters of the whole model
};

// Throws std::invalid_argument with one line if the model cannot be split tp ways.
ParamTable build_param_table(const ModelSpec& model, int tp, int tp_rank);

// Layout-independent initialization: the value of global element `index` of tensor `name` depends only
// on (seed, name, index). Norm weights are 1; other weights N(0, 0.02²), output projections (o_proj,
// down_proj) N(0, (0.02/√(2L))²) as in GPT-2.
double init_value(std::uint64_t seed, const std::string& name, std::int64_t index, int layers);
// The same in two parts, so that a loop over a tensor's elements looks at the name once.
struct TensorInit {
  bool ones = false;
  double stddev = 0;
  std::uint64_t key = 0;  // mix64(seed ^ hash_name(name))
};
TensorInit tensor_init(std::uint64_t seed, const std::string& name, int layers);
double init_value(const TensorInit& t, std::int64_t index);
// Fills a unit's flat buffer (padding stays as it is).
template <class T>
void init_unit(T* buf, const Unit& unit, std::uint64_t seed, int layers);

// Counter-based hash (splitmix64 finalizer) used by initialization and data shuffling.
std::uint64_t mix64(std::uint64_t x);
std::uint64_t hash_name(const std::string& s);

}  // namespace meshrun::train
