// Layouts, node types, clusters and the checks that tie them to a model.
// Pure values and functions: nothing here reads files or the environment.
#pragma once
#include <array>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "meshrun/job.hpp"

namespace meshrun {

// One actionable line: what is wrong and how to fix it.
struct Problem {
  std::string check;    // short id of the check, e.g. "world-size", "heads-tp"
  std::string message;  // "<what is wrong>; <fix>"
};

// The five axes in rank order; axes[0] varies fastest. Written "tp-cp-ep-dp-pp".
struct AxisOrder {
  std::array<Axis, kAxes> axes{Axis::tp, Axis::cp, Axis::ep, Axis::dp, Axis::pp};
  std::string str() const;
  int position(Axis a) const;  // 0 = fastest
  bool operator==(const AxisOrder&) const = default;
};
// Accepts '-', ',' or ' ' as separators, any case ("TP,CP,PP,DP" is Llama 3's order; a missing ep is
// placed right after the last of cp/dp, as Megatron folds it). On failure returns nullopt and sets *error.
std::optional<AxisOrder> parse_order(std::string_view text, std::string* error);

// A layout with every size known.
struct Layout {
  int tp = 1, cp = 1, pp = 1, dp = 1, ep = 1;
  AxisOrder order;
  int virtual_stages = 1;
  int zero_stage = 0;
  bool sequence_parallel = false;
  int64_t world() const { return int64_t(tp) * cp * pp * dp; }  // 64-bit: sizes come from input
  int size(Axis a) const;  // ep's size is the expert-parallel degree (it folds into cp·dp)
};

// Hardware facts of a node type that placement needs (performance figures live in the planner).
struct NodeType {
  std::string name;
  std::string gpu;                // GPU model key, e.g. "h100-sxm"
  int gpus_per_node = 1;
  int nvlink_domain_gpus = 1;     // GPUs that share one NVLink domain (1 = no NVLink)
  int nics_per_node = 0;          // compute (GPU-facing) NICs
  bool rail_optimized = false;    // one NIC per GPU on its own rail
  std::string description;
};
const std::vector<NodeType>& node_types();
const NodeType* find_node_type(std::string_view name);

// The cluster a layout is placed on.
struct Cluster {
  int nodes = 1;
  int gpus_per_node = 8;
  int nvlink_domain_gpus = 1;
  NodeType type;
  std::vector<std::string> hosts;  // one per node
  int64_t gpus() const { return int64_t(nodes) * gpus_per_node; }  // ≤ limits::kWorld once resolved
  // NVLink domain index of a global GPU slot (node * gpus_per_node + local).
  int nvlink_domain_of(int node, int local) const;
};
// Resolves node type defaults, the NVLink domain and host names. Problems go to *problems; beyond
// meshrun/limits.hpp (nodes, GPUs per node, nodes × GPUs) it names the key and returns one node without
// host names.
Cluster resolve_cluster(const ClusterSpec& spec, std::vector<Problem>* problems);
// The CPU trainer's allocation: one shared-memory node ("generic") holding all `ranks`.
ClusterSpec single_node_spec(int ranks);

// Resolves "auto" (dp = 0) and parses the order. world = the number of GPUs (ranks) the job gets. Refuses
// (nullopt + a problem) a world or tp·cp·pp·dp beyond limits::kWorld and pp·virtual_stages beyond
// limits::kLayers, so a resolved layout's products all fit an int.
std::optional<Layout> resolve_layout(const LayoutSpec& spec, int64_t world, std::vector<Problem>* problems);

// Layer placement over pipeline chunks (pp · virtual_stages of them): even, or Llama 3's split where the
// first and last chunks hold one layer fewer (room for the embedding and the output head).
// nullopt when no split exists, including chunks > layers + 2 and layers > limits::kLayers (so the vector
// stays small whatever the input).
std::optional<std::vector<int>> chunk_layers(int layers, int chunks);

// The divisors of n (n ≥ 1) that are ≤ limit, ascending; O(√n) steps.
std::vector<int64_t> divisors_up_to(int64_t n, int64_t limit);

// Every check of a layout against model, training setup and cluster. Empty = valid. Expects a layout from
// resolve_layout and a cluster from resolve_cluster; throws nothing but std::bad_alloc.
// `checks_run` (optional) receives the name of every check performed, for the dry run's "checks passed".
std::vector<Problem> validate(const JobConfig& cfg, const Layout& layout, const Cluster& cluster,
                              std::vector<std::string>* checks_run = nullptr);

// Whether validate()'s check `name` concerns the layout and the allocation only (no model or batch facts):
// the rules any program's job is held to. A job without a template (plugin flags, `meshrun plan` with
// flags only) gets these alone; a template's [model] and [training] add the rest.
bool is_layout_rule(std::string_view name);

// The bundled trainer's own rules (meshrun-train builds Llama-style models: RoPE needs an even head dimension,
// expert MLPs are tensor-parallel, the MLP is SwiGLU, the LM head untied, known CP and pipeline schedules):
// added to validate()'s for every job that names a template (its [model] is the one meshrun-train trains) —
// `meshrun plan`, `sbatch`, `run`, `exec`, the plugin with --mesh-template, and meshrun-train itself — so
// whatever the dry run accepts, the trainer runs. `meshrun plan --for megatron|torchtitan` leaves them out.
// Check ids (is_trainer_rule): rope-head-dim, expert-width-tp, trainer-mlp, trainer-tied-embeddings, cp-comm,
// pipeline-schedule, router-aux-pp (router_aux = "hf" pools over layers: pp = 1), recompute-experts (no full
// recomputation of expert layers), cp-alltoall (cp_alltoall's group for alltoall+ring; heads and kv heads per
// rank divisible by the all-to-all group), data-source, data-blend, eval-valid.
// Context parallelism's all-to-all group (parallel.cp_comm): 1 for "ring" and "allgather", cp for
// "alltoall", parallel.cp_alltoall for "alltoall+ring". cp_alltoall_fits: whether it divides cp (under
// alltoall+ring from 2 to cp/2) and the rank's heads and kv heads (rule cp-alltoall; always at cp 1).
int cp_alltoall_group(const LayoutSpec& spec, int cp);
bool cp_alltoall_fits(const LayoutSpec& spec, int cp, int heads_per_tp, int kv_heads_per_tp);
// Where CP rank `cp_index` sits when the all-to-all group has `group` ranks: its group is the consecutive CP
// ranks [first, first + group) (Megatron's level-1 groups too), and the ring runs across the cp/group groups
// among the ranks with the same place in theirs (prev, next: CP indices). group 1: the plain ring.
struct CpAlltoallPlace {
  int first, prev, next;
};
CpAlltoallPlace cp_alltoall_place(int cp, int group, int cp_index);
std::vector<Problem> validate_trainer(const JobConfig& cfg, const Layout& layout,
                                      std::vector<std::string>* checks_run = nullptr);
bool is_trainer_rule(std::string_view name);

// The input files of the job's data (docs/trainer.md, "Data"), checked where they are named: data.path (read as
// given, never written; a Megatron PREFIX with PREFIX.bin/.idx counts), each data.blend and data.valid entry, and,
// when neither data.path nor data.blend is set, each data.text input and data.tokenizer. One line per missing
// file, naming the key and the fix; `where` gives the source of a key ("--set data.path=x", "" for none).
// meshrun-train, `meshrun plan`, `run` and `sbatch` refuse a job with any (exit 2). Not a rule: it reads the
// filesystem, so only where the job starts.
std::vector<std::string> data_input_problems(const DataSpec& data,
                                             const std::function<std::string(const std::string&)>& where = {});

// checkpoint.finetune's, checked where the job starts as data_input_problems are: set with checkpoint.load
// (two starting weights), not a meshrun checkpoint (neither `latest` nor manifest.json in it), or inside
// checkpoint.dir (which the run writes and prunes). One line each, naming the key and the fix.
std::vector<std::string> checkpoint_input_problems(const CheckpointSpec& ck,
                                                   const std::function<std::string(const std::string&)>& where = {});
// Both, data's first: what meshrun-train, `meshrun plan`, `run` and `sbatch` refuse a trainer job for.
std::vector<std::string> input_file_problems(const JobConfig& job,
                                             const std::function<std::string(const std::string&)>& where = {});

// data.split (Megatron-LM's --split, megatron/core/datasets/blended_megatron_dataset_config.py): one to three
// comma-separated non-negative numbers (train, valid, test; missing ones are 0), normalised by their sum.
// Returns "" and the normalised weights, or one line naming the problem and the fix.
std::string parse_data_split(const std::string& text, std::array<double, 3>* weights);
// Part `part` (0 train, 1 valid, 2 test) of `n` elements, as Megatron cuts it: the weights' running sums
// lo, hi give [round(lo·n), round(hi·n)), rounding half to even (Python's round); a weight of 0 gives an
// empty part. Megatron's elements are an indexed dataset's sequences.
std::pair<std::int64_t, std::int64_t> data_split_range(const std::array<double, 3>& weights, int part, std::int64_t n);

// Which rules a job is held to: those of the program that will run it. Any program's job: the layout's
// (is_layout_rule). A template's: also its model's and batch's (the rest of validate). A job of meshrun-train
// (a template it trains, or `meshrun run`/`sbatch` of meshrun-train): also the bundled trainer's
// (validate_trainer). A job for Megatron-LM or torchtitan (job.trainer, `meshrun plan --for`): the model's and
// batch's as that framework applies them, and whether its flags can express the layout (check
// "framework-bridge", bridges.hpp). Megatron pads the vocabulary to a multiple of 128·tp
// (--make-vocab-size-divisible-by), so "vocab-tp" is not its rule; torchtitan's models (llama3, llama4,
// deepseek_v3, qwen3) are SwiGLU ("framework-mlp"). Outputs name the set (rule_set_name).
enum class RuleSet { layout, model, trainer, megatron, torchtitan };
// "layout", "layout+model", "layout+model+trainer", "layout+model+megatron", "layout+model+torchtitan"
const char* rule_set_name(RuleSet set);
// The set for a job: layout alone without a template; with one, job.trainer's (meshrun: trainer).
RuleSet rules_for_job(const JobConfig& cfg, bool has_template);
// Why meshrun-train does not train this job ("" when it does): job.trainer names another program. One line
// naming the key (`where`: its file:line:column or flag, "" for none) and both fixes. meshrun-train and
// `meshrun run`/`sbatch` of meshrun-train refuse with it.
std::string meshrun_train_refusal(const JobConfig& cfg, const std::string& where);

// The rules of `set` for a resolved layout and cluster, each written once (validate, validate_trainer):
// what resolve_job (resolve.hpp) applies for the dry run, the launcher and the plugin, and meshrun-train and
// the single-process trainer apply to themselves. `checks_run` receives the name of every check of the set.
std::vector<Problem> check_rules(const JobConfig& cfg, const Layout& layout, const Cluster& cluster, RuleSet set,
                                 std::vector<std::string>* checks_run = nullptr);


}  // namespace meshrun
