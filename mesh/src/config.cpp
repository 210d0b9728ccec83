// The configuration schema and its layers. One table of keys drives TOML parsing, --set, flags,
// did-you-mean suggestions and the dry run's source column.
#include "meshrun/schedule.hpp"
#include "meshrun/config.hpp"
#include "meshrun/bounded_file.hpp"

#include <toml++/toml.h>

#include <algorithm>
#include <tuple>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>

#include "meshrun/hostlist.hpp"
#include "meshrun/layout.hpp"
#include "meshrun/limits.hpp"

namespace meshrun {
namespace {

struct Field {
  KeyInfo info;
  std::function<void*(JobConfig&)> ptr;
  int64_t min = INT64_MIN;             // for integers
  int64_t max = INT32_MAX;             // for integers; meshrun::limits for sizes that enter products
  double min_number = -HUGE_VAL;       // for numbers
  std::vector<std::string> choices;    // for strings; empty = free text
  std::function<std::string(const std::string&)> check;  // for strings: "" or what is wrong (no key)
};

template <class S, class T>
Field field(const char* key, S JobConfig::*section, T S::*member, ValueType type, const char* help) {
  Field f;
  f.info = {key, type, help};
  f.ptr = [section, member](JobConfig& j) -> void* { return &(j.*section.*member); };
  return f;
}

std::vector<Field> make_schema() {
  using V = ValueType;
  std::vector<Field> f;
  auto add = [&](Field x) -> Field& { f.push_back(std::move(x)); return f.back(); };
  auto at_least = [](Field x, int64_t m) { x.min = m; return x; };
  auto at_most = [](Field x, int64_t m) { x.max = m; return x; };
  auto choose = [](Field x, std::vector<std::string> c) { x.choices = std::move(c); return x; };
  auto nonneg = [](Field x) { x.min_number = 0; return x; };

  add(field("job.name", &JobConfig::job, &JobSpec::name, V::string, "Slurm job name"));
  add(field("job.time", &JobConfig::job, &JobSpec::time, V::string, "time limit, [D-]HH:MM:SS"));
  add(field("job.partition", &JobConfig::job, &JobSpec::partition, V::string, "Slurm partition"));
  add(field("job.account", &JobConfig::job, &JobSpec::account, V::string, "Slurm account"));
  add(field("job.qos", &JobConfig::job, &JobSpec::qos, V::string, "Slurm QOS"));
  add(field("job.output_dir", &JobConfig::job, &JobSpec::output_dir, V::string,
            "meshrun-train's run directory: metrics.jsonl goes there (default: checkpoint.dir)"));
  add(choose(field("job.trainer", &JobConfig::job, &JobSpec::trainer, V::string,
                   "the program that trains the template: meshrun (meshrun-train), megatron or torchtitan; picks "
                   "the rules the job is held to"),
             {"meshrun", "megatron", "torchtitan"}));

  add(at_most(at_least(field("cluster.nodes", &JobConfig::cluster, &ClusterSpec::nodes, V::integer, "node count (0 = from hostlist)"), 0), limits::kHosts));
  add(at_most(at_least(field("cluster.gpus_per_node", &JobConfig::cluster, &ClusterSpec::gpus_per_node, V::integer, "GPUs per node (0 = from node_type)"), 0), limits::kGpusPerNode));
  {
    std::vector<std::string> names;
    for (const auto& t : node_types()) names.push_back(t.name);
    add(choose(field("cluster.node_type", &JobConfig::cluster, &ClusterSpec::node_type, V::string, "node type"), names));
  }
  add(at_most(at_least(field("cluster.nvlink_domain_gpus", &JobConfig::cluster, &ClusterSpec::nvlink_domain_gpus, V::integer, "GPUs per NVLink domain (0 = from node_type)"), 0), limits::kNvlinkDomainGpus));
  {
    // Syntax and size at the layer that knows the value's location; resolve_cluster expands it.
    Field h = field("cluster.hostlist", &JobConfig::cluster, &ClusterSpec::hostlist, V::string, "Slurm hostlist, e.g. node[001-128]");
    h.check = [](const std::string& v) {
      std::string error;
      return v.empty() || check_hostlist(v, &error) ? std::string() : error;
    };
    add(std::move(h));
  }
  add(field("cluster.gpu", &JobConfig::cluster, &ClusterSpec::gpu, V::string, "GPU model for the planner"));
  add(nonneg(field("cluster.gpu_memory_gib", &JobConfig::cluster, &ClusterSpec::gpu_memory_gib, V::number, "GPU memory (GiB)")));
  add(nonneg(field("cluster.gpu_bf16_tflops", &JobConfig::cluster, &ClusterSpec::gpu_bf16_tflops, V::number, "dense bf16 peak (TFLOP/s)")));
  add(at_least(field("cluster.gpu_sms", &JobConfig::cluster, &ClusterSpec::gpu_sms, V::integer, "streaming multiprocessors per GPU"), 0));
  add(nonneg(field("cluster.nvlink_gbps", &JobConfig::cluster, &ClusterSpec::nvlink_gbps, V::number, "NVLink GB/s per GPU per direction")));
  add(at_most(at_least(field("cluster.nics_per_node", &JobConfig::cluster, &ClusterSpec::nics_per_node, V::integer, "compute NICs per node"), 0), limits::kGpusPerNode));
  add(nonneg(field("cluster.nic_gbps", &JobConfig::cluster, &ClusterSpec::nic_gbps, V::number, "Gbit/s per NIC")));

  add(field("model.name", &JobConfig::model, &ModelSpec::name, V::string, "model name"));
  add(at_most(at_least(field("model.layers", &JobConfig::model, &ModelSpec::layers, V::integer, "transformer layers"), 1), limits::kLayers));
  add(at_most(at_least(field("model.hidden", &JobConfig::model, &ModelSpec::hidden, V::integer, "model dimension"), 1), limits::kWidth));
  add(at_most(at_least(field("model.ffn_hidden", &JobConfig::model, &ModelSpec::ffn_hidden, V::integer, "MLP inner dimension"), 1), limits::kWidth));
  add(at_most(at_least(field("model.heads", &JobConfig::model, &ModelSpec::heads, V::integer, "query heads"), 1), limits::kHeads));
  add(at_most(at_least(field("model.kv_heads", &JobConfig::model, &ModelSpec::kv_heads, V::integer, "key/value heads (GQA)"), 1), limits::kHeads));
  add(at_most(at_least(field("model.vocab", &JobConfig::model, &ModelSpec::vocab, V::integer, "vocabulary size"), 1), limits::kVocab));
  add(choose(field("model.mlp", &JobConfig::model, &ModelSpec::mlp, V::string, "MLP type"), {"swiglu", "gelu"}));
  add(field("model.tied_embeddings", &JobConfig::model, &ModelSpec::tied_embeddings, V::boolean, "share input and output embeddings"));
  add(at_most(at_least(field("model.experts", &JobConfig::model, &ModelSpec::experts, V::integer, "experts per MoE layer (0 = dense)"), 0), limits::kExperts));
  add(at_most(at_least(field("model.top_k", &JobConfig::model, &ModelSpec::top_k, V::integer, "experts per token"), 1), limits::kExperts));
  add(at_most(at_least(field("model.moe_ffn_hidden", &JobConfig::model, &ModelSpec::moe_ffn_hidden, V::integer, "expert MLP dimension (0 = ffn_hidden)"), 0), limits::kWidth));
  add(choose(field("model.router_aux", &JobConfig::model, &ModelSpec::router_aux, V::string,
                   "MoE load-balancing loss convention: meshrun (per layer) | hf (HF Mixtral's, pooled over layers)"), {"meshrun", "hf"}));
  add(nonneg(field("model.router_aux_loss_coef", &JobConfig::model, &ModelSpec::router_aux_loss_coef, V::number,
                   "MoE load-balancing loss coefficient (unset: 0.01 for router_aux = meshrun, 0.001 for hf)")));
  add(nonneg(field("model.rope_theta", &JobConfig::model, &ModelSpec::rope_theta, V::number, "RoPE base")));
  add(nonneg(field("model.norm_eps", &JobConfig::model, &ModelSpec::norm_eps, V::number, "RMSNorm epsilon")));

  add(at_most(at_least(field("parallel.tp", &JobConfig::parallel, &LayoutSpec::tp, V::integer, "tensor-parallel size"), 1), limits::kWorld));
  add(at_most(at_least(field("parallel.cp", &JobConfig::parallel, &LayoutSpec::cp, V::integer, "context-parallel size"), 1), limits::kWorld));
  add(at_most(at_least(field("parallel.pp", &JobConfig::parallel, &LayoutSpec::pp, V::integer, "pipeline stages"), 1), limits::kWorld));
  add(at_most(at_least(field("parallel.dp", &JobConfig::parallel, &LayoutSpec::dp, V::int_or_auto, "data-parallel size or \"auto\""), 1), limits::kWorld));
  add(at_most(at_least(field("parallel.ep", &JobConfig::parallel, &LayoutSpec::ep, V::integer, "expert-parallel size"), 1), limits::kWorld));
  add(field("parallel.order", &JobConfig::parallel, &LayoutSpec::order, V::string, "axis order, leftmost fastest"));
  add(at_most(at_least(field("parallel.virtual_stages", &JobConfig::parallel, &LayoutSpec::virtual_stages, V::integer, "pipeline chunks per rank (interleaved; zbv and dualpipev always run 2)"), 1), limits::kLayers));
  add(at_least(field("parallel.zero_stage", &JobConfig::parallel, &LayoutSpec::zero_stage, V::integer, "ZeRO stage 0-3"), 0));
  add(field("parallel.sequence_parallel", &JobConfig::parallel, &LayoutSpec::sequence_parallel, V::boolean, "Megatron sequence parallelism"));
  add(choose(field("parallel.pipeline_schedule", &JobConfig::parallel, &LayoutSpec::pipeline_schedule, V::string, "pipeline schedule"),
             pipeline_schedule_names()));
  add(choose(field("parallel.cp_comm", &JobConfig::parallel, &LayoutSpec::cp_comm, V::string,
                   "context-parallel attention: K/V ring, all-gather, all-to-all (Ulysses) or all-to-all + ring"),
             {"ring", "allgather", "alltoall", "alltoall+ring"}));
  add(at_most(at_least(field("parallel.cp_alltoall", &JobConfig::parallel, &LayoutSpec::cp_alltoall, V::integer,
                             "alltoall+ring: CP ranks per all-to-all group"), 0), limits::kWorld));

  add(at_most(at_least(field("training.seq_len", &JobConfig::training, &TrainingSpec::seq_len, V::integer, "tokens per sequence"), 1), limits::kSeqLen));
  add(at_most(at_least(field("training.global_batch_size", &JobConfig::training, &TrainingSpec::global_batch_size, V::integer, "sequences per step"), 1), limits::kBatch));
  add(at_most(at_least(field("training.micro_batch_size", &JobConfig::training, &TrainingSpec::micro_batch_size, V::integer, "sequences per micro-batch per DP rank"), 1), limits::kBatch));
  add(at_least(field("training.steps", &JobConfig::training, &TrainingSpec::steps, V::integer, "optimizer steps"), 0));
  add(nonneg(field("training.lr", &JobConfig::training, &TrainingSpec::lr, V::number, "peak learning rate")));
  add(nonneg(field("training.min_lr", &JobConfig::training, &TrainingSpec::min_lr, V::number, "final learning rate of the cosine decay")));
  add(at_least(field("training.warmup_steps", &JobConfig::training, &TrainingSpec::warmup_steps, V::integer, "linear warmup steps"), 0));
  add(at_least(field("training.lr_decay_steps", &JobConfig::training, &TrainingSpec::lr_decay_steps, V::integer,
                     "learning-rate schedule horizon in steps (0 = training.steps); set it to extend a finished run"), 0));
  add(nonneg(field("training.weight_decay", &JobConfig::training, &TrainingSpec::weight_decay, V::number, "AdamW decoupled weight decay")));
  add(nonneg(field("training.beta1", &JobConfig::training, &TrainingSpec::beta1, V::number, "Adam beta1")));
  add(nonneg(field("training.beta2", &JobConfig::training, &TrainingSpec::beta2, V::number, "Adam beta2")));
  add(nonneg(field("training.adam_eps", &JobConfig::training, &TrainingSpec::adam_eps, V::number, "Adam epsilon")));
  add(nonneg(field("training.grad_clip", &JobConfig::training, &TrainingSpec::grad_clip, V::number, "global-norm clip (0 = off)")));
  add(at_least(field("training.seed", &JobConfig::training, &TrainingSpec::seed, V::integer, "seed for initialization and shuffling"), 0));
  add(choose(field("training.recompute", &JobConfig::training, &TrainingSpec::recompute, V::string, "activation recomputation"), {"none", "selective", "full"}));
  add(choose(field("training.dtype", &JobConfig::training, &TrainingSpec::dtype, V::string, "CPU trainer dtype"), {"fp32", "fp64", "bf16"}));
  add(choose(field("training.device", &JobConfig::training, &TrainingSpec::device, V::string, "kernel backend"), {"cpu", "cuda"}));
  add(at_least(field("training.straggler_interval", &JobConfig::training, &TrainingSpec::straggler_interval, V::integer,
                     "steps between straggler reports (0 = off)"), 0));
  add(nonneg(field("training.straggler_margin", &JobConfig::training, &TrainingSpec::straggler_margin, V::number,
                   "compute time above the ranks' median that names a straggler (0.3 = 30%)")));
  add(at_least(field("training.eval_interval", &JobConfig::training, &TrainingSpec::eval_interval, V::integer,
                     "steps between validation losses on data.valid (0 = off)"), 0));
  add(at_most(at_least(field("training.eval_batches", &JobConfig::training, &TrainingSpec::eval_batches, V::integer,
                             "global batches of data.valid per evaluation"), 1), limits::kBatch));
  std::vector<std::string> dtypes{"fp8", "bf16", "fp16", "fp32"};
  add(choose(field("training.param_dtype", &JobConfig::training, &TrainingSpec::param_dtype, V::string, "planner: parameter dtype"), dtypes));
  add(choose(field("training.grad_dtype", &JobConfig::training, &TrainingSpec::grad_dtype, V::string, "planner: gradient dtype"), dtypes));
  add(choose(field("training.optim_dtype", &JobConfig::training, &TrainingSpec::optim_dtype, V::string, "planner: master weights and Adam moments"), dtypes));

  add(field("data.path", &JobConfig::data, &DataSpec::path, V::string, "token file to read (raw little-endian, or an indexed dataset); never written"));
  add(choose(field("data.token_dtype", &JobConfig::data, &DataSpec::token_dtype, V::string, "token width"), {"uint16", "uint32"}));
  add(field("data.shuffle", &JobConfig::data, &DataSpec::shuffle, V::boolean, "seeded permutation of sequences"));
  add(field("data.text", &JobConfig::data, &DataSpec::text, V::string, "UTF-8 corpus to tokenize when data.path is not set (into data.text_cache, else the cache directory)"));
  add(field("data.text_cache", &JobConfig::data, &DataSpec::text_cache, V::string, "token file data.text is tokenized into when it is missing (default: $MESHRUN_CACHE_DIR/text-<hash>.<dtype>.bin)"));
  add(field("data.tokenizer", &JobConfig::data, &DataSpec::tokenizer, V::string, "tokenizer for data.text (tokenizer.json, .model or model directory; else byte-level), recorded for export and sample"));
  add(field("data.blend", &JobConfig::data, &DataSpec::blend, V::blend, "datasets mixed by weight: [[weight, path], ...]"));
  add(field("data.valid", &JobConfig::data, &DataSpec::valid, V::blend, "validation data: a path or [[weight, path], ...]"));
  add(field("data.split", &JobConfig::data, &DataSpec::split, V::string, "Megatron's train,valid,test split of each dataset, e.g. \"969,30,1\""));

  add(field("checkpoint.dir", &JobConfig::checkpoint, &CheckpointSpec::dir, V::string, "checkpoint directory"));
  add(at_least(field("checkpoint.interval", &JobConfig::checkpoint, &CheckpointSpec::interval, V::integer, "steps between checkpoints (0 = signal/end only)"), 0));
  add(at_least(field("checkpoint.keep", &JobConfig::checkpoint, &CheckpointSpec::keep, V::integer, "complete checkpoints kept in checkpoint.dir"), 1));
  add(field("checkpoint.resume", &JobConfig::checkpoint, &CheckpointSpec::resume, V::boolean, "resume from the latest checkpoint"));
  add(field("checkpoint.signal", &JobConfig::checkpoint, &CheckpointSpec::signal, V::string, "signal that asks for a checkpoint"));
  add(at_least(field("checkpoint.signal_lead_s", &JobConfig::checkpoint, &CheckpointSpec::signal_lead_s, V::integer, "seconds before the time limit"), 0));
  add(field("checkpoint.load", &JobConfig::checkpoint, &CheckpointSpec::load, V::string, "weights to start from: a safetensors file or a Hugging Face model directory"));
  add(field("checkpoint.finetune", &JobConfig::checkpoint, &CheckpointSpec::finetune, V::string, "a meshrun checkpoint whose weights start a new run (fresh optimizer, step 0)"));
  add(field("checkpoint.save", &JobConfig::checkpoint, &CheckpointSpec::save, V::string, "safetensors file written at the end"));
  add(choose(field("checkpoint.on_error", &JobConfig::checkpoint, &CheckpointSpec::on_error, V::string, "a failed periodic save: continue or stop"), {"continue", "stop"}));
  add(at_least(field("checkpoint.max_failures", &JobConfig::checkpoint, &CheckpointSpec::max_failures, V::integer, "consecutive failed saves that stop the run"), 1));
  add(field("checkpoint.async", &JobConfig::checkpoint, &CheckpointSpec::async, V::boolean, "write checkpoints in the background"));

  add(choose(field("site.nccl", &JobConfig::site, &SiteSpec::nccl, V::string, "site: NCCL variables from the topology"), {"auto", "off"}));
  add(field("site.allow_env", &JobConfig::site, &SiteSpec::allow_env, V::string, "site: extra [env] names a template may set"));
  add(field("site.socket_ifname", &JobConfig::site, &SiteSpec::socket_ifname, V::string, "site: NCCL_SOCKET_IFNAME"));
  add(choose(field("site.hca_scope", &JobConfig::site, &SiteSpec::hca_scope, V::string, "site: NCCL_IB_HCA per node (default) or per rank (warned)"), {"node", "rank"}));
  add(choose(field("site.cpu_bind", &JobConfig::site, &SiteSpec::cpu_bind, V::string, "site: CPU binding"), {"numa", "none"}));
  add(at_least(field("site.port_base", &JobConfig::site, &SiteSpec::port_base, V::integer, "site: MASTER_PORT range start"), 1024));
  add(nonneg(field("site.preflight_gemm_gflops", &JobConfig::site, &SiteSpec::preflight_gemm_gflops, V::number, "site: meshrun preflight's expected GEMM GFLOP/s per device (0 = the allocation's median)")));
  add(nonneg(field("site.preflight_p2p_gbs", &JobConfig::site, &SiteSpec::preflight_p2p_gbs, V::number, "site: meshrun preflight's expected node-to-node GB/s each way (0 = the median)")));
  add(nonneg(field("site.preflight_allreduce_gbs", &JobConfig::site, &SiteSpec::preflight_allreduce_gbs, V::number, "site: meshrun preflight's expected all-reduce bus GB/s (0 = none)")));

  add(field("planner.calibration", &JobConfig::planner, &PlannerSpec::calibration, V::string, "planner: calibration file (meshrun plan --calibrate) with the device's figures and fitted constants"));
  {
    Field x = field("planner.expert_imbalance", &JobConfig::planner, &PlannerSpec::expert_imbalance, V::number, "planner: MoE routed rows of the busiest EP rank over a balanced rank's (meshrun-train's expert_rank_imbalance)");
    x.min_number = 1;
    add(std::move(x));
  }
  return f;
}

const std::vector<Field>& schema() {
  static const std::vector<Field> s = make_schema();
  return s;
}

const Field* find_field(std::string_view key) {
  for (const auto& f : schema())
    if (f.info.key == key) return &f;
  return nullptr;
}

const std::vector<std::string>& sections() {
  static const std::vector<std::string> s{"job",  "cluster",    "model", "parallel", "training",
                                          "data", "checkpoint", "env",   "site", "planner"};
  return s;
}

size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j)
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

std::string nearest(std::string_view wrong, const std::vector<std::string>& candidates) {
  std::string best;
  size_t best_d = SIZE_MAX;
  for (const auto& c : candidates) {
    size_t d = edit_distance(wrong, c);
    if (d < best_d) best_d = d, best = c;
  }
  size_t limit = std::max<size_t>(2, wrong.size() / 3);
  return best_d <= limit ? best : "";
}

std::string type_name(ValueType t) {
  switch (t) {
    case ValueType::integer: return "an integer";
    case ValueType::number: return "a number";
    case ValueType::string: return "a string";
    case ValueType::boolean: return "true or false";
    case ValueType::int_or_auto: return "an integer or \"auto\"";
    case ValueType::table: return "a table";
    case ValueType::blend: return "a path or an array of [weight, path] pairs";
  }
  return "?";
}

std::string example(const Field& f) {
  std::string name = f.info.key.substr(f.info.key.find('.') + 1);
  switch (f.info.type) {
    case ValueType::integer: return name + " = 8";
    case ValueType::number: return name + " = 0.5";
    case ValueType::string: return name + " = \"" + (f.choices.empty() ? "text" : f.choices.front()) + "\"";
    case ValueType::boolean: return name + " = true";
    case ValueType::int_or_auto: return name + " = \"auto\"";
    case ValueType::table: return "[" + name + "]";
    case ValueType::blend: return name + " = [[0.7, \"data/web\"], [0.3, \"data/code\"]]";
  }
  return name;
}

std::string join(const std::vector<std::string>& xs) {
  std::string s;
  for (const auto& x : xs) s += (s.empty() ? "" : ", ") + x;
  return s;
}

// A blend as TOML text (weights in their shortest exact form), "" when empty: what --set reads back.
std::string blend_text(const std::vector<BlendEntry>& entries) {
  if (entries.empty()) return "";
  std::string out = "[";
  for (const BlendEntry& e : entries) {
    char num[32];
    const auto r = std::to_chars(num, num + sizeof num, e.weight);
    std::string path;
    for (char c : e.path) path += c == '"' || c == '\\' ? std::string("\\") + c : std::string(1, c);
    out += (out.size() > 1 ? ", [" : "[") + std::string(num, r.ptr) + ", \"" + path + "\"]";
  }
  return out + "]";
}

// A parsed scalar, independent of where it came from (TOML node or command-line text).
struct Scalar {
  enum Kind { integer, number, string, boolean, list } kind = string;
  int64_t i = 0;
  double d = 0;
  std::string s;
  bool b = false;
  std::vector<BlendEntry> entries;  // list: [[weight, path], ...]
  static Scalar of_int(int64_t v) { Scalar x; x.kind = integer; x.i = v; return x; }
  static Scalar of_number(double v) { Scalar x; x.kind = number; x.d = v; return x; }
  static Scalar of_string(std::string v) { Scalar x; x.kind = string; x.s = std::move(v); return x; }
  static Scalar of_bool(bool v) { Scalar x; x.kind = boolean; x.b = v; return x; }
  static Scalar of_list(std::vector<BlendEntry> v) { Scalar x; x.kind = list; x.entries = std::move(v); return x; }
  std::string shown() const {
    switch (kind) {
      case integer: return std::to_string(i);
      case number: { std::ostringstream o; o << d; return o.str(); }
      case string: return "\"" + s + "\"";
      case boolean: return b ? "true" : "false";
      case list: return blend_text(entries);
    }
    return "";
  }
};

// [[weight, path], ...] of a TOML array; "" or what is wrong with element i (`where` its location).
std::string blend_from_toml(const toml::array& a, std::vector<BlendEntry>* out, toml::source_region* where) {
  out->clear();
  for (std::size_t i = 0; i < a.size(); ++i) {
    const toml::array* pair = a[i].as_array();
    const toml::node* w = pair && pair->size() == 2 ? pair->get(0) : nullptr;
    const toml::node* path = pair && pair->size() == 2 ? pair->get(1) : nullptr;
    double weight = 0;
    if (w && w->as_integer()) weight = static_cast<double>(w->as_integer()->get());
    else if (w && w->as_floating_point()) weight = w->as_floating_point()->get();
    else w = nullptr;
    if (!w || !path || !path->as_string()) {
      *where = a[i].source();
      return "element " + std::to_string(i) + " is not a [weight, path] pair; write e.g. [[0.7, \"data/web\"], [0.3, \"data/code\"]]";
    }
    out->push_back({weight, path->as_string()->get()});
  }
  return "";
}

// Stores `v` into field `f` of `job`; returns an error message (without location) or "".
std::string store(JobConfig& job, const Field& f, const Scalar& v) {
  const std::string& key = f.info.key;
  auto wrong_type = [&]() {
    std::string fix = example(f);
    // A number written in quotes: show the user's own value without them.
    int64_t n;
    if (v.kind == Scalar::string && (f.info.type == ValueType::integer || f.info.type == ValueType::int_or_auto)) {
      auto r = std::from_chars(v.s.data(), v.s.data() + v.s.size(), n);
      if (r.ec == std::errc() && r.ptr == v.s.data() + v.s.size())
        fix = key.substr(key.find('.') + 1) + " = " + v.s;
    }
    return key + " must be " + type_name(f.info.type) + ", got " + v.shown() + "; write " + fix;
  };
  void* p = f.ptr(job);
  switch (f.info.type) {
    case ValueType::integer:
    case ValueType::int_or_auto: {
      int64_t val;
      if (v.kind == Scalar::integer) {
        val = v.i;
      } else if (f.info.type == ValueType::int_or_auto && v.kind == Scalar::string && v.s == "auto") {
        *static_cast<int*>(p) = 0;
        return "";
      } else {
        return wrong_type();
      }
      if (val < f.min)
        return key + " = " + std::to_string(val) + " must be at least " + std::to_string(f.min) +
               (f.info.type == ValueType::int_or_auto ? " (or \"auto\")" : "") +
               (f.min == 1 && key.rfind("parallel.", 0) == 0 ? "; use 1 to leave the axis unused"
                                                             : "; use " + std::to_string(f.min) + " or more");
      if (val > f.max)
        return key + " = " + std::to_string(val) + " is larger than " + std::to_string(f.max) +
               ", the most meshrun accepts (docs/mesh.md, Limits); use at most " + std::to_string(f.max);
      if (key == "model.vocab") {
        *static_cast<int64_t*>(p) = val;
      } else if (key == "training.seed") {
        *static_cast<uint64_t*>(p) = static_cast<uint64_t>(val);
      } else {
        *static_cast<int*>(p) = static_cast<int>(val);
      }
      return "";
    }
    case ValueType::number: {
      double val;
      if (v.kind == Scalar::number) val = v.d;
      else if (v.kind == Scalar::integer) val = static_cast<double>(v.i);
      else return wrong_type();
      if (!std::isfinite(val) || val < f.min_number) {
        char floor[32];
        std::snprintf(floor, sizeof floor, "%g", f.min_number == -HUGE_VAL ? 0.0 : f.min_number);
        return key + " = " + v.shown() + " must be a finite number ≥ " + floor;
      }
      *static_cast<double*>(p) = val;
      return "";
    }
    case ValueType::string: {
      if (v.kind != Scalar::string) return wrong_type();
      if (!f.choices.empty() && std::find(f.choices.begin(), f.choices.end(), v.s) == f.choices.end()) {
        std::string near = nearest(v.s, f.choices);
        return key + " = \"" + v.s + "\" is not one of " + join(f.choices) +
               (near.empty() ? "" : "; did you mean \"" + near + "\"?");
      }
      if (f.check) {
        std::string why = f.check(v.s);
        if (!why.empty()) return key + ": " + why;
      }
      *static_cast<std::string*>(p) = v.s;
      return "";
    }
    case ValueType::boolean:
      if (v.kind != Scalar::boolean) return wrong_type();
      *static_cast<bool*>(p) = v.b;
      return "";
    case ValueType::table:
      return wrong_type();
    case ValueType::blend: {
      auto& out = *static_cast<std::vector<BlendEntry>*>(p);
      if (v.kind == Scalar::list) out = v.entries;
      else if (v.kind == Scalar::string) out = v.s.empty() ? std::vector<BlendEntry>{} : std::vector<BlendEntry>{{1.0, v.s}};
      else return wrong_type();
      return "";
    }
  }
  return "";
}

std::string location(const std::string& file, const toml::source_region& r) {
  return file + ":" + std::to_string(r.begin.line) + ":" + std::to_string(r.begin.column);
}

// Other trainers' names for meshrun's keys (Megatron-LM, Hugging Face, torchtitan), which no edit distance finds.
std::string alias_of(std::string_view name) {
  static const std::pair<std::string_view, std::string_view> kAliases[] = {
      {"learning_rate", "training.lr"},        {"min_learning_rate", "training.min_lr"},
      {"num_layers", "model.layers"},          {"num_hidden_layers", "model.layers"},
      {"n_layers", "model.layers"},            {"hidden_size", "model.hidden"},
      {"dim", "model.hidden"},                 {"ffn_hidden_size", "model.ffn_hidden"},
      {"intermediate_size", "model.ffn_hidden"}, {"num_attention_heads", "model.heads"},
      {"n_heads", "model.heads"},              {"num_key_value_heads", "model.kv_heads"},
      {"num_query_groups", "model.kv_heads"},  {"n_kv_heads", "model.kv_heads"},
      {"vocab_size", "model.vocab"},           {"num_experts", "model.experts"},
      {"seq_length", "training.seq_len"},      {"max_position_embeddings", "training.seq_len"},
      {"train_iters", "training.steps"},       {"max_steps", "training.steps"},
      {"global_batch", "training.global_batch_size"}, {"micro_batch", "training.micro_batch_size"},
      {"clip_grad", "training.grad_clip"},     {"max_norm", "training.grad_clip"},
      {"tensor_model_parallel_size", "parallel.tp"}, {"pipeline_model_parallel_size", "parallel.pp"},
      {"context_parallel_size", "parallel.cp"}, {"expert_model_parallel_size", "parallel.ep"},
      {"data_path", "data.path"},              {"tokenizer_model", "data.tokenizer"},
  };
  for (const auto& [a, key] : kAliases)
    if (a == name) return std::string(key);
  return "";
}

std::string unknown_key_message(std::string_view section, std::string_view name) {
  std::vector<std::string> in_section;
  std::string elsewhere;  // the same name in another section ("tp" under [model])
  if (std::string alias = alias_of(name); !alias.empty())
    return "unknown key '" + std::string(name) + "' in [" + std::string(section) + "]; did you mean '" +
           (alias.rfind(std::string(section) + ".", 0) == 0 ? alias.substr(section.size() + 1) : alias) + "'?";
  for (const auto& f : schema()) {
    std::string_view sec = std::string_view(f.info.key).substr(0, f.info.key.find('.'));
    std::string_view key = std::string_view(f.info.key).substr(f.info.key.find('.') + 1);
    if (sec == section) in_section.emplace_back(key);
    else if (key == name) elsewhere = f.info.key;
  }
  std::string msg = "unknown key '" + std::string(name) + "' in [" + std::string(section) + "]";
  if (!elsewhere.empty()) return msg + "; did you mean '" + elsewhere + "'?";
  std::string near = nearest(name, in_section);
  if (!near.empty()) return msg + "; did you mean '" + near + "'?";
  return msg + "; valid keys: " + join(in_section);
}

std::string site_only_message() {
  return "[site] policy can only be set in the site file (/etc/meshrun/site.toml or $MESHRUN_SITE_CONFIG); "
         "a job cannot change what the site allows";
}

// Every problem of the file is reported, one located line each ("t.toml:3:1: unknown key 'layer' in [model];
// did you mean 'layers'?"), not only the first; the file is applied only when it has none.
void apply_table(Config& cfg, const toml::table& root, const std::string& file, SourceKind kind) {
  Config next = cfg;
  // (line, column, message): reported in the file's order (the TOML tables iterate by key).
  std::vector<std::tuple<uint32_t, uint32_t, std::string>> found;
  auto problem = [&](const std::string& line) {
    uint32_t l = 0, c = 0;  // parsed back from the "file:line:col: " the message starts with
    if (line.rfind(file + ":", 0) == 0) std::sscanf(line.c_str() + file.size() + 1, "%u:%u", &l, &c);
    found.emplace_back(l, c, line);
  };
  for (auto&& [k, node] : root) {
    std::string section(k.str());
    std::string where = location(file, k.source());
    if (std::find(sections().begin(), sections().end(), section) == sections().end()) {
      std::string near = nearest(section, sections());
      problem(where + ": unknown section [" + section + "]" +
              (near.empty() ? "; sections are " + join(sections()) : "; did you mean [" + near + "]?"));
      continue;
    }
    const toml::table* tbl = node.as_table();
    if (!tbl) {
      problem(where + ": '" + section + "' must be a table; write [" + section + "] on its own line");
      continue;
    }
    if (section == "site" && kind != SourceKind::site) {
      problem(where + ": " + site_only_message());
      continue;
    }
    for (auto&& [kk, vnode] : *tbl) {
      std::string name(kk.str());
      std::string vwhere = location(file, vnode.source());
      Scalar v;
      if (auto x = vnode.as_integer()) v = Scalar::of_int(x->get());
      else if (auto y = vnode.as_floating_point()) v = Scalar::of_number(y->get());
      else if (auto z = vnode.as_string()) v = Scalar::of_string(z->get());
      else if (auto b = vnode.as_boolean()) v = Scalar::of_bool(b->get());
      else if (const Field* bf = find_field(section + "." + name); bf && bf->info.type == ValueType::blend && vnode.as_array()) {
        std::vector<BlendEntry> entries;
        toml::source_region at;
        if (std::string why = blend_from_toml(*vnode.as_array(), &entries, &at); !why.empty()) {
          problem(location(file, at) + ": " + bf->info.key + ": " + why);
          continue;
        }
        v = Scalar::of_list(std::move(entries));
      } else {
        if (section == "env") {
          problem(vwhere + ": env." + name + " must be a string; write " + name + " = \"value\"");
          continue;
        }
        const Field* f = find_field(section + "." + name);
        if (!f) {
          problem(location(file, kk.source()) + ": " + unknown_key_message(section, name));
          continue;
        }
        problem(vwhere + ": " + f->info.key + " must be " + type_name(f->info.type) +
                ", got a " + (vnode.is_table() ? "table" : vnode.is_array() ? "array" : "date/time") +
                "; write " + example(*f));
        continue;
      }
      if (section == "env") {
        if (v.kind != Scalar::string) {
          problem(vwhere + ": env." + name + " must be a string; write " + name + " = \"" +
                  (v.kind == Scalar::integer ? std::to_string(v.i) : v.shown()) + "\"");
          continue;
        }
        next.job.env[name] = v.s;
        next.origins["env." + name] = Origin{kind, vwhere};
        continue;
      }
      const Field* f = find_field(section + "." + name);
      if (!f) {
        problem(location(file, kk.source()) + ": " + unknown_key_message(section, name));
        continue;
      }
      std::string err = store(next.job, *f, v);
      if (!err.empty()) {
        problem(vwhere + ": " + err);
        continue;
      }
      next.origins[f->info.key] = Origin{kind, vwhere};
    }
  }
  if (!found.empty()) {
    std::stable_sort(found.begin(), found.end(), [](const auto& a, const auto& b) {
      return std::tie(std::get<0>(a), std::get<1>(a)) < std::tie(std::get<0>(b), std::get<1>(b));
    });
    // At most kMaxProblems lines, so that a file of garbage gives a bounded message, not one line per key.
    constexpr size_t kMaxProblems = 8;
    std::vector<std::string> problems;
    for (size_t i = 0; i < found.size() && i < kMaxProblems; ++i) problems.push_back(std::move(std::get<2>(found[i])));
    if (found.size() > kMaxProblems)
      problems.push_back(file + ": " + std::to_string(found.size() - kMaxProblems) + " more problems not shown; fix the ones above first");
    throw ConfigError(problems);  // each line cut on its own (ConfigError), joined by '\n'
  }
  next.files.push_back(file);
  cfg = std::move(next);
}

// Parses command-line text for a field: integers, numbers, booleans by the field's type; strings raw or quoted.
Scalar scalar_from_text(const Field* f, std::string_view text) {
  std::string t(text);
  if (f && f->info.type == ValueType::blend && !t.empty() && t.front() == '[') {
    // The TOML array's own text: parsed by the TOML parser, as in a template.
    std::vector<BlendEntry> entries;
    std::string why;
    try {
      const toml::table root = toml::parse("v = " + t);
      toml::source_region at;
      if (const toml::array* a = root["v"].as_array()) why = blend_from_toml(*a, &entries, &at);
      else why = "not an array";
    } catch (const toml::parse_error& e) {
      why = std::string(e.description());
    }
    if (!why.empty())
      throw ConfigError(f->info.key + " = " + t + ": " + why + "; write e.g. [[0.7, \"data/web\"], [0.3, \"data/code\"]]");
    return Scalar::of_list(std::move(entries));
  }
  if (t.size() >= 2 && ((t.front() == '"' && t.back() == '"') || (t.front() == '\'' && t.back() == '\'')))
    return Scalar::of_string(t.substr(1, t.size() - 2));
  if (f) {
    switch (f->info.type) {
      case ValueType::integer:
      case ValueType::int_or_auto: {
        int64_t v;
        auto r = std::from_chars(t.data(), t.data() + t.size(), v);
        if (r.ec == std::errc() && r.ptr == t.data() + t.size()) return Scalar::of_int(v);
        break;
      }
      case ValueType::number: {
        char* end = nullptr;
        double d = std::strtod(t.c_str(), &end);
        if (!t.empty() && end == t.c_str() + t.size()) return Scalar::of_number(d);
        break;
      }
      case ValueType::boolean:
        if (t == "true" || t == "1" || t == "yes" || t == "on") return Scalar::of_bool(true);
        if (t == "false" || t == "0" || t == "no" || t == "off") return Scalar::of_bool(false);
        break;
      default: break;
    }
  }
  return Scalar::of_string(t);
}

}  // namespace

