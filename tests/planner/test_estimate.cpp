// estimate(): Llama 3 405B Table 4 throughput, memory verdicts, consistency and bad input.
#include <catch2/catch.hpp>

#include <sstream>

#include "meshrun/config.hpp"
#include "meshrun/planner.hpp"
#include "reference_models.hpp"

using namespace meshrun::planner;
using meshrun::ConfigError;
using meshrun::JobConfig;

namespace {
struct Table4Row {
  int gpus, tp, cp, pp, seq_len, global_batch;
  double tflops;  // published TFLOP/s per GPU
};
// llama3-405b.md §5 (DP = 8 in row 3, per the note there). Hopper's η_mm and η_attn are fitted on these
// three rows (docs/planner.md, "Constants"); the band is the issue's ±10%.
const Table4Row kTable4[] = {
    {8192, 8, 1, 16, 8192, 2048, 430},
    {16384, 8, 1, 16, 8192, 2048, 400},
    {16384, 8, 16, 16, 131072, 128, 380},
};

void check_table4_row(const Table4Row& row) {
  // V = 8 virtual stages, one layer per chunk as the paper describes (§3.3.2; templates/llama3-405b.toml),
  // and selective recomputation.
  JobConfig job = testing::llama3_405b_job(row.gpus, row.tp, row.cp, row.pp, row.seq_len, row.global_batch);
  Estimate e = estimate(job);
  job.parallel.virtual_stages = 4;
  Estimate v4 = estimate(job);
  job.parallel.virtual_stages = 2;
  Estimate v2 = estimate(job);
  CHECK(v2.tflops_per_gpu < v4.tflops_per_gpu);  // a deeper interleave shrinks the bubble
  CHECK(v4.tflops_per_gpu < e.tflops_per_gpu);
  INFO("row " << row.gpus << " GPUs, cp " << row.cp << ": " << e.tflops_per_gpu << " TFLOP/s vs " << row.tflops);
  CHECK(e.hardware.generation == "hopper");
  CHECK(e.layout.dp == row.gpus / (row.tp * row.cp * row.pp));
  CHECK(e.fits);
  CHECK(e.tflops_per_gpu == Approx(row.tflops).epsilon(0.10));
  CHECK(e.mfu == Approx(e.tflops_per_gpu / 989.0));
}
}  // namespace

TEST_CASE("Table 4 (hopper fit): 8,192 GPUs, TP8 PP16 DP64, 8K, within ±10% of 430 TFLOP/s", "[planner][table4]") {
  check_table4_row(kTable4[0]);
}

TEST_CASE("Table 4 (hopper fit): 16,384 GPUs, TP8 PP16 DP128, 8K, within ±10% of 400 TFLOP/s", "[planner][table4]") {
  check_table4_row(kTable4[1]);
}

TEST_CASE("Table 4 (hopper fit): 16,384 GPUs, TP8 CP16 PP16 DP8, 128K, within ±10% of 380 TFLOP/s",
          "[planner][table4]") {
  check_table4_row(kTable4[2]);
}

TEST_CASE("Table 4: the 430/400 throughput ratio of the two 8K rows pins the bubble", "[planner][table4]") {
  // The two 8K rows differ only in DP and so in micro-batches per step (32 against 16): the paper's
  // throughput ratio 430 / 400 pins the bubble's share; with V = 8 the model's ratio is within 2% of it
  // (with V = 4 it is 5% high, with V = 2 13%).
  Estimate half = estimate(testing::llama3_405b_job(8192, 8, 1, 16, 8192, 2048));
  Estimate full = estimate(testing::llama3_405b_job(16384, 8, 1, 16, 8192, 2048));
  CHECK(half.tflops_per_gpu / full.tflops_per_gpu == Approx(430.0 / 400).epsilon(0.02));
}

