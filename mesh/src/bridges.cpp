// Megatron-LM and torchtitan flags for a resolved layout (bridges.hpp). The rank rules each framework
// applies to them are in docs/launcher.md; tests/launcher/bridges_check.py re-implements those rules from the
// frameworks' sources and compares the result with meshrun's map.
#include "meshrun/bridges.hpp"

#include <cmath>
#include <sstream>

namespace meshrun {

namespace {

void add(std::vector<std::string>& v, const std::string& flag, long long value) {
  v.push_back(flag);
  v.push_back(std::to_string(value));
}

FrameworkFlags refuse(std::string why) { return {{}, std::move(why)}; }

std::string number(double v) {
  // Whole numbers as integers (Megatron parses --rotary-base as an int: 1000000, not 1e+06), else 1e-05.
  if (v == std::floor(v) && std::fabs(v) < 1e15) return std::to_string(static_cast<long long>(v));
  std::ostringstream o;
  o << v;
  return o.str();
}

// The model's shape as Megatron-LM's GPT flags (megatron/training/arguments.py), with a template: a Llama-style
// decoder has rotary positions, RMSNorm, no linear biases and (unless tied) its own output layer; GQA names
// its query groups; the MLP is SwiGLU (Megatron's default is GeLU, so "gelu" adds nothing); experts name
// their count, top-k and width. The vocabulary comes from the framework's tokenizer (Megatron pads it to
// --make-vocab-size-divisible-by × tp), so no vocab flag is written.
void megatron_model(std::vector<std::string>& f, const ModelSpec& m, long long seq_len) {
  add(f, "--num-layers", m.layers);
  add(f, "--hidden-size", m.hidden);
  add(f, "--ffn-hidden-size", m.ffn_hidden);
  add(f, "--num-attention-heads", m.heads);
  if (m.kv_heads != m.heads) {
    f.push_back("--group-query-attention");
    add(f, "--num-query-groups", m.kv_heads);
  }
  add(f, "--max-position-embeddings", seq_len);
  f.insert(f.end(), {"--position-embedding-type", "rope", "--rotary-base", number(m.rope_theta), "--normalization",
                     "RMSNorm", "--norm-epsilon", number(m.norm_eps), "--disable-bias-linear"});
  if (m.mlp == "swiglu") f.push_back("--swiglu");
  if (!m.tied_embeddings) f.push_back("--untie-embeddings-and-output-weights");
  if (m.experts > 0) {
    add(f, "--num-experts", m.experts);
    add(f, "--moe-router-topk", m.top_k);
    add(f, "--moe-ffn-hidden-size", m.expert_ffn());
  }
}

// Megatron-Core's RankGenerator orders (megatron/training/initialize.py: order='tp-cp-ep-dp-pp', or
// 'tp-cp-ep-pp-dp' with --use-tp-pp-dp-mapping); its expert grid uses the same order with cp = 1.
FrameworkFlags megatron(const JobConfig& cfg, const Layout& l, const BatchGeometry* g) {
  const std::string order = l.order.str();
  const std::string& schedule = cfg.parallel.pipeline_schedule;
  FrameworkFlags out;
  auto& f = out.flags;
  if (order != "tp-cp-ep-dp-pp" && order != "tp-cp-ep-pp-dp")
    return refuse("Megatron-LM builds its groups in the order tp-cp-ep-dp-pp (its default) or tp-cp-ep-pp-dp "
                  "(--use-tp-pp-dp-mapping), not " + order + ": set parallel.order to one of them");
  // initialize_model_parallel asserts that a non-pp-last order keeps the dense and expert data-parallel sizes
  // equal (ETP · EP = TP · CP; meshrun's ETP = TP), else its two grids' pipeline groups differ.
  if (order == "tp-cp-ep-pp-dp" && l.pp > 1 && l.ep > 1 && l.ep != l.cp)
    return refuse("Megatron-LM's tp-cp-ep-pp-dp order (--use-tp-pp-dp-mapping) with pp > 1 needs the expert data-parallel "
                  "size equal to the dense one (ep = cp here, as expert TP = TP), not ep = " + std::to_string(l.ep) +
                  " with cp = " + std::to_string(l.cp) + ": use parallel.order = \"tp-cp-ep-dp-pp\"");
  if (l.pp > 1 && schedule != "1f1b" && schedule != "interleaved")
    return refuse("Megatron-LM runs 1F1B and interleaved 1F1B pipelines, not parallel.pipeline_schedule = \"" + schedule +
                  "\"" + (schedule == "zbv" || schedule == "dualpipev" ? " (a V of two chunks per rank, which Megatron-Core's "
                                                                      "interleaving does not place; torchtitan runs it)" : "") +
                  ": set parallel.pipeline_schedule = \"1f1b\" (or \"interleaved\" with parallel.virtual_stages)");
  add(f, "--tensor-model-parallel-size", l.tp);
  add(f, "--pipeline-model-parallel-size", l.pp);
  add(f, "--context-parallel-size", l.cp);
  if (l.ep > 1) {
    add(f, "--expert-model-parallel-size", l.ep);
    add(f, "--expert-tensor-parallel-size", l.tp);  // meshrun's expert grid keeps ETP = TP
  }
  if (l.virtual_stages > 1) add(f, "--num-virtual-stages-per-pipeline-rank", l.virtual_stages);
  if (order == "tp-cp-ep-pp-dp") f.push_back("--use-tp-pp-dp-mapping");
  if (l.sequence_parallel) f.push_back("--sequence-parallel");
  // Megatron-Core's cp_comm_type (TransformerConfig): p2p (ring), all_gather, a2a (Ulysses), a2a+p2p (a2a
  // inside the first --hierarchical-context-parallel-sizes group, p2p across: meshrun's consecutive groups).
  if (l.cp > 1) {
    const std::string& cc = cfg.parallel.cp_comm;
    const int group = cp_alltoall_group(cfg.parallel, l.cp);
    if (cc == "alltoall+ring" && !cp_alltoall_fits(cfg.parallel, l.cp, 1 << 30, 1 << 30))  // heads: Megatron checks
      return refuse("parallel.cp_comm = \"alltoall+ring\" at cp=" + std::to_string(l.cp) + " with parallel.cp_alltoall = " +
                    std::to_string(group) + ": set cp_alltoall to a divisor of cp from 2 to cp/2 (Megatron-LM's "
                    "--hierarchical-context-parallel-sizes A2A P2P)");
    f.push_back("--cp-comm-type");
    f.push_back(cc == "allgather" ? "all_gather" : cc == "alltoall" ? "a2a" : cc == "alltoall+ring" ? "a2a+p2p" : "p2p");
    if (cc == "alltoall+ring") {
      f.push_back("--hierarchical-context-parallel-sizes");
      f.push_back(std::to_string(group));
      f.push_back(std::to_string(l.cp / group));
    }
  }
  // ZeRO: the distributed optimizer shards the optimizer state (ZeRO-1); Megatron-FSDP shards gradients too
  // (optim_grads, ZeRO-2) or also the parameters (optim_grads_params, ZeRO-3).
  if (l.zero_stage == 1) f.push_back("--use-distributed-optimizer");
  if (l.zero_stage >= 2) {
    f.push_back("--use-megatron-fsdp");
    f.push_back("--data-parallel-sharding-strategy");
    f.push_back(l.zero_stage == 2 ? "optim_grads" : "optim_grads_params");
  }
  if (g) {
    add(f, "--micro-batch-size", g->micro_batch_size);
    add(f, "--global-batch-size", g->global_batch);
    add(f, "--seq-length", g->seq_len);
    megatron_model(f, cfg.model, g->seq_len);
    // training.recompute as Megatron-Core's recompute_granularity / recompute_modules (TransformerConfig):
    // full = every layer's forward rerun from its input (uniform, one layer per unit); selective = the two
    // norm outputs and the MLP activation's output, which is "layernorm" + "moe_act" for expert layers
    // (output-discarding checkpointing of exactly those). A dense MLP's activation alone is no Megatron
    // module ("mlp" recomputes the whole MLP, "core_attn" the attention core): refused.
    const std::string& rc = cfg.training.recompute;
    if (rc == "full")
      f.insert(f.end(), {"--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1"});
    if (rc == "selective" && cfg.model.experts == 0)
      return refuse("training.recompute = \"selective\" recomputes the two norm outputs and the SwiGLU output; Megatron-LM "
                    "recomputes a dense MLP only whole (--recompute-modules mlp) or the attention core (core_attn), so it "
                    "has no equivalent: set training.recompute = \"full\" (--recompute-granularity full) or \"none\" and "
                    "give Megatron's own --recompute-* flags");
    if (rc == "selective")
      f.insert(f.end(), {"--recompute-granularity", "selective", "--recompute-modules", "layernorm", "moe_act"});
  }
  return out;
}

// torchtitan's device mesh ("pp", "dp_replicate", "dp_shard", "cp", "tp"), row-major (torchtitan/distributed/
// parallel_dims.py), i.e. meshrun's tp-cp-dp-pp; its expert mesh ("pp", "dp_replicate", "efsdp", "ep") puts EP
// on the fastest ranks.
FrameworkFlags torchtitan(const JobConfig& cfg, const Layout& l, const BatchGeometry* g) {
  const AxisOrder& o = l.order;
  FrameworkFlags out;
  auto& f = out.flags;
  if (!(o.position(Axis::tp) < o.position(Axis::cp) && o.position(Axis::cp) < o.position(Axis::dp) &&
        o.position(Axis::dp) < o.position(Axis::pp)))
    return refuse("torchtitan's device mesh is (pp, dp_replicate, dp_shard, cp, tp), tp fastest: meshrun order "
                  "tp-cp-ep-dp-pp, not " + o.str() + ": set parallel.order = \"tp-cp-ep-dp-pp\"");
  if (l.ep > 1 && l.tp > 1)
    return refuse("torchtitan's expert mesh (pp, dp_replicate, efsdp, ep) takes EP ranks from TP first, while meshrun "
                  "keeps TP inside each expert (ETP = TP): use parallel.tp = 1 with expert parallelism for torchtitan");
  if (l.ep > 1 && l.zero_stage == 0)
    return refuse("torchtitan takes EP ranks from its FSDP dimension (dp_shard × cp × tp), which DDP (zero_stage = 0) "
                  "leaves at 1: use parallel.zero_stage = 2 or 3 with expert parallelism for torchtitan");
  if (l.zero_stage == 1)
    return refuse("torchtitan has no ZeRO-1 (its FSDP shards parameters and gradients): set parallel.zero_stage = 0 "
                  "(DDP: dp_replicate), 2 (FSDP without resharding after forward) or 3 (FSDP)");
  if (l.cp > 1 && (cfg.parallel.cp_comm == "alltoall" || cfg.parallel.cp_comm == "alltoall+ring"))
    return refuse("torchtitan's context parallelism is ring attention (its rotate method only changes how K/V "
                  "travel), not parallel.cp_comm = \"" + cfg.parallel.cp_comm + "\"'s all-to-all over heads: use "
                  "parallel.cp_comm = \"ring\" for torchtitan, or --for megatron (--cp-comm-type a2a / a2a+p2p)");
  const std::string& schedule = cfg.parallel.pipeline_schedule;
  std::string tt_schedule;
  if (l.pp > 1) {
    if (schedule == "gpipe") tt_schedule = "GPipe";
    else if (schedule == "1f1b") tt_schedule = "1F1B";
    else if (schedule == "interleaved") tt_schedule = "Interleaved1F1B";
    // torch.distributed.pipelining's V schedules: rank r holds stages r and 2pp−1−r, as meshrun places them.
    else if (schedule == "zbv") tt_schedule = "ZBVZeroBubble";
    else if (schedule == "dualpipev") tt_schedule = "DualPipeV";
    else
      return refuse("torchtitan's zero-bubble schedules need several stages per rank in its own placement; meshrun's "
                    "parallel.pipeline_schedule = \"zb\" has no torchtitan equivalent: use \"zbv\", \"1f1b\" or \"interleaved\"");
  }
  const int stages = l.pp * l.virtual_stages;
  if (!g && l.virtual_stages > 1)
    return refuse("torchtitan's multi-stage schedules need the layers per stage, from the model: give the template "
                  "(--template T.toml) whose [model] it trains");
  if (g && l.pp > 1 && cfg.model.layers % stages != 0)
    return refuse("torchtitan splits the model by layers per stage: model.layers = " + std::to_string(cfg.model.layers) +
                  " is not a multiple of pp × virtual_stages = " + std::to_string(stages));
  add(f, "--parallelism.data_parallel_replicate_degree", l.zero_stage == 0 ? l.dp : 1);
  add(f, "--parallelism.data_parallel_shard_degree", l.zero_stage == 0 ? 1 : l.dp);
  add(f, "--parallelism.tensor_parallel_degree", l.tp);
  add(f, "--parallelism.context_parallel_degree", l.cp);
  add(f, "--parallelism.pipeline_parallel_degree", l.pp);
  if (l.ep > 1) add(f, "--parallelism.expert_parallel_degree", l.ep);
  if (l.zero_stage == 2) {
    f.push_back("--parallelism.fsdp_reshard_after_forward");
    f.push_back("never");
  }
  if (l.tp > 1) f.push_back(l.sequence_parallel ? "--parallelism.enable_sequence_parallel" : "--parallelism.no_enable_sequence_parallel");
  if (l.pp > 1) {
    f.push_back("--parallelism.pipeline_parallel_schedule");
    f.push_back(tt_schedule);
    if (g) {
      add(f, "--parallelism.pipeline_parallel_layers_per_stage", cfg.model.layers / stages);
      add(f, "--parallelism.num_pp_microbatches", g->microbatches);
    }
  }
  if (g) {
    // training.recompute as torchtitan's activation_checkpoint.mode: full wraps every transformer block (its
    // forward rerun from the block's input), none is said out loud (torchtitan's own default has been
    // "selective"); its selective is op- or layer-level, not meshrun's norm and activation outputs: refused.
    const std::string& rc = cfg.training.recompute;
    if (rc == "selective")
      return refuse("training.recompute = \"selective\" recomputes the two norm outputs and the SwiGLU output; "
                    "torchtitan's selective activation checkpointing is per operator or per N layers, so it has no "
                    "equivalent: set training.recompute = \"full\" (--activation_checkpoint.mode full) or \"none\"");
    f.push_back("--activation_checkpoint.mode");
    f.push_back(rc == "full" ? "full" : "none");
    add(f, "--training.num_tokens_per_microbatch_per_dp_rank", g->micro_batch_size * g->seq_len);
    add(f, "--training.num_tokens_per_train_step", g->global_batch * g->seq_len);
    add(f, "--training.max_context_length", g->seq_len);
  }
  return out;
}

}  // namespace

std::optional<Framework> parse_framework(std::string_view name) {
  if (name == "megatron") return Framework::megatron;
  if (name == "torchtitan") return Framework::torchtitan;
  return std::nullopt;
}

const char* framework_key(Framework f) { return f == Framework::megatron ? "megatron" : "torchtitan"; }

const char* framework_name(Framework f) { return f == Framework::megatron ? "Megatron-LM" : "torchtitan"; }

FrameworkFlags framework_flags(Framework f, const JobConfig& cfg, const Layout& layout, const BatchGeometry* geometry) {
  return f == Framework::megatron ? megatron(cfg, layout, geometry) : torchtitan(cfg, layout, geometry);
}

long long megatron_padded_vocab(long long vocab, int tp) {
  const long long multiple = 128LL * tp;
  return (vocab + multiple - 1) / multiple * multiple;
}

std::string merge_with_command(const std::vector<std::string>& command, std::vector<std::string>* flags) {
  // A flag word is "--name" with its values next (the words up to the next "--": one for most flags, two
  // for --hierarchical-context-parallel-sizes and --recompute-modules here, none for a boolean) or
  // "--name=value".
  auto values_after = [](const std::vector<std::string>& words, std::size_t i) {
    std::string v;
    for (std::size_t j = i + 1; j < words.size() && words[j].rfind("--", 0) != 0; ++j) v += (v.empty() ? "" : " ") + words[j];
    return v;
  };
  auto given = [&](const std::string& name, std::string* value) {
    for (std::size_t i = 0; i < command.size(); ++i) {
      const std::string& w = command[i];
      if (w == name) {
        *value = values_after(command, i);
        return true;
      }
      if (w.size() > name.size() && w.compare(0, name.size(), name) == 0 && w[name.size()] == '=') {
        *value = w.substr(name.size() + 1);
        return true;
      }
    }
    return false;
  };
  std::vector<std::string> kept;
  for (std::size_t i = 0; i < flags->size();) {
    const std::string& name = (*flags)[i];
    std::size_t next = i + 1;
    while (next < flags->size() && (*flags)[next].rfind("--", 0) != 0) ++next;
    const std::string mine = values_after(*flags, i);
    std::string theirs;
    if (given(name, &theirs)) {
      if (theirs != mine)
        return "the command already gives " + name + (theirs.empty() ? "" : " " + theirs) + " but the layout needs " + name +
               (mine.empty() ? "" : " " + mine) + ": remove it from the command (the framework would silently take the last one)";
    } else {
      kept.insert(kept.end(), flags->begin() + static_cast<std::ptrdiff_t>(i), flags->begin() + static_cast<std::ptrdiff_t>(next));
    }
    i = next;
  }
  *flags = std::move(kept);
  return "";
}

}  // namespace meshrun