const char* source_kind_name(SourceKind k) {
  switch (k) {
    case SourceKind::defaults: return "default";
    case SourceKind::site: return "site";
    case SourceKind::template_file: return "template";
    case SourceKind::environment: return "environment";
    case SourceKind::flag: return "flag";
    case SourceKind::set: return "set";
  }
  return "?";
}

std::string Origin::str() const {
  return where.empty() ? source_kind_name(kind) : std::string(source_kind_name(kind)) + " " + where;
}

Origin Config::origin_of(const std::string& key) const {
  auto it = origins.find(key);
  return it == origins.end() ? Origin{} : it->second;
}

const std::vector<KeyInfo>& config_keys() {
  static const std::vector<KeyInfo> keys = [] {
    std::vector<KeyInfo> k;
    for (const auto& f : schema()) k.push_back(f.info);
    return k;
  }();
  return keys;
}

std::string suggest_key(std::string_view wrong) {
  std::vector<std::string> all;
  for (const auto& f : schema()) all.push_back(f.info.key);
  std::string near = nearest(wrong, all);
  if (near.empty()) {
    auto dot = wrong.find('.');
    if (dot != std::string_view::npos) {
      std::string_view name = wrong.substr(dot + 1);
      for (const auto& k : all)
        if (k.substr(k.find('.') + 1) == name) return k;
    }
  }
  return near;
}

