#include "meshrun/train/checkpoint/hf_model.hpp"

#include <cmath>
#include <filesystem>
#include <limits>
#include <optional>
#include <set>

#include <nlohmann/json.hpp>

#include "json_read.hpp"
#include "meshrun/bounded_file.hpp"
#include "meshrun/train/model/params.hpp"

namespace meshrun::train {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// config.json and the index are a few KiB; a file larger than this is not one.
constexpr std::size_t kMaxHfJson = std::size_t(64) << 20;

json read_json(const std::string& path, const std::string& what) {
  std::string text, error;
  if (!read_bounded_file(path, kMaxHfJson, what, &text, &error)) throw SafetensorsError(error + " (checkpoint.load)");
  return parse_json_bounded<SafetensorsError>(text, path);
}

std::string num(double v) { return json(v).dump(); }  // the shortest text that reads back as v

}  // namespace

// The fields and their meaning: transformers' LlamaConfig and MixtralConfig (configuration_llama.py,
// configuration_mixtral.py), as their modeling files use them (docs/trainer.md cites both).
namespace {
json id_or_null(const std::optional<std::uint32_t>& id) { return id ? json(*id) : json(nullptr); }
}  // namespace

std::string hf_config_text(const ModelSpec& m, int max_positions, const std::string& safetensors_dtype,
                           const SpecialTokenIds& special) {
  const bool moe = m.experts > 0;
  json c = json::object();
  c["architectures"] = {moe ? "MixtralForCausalLM" : "LlamaForCausalLM"};
  c["model_type"] = moe ? "mixtral" : "llama";
  c["vocab_size"] = m.vocab;
  c["hidden_size"] = m.hidden;
  c["intermediate_size"] = moe ? m.expert_ffn() : static_cast<std::int64_t>(m.ffn_hidden);
  c["num_hidden_layers"] = m.layers;
  c["num_attention_heads"] = m.heads;
  c["num_key_value_heads"] = m.kv_heads;
  c["head_dim"] = m.head_dim();
  c["hidden_act"] = "silu";
  c["max_position_embeddings"] = max_positions;
  c["rms_norm_eps"] = m.norm_eps;
  c["rope_theta"] = m.rope_theta;
  c["rope_scaling"] = nullptr;
  c["tie_word_embeddings"] = m.tied_embeddings;
  c["attention_dropout"] = 0.0;
  c["initializer_range"] = 0.02;
  c["use_cache"] = true;
  // The shipped tokenizer's special tokens; without one (byte-level) null, so that LlamaConfig's defaults (1, 2)
  // do not apply.
  c["bos_token_id"] = id_or_null(special.bos);
  c["eos_token_id"] = id_or_null(special.eos);
  c["pad_token_id"] = id_or_null(special.pad);
  c["torch_dtype"] = safetensors_dtype == "F64" ? "float64" : "float32";
  if (moe) {
    c["num_local_experts"] = m.experts;
    c["num_experts_per_tok"] = m.top_k;
    c["router_aux_loss_coef"] = m.aux_loss_coef();
    c["output_router_logits"] = false;
    c["router_jitter_noise"] = 0.0;
    c["sliding_window"] = nullptr;
  } else {
    c["attention_bias"] = false;
    c["mlp_bias"] = false;
    c["pretraining_tp"] = 1;
  }
  return c.dump(2) + "\n";
}

std::string hf_generation_config_text(const SpecialTokenIds& special) {
  // GenerationConfig.from_model_config's form: the token ids config.json has, none when they are null.
  json g{{"_from_model_config", true}};
  if (special.bos) g["bos_token_id"] = *special.bos;
  if (special.eos) g["eos_token_id"] = *special.eos;
  if (special.pad) g["pad_token_id"] = *special.pad;
  return g.dump(2) + "\n";
}

std::uint64_t parse_shard_size(const std::string& text) {
  std::size_t i = 0;
  while (i < text.size() && text[i] >= '0' && text[i] <= '9') ++i;
  const std::string digits = text.substr(0, i), unit = text.substr(i);
  static const std::map<std::string, std::uint64_t> kUnits = {
      {"", 1}, {"B", 1}, {"KB", 1000ULL}, {"MB", 1000ULL * 1000}, {"GB", 1000ULL * 1000 * 1000},
      {"KiB", 1ULL << 10}, {"MiB", 1ULL << 20}, {"GiB", 1ULL << 30}};
  const auto u = kUnits.find(unit);
  std::uint64_t n = 0, bytes = 0;
  bool ok = !digits.empty() && digits.size() <= 15 && u != kUnits.end();
  if (ok) n = std::stoull(digits);
  ok = ok && n > 0 && !__builtin_mul_overflow(n, u->second, &bytes);
  if (!ok)
    throw SafetensorsError("--max-shard-size " + text + " is not a size; give bytes or a number with KB, MB, GB, KiB, MiB "
                           "or GiB, e.g. 5GB");
  return bytes;
}