TEST_CASE("GEMM efficiency: wave quantization over the SMs and thin-matrix falloff", "[planner][gemm]") {
  Hardware h100;
  h100.sms = 132;
  const double eta = cost_constants("hopper").matmul_efficiency;
  // 12 × 11 tiles of 128 × 256 fill the 132 SMs exactly once.
  CHECK(gemm_efficiency(h100, 1536, 2816, 16384) == Approx(eta * 1536 / (1536 + 128)));
  // One more output column needs a second wave that is almost empty: the rate halves.
  CHECK(gemm_efficiency(h100, 1536, 2817, 16384) == Approx(eta * 1536 / (1536 + 128) * (1536.0 * 2817 / 32768) / 264));
  // Llama 3 405B's QKV projection at TP 8 (2,304 outputs per token): 2,048 tokens give 144 tiles, two waves
  // at 55%; 8,192 tokens give 576 tiles, five waves at 87%.
  CHECK(gemm_efficiency(h100, 2048, 2304, 16384) == Approx(eta * 144.0 / 264 * 2048 / 2176));
  CHECK(gemm_efficiency(h100, 8192, 2304, 16384) == Approx(eta * 576.0 / 660 * 2304 / 2432));
  // Either tile orientation: the better one counts.
  CHECK(gemm_efficiency(h100, 2816, 1536, 16384) == Approx(gemm_efficiency(h100, 1536, 2816, 16384)));
  // A grouped GEMM schedules every problem's tiles together: 8 experts × 18 tiles = 144 tiles.
  CHECK(gemm_efficiency(h100, 256, 2304, 4096, 8) == Approx(eta * 144.0 / 264 * 256 / 384));
  // Unknown SM count (a GPU outside the catalogue without cluster.gpu_sms): no quantization.
  Hardware custom;
  CHECK(gemm_efficiency(custom, 2048, 2304, 16384) == Approx(eta * 2048 / 2176));

  // The template key overrides the catalogue's count, and the estimate uses it.
  JobConfig job = testing::llama3_405b_job(16384, 8, 1, 16, 8192, 2048);
  Estimate base = estimate(job);
  CHECK(base.hardware.sms == 132);
  job.cluster.gpu_sms = 144;  // a full GH100 die: 576 tiles are exactly four waves
  Estimate more = estimate(job);
  CHECK(more.hardware.sms == 144);
  CHECK(more.time.compute < base.time.compute);
  CHECK(estimate_json(more).find("\"sms\":144") != std::string::npos);
}

TEST_CASE("estimate parts add up and throughput follows from the step time", "[planner][estimate]") {
  JobConfig job = testing::llama3_405b_job(16384, 8, 1, 16, 8192, 2048);
  Estimate e = estimate(job);
  const MemoryParts& m = e.memory;
  CHECK(m.total() == Approx(m.params + m.grads + m.optimizer + m.activations + m.logits + m.workspace + m.comm_buffers +
                            m.reserve));
  CHECK(e.step_time_s == Approx(e.time.step()));
  CHECK(e.tokens_per_s_per_gpu == Approx(2048.0 * 8192 / e.step_time_s / 16384));
  CHECK(e.tflops_per_gpu == Approx(e.model_flops_per_step / e.step_time_s / 16384 / 1e12));
  CHECK(e.micro_batches == 16);
  CHECK(e.first_stage_layers == 7);  // Llama 3: one layer fewer on the first and last stage
  CHECK(e.last_stage_layers == 7);
  CHECK(e.links.tp == meshrun::Link::nvlink);
  CHECK(e.links.pp == meshrun::Link::network);
  CHECK(e.time.pp_bubble > 0);
  CHECK(e.time.cp_comm == 0);

  // The 128K row pays for its CP K/V exchange; the 8K rows do not.
  Estimate longctx = estimate(testing::llama3_405b_job(16384, 8, 16, 16, 131072, 128));
  CHECK(longctx.time.cp_comm > 0);
  CHECK(longctx.links.cp == meshrun::Link::network);
}