// An unknown section.name of --set (or a flag): the suggestions a template gets for the same key.
std::string unknown_set_key_message(const std::string& key) {
  const std::string msg = "unknown key '" + key + "'";
  const size_t dot = key.find('.');
  if (dot == std::string::npos || dot == 0) {
    if (std::string alias = alias_of(key); !alias.empty()) return msg + "; did you mean '" + alias + "'?";
    if (std::string near = suggest_key(key); !near.empty()) return msg + "; did you mean '" + near + "'?";
    return msg + "; keys are section.name, e.g. parallel.tp";
  }
  const std::string section = key.substr(0, dot), name = key.substr(dot + 1);
  if (std::find(sections().begin(), sections().end(), section) == sections().end()) {
    if (std::string alias = alias_of(name); !alias.empty()) return msg + "; did you mean '" + alias + "'?";
    if (std::string near = suggest_key(key); !near.empty()) return msg + "; did you mean '" + near + "'?";
    const std::string near = nearest(section, sections());
    return msg + ": no section [" + section + "]" +
           (near.empty() ? "; sections are " + join(sections()) : "; did you mean '" + near + "." + name + "'?");
  }
  // unknown_key_message's candidates for the section: a key of that name elsewhere, else the section's keys.
  const std::string in_file = unknown_key_message(section, name);
  const std::string head = "unknown key '" + name + "' in [" + section + "]";
  std::string rest = in_file.substr(head.size());
  if (rest.rfind("; did you mean '", 0) == 0) {
    const std::string cand = rest.substr(16, rest.size() - 16 - 2);
    return msg + "; did you mean '" + (cand.find('.') == std::string::npos ? section + "." + cand : cand) + "'?";
  }
  return msg + rest;  // "; valid keys: ..."
}

