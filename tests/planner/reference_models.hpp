// Published model shapes and runs the planner is checked against (tests and bench/planner_bench.cpp).
// Sources: /work/shared/reference/llama3-405b.md (Llama 3 paper, Table 3 and 4), released HF configs,
// and the public throughput tables cited in docs/planner.md. Only model/cluster descriptions live here:
// the planner has no per-model constants.
#pragma once
#include "meshrun/job.hpp"

namespace meshrun::planner::testing {

inline ModelSpec llama3_405b() {
  ModelSpec m;
  m.name = "llama3-405b";
  m.layers = 126;
  m.hidden = 16384;
  m.ffn_hidden = 53248;
  m.heads = 128;
  m.kv_heads = 8;
  m.vocab = 128256;
  m.mlp = "swiglu";
  m.rope_theta = 500000;
  return m;
}

inline ModelSpec llama3_70b() {
  ModelSpec m;
  m.name = "llama3-70b";
  m.layers = 80;
  m.hidden = 8192;
  m.ffn_hidden = 28672;
  m.heads = 64;
  m.kv_heads = 8;
  m.vocab = 128256;
  return m;
}

inline ModelSpec llama3_8b() {
  ModelSpec m;
  m.name = "llama3-8b";
  m.layers = 32;
  m.hidden = 4096;
  m.ffn_hidden = 14336;
  m.heads = 32;
  m.kv_heads = 8;
  m.vocab = 128256;
  return m;
}

inline ModelSpec mixtral_8x7b() {
  ModelSpec m;
  m.name = "mixtral-8x7b";
  m.layers = 32;
  m.hidden = 4096;
  m.ffn_hidden = 14336;
  m.heads = 32;
  m.kv_heads = 8;
  m.vocab = 32000;
  m.experts = 8;
  m.top_k = 2;
  return m;
}

// A DGX cluster of `gpus` GPUs (8 per node).
inline ClusterSpec dgx(const char* node_type, int gpus) {
  ClusterSpec c;
  c.node_type = node_type;
  c.gpus_per_node = 8;
  c.nodes = gpus / 8;
  return c;
}

// Llama 3 405B pre-training on H100 (paper Table 4): order [TP, CP, PP, DP], global batch 16M tokens,
// interleaved pipeline with one layer per chunk (§3.3.2: the first chunk holds only the embedding, the last
// only the output head, so 126 + 2 = 16 · 8 chunks: 8 virtual stages), FSDP-style sharding of optimizer
// state (ZeRO-1 traffic pattern).
inline JobConfig llama3_405b_job(int gpus, int tp, int cp, int pp, int seq_len, int global_batch) {
  JobConfig j;
  j.model = llama3_405b();
  j.cluster = dgx("dgx-h100", gpus);
  j.parallel.tp = tp;
  j.parallel.cp = cp;
  j.parallel.pp = pp;
  j.parallel.dp = 0;
  j.parallel.order = "tp-cp-pp-dp";
  j.parallel.sequence_parallel = true;
  j.parallel.zero_stage = 1;
  j.parallel.pipeline_schedule = "interleaved";
  j.parallel.virtual_stages = 8;
  j.parallel.cp_comm = "allgather";  // Llama 3's context parallelism (all-gather K/V)
  j.training.seq_len = seq_len;
  j.training.global_batch_size = global_batch;
  j.training.micro_batch_size = 1;
  j.training.recompute = "selective";
  j.training.device = "cuda";  // a GPU run: activations in param_dtype (bf16), as the published runs
  return j;
}

}  // namespace meshrun::planner::testing