TEST_CASE("CP ring variant: K/V hops hide behind a block's attention, dK/dV hops do not", "[planner][estimate][cp]") {
  // 405B at 128K, CP 16 over the network: one hop moves one rank's K/V block, s/16·2·k·d/t·2 bytes.
  JobConfig job = testing::llama3_405b_job(16384, 8, 16, 16, 131072, 128);
  const Estimate gather = estimate(job);
  job.parallel.cp_comm = "ring";
  const Estimate ring = estimate(job);
  const double kv = 131072.0 * 2 * 8 * 128 / 8 * 2;
  const double hop = kv / 16 / (50e9 * 0.8) + 8.4e-6 + 9.6e-6;  // NIC at η_net, base + one network hop
  // At 8,192 tokens per rank the attention of a block (1/16 of the rank's) takes far longer than a hop:
  // only the 16 dK/dV hops of the backward are exposed, per layer (8 on the slowest rank).
  CHECK(ring.time.cp_comm / ring.micro_batches == Approx(8 * 16 * hop).epsilon(1e-6));
  CHECK(ring.time.cp_comm < gather.time.cp_comm);
  // The all-gather variant is unchanged by the key (the Table 4 row keeps its meaning).
  job.parallel.cp_comm = "allgather";
  CHECK(estimate(job).time.cp_comm == Approx(gather.time.cp_comm));
  // Short sequences: attention per block shrinks with s², the hop only with s, so hops become exposed and
  // the ring pays more than its dK/dV hops.
  JobConfig short_seq = testing::llama3_405b_job(16384, 8, 16, 16, 8192, 2048);
  short_seq.parallel.cp_comm = "ring";
  const Estimate sr = estimate(short_seq);
  const double short_hop = 8192.0 * 2 * 8 * 128 / 8 * 2 / 16 / (50e9 * 0.8) + 8.4e-6 + 9.6e-6;
  CHECK(sr.time.cp_comm / sr.micro_batches > 8 * 16 * short_hop * 1.01);
}

TEST_CASE("all-to-all CP: the head exchange is exposed, inside its group's link", "[planner][estimate][cp]") {
  // 405B at 128K as multi-head attention (128 kv heads: 16 per TP rank, so all-to-all over 16 CP ranks).
  JobConfig job = testing::llama3_405b_job(16384, 8, 16, 16, 131072, 128);
  job.model.kv_heads = 128;
  job.parallel.cp_comm = "alltoall";
  const Estimate a2a = estimate(job);
  CHECK(a2a.links.cp_group == meshrun::Link::network);  // tp 8 fills a node: every CP rank on its own
  // Per layer and micro-batch: forward q, k, v there and out back (+ the log-sum-exp), backward q, k, v,
  // out, dout (+ lse) there and dq, dk, dv back; 15/16 of each leaves the rank, 5 + 9 all-to-all latencies;
  // no ring hops. 8 layers on the slowest rank; selective recomputation reruns nothing of it.
  const double rows = 131072.0 / 16, q = rows * 128 * 128 / 8 * 2, kv = q, lse = rows * 128 / 8 * 4;
  const double share = 15.0 / 16 / (50e9 * 0.8), lat = 8.4e-6 + 9.6e-6;
  const double per_layer = (2 * q + 2 * kv + lse) * share + 5 * lat + (4 * q + 4 * kv + lse) * share + 9 * lat;
  CHECK(a2a.time.cp_comm / a2a.micro_batches == Approx(8 * per_layer).epsilon(1e-6));
  // alltoall+ring with groups of 8 on tp 1: the all-to-all stays inside a node (NVLink), the ring of 2
  // groups crosses the network; cheaper than the all-to-all over all 16 network ranks (2,048 GPUs: dp 8).
  job.cluster = testing::dgx("dgx-h100", 2048);
  job.parallel.tp = 1;
  job.parallel.sequence_parallel = false;
  const Estimate flat = estimate(job);
  job.parallel.cp_comm = "alltoall+ring";
  job.parallel.cp_alltoall = 8;
  const Estimate hybrid = estimate(job);
  CHECK(flat.links.cp_group == meshrun::Link::network);
  CHECK(hybrid.links.cp_group == meshrun::Link::nvlink);
  CHECK(hybrid.links.cp == meshrun::Link::network);
  CHECK(hybrid.time.cp_comm > 0);
  CHECK(hybrid.time.cp_comm < flat.time.cp_comm);
  // At cp 1 every cp_comm is moot: no CP time at all.
  job.parallel.cp = 1;
  job.training.global_batch_size = 2048;  // dp 128: 16 micro-batches for the 16 stages
  CHECK(estimate(job).time.cp_comm == 0);
}