void apply_toml_text(Config& cfg, std::string_view text, const std::string& source_name, SourceKind kind) {
  toml::table root;
  try {
    root = toml::parse(text, source_name);
  } catch (const toml::parse_error& e) {
    throw ConfigError(location(source_name, e.source()) + ": TOML syntax error: " + std::string(e.description()) +
                      "; fix the line (see https://toml.io for the syntax)");
  }
  apply_table(cfg, root, source_name, kind);
}

void apply_toml_file(Config& cfg, const std::string& path, SourceKind kind) {
  // A regular file of at most 1 MiB: /dev/zero or a FIFO must not hang or exhaust a login node.
  std::string text, error;
  if (!read_bounded_file(path, kTemplateFileLimit, kind == SourceKind::site ? "site file" : "template", &text, &error))
    throw ConfigError(error);
  apply_toml_text(cfg, text, path, kind);
}

void apply_int(Config& cfg, const std::string& key, int64_t value, const Origin& origin) {
  std::string prefix = origin.where.empty() ? key : origin.where;
  if (key.rfind("site.", 0) == 0 && origin.kind != SourceKind::site) throw ConfigError(prefix + ": " + site_only_message());
  const Field* f = find_field(key);
  if (!f) throw ConfigError(prefix + ": " + unknown_set_key_message(key));
  JobConfig next = cfg.job;
  std::string err = store(next, *f, Scalar::of_int(value));
  if (!err.empty()) throw ConfigError(prefix + ": " + err);
  cfg.job = std::move(next);
  cfg.origins[key] = origin;
}

