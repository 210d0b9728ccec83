// The job description every part of meshrun reads: model, layout, cluster, training.
// Plain values with defaults; templates (template.hpp) fill them, nothing here does I/O.
#pragma once
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace meshrun {

// Parallel axes. The order string names all five; the leftmost varies fastest.
enum class Axis { tp, cp, ep, dp, pp };
inline constexpr int kAxes = 5;
const char* axis_name(Axis a);

struct ModelSpec {
  std::string name = "model";
  int layers = 2;
  int hidden = 64;
  int ffn_hidden = 256;
  int heads = 4;
  int kv_heads = 4;          // GQA: kv_heads divides heads
  int64_t vocab = 256;
  std::string mlp = "swiglu";  // "swiglu" | "gelu"
  bool tied_embeddings = false;
  int experts = 0;           // 0 = dense
  int top_k = 1;
  int moe_ffn_hidden = 0;    // 0 = ffn_hidden
  // MoE load-balancing loss: "meshrun" (per layer E·Σᵢ fᵢ·Pᵢ with fᵢ the share of the k·T assignments,
  // summed over layers; default 0.01) or "hf" (Hugging Face Mixtral's load_balancing_loss_func: fᵢ, Pᵢ
  // pooled over all layers' router outputs, fᵢ summed over the k slots; HF's default 0.001). docs/trainer.md.
  std::string router_aux = "meshrun";
  double router_aux_loss_coef = -1;  // weight; -1 (unset) = router_aux's default above
  double aux_loss_coef() const { return router_aux_loss_coef >= 0 ? router_aux_loss_coef : router_aux == "hf" ? 0.001 : 0.01; }
  double rope_theta = 10000.0;
  double norm_eps = 1e-5;
  int head_dim() const { return hidden / heads; }
  int64_t q_dim() const { return int64_t(heads) * head_dim(); }
  int64_t kv_dim() const { return int64_t(kv_heads) * head_dim(); }
  bool gated() const { return mlp != "gelu"; }  // swiglu: gate, up and down projections
  int64_t expert_ffn() const { return moe_ffn_hidden > 0 ? moe_ffn_hidden : ffn_hidden; }
};

struct LayoutSpec {
  int tp = 1, cp = 1, pp = 1, ep = 1;
  int dp = 0;                // 0 = "auto": world / (tp·cp·pp)
  std::string order = "tp-cp-ep-dp-pp";
  int virtual_stages = 1;    // interleaved pipeline chunks per rank (zbv, dualpipev: 1 or 2, run as 2)
  int zero_stage = 0;        // 0..3
  bool sequence_parallel = false;
  std::string pipeline_schedule = "1f1b";  // gpipe | 1f1b | interleaved | zb | zbv | dualpipev
  std::string cp_comm = "ring";            // context-parallel attention: ring | allgather (Llama 3's) | alltoall
                                           // (Ulysses) | alltoall+ring (Megatron's a2a+p2p)
  int cp_alltoall = 0;                     // alltoall+ring: CP ranks per all-to-all group (0 = unset)
};

struct ClusterSpec {
  int nodes = 0;                      // 0 = the hostlist's length, else 1
  int gpus_per_node = 0;              // 0 = from node_type
  std::string node_type = "generic";  // dgx-h100 | dgx-h200 | dgx-a100 | gb200-nvl72 | generic
  int nvlink_domain_gpus = 0;         // 0 = from node_type (generic: 1 = no NVLink)
  std::string hostlist;               // Slurm hostlist, e.g. "node[001-128]"; empty = node0000..
  // Hardware facts for the planner; 0 / empty = take them from the node type's catalogue entry.
  std::string gpu;                    // GPU model ("h100-sxm", "h200", "a100-80gb", "b200", "gb200")
  double gpu_memory_gib = 0;
  double gpu_bf16_tflops = 0;         // dense peak
  int gpu_sms = 0;                    // streaming multiprocessors (GEMM wave quantization)
  double nvlink_gbps = 0;             // GB/s per GPU per direction
  int nics_per_node = 0;
  double nic_gbps = 0;                // Gbit/s per NIC
};

struct TrainingSpec {
  int seq_len = 128;
  int global_batch_size = 8;          // sequences per optimizer step
  int micro_batch_size = 1;           // sequences per micro-batch per DP rank
  int steps = 10;
  double lr = 3e-4;
  double min_lr = 0.0;
  int warmup_steps = 0;
  int lr_decay_steps = 0;             // the schedule's horizon (warmup + decay); 0 = steps. Set it to extend a run.
  int decay_horizon() const { return lr_decay_steps > 0 ? lr_decay_steps : steps; }
  double weight_decay = 0.1;
  double beta1 = 0.9, beta2 = 0.95, adam_eps = 1e-8;
  double grad_clip = 1.0;             // 0 = off
  uint64_t seed = 1234;
  std::string recompute = "none";     // none | selective | full (planner)
  std::string dtype = "fp32";         // trainer dtype on CPU: fp32 | fp64 | bf16 (mixed, as the CUDA backend)
  std::string device = "cpu";         // kernel backend: cpu | cuda (docs/gpu.md)
  // Mixed-precision dtypes the planner assumes for GPU runs (bytes per element from the name); the CUDA
  // backend stores what they say (docs/gpu.md), the CPU backend computes everything in `dtype`.
  std::string param_dtype = "bf16";
  std::string grad_dtype = "fp32";
  std::string optim_dtype = "fp32";   // master weights and both Adam moments
  // meshrun-train's straggler report: every straggler_interval steps (0 = off) the ranks compare their
  // compute time (step time minus communication waits); one more than straggler_margin above the median is named.
  int straggler_interval = 10;
  double straggler_margin = 0.3;
  int eval_interval = 0;              // steps between validation losses on data.valid (0 = off)
  int eval_batches = 1;               // global batches of data.valid per evaluation
};

// One dataset of a blend: a token file or Megatron indexed dataset (as data.path) and its weight.
struct BlendEntry {
  double weight = 0;
  std::string path;
  bool operator==(const BlendEntry&) const = default;
};

struct DataSpec {
  std::string path;                   // input only: raw token file (.bin), or a Megatron indexed dataset (PREFIX[.bin|.idx])
  std::string token_dtype = "uint16"; // uint16 | uint32 (raw files; indexed datasets name their own)
  bool shuffle = false;
  std::string text;                   // optional UTF-8 corpus to tokenize (used when data.path and data.blend are empty)
  std::string text_cache;             // the token file data.text is tokenized into when missing ("" = the cache
                                      // directory's text-<hash>.<dtype>.bin)
  std::string tokenizer;              // tokenizer.json, SentencePiece .model or model directory: tokenizes data.text
                                      // (else byte-level); recorded in checkpoints for export and sample
  std::vector<BlendEntry> blend;      // [[weight, path], ...]: datasets mixed by weight (instead of path)
  std::vector<BlendEntry> valid;      // validation data: a path (one entry, weight 1) or a blend
  // Megatron-LM's --split: "train,valid[,test]" weights (e.g. "969,30,1") cutting every dataset of data.path or
  // data.blend into consecutive parts: training reads the first, evaluation the second (instead of data.valid),
  // the third is held out. "" = no split.
  std::string split;
};

struct CheckpointSpec {
  std::string dir;
  int interval = 0;                   // steps; 0 = only on signal / at end
  int keep = 2;                       // complete checkpoints kept in dir (older ones are removed)
  bool resume = true;
  std::string signal = "USR1";
  int signal_lead_s = 120;
  std::string load;                   // safetensors file or Hugging Face model directory to start from
  std::string save;                   // safetensors file to write at the end
  // A meshrun checkpoint (a checkpoint.dir, its `latest` taken, or one step-N) whose parameters start a new
  // run at step 0, with fresh AdamW moments and data position (Megatron's --finetune). Resume still wins.
  std::string finetune;
  std::string on_error = "continue";  // a failed periodic save: continue (keep the previous checkpoint) or stop
  int max_failures = 3;               // consecutive failed saves that end the run even with on_error = continue
  bool async = false;                 // write shards in the background; the step stalls only for the host copy
};

struct JobSpec {
  std::string name = "meshrun";
  std::string time = "01:00:00";
  std::string partition, account, qos;
  std::string output_dir;  // the run's directory for meshrun-train's metrics (else checkpoint.dir's)
  // The program that trains this template: "meshrun" (meshrun-train, what `meshrun run` starts), "megatron"
  // or "torchtitan". It picks the rules the job is held to (rules_for_job, layout.hpp) and, for a framework,
  // the flags `meshrun plan` prints; meshrun-train and `meshrun run` without a command refuse a framework's.
  std::string trainer = "meshrun";
};

// The planner's inputs beyond the job itself (docs/planner.md, "Calibration").
struct PlannerSpec {
  // A calibration file (written by `meshrun plan --calibrate` or meshrun-bench-device): the device's measured
  // figures and the cost model's fitted constants. Usually set in the site file; `meshrun plan --calibration
  // FILE` sets it for one command. Empty = the catalogue's published figures (GPUs only).
  std::string calibration;
  // MoE: routed rows of the busiest EP rank over a balanced rank's (meshrun-train's expert_rank_imbalance,
  // >= 1); its expert GEMMs and all-to-all are charged for it. 1 = balanced routing.
  double expert_imbalance = 1.0;
  // The trainer's LM head is fused with the cross-entropy (meshrun-train: logits a chunk of rows at a time,
  // recomputed in the backward); false for a trainer that keeps a micro-batch's full logits until its backward
  // (Megatron's and torchtitan's default), which the estimates of their published runs use. Not a template key.
  bool fused_head = true;
};

// Site policy for task environments. Only the site file (/etc/meshrun/site.toml or $MESHRUN_SITE_CONFIG) may
// set these; a template, flag or --set that tries is refused, so a job cannot widen what the site allows.
struct SiteSpec {
  std::string nccl = "auto";           // auto | off: emit NCCL_* variables from the topology, or none
  std::string allow_env;               // extra names (or prefixes ending in '*') a template's [env] may set, comma-separated
  std::string socket_ifname;           // NCCL_SOCKET_IFNAME for every task; empty = derive from the topology
  std::string hca_scope = "node";      // node: every GPU-paired NIC of the node, the same on all its ranks;
                                       // rank: the task's paired NIC (NCCL advises against it; warned)
  std::string cpu_bind = "numa";       // numa: bind to the GPU's NUMA domain; none
  int port_base = 20000;               // MASTER_PORT range start (see docs/topology.md)
  // `meshrun preflight`'s expected figures for this site's nodes; 0 = judge each node against the allocation's
  // median instead (docs/launcher.md, "meshrun preflight").
  double preflight_gemm_gflops = 0;    // GEMM GFLOP/s per device (task)
  double preflight_p2p_gbs = 0;        // point-to-point GB/s each way between two nodes' leader ranks
  double preflight_allreduce_gbs = 0;  // all-reduce bus bandwidth (GB/s) over one rank per node
};

// Everything one template describes.
struct JobConfig {
  JobSpec job;
  ClusterSpec cluster;
  ModelSpec model;
  LayoutSpec parallel;
  TrainingSpec training;
  DataSpec data;
  CheckpointSpec checkpoint;
  SiteSpec site;
  PlannerSpec planner;
  std::map<std::string, std::string> env;   // [env]: extra variables (filtered by an allow-list)
};

}  // namespace meshrun