TEST_CASE("CP and ring latency: the backward re-gathers K/V, latency grows with the ring", "[planner][estimate][cp]") {
  // Order tp-cp-pp-dp with tp = 8 on 8-GPU nodes: every CP and dp·cp member is on its own node.
  JobConfig job = testing::llama3_405b_job(16384, 8, 16, 16, 131072, 128);
  Estimate sel = estimate(job);
  CHECK(sel.links.tp_islands == 1);
  CHECK(sel.links.cp_islands == 16);
  CHECK(sel.links.dp_islands == 128);  // dp·cp = 8·16
  // Forward all-gather, backward all-gather again + reduce-scatter: three per layer and micro-batch, and
  // full recomputation's forward gather is the one the backward uses, so it adds none.
  job.training.recompute = "full";
  Estimate full = estimate(job);
  CHECK(full.time.cp_comm == Approx(sel.time.cp_comm));
  CHECK(full.time.tp_comm > sel.time.tp_comm);  // TP collectives are re-run by the recomputed forward

  // Per micro-batch on the slowest rank (8 layers): 3 collectives of (15/16)·s·2·k·d/t·2 bytes over the
  // 50 GB/s NIC at η_net = 0.8, each with NCCL's ring latency 8.4 µs + 15 network steps of 9.6 µs.
  const double kv = 131072.0 * 2 * 8 * 128 / 8 * 2;
  const double one = 15.0 / 16 * kv / (50e9 * 0.8) + 8.4e-6 + 15 * 9.6e-6;
  CHECK(sel.time.cp_comm / sel.micro_batches == Approx(8 * 3 * one).epsilon(1e-6));

  // On a GB200 NVL72 rack the NVLink domain spans 18 nodes: a CP group inside it is one island.
  JobConfig rack = testing::llama3_405b_job(72 * 4, 4, 2, 9, 8192, 64);
  rack.cluster = testing::dgx("gb200-nvl72", 72 * 4);
  rack.cluster.gpus_per_node = 4;
  rack.cluster.nodes = 72;
  rack.training.recompute = "full";
  rack.parallel.virtual_stages = 1;
  rack.parallel.pipeline_schedule = "1f1b";
  Estimate nvl = estimate(rack);
  CHECK(nvl.links.cp == meshrun::Link::nvlink);
  CHECK(nvl.links.cp_islands == 1);
}

TEST_CASE("memory: ZeRO stages shard what they promise, overflow names the part", "[planner][memory]") {
  JobConfig job = testing::llama3_405b_job(8192, 8, 1, 16, 8192, 2048);
  job.parallel.zero_stage = 0;
  Estimate z0 = estimate(job);
  job.parallel.zero_stage = 1;
  Estimate z1 = estimate(job);
  job.parallel.zero_stage = 2;
  Estimate z2 = estimate(job);
  job.parallel.zero_stage = 3;
  Estimate z3 = estimate(job);
  CHECK(z1.memory.optimizer == Approx(z0.memory.optimizer / 64));  // dp·cp = 64
  CHECK(z1.memory.grads == Approx(z0.memory.grads));
  CHECK(z2.memory.grads == Approx(z0.memory.grads / 64));
  CHECK(z3.memory.params == Approx(z0.memory.params / 64));
  // Mixed precision: bf16 weights, fp32 grads, fp32 master + m + v = 2 + 4 + 12 bytes per parameter.
  CHECK(z0.memory.grads == Approx(2 * z0.memory.params));
  CHECK(z0.memory.optimizer == Approx(6 * z0.memory.params));
  CHECK_FALSE(z0.fits);
  CHECK(z0.overflow.find("activations") == 0);  // the largest part is named first

  // 70B on one node with full recomputation and no ZeRO: the optimizer state is what overflows.
  JobConfig small;
  small.model = testing::llama3_70b();
  small.cluster = testing::dgx("dgx-h100", 8);
  small.parallel.tp = 8;
  small.parallel.sequence_parallel = true;
  small.training.seq_len = 8192;
  small.training.global_batch_size = 8;
  small.training.recompute = "full";
  small.training.device = "cuda";
  Estimate opt = estimate(small);
  CHECK_FALSE(opt.fits);
  CHECK(opt.overflow.find("optimizer state") == 0);
  CHECK(opt.overflow.find("zero_stage") != std::string::npos);

  // No recomputation at 8K on 8,192 GPUs: 32 micro-batches in flight overflow the first stage's memory.
  job.parallel.zero_stage = 1;
  job.training.recompute = "none";
  Estimate none = estimate(job);
  CHECK_FALSE(none.fits);
  CHECK(none.overflow.find("activations") == 0);
  CHECK(none.memory_stage == "first");
  job.training.recompute = "full";
  Estimate full = estimate(job);
  CHECK(full.fits);
  CHECK(full.time.recompute > 0);
  CHECK(full.step_time_s > z1.step_time_s);

  // A smaller GPU (catalogue override) turns a fitting layout into an overflowing one.
  job.training.recompute = "selective";
  job.cluster.gpu_memory_gib = 40;
  CHECK_FALSE(estimate(job).fits);
}