void apply_value(Config& cfg, const std::string& key, std::string_view value, const Origin& origin) {
  std::string prefix = origin.where.empty() ? key : origin.where;
  if (key.rfind("env.", 0) == 0 && key.size() > 4) {
    cfg.job.env[key.substr(4)] = std::string(scalar_from_text(nullptr, value).s);
    cfg.origins[key] = origin;
    return;
  }
  if (key.rfind("site.", 0) == 0 && origin.kind != SourceKind::site) throw ConfigError(prefix + ": " + site_only_message());
  const Field* f = find_field(key);
  if (!f) throw ConfigError(prefix + ": " + unknown_set_key_message(key));
  JobConfig next = cfg.job;
  Scalar parsed;
  try {
    parsed = scalar_from_text(f, value);
  } catch (const ConfigError& e) {
    throw ConfigError(prefix + ": " + e.what());
  }
  std::string err = store(next, *f, parsed);
  if (!err.empty()) throw ConfigError(prefix + ": " + err);
  cfg.job = std::move(next);
  cfg.origins[key] = origin;
}

void apply_set(Config& cfg, std::string_view assignment, SourceKind kind, const std::string& where) {
  std::string what = where.empty() ? "--set " + std::string(assignment) : where;
  auto eq = assignment.find('=');
  if (eq == std::string_view::npos || eq == 0)
    throw ConfigError(what + ": expected section.key=value, e.g. --set parallel.tp=4");
  std::string key(assignment.substr(0, eq));
  apply_value(cfg, key, assignment.substr(eq + 1), Origin{kind, what});
}

