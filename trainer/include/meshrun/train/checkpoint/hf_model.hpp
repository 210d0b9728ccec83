// Hugging Face model directories (what `from_pretrained` reads): config.json, model.safetensors or shards
// listed by model.safetensors.index.json, generation_config.json. meshrun's parameter names are already
// Hugging Face's (LlamaForCausalLM, MixtralForCausalLM: params.cpp); this file holds the config.json side:
// writing it from a model's settings, and checking one against a template's [model] before loading its
// weights (docs/trainer.md, "Hugging Face directories", with the transformers sources cited there).
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "meshrun/job.hpp"
#include "meshrun/train/checkpoint/safetensors.hpp"

namespace meshrun::train {

inline constexpr const char* kHfConfigFile = "config.json";
inline constexpr const char* kHfGenerationConfigFile = "generation_config.json";
inline constexpr const char* kHfWeightsFile = "model.safetensors";
inline constexpr const char* kHfIndexFile = "model.safetensors.index.json";
// transformers' save_pretrained default max_shard_size ("5GB", decimal).
inline constexpr std::uint64_t kHfDefaultShardBytes = 5'000'000'000ULL;

// config.json of model m (LlamaForCausalLM, or MixtralForCausalLM when m.experts > 0): every field the
// forward pass depends on, written explicitly so that no transformers default decides it.
// max_positions: max_position_embeddings (the sequence length the model was trained at).
// The special token ids of the tokenizer shipped with an export (none: null in config.json, as for the
// byte-level tokenizer, so that LlamaConfig's defaults 1 and 2 do not apply).
struct SpecialTokenIds {
  std::optional<std::uint32_t> bos, eos, pad;
};
std::string hf_config_text(const ModelSpec& m, int max_positions, const std::string& safetensors_dtype,
                           const SpecialTokenIds& special = {});
// generation_config.json: GenerationConfig.from_model_config's form, with the ids config.json has.
std::string hf_generation_config_text(const SpecialTokenIds& special = {});

// "--max-shard-size" values: bytes, or a number with KB/MB/GB (10^3..) or KiB/MiB/GiB (2^10..), as
// transformers' convert_file_size_to_int reads them. Throws SafetensorsError (one line) on anything else.
std::uint64_t parse_shard_size(const std::string& text);

// The model a Hugging Face model directory's config.json describes (absent fields: the transformers class's
// defaults), what meshrun-ckpt sample builds from the directory. SafetensorsError (one line naming the file and
// the field) for a field meshrun-train does not implement (rope_scaling, biases, another activation, sliding
// windows, router jitter) or one that is malformed.
// max_positions (if given): config.json's max_position_embeddings (meshrun-ckpt export writes the trained
// seq_len), 0 when absent.
ModelSpec hf_dir_model(const std::string& dir, int* max_positions = nullptr);

// A Hugging Face model directory opened for loading into model `m` (the template's [model], or hf_dir_model's):
// its config.json is read as hf_dir_model reads it and agrees with m field by field (tied embeddings refused),
// and its weight files hold exactly m's tensors. Every refusal is one SafetensorsError line naming the file and
// the field or tensor.
class HfModelDir {
 public:
  HfModelDir(const std::string& dir, const ModelSpec& m);
  // Tensor `name` in its global shape (checked), converted to T.
  template <class T>
  std::vector<T> read(const std::string& name, const std::vector<std::int64_t>& shape) const;

 private:
  std::string dir_;
  std::map<std::string, std::string> file_of_;                       // tensor -> weight file
  mutable std::map<std::string, std::unique_ptr<SafetensorsFile>> files_;  // weight file -> opened on first read
};

// Whether `path` is a directory holding config.json (checkpoint.load's directory form).
bool is_hf_model_dir(const std::string& path);

}  // namespace meshrun::train