TEST_CASE("pipeline schedules: interleaving and zero-bubble shrink the bubble", "[planner][schedule]") {
  JobConfig job = testing::llama3_405b_job(8192, 8, 1, 16, 8192, 2048);  // 32 micro-batches per step
  job.parallel.virtual_stages = 1;
  job.parallel.pipeline_schedule = "1f1b";
  job.training.recompute = "full";  // so that every schedule fits
  Estimate f1b = estimate(job);
  job.parallel.pipeline_schedule = "gpipe";
  Estimate gpipe = estimate(job);
  job.parallel.pipeline_schedule = "zb";
  Estimate zb = estimate(job);
  job.parallel.pipeline_schedule = "interleaved";
  job.parallel.virtual_stages = 4;
  Estimate inter = estimate(job);
  // The bubble is the simulated schedule's idle time of the busiest rank. 1F1B: about (p−1)·T_mb (total
  // step ∝ (m + p − 1) micro-batch times), plus the P2P hops on the critical path.
  const TimeParts& t = f1b.time;
  const double t_mb = (t.compute + t.recompute + t.tp_comm + t.cp_comm + t.ep_comm) / f1b.micro_batches;
  CHECK(f1b.time.pp_bubble == Approx(15 * t_mb).epsilon(0.03));
  // GPipe and 1F1B idle alike: exactly with equal stages and free transfers (tests/mesh/test_schedule.cpp);
  // here the last stage carries the output head and hops cost time.
  CHECK(gpipe.time.pp_bubble == Approx(f1b.time.pp_bubble).epsilon(0.01));
  CHECK(gpipe.memory.activations > f1b.memory.activations);  // all micro-batches in flight
  // ZB-H1 idles (p−1)(F+B−W) against 1F1B's (p−1)(F+B+W) (Qi et al.): a third with F = B = W; with full
  // recomputation the input-gradient pass B also re-runs the forward (B ≈ 2F + collectives, W ≈ F), so
  // about (1+2−1)/(1+2+1) = 1/2 plus the hops.
  CHECK(zb.time.pp_bubble < 0.7 * f1b.time.pp_bubble);
  CHECK(zb.time.pp_bubble > 0.4 * f1b.time.pp_bubble);
  CHECK(inter.time.pp_bubble < f1b.time.pp_bubble / 3);
  CHECK(inter.memory.activations > f1b.memory.activations);  // × (1 + (p−1)/(p·v)) warm-up depth
}

TEST_CASE("hardware overrides move the estimate the right way", "[planner][hardware]") {
  JobConfig job = testing::llama3_405b_job(16384, 8, 1, 16, 8192, 2048);
  Estimate base = estimate(job);
  CHECK(base.hardware.gpu == "h100-sxm");
  CHECK(base.hardware.nic_gbps_per_gpu == Approx(50));
  job.cluster.gpu_bf16_tflops = 2 * 989;
  CHECK(estimate(job).step_time_s < base.step_time_s);
  job = testing::llama3_405b_job(16384, 8, 1, 16, 8192, 2048);
  job.cluster.nic_gbps = 100;  // a quarter of the network bandwidth
  Estimate slow_net = estimate(job);
  CHECK(slow_net.time.dp_comm > base.time.dp_comm);
  CHECK(slow_net.time.pp_bubble > base.time.pp_bubble);
  job = testing::llama3_405b_job(16384, 8, 1, 16, 8192, 2048);
  job.cluster.node_type = "dgx-h200";  // more memory, same compute
  Estimate h200 = estimate(job);
  CHECK(h200.hardware.gpu == "h200");
  CHECK(h200.memory_capacity_gib > base.memory_capacity_gib);
  // Same tensor cores; only the memory-bound elementwise kernels gain from 4.8 vs 3.35 TB/s of HBM.
  CHECK(h200.tflops_per_gpu > base.tflops_per_gpu);
  CHECK(h200.tflops_per_gpu < 1.02 * base.tflops_per_gpu);
}