std::string value_text(const JobConfig& job, const std::string& key) {
  if (key.rfind("env.", 0) == 0) {
    auto it = job.env.find(key.substr(4));
    return it == job.env.end() ? "" : it->second;
  }
  const Field* f = find_field(key);
  if (!f) return "";
  JobConfig& j = const_cast<JobConfig&>(job);  // ptr() is shared by readers and writers; nothing is written here
  void* p = f->ptr(j);
  switch (f->info.type) {
    case ValueType::int_or_auto: {
      int v = *static_cast<int*>(p);
      return v == 0 ? "auto" : std::to_string(v);
    }
    case ValueType::integer:
      if (key == "model.vocab") return std::to_string(*static_cast<int64_t*>(p));
      if (key == "training.seed") return std::to_string(*static_cast<uint64_t*>(p));
      return std::to_string(*static_cast<int*>(p));
    case ValueType::number: {
      std::ostringstream o;
      o << *static_cast<double*>(p);
      return o.str();
    }
    case ValueType::string: return *static_cast<std::string*>(p);
    case ValueType::boolean: return *static_cast<bool*>(p) ? "true" : "false";
    case ValueType::table: return "";
    case ValueType::blend: return blend_text(*static_cast<std::vector<BlendEntry>*>(p));
  }
  return "";
}