bool is_hf_model_dir(const std::string& path) {
  std::error_code ec;
  return fs::is_directory(path, ec) && fs::exists(fs::path(path) / kHfConfigFile, ec);
}

namespace {

// config.json as meshrun's model. Absent fields take the transformers class's default (the value from_pretrained
// would use); what meshrun-train does not implement is refused (SafetensorsError naming the file and the field).
ModelSpec hf_config_model(const std::string& file, const json& c) {
  if (!c.is_object()) throw SafetensorsError(file + ": not a JSON object");
  auto fail = [&](const std::string& what) { throw SafetensorsError(file + ": " + what); };
  const std::string type = c.contains("model_type") && c["model_type"].is_string() ? c["model_type"].get<std::string>() : "";
  if (type != "llama" && type != "mixtral")
    fail("model_type = " + (c.contains("model_type") ? json_snippet(c["model_type"]) : std::string("(missing)")) +
         ": meshrun-train loads \"llama\" (LlamaForCausalLM) or \"mixtral\" (MixtralForCausalLM) directories");
  const bool moe = type == "mixtral";
  const std::string arch = moe ? "MixtralForCausalLM" : "LlamaForCausalLM";
  if (c.contains("architectures") && c["architectures"] != json::array({arch}))
    fail("architectures = " + json_snippet(c["architectures"]) + ", expected [\"" + arch + "\"]");

  // An integer field in [0, hi]; `fallback`: transformers' default when absent (none: required).
  auto integer = [&](const char* key, std::optional<std::int64_t> fallback,
                     std::int64_t hi = std::numeric_limits<int>::max()) -> std::int64_t {
    if (!c.contains(key) || c[key].is_null()) {
      if (!fallback) fail(std::string(key) + " is missing");
      return *fallback;
    }
    const auto v = json_int(c[key], 0, hi);
    if (!v) fail(std::string(key) + " = " + json_snippet(c[key]) + " is not a non-negative integer" +
                 (hi < std::numeric_limits<std::int64_t>::max() ? " below 2^31" : ""));
    return *v;
  };
  auto number = [&](const char* key, double fallback) -> double {
    if (!c.contains(key)) return fallback;
    if (!c[key].is_number()) fail(std::string(key) + " = " + json_snippet(c[key]) + " is not a number");
    return c[key].get<double>();
  };
  auto refuse_unless = [&](const char* key, const json& allowed, const std::string& why) {
    if (c.contains(key) && c[key] != allowed && !(allowed.is_null() && c[key].is_null()))
      fail(std::string(key) + " = " + json_snippet(c[key]) + ": " + why);
  };

  ModelSpec s;
  s.heads = static_cast<int>(integer("num_attention_heads", std::nullopt));
  s.hidden = static_cast<int>(integer("hidden_size", std::nullopt));
  s.ffn_hidden = static_cast<int>(integer("intermediate_size", std::nullopt));  // MoE: each expert's width
  s.layers = static_cast<int>(integer("num_hidden_layers", std::nullopt));
  s.kv_heads = static_cast<int>(integer("num_key_value_heads", moe ? 8 : s.heads));
  s.vocab = integer("vocab_size", 32000, std::numeric_limits<std::int64_t>::max());
  if (s.heads == 0) fail("num_attention_heads = 0; a model has at least one attention head");
  if (c.contains("head_dim") && !c["head_dim"].is_null() && integer("head_dim", std::nullopt) != s.head_dim())
    fail("head_dim = " + json_snippet(c["head_dim"]) + " is not hidden_size / num_attention_heads = " +
         std::to_string(s.head_dim()) + ": meshrun-train's heads are hidden/heads wide");
  s.norm_eps = number("rms_norm_eps", moe ? 1e-5 : 1e-6);
  s.rope_theta = number("rope_theta", moe ? 1e6 : 10000.0);
  if (c.contains("rope_parameters") && c["rope_parameters"].is_object()) {  // newer transformers nest rope_theta here
    const json& rp = c["rope_parameters"];
    if (rp.contains("rope_type") && rp["rope_type"] != "default")
      fail("rope_parameters.rope_type = " + json_snippet(rp["rope_type"]) +
           ": meshrun-train implements the default RoPE only (no scaling); export the model without it");
    if (rp.contains("rope_theta") && rp["rope_theta"].is_number()) s.rope_theta = rp["rope_theta"].get<double>();
  }
  refuse_unless("rope_scaling", nullptr,
                "meshrun-train implements plain RoPE (no scaling: Llama 3.1's llama3, linear, dynamic, yarn); "
                "load a model without rope_scaling");
  s.tied_embeddings = c.contains("tie_word_embeddings") ? c["tie_word_embeddings"] == true : false;
  if (s.tied_embeddings)  // not implemented in meshrun-train (docs/trainer.md, "Not done here")
    fail("tie_word_embeddings = true: meshrun-train keeps Llama's untied LM head (model.tied_embeddings = false); load a "
         "model with its own lm_head.weight");
  refuse_unless("hidden_act", "silu", "meshrun-train's MLP is SwiGLU (silu); load a model with hidden_act = \"silu\"");
  refuse_unless("attention_bias", false, "meshrun-train's projections have no bias; load a model without biases");
  refuse_unless("mlp_bias", false, "meshrun-train's projections have no bias; load a model without biases");
  refuse_unless("pretraining_tp", 1, "the sliced-projection emulation is not implemented; set pretraining_tp = 1");
  if (number("attention_dropout", 0.0) != 0.0)
    fail("attention_dropout = " + json_snippet(c["attention_dropout"]) + ": meshrun-train has no dropout; set it to 0");
  if (moe) {
    s.experts = static_cast<int>(integer("num_local_experts", 8));
    s.top_k = static_cast<int>(integer("num_experts_per_tok", 2));
    s.router_aux_loss_coef = number("router_aux_loss_coef", 0.001);
    refuse_unless("sliding_window", nullptr, "meshrun-train attends to the whole causal window; load a model with "
                                             "sliding_window = null");
    if (number("router_jitter_noise", 0.0) != 0.0)
      fail("router_jitter_noise = " + json_snippet(c["router_jitter_noise"]) + ": meshrun-train's router has no jitter; set it to 0");
  }
  return s;
}

// config.json against the template's model: hf_config_model, then field by field equal to the template's.
void check_hf_config(const std::string& file, const json& c, const ModelSpec& m) {
  const ModelSpec have = hf_config_model(file, c);
  const bool moe = m.experts > 0;
  auto fail = [&](const std::string& what) { throw SafetensorsError(file + ": " + what); };
  const std::string type = c["model_type"].get<std::string>();  // "llama" or "mixtral" (hf_config_model checked)
  if ((type == "mixtral") != moe)
    fail("model_type = \"" + type + "\" but the template's model is " + (moe ? "a mixture of experts" : "dense") +
         " (model.experts = " + std::to_string(m.experts) + "); use a template of this model");
  auto same = [&](const char* key, std::int64_t value, std::int64_t want, const std::string& setting) {
    if (value != want)
      fail(std::string(key) + " = " + std::to_string(value) + " but the template's " + setting + " = " + std::to_string(want) +
           "; use a template of this model (or --set " + setting + "=" + std::to_string(value) + ")");
  };
  auto same_real = [&](const char* key, double value, double want, const std::string& setting) {
    if (value != want)
      fail(std::string(key) + " = " + num(value) + " but the template's " + setting + " = " + num(want) +
           "; use a template of this model (or --set " + setting + "=" + num(value) + ")");
  };
  same("hidden_size", have.hidden, m.hidden, "model.hidden");
  same("intermediate_size", have.ffn_hidden, moe ? m.expert_ffn() : m.ffn_hidden, moe ? "model.moe_ffn_hidden" : "model.ffn_hidden");
  same("num_hidden_layers", have.layers, m.layers, "model.layers");
  same("num_attention_heads", have.heads, m.heads, "model.heads");
  same("num_key_value_heads", have.kv_heads, m.kv_heads, "model.kv_heads");
  same("vocab_size", have.vocab, m.vocab, "model.vocab");
  same_real("rms_norm_eps", have.norm_eps, m.norm_eps, "model.norm_eps");
  const bool nested_theta = c.contains("rope_parameters") && c["rope_parameters"].is_object() &&
                            c["rope_parameters"].contains("rope_theta") && c["rope_parameters"]["rope_theta"].is_number();
  same_real(nested_theta ? "rope_parameters.rope_theta" : "rope_theta", have.rope_theta, m.rope_theta, "model.rope_theta");
  if (have.tied_embeddings != m.tied_embeddings)
    fail(std::string("tie_word_embeddings = ") + (have.tied_embeddings ? "true" : "false") + ": meshrun-train keeps Llama's untied LM head " +
         "(model.tied_embeddings = false); load a model with its own lm_head.weight");
  if (moe) {
    same("num_local_experts", have.experts, m.experts, "model.experts");
    same("num_experts_per_tok", have.top_k, m.top_k, "model.top_k");
    same_real("router_aux_loss_coef", have.router_aux_loss_coef, m.aux_loss_coef(), "model.router_aux_loss_coef");
  }
}

}  // namespace