TEST_CASE("bad input: one line naming the problem and the fix", "[planner][errors]") {
  JobConfig job = testing::llama3_405b_job(16384, 8, 1, 16, 8192, 2048);
  job.cluster.node_type = "generic";
  try {
    estimate(job);
    FAIL("expected ConfigError");
  } catch (const ConfigError& e) {
    std::string what = e.what();
    CHECK(what.find("cluster.node_type 'generic'") == 0);
    CHECK(what.find("set cluster.gpu") != std::string::npos);
    CHECK(what.find("h100-sxm") != std::string::npos);
    CHECK(what.find('\n') == std::string::npos);
  }
  job = testing::llama3_405b_job(16384, 8, 1, 16, 8192, 2048);
  job.parallel.tp = 3;
  job.parallel.dp = 1;
  CHECK_THROWS_AS(estimate(job), ConfigError);
  job = testing::llama3_405b_job(16384, 8, 1, 16, 8192, 2048);
  job.training.recompute = "partial";
  CHECK_THROWS_WITH(estimate(job), Catch::Contains("training.recompute"));
  job = testing::llama3_405b_job(16384, 8, 1, 16, 8192, 2048);
  job.training.grad_dtype = "fp12";
  CHECK_THROWS_WITH(estimate(job), Catch::Contains("grad_dtype"));
  job = testing::llama3_405b_job(16384, 8, 1, 16, 8192, 2048);
  job.parallel.pipeline_schedule = "zb";  // virtual stages need the interleaved schedule
  CHECK_THROWS_WITH(estimate(job), Catch::Contains("virtual_stages"));
  job.parallel.pipeline_schedule = "1f1b";  // mesh's rule, not a silent switch to interleaved
  CHECK_THROWS_WITH(estimate(job), Catch::Contains("needs pipeline_schedule = \"interleaved\""));
  job.parallel.pipeline_schedule = "interleaved";
  job.parallel.virtual_stages = 1;  // interleaved needs at least two chunks per rank
  CHECK_THROWS_WITH(estimate(job), Catch::Contains("virtual_stages ≥ 2"));
  job = testing::llama3_405b_job(16384, 8, 1, 16, 8192, 2048);
  job.cluster.gpu = "h100-pcie";
  CHECK_THROWS_WITH(estimate(job), Catch::StartsWith("cluster.gpu 'h100-pcie' is not in the planner's catalogue"));
  // A GPU outside the catalogue is fine when the template gives its figures.
  job = testing::llama3_405b_job(16384, 8, 1, 16, 8192, 2048);
  job.cluster.gpu = "mi300x";
  job.cluster.gpu_bf16_tflops = 1307, job.cluster.gpu_memory_gib = 192, job.cluster.nic_gbps = 400;
  job.cluster.nvlink_gbps = 448;
  Estimate custom = estimate(job);
  CHECK(custom.hardware.gpu == "mi300x");
  CHECK(custom.mfu == Approx(custom.tflops_per_gpu / 1307));
}

TEST_CASE("renderers: table and JSON carry the contract keys", "[planner][render]") {
  JobConfig job = testing::llama3_405b_job(8192, 8, 1, 16, 8192, 2048);
  job.training.recompute = "none";
  Estimate e = estimate(job);
  std::string json = estimate_json(e);
  for (const char* key : {"\"memory_gib_per_gpu\":{\"total\":", "\"step_time_s\":", "\"tokens_per_s_per_gpu\":",
                          "\"tflops_per_gpu\":", "\"mfu\":", "\"activations\":", "\"fits\":false", "\"overflow\":\"",
                          "\"layout\":{\"tp\":8,\"cp\":1,\"pp\":16,\"dp\":64"})
    CHECK(json.find(key) != std::string::npos);
  CHECK(json.find("nan") == std::string::npos);
  CHECK(json.front() == '{');
  CHECK(json.back() == '}');
  std::ostringstream table;
  print_estimate_table(table, e);
  CHECK(table.str().find("DOES NOT FIT") != std::string::npos);
  CHECK(table.str().find("overflow: activations") != std::string::npos);

  job.training.recompute = "selective";
  std::ostringstream ok;
  print_estimate_table(ok, estimate(job));
  CHECK(ok.str().find("  fits") != std::string::npos);
  CHECK(estimate_json(estimate(job)).find("\"overflow\":null") != std::string::npos);
}