Config load_template(const std::string& path) {
  Config cfg;
  apply_toml_file(cfg, path, SourceKind::template_file);
  return cfg;
}

Config build_config(const ConfigRequest& r) {
  Config cfg;
  if (r.use_site) {
    std::string site = r.site_path;
    bool explicit_site = !site.empty();
    if (site.empty() && r.environment) {
      auto it = r.environment->find("MESHRUN_SITE_CONFIG");
      if (it != r.environment->end() && !it->second.empty()) site = it->second, explicit_site = true;
    }
    std::error_code ec;
    if (site.empty() && std::filesystem::exists("/etc/meshrun/site.toml", ec)) site = "/etc/meshrun/site.toml";
    if (!site.empty()) {
      if (explicit_site && !std::filesystem::exists(site, ec))
        throw ConfigError(site + ": site file not found (from MESHRUN_SITE_CONFIG or --site); fix the path or unset it");
      apply_toml_file(cfg, site, SourceKind::site);
    }
  }
  if (!r.template_path.empty()) apply_toml_file(cfg, r.template_path, SourceKind::template_file);
  if (r.environment) apply_environment(cfg, *r.environment);
  for (const auto& f : r.flags) apply_value(cfg, f.key, f.value, Origin{SourceKind::flag, f.flag + "=" + f.value});
  for (const auto& s : r.sets) apply_set(cfg, s);
  check_limits(cfg);
  return cfg;
}