ModelSpec hf_dir_model(const std::string& dir, int* max_positions) {
  const std::string config = (fs::path(dir) / kHfConfigFile).string();
  const json j = read_json(config, "Hugging Face config.json");
  if (max_positions)
    *max_positions = j.is_object() && j.contains("max_position_embeddings") && j["max_position_embeddings"].is_number_integer()
                         ? j["max_position_embeddings"].get<int>()
                         : 0;
  return hf_config_model(config, j);
}

HfModelDir::HfModelDir(const std::string& dir, const ModelSpec& m) : dir_(dir) {
  const std::string config = (fs::path(dir) / kHfConfigFile).string();
  check_hf_config(config, read_json(config, "Hugging Face config.json"), m);
  const std::string index = (fs::path(dir) / kHfIndexFile).string();
  std::error_code ec;
  if (fs::exists(index, ec)) {
    const json j = read_json(index, "safetensors index");
    if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
      throw SafetensorsError(index + ": weight_map is missing or not an object");
    for (const auto& [name, file] : j["weight_map"].items()) {
      const std::string f = file.is_string() ? file.get<std::string>() : "";
      if (f.empty() || f.find('/') != std::string::npos || f[0] == '.')
        throw SafetensorsError(index + ": weight_map[\"" + name + "\"] = " + json_snippet(file) + " is not a file name in the directory");
      file_of_[name] = f;
    }
  } else {
    const std::string single = (fs::path(dir) / kHfWeightsFile).string();
    if (!fs::exists(single, ec))
      throw SafetensorsError(dir + " has config.json but neither " + kHfWeightsFile + " nor " + kHfIndexFile +
                             "; it is not a complete Hugging Face model directory");
    files_[kHfWeightsFile] = std::make_unique<SafetensorsFile>(single);
    for (const std::string& name : files_[kHfWeightsFile]->names()) file_of_[name] = kHfWeightsFile;
  }
  // The model's tensors by name (global shapes; the same for every tensor-parallel split).
  std::set<std::string> wanted;
  for (const Unit& u : build_param_table(m, 1, 0).units)
    for (const TensorSlot& t : u.tensors) {
      wanted.insert(t.name);
      if (!file_of_.count(t.name))
        throw SafetensorsError(dir + ": tensor " + t.name + " is missing (" + (fs::exists(index, ec) ? kHfIndexFile : kHfWeightsFile) +
                               "); the directory does not hold this template's model");
    }
  for (const auto& [name, file] : file_of_)
    if (!wanted.count(name))
      throw SafetensorsError(dir + ": tensor " + name + " (" + file + ") is not part of this template's model; check [model]");
}

template <class T>
std::vector<T> HfModelDir::read(const std::string& name, const std::vector<std::int64_t>& shape) const {
  const std::string& file = file_of_.at(name);
  std::unique_ptr<SafetensorsFile>& opened = files_[file];
  if (!opened) opened = std::make_unique<SafetensorsFile>((fs::path(dir_) / file).string());
  return opened->read<T>(name, shape);
}

template std::vector<float> HfModelDir::read<float>(const std::string&, const std::vector<std::int64_t>&) const;
template std::vector<double> HfModelDir::read<double>(const std::string&, const std::vector<std::int64_t>&) const;

}  // namespace meshrun::train