TEST_CASE("CUDA device names map to the catalogue only where the name says which part it is", "[planner][catalogue]") {
  const auto key = [](const char* n) { const GpuPerf* g = gpu_for_device_name(n); return g ? g->name : std::string("-"); };
  CHECK(key("NVIDIA H100 80GB HBM3") == "h100-sxm");
  CHECK(key("NVIDIA H200") == "h200");
  CHECK(key("NVIDIA A100-SXM4-80GB") == "a100-80gb");
  CHECK(key("NVIDIA B200") == "b200");
  CHECK(key("NVIDIA GB200") == "gb200");
  // Other peaks than the catalogue's entries: no MFU rather than a wrong one.
  for (const char* other : {"NVIDIA H100 PCIe", "NVIDIA H100 NVL", "NVIDIA H200 NVL", "NVIDIA A100-SXM4-40GB",
                            "NVIDIA A100-PCIE-40GB", "NVIDIA L40S", "meshrun emulated CUDA device (host CPU)", ""})
    CHECK(key(other) == "-");
  CHECK(gpu_for_device_name("NVIDIA H100 80GB HBM3")->bf16_tflops == 989);
}

TEST_CASE("GPU generations: each catalogue GPU names its constants, a GPU outside the catalogue gets hopper's",
          "[planner][generation]") {
  CHECK(find_gpu("a100-80gb")->generation == "ampere");
  for (const char* gpu : {"h100-sxm", "h200"}) CHECK(find_gpu(gpu)->generation == "hopper");
  for (const char* gpu : {"b200", "gb200"}) CHECK(find_gpu(gpu)->generation == "blackwell");
  const CostConstants& hopper = cost_constants("hopper");
  const CostConstants& ampere = cost_constants("ampere");
  // Ampere differs where it was fitted (the network), Blackwell is hopper's, an unknown name gets hopper's.
  CHECK(ampere.network_efficiency != hopper.network_efficiency);
  CHECK(ampere.overlap_cost != hopper.overlap_cost);
  const CostConstants& blackwell = cost_constants("blackwell");
  CHECK(blackwell.matmul_efficiency == hopper.matmul_efficiency);
  CHECK(blackwell.attention_efficiency == hopper.attention_efficiency);
  CHECK(blackwell.network_efficiency == hopper.network_efficiency);
  CHECK(blackwell.overlap_cost == hopper.overlap_cost);
  CHECK(&cost_constants("mi300x") == &hopper);
  // Fitted efficiencies stay within physical bounds.
  for (const char* g : {"ampere", "hopper", "blackwell"}) {
    const CostConstants& c = cost_constants(g);
    CHECK(c.matmul_efficiency > 0);
    CHECK(c.matmul_efficiency <= 1);
    CHECK(c.attention_efficiency > 0);
    CHECK(c.attention_efficiency <= 1);
    CHECK(c.network_efficiency > 0);
    CHECK(c.network_efficiency <= 1);
    CHECK(c.overlap_cost >= 0);
    CHECK(c.overlap_cost <= 1);
  }
  // The estimate takes the constants of its GPU's generation: the same job on A100 and on an A100 described
  // outside the catalogue (hopper's constants) differ, and JSON names the generation.
  JobConfig job;
  job.model = testing::llama3_8b();
  job.cluster = testing::dgx("dgx-a100", 64);
  job.parallel.zero_stage = 3;
  job.training.seq_len = 8192;
  job.training.global_batch_size = 64;
  job.training.recompute = "selective";
  job.training.device = "cuda";
  Estimate a100 = estimate(job);
  CHECK(a100.hardware.generation == "ampere");
  CHECK(estimate_json(a100).find("\"generation\":\"ampere\"") != std::string::npos);
  job.cluster.gpu = "a100-described";
  job.cluster.gpu_bf16_tflops = 312, job.cluster.gpu_sms = 108, job.cluster.gpu_memory_gib = 80;
  job.cluster.nvlink_gbps = 300, job.cluster.nic_gbps = 200;
  Estimate described = estimate(job);
  CHECK(described.hardware.generation == "hopper");
  CHECK(described.time.dp_comm > a100.time.dp_comm);  // η_net 0.80 and overlap 0.15 instead of ampere's
}

namespace {
// Mixtral 8x7B on one DGX H100: EP 8 (one expert per GPU), no pipeline, one micro-batch of 4,096 tokens.
JobConfig mixtral_one_node(double imbalance) {
  JobConfig j;
  j.model = testing::mixtral_8x7b();
  j.cluster = testing::dgx("dgx-h100", 8);
  j.parallel.ep = 8;
  j.parallel.zero_stage = 1;
  j.training.seq_len = 4096;
  j.training.global_batch_size = 8;
  j.training.recompute = "selective";
  j.training.device = "cuda";
  j.planner.expert_imbalance = imbalance;
  return j;
}
}  // namespace