void check_limits(const Config& cfg) {
  const JobConfig& j = cfg.job;
  // A product of keys against a limit; the error sits at the largest factor's origin, where the fix likely is.
  auto check = [&](std::initializer_list<std::pair<const char*, int64_t>> factors, int64_t limit,
                   const std::string& what) {
    std::vector<int64_t> values;
    std::string names, shown;
    const char* largest = factors.begin()->first;
    int64_t largest_value = 0;
    for (const auto& [key, v] : factors) {
      values.push_back(v);
      names += (names.empty() ? "" : " × ") + std::string(key);
      shown += (shown.empty() ? "" : " × ") + std::to_string(v);
      if (v > largest_value) largest = key, largest_value = v;
    }
    int64_t p = 1;
    for (int64_t v : values) p = limits::product({p, v});
    if (p <= limit) return;
    std::string where = cfg.origin_of(largest).where;
    throw ConfigError((where.empty() ? "" : where + ": ") + names + " = " + shown + " = " +
                      (p == INT64_MAX ? "more than 2^63" : std::to_string(p)) + " " + what + " is more than " +
                      std::to_string(limit) + ", the most meshrun accepts (docs/mesh.md, Limits); make " + largest +
                      " smaller");
  };
  const LayoutSpec& l = j.parallel;
  check({{"parallel.tp", l.tp}, {"parallel.cp", l.cp}, {"parallel.pp", l.pp}, {"parallel.dp", std::max(l.dp, 1)}},
        limits::kWorld, "ranks");
  check({{"parallel.pp", l.pp}, {"parallel.virtual_stages", l.virtual_stages}}, limits::kLayers, "pipeline chunks");
  const NodeType* type = find_node_type(j.cluster.node_type);
  const int64_t gpus = j.cluster.gpus_per_node > 0 ? j.cluster.gpus_per_node : type ? type->gpus_per_node : 1;
  check({{"cluster.nodes", std::max(j.cluster.nodes, 1)}, {"cluster.gpus_per_node", gpus}}, limits::kWorld, "GPUs");
}

std::map<std::string, std::string> environment_map(char** envp) {
  std::map<std::string, std::string> m;
  for (char** e = envp; e && *e; ++e) {
    std::string_view kv(*e);
    auto eq = kv.find('=');
    if (eq != std::string_view::npos) m.emplace(std::string(kv.substr(0, eq)), std::string(kv.substr(eq + 1)));
  }
  return m;
}

}  // namespace meshrun