TEST_CASE("MoE routing imbalance: the busiest rank's expert GEMMs, all-to-all and buffers scale with it",
          "[planner][moe]") {
  const Estimate even = estimate(mixtral_one_node(1));
  const Estimate skew = estimate(mixtral_one_node(2));
  // 1 is balanced routing: the same figures as a config that never mentions it.
  JobConfig plain = mixtral_one_node(1);
  plain.planner = meshrun::PlannerSpec{};
  CHECK(estimate_json(estimate(plain)) == estimate_json(even));
  CHECK(even.expert_imbalance == 1);
  CHECK(skew.expert_imbalance == 2);
  REQUIRE(even.micro_batches == 1);

  // Expected from the formulas (docs/planner.md, "Step time"): per layer the expert GEMMs gate/up
  // (rows × 2F, depth h) and down (rows × h, depth F), each forward 2·m·n·k / (peak · efficiency) and a
  // backward pair (m×k over n, k×n over m); rows per expert 4,096 · top-2 · EP 8 / 8 experts = 8,192, twice that
  // at imbalance 2. 32 layers, one micro-batch.
  const Hardware& hw = even.hardware;
  auto gemm = [&](double m, double n, double k) { return 2 * m * n * k / (hw.bf16_tflops * 1e12 * gemm_efficiency(hw, m, n, k)); };
  auto fwd_bwd = [&](double m, double n, double k) { return gemm(m, n, k) + gemm(m, k, n) + gemm(k, n, m); };
  const double h = 4096, f = 14336, rows = 4096.0 * 2 * 8 / 8;
  auto experts = [&](double r) { return fwd_bwd(r, 2 * f, h) + fwd_bwd(r, h, f); };
  const double added_compute = 32 * (experts(2 * rows) - experts(rows));
  CHECK(added_compute > 0.3 * even.time.compute);  // the expert GEMMs dominate the layer
  CHECK(skew.time.compute - even.time.compute == Approx(added_compute).epsilon(1e-9));
  // All-to-all: dispatch + combine, forward and backward, (ep − 1)/ep of the rows' bf16 hidden states over
  // NVLink (450 GB/s × η_net); the latency does not grow.
  const double eta_net = cost_constants("hopper").network_efficiency;
  const double a2a = 2 * 7.0 / 8 * (4096.0 * 2 * h * 2) / (450e9 * eta_net);
  CHECK(skew.time.ep_comm - even.time.ep_comm == Approx(32 * 2 * a2a).epsilon(1e-9));
  // Memory: the routed rows that arrive (expert output and gate/up gradients per layer in flight, the
  // experts' scratch in the workspace) double; nothing else moves.
  CHECK(skew.memory.workspace - even.memory.workspace == Approx(4096.0 * 2 * f * 2).epsilon(1e-9));
  CHECK(skew.memory.activations - even.memory.activations == Approx(32 * 4096.0 * 2 * (h + 2 * f) * 2).epsilon(1e-9));
  CHECK(skew.memory.params == even.memory.params);
  // A dense model ignores it.
  JobConfig dense = testing::llama3_405b_job(16384, 8, 1, 16, 8192, 2048);
  const Estimate dense1 = estimate(dense);
  dense.planner.expert_imbalance = 3;
  const Estimate dense3 = estimate(dense);
  CHECK(dense3.step_time_s == dense1.step_time_s);
  CHECK(dense3.memory.total() == dense1.memory.total());
  // The table says which imbalance it charged, only when it is not 1.
  std::ostringstream skew_table, even_table;
  print_estimate_table(skew_table, skew);
  print_estimate_table(even_table, even);
  CHECK(skew_table.str().find("expert imbalance 2 (planner.expert_imbalance)") != std::string::npos);
  CHECK(even_table.str().find("expert imbalance") == std::string::npos);
  // Below 1 (a JobConfig built in code; the config layer refuses it in a template): one line naming the key.
  CHECK_THROWS_WITH(estimate(mixtral_one_node(0.5)), Catch::StartsWith("planner.expert_imbalance = 0.5") &&
                                                         Catch::Contains("use a number >= 1"));
}
