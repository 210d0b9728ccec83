// Calibration (issue 30): the CPU device model, calibration files, and the fit of the constants to measured
// runs. The runs here are synthetic: the planner's own estimate under known constants, so the fit must find
// constants that reproduce them; tests/planner/calibrate_cli.sh fits runs meshrun-train measured.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <string>

#include "meshrun/config.hpp"
#include "meshrun/planner.hpp"
#include "meshrun/planner_calibration.hpp"

using namespace meshrun;
using namespace meshrun::planner;
using Catch::Contains;

namespace {

Calibration cpu_figures() {
  Calibration c;
  c.path = "test";
  c.device = "cpu";
  c.node_cpus = 2;
  c.gflops_per_cpu = 80;
  c.gflops_per_cpu_fp64 = 20;
  c.memory_gbps_per_cpu = 10;
  c.link_gbps = 8;
  c.memory_gib = 16;
  return c;
}

// tiny (templates/tiny.toml's model) on `ranks` ranks of one generic node.
JobConfig tiny(int ranks, int tp, int pp, int cp, int zero, const char* schedule = "1f1b") {
  JobConfig j;
  j.model.layers = 4, j.model.hidden = 128, j.model.ffn_hidden = 352, j.model.heads = 4, j.model.kv_heads = 2;
  j.model.vocab = 256;
  j.cluster.nodes = 1, j.cluster.gpus_per_node = ranks, j.cluster.node_type = "generic";
  j.parallel.tp = tp, j.parallel.pp = pp, j.parallel.cp = cp, j.parallel.zero_stage = zero;
  j.parallel.pipeline_schedule = schedule;
  j.training.seq_len = 64, j.training.global_batch_size = 16, j.training.micro_batch_size = 4;
  j.training.dtype = "fp32";
  return j;
}

MeasuredRun synthetic(const JobConfig& cfg, const Calibration& truth, const char* name) {
  const Estimate e = estimate(cfg, truth);
  MeasuredRun r;
  r.path = name;
  r.cfg = cfg;
  r.step_ms = e.step_time_s * 1000;
  r.matmul_ms = e.time.compute_parts.matmul * 1000;
  r.attention_ms = e.time.compute_parts.attention * 1000;
  r.elementwise_ms = e.time.compute_parts.elementwise * 1000;
  r.optimizer_ms = e.time.optimizer * 1000;
  r.steps = 5;
  return r;
}

double constant(const Calibration& c, const std::string& name) {
  for (const auto& [k, v] : c.constants)
    if (k == name) return v;
  return -1;
}

std::string write_file(const std::string& name, const std::string& text) {
  const std::string path = std::string("/tmp/meshrun-test-calibration-") + name;
  std::ofstream(path) << text;
  return path;
}

}  // namespace

TEST_CASE("CPU runs need a calibration; with one they are costed from its figures", "[planner][calibration]") {
  const JobConfig cfg = tiny(2, 2, 1, 1, 0);
  CHECK_THROWS_WITH(estimate(cfg), Contains("meshrun-bench-device") && Contains("--calibration"));
  const Estimate e = estimate(cfg, cpu_figures());
  CHECK(e.hardware.gpu == "cpu");
  CHECK(e.hardware.bf16_tflops == 0.08);
  CHECK(e.hardware.calibration == "test");
  CHECK(e.step_time_s > 0);
  // The parts and the host overhead per layer and micro-batch (4 layers × 4 micro-batches here) add up to compute.
  const ComputeParts& p = e.time.compute_parts;
  CHECK(p.matmul + p.attention + p.elementwise + 16 * 1e-4 == Approx(e.time.compute));
  CHECK(e.time.host > 0);  // zeroing gradients and casting weights, per parameter, outside kernels
  // Twice the GEMM rate: the GEMM part halves.
  Calibration fast = cpu_figures();
  fast.gflops_per_cpu = 160;
  CHECK(estimate(cfg, fast).time.compute_parts.matmul == Approx(p.matmul / 2));
  // fp64 uses its own rate.
  JobConfig f64 = cfg;
  f64.training.dtype = "fp64";
  CHECK(estimate(f64, cpu_figures()).hardware.bf16_tflops == 0.02);
  // meshrun-train recomputes on CPU too: selective keeps less and spends more than none, full less and more still.
  JobConfig again = cfg;
  again.training.recompute = "selective";
  const Estimate none_e = estimate(cfg, cpu_figures()), sel_e = estimate(again, cpu_figures());
  again.training.recompute = "full";
  const Estimate full_e = estimate(again, cpu_figures());
  CHECK(sel_e.memory.activations < none_e.memory.activations);
  CHECK(full_e.memory.activations < sel_e.memory.activations);
  CHECK(none_e.time.recompute == 0);
  CHECK(sel_e.time.recompute > 0);
  CHECK(full_e.time.recompute > sel_e.time.recompute);
    // A GPU calibration does not fit a CPU run, nor a CPU one a GPU run.
  Calibration gpu;
  gpu.path = "h100.toml", gpu.device = "h100-sxm";
  CHECK_THROWS_WITH(estimate(cfg, gpu), Contains("h100.toml calibrates h100-sxm"));
  JobConfig on_h100 = cfg;
  on_h100.cluster.gpu = "h100-sxm";
  CHECK_THROWS_WITH(estimate(on_h100, cpu_figures()), Contains("calibrates cpu, and this run plans h100-sxm"));
  // A GPU calibration changes only the constants it names.
  gpu.constants = {{"matmul_efficiency", cost_constants("hopper").matmul_efficiency / 2}};
  const Estimate base = estimate(on_h100), half = estimate(on_h100, gpu);
  CHECK(half.time.compute_parts.matmul == Approx(2 * base.time.compute_parts.matmul));
  CHECK(half.time.compute_parts.attention == Approx(base.time.compute_parts.attention));
}

TEST_CASE("the CPU model: collectives at collective_gbps, norms not split by tp, experts' optimizer shard", "[planner][calibration]") {
  const Calibration cal = cpu_figures();  // link 8 GB/s, no collective figure: collectives at the link's rate
  Calibration slow = cal;
  slow.collective_gbps = 2;  // a quarter of the link
  // TP's all-reduces and DP's gradient collectives move at the collective rate; their latency stays.
  const JobConfig tp2 = tiny(2, 2, 1, 1, 0), dp2 = tiny(2, 1, 1, 1, 1), pp2 = tiny(2, 1, 2, 1, 0);
  Calibration no_latency = cal;
  no_latency.constants = {{"collective_base_latency_s", 0}, {"hop_latency_pcie_s", 0}};
  Calibration slow_no_latency = no_latency;
  slow_no_latency.collective_gbps = 2;
  CHECK(estimate(tp2, slow_no_latency).time.tp_comm == Approx(4 * estimate(tp2, no_latency).time.tp_comm));
  CHECK(estimate(dp2, slow_no_latency).time.dp_comm == Approx(4 * estimate(dp2, no_latency).time.dp_comm));
  // Point-to-point transfers (the pipeline's) keep the link's rate.
  CHECK(estimate(pp2, slow).step_time_s == Approx(estimate(pp2, cal).step_time_s));
  // Without sequence parallelism every TP rank runs the norms and residual adds on the whole hidden state:
  // the elementwise part at tp 2 is more than half of tp 1's (the heads' and FFN's share halves).
  const double el1 = estimate(tiny(1, 1, 1, 1, 0), cal).time.compute_parts.elementwise;
  const double el2 = estimate(tp2, cal).time.compute_parts.elementwise;
  CHECK(el2 > 0.55 * el1);
  CHECK(el2 < 0.9 * el1);
  // MoE under ZeRO-1 at ep 2, dp 2: the dense weights' optimizer state is split over 2 ranks, the experts'
  // over their expert-data group of 1, so the optimizer reads the rank's whole expert shard.
  JobConfig moe = tiny(2, 1, 1, 1, 1);
  moe.model.experts = 8, moe.model.top_k = 2, moe.model.moe_ffn_hidden = 128;
  moe.parallel.ep = 2;
  JobConfig moe_ep1 = moe;
  moe_ep1.parallel.ep = 1;  // 8 local experts, split over the 2 DP ranks by ZeRO: the same state per rank
  CHECK(estimate(moe, cal).time.optimizer == Approx(estimate(moe_ep1, cal).time.optimizer).epsilon(1e-9));
}

TEST_CASE("the search over a CPU calibration offers what meshrun-train runs", "[planner][calibration]") {
  JobConfig cfg = tiny(4, 2, 1, 1, 1);
  const std::string path = write_file("search.toml", calibration_toml(cpu_figures(), "search"));
  cfg.planner.calibration = path;
  const SearchResult r = search(cfg, 50);
  REQUIRE(!r.top.empty());
  for (const Estimate& e : r.top) CHECK(e.hardware.calibration == path);
  // Every recomputation mode is a candidate (meshrun-train runs each): without a memory limit that binds,
  // none is the fastest.
  CHECK(r.top.front().recompute == Recompute::none);
  CHECK(r.config_rank > 0);
}

TEST_CASE("more ranks than CPUs: the node's CPUs bound the step", "[planner][calibration]") {
  const Calibration cal = cpu_figures();  // 2 CPUs
  const Estimate two = estimate(tiny(2, 2, 1, 1, 0), cal), four = estimate(tiny(4, 2, 1, 1, 0), cal);
  CHECK(two.time.shared_cores == 0);
  CHECK(two.hardware.core_share == 1);
  CHECK(four.hardware.core_share == 2);
  // Four ranks (tp 2 × dp 2) each compute half of what two do, and two share each CPU.
  CHECK(four.time.compute == Approx(two.time.compute / 2));
  CHECK(four.step_time_s >= 2 * (four.time.compute + four.time.optimizer) * (1 - 1e-12));
}

TEST_CASE("calibration files: read, written, refused in one line with file:line:column", "[planner][calibration]") {
  Calibration c = cpu_figures();
  c.constants = {{"matmul_efficiency", 0.61}, {"shared_core_latency_s", 0.002}};
  c.fitted_runs = 3;
  c.collective_gbps = 1.5;
  const std::string path = write_file("ok.toml", calibration_toml(c, "a comment\nover two lines"));
  const Calibration back = load_calibration(path);
  CHECK(back.device == "cpu");
  CHECK(back.node_cpus == 2);
  CHECK(back.gflops_per_cpu == 80);
  CHECK(back.link_gbps == 8);
  CHECK(back.collective_gbps == 1.5);
  CHECK(constant(back, "matmul_efficiency") == 0.61);
  CHECK(constant(back, "shared_core_latency_s") == 0.002);
  CHECK(back.fitted_runs == 3);

  auto refused = [](const std::string& name, const std::string& text) {
    const std::string p = write_file(name, text);
    try {
      load_calibration(p);
    } catch (const ConfigError& e) {
      const std::string what = e.what();
      CHECK(what.find('\n') == std::string::npos);
      return what;
    }
    FAIL("no error for " << text);
    return std::string();
  };
  CHECK_THAT(refused("unknown.toml", "[planner]\ndevice = \"cpu\"\nmatmul_eficiency = 0.5\n"),
             Contains("unknown.toml:3:1: unknown key planner.matmul_eficiency") &&
                 Contains("matmul_efficiency"));
  CHECK_THAT(refused("neg.toml", "[planner]\ndevice = \"cpu\"\nlink_gbps = -1\n"),
             Contains("neg.toml:3:1: planner.link_gbps must be a finite number >= 0"));
  CHECK_THAT(refused("dev.toml", "[planner]\ndevice = \"tpu\"\n"), Contains("neither \"cpu\" nor a GPU"));
  CHECK_THAT(refused("nodev.toml", "[planner]\nlink_gbps = 3\n"), Contains("has no device"));
  CHECK_THAT(refused("figures.toml", "[planner]\ndevice = \"cpu\"\n"), Contains("needs node_cpus, gflops_per_cpu"));
  CHECK_THAT(refused("table.toml", "[cluster]\nnodes = 1\n"), Contains("table.toml:1:2: unknown table [cluster]"));
  CHECK_THAT(refused("syntax.toml", "[planner\n"), Contains("syntax.toml:1:"));
  CHECK_THROWS_WITH(load_calibration("/nonexistent/cal.toml"), Contains("cannot read /nonexistent/cal.toml"));
}

TEST_CASE("the fit reproduces runs made under known constants, from a wrong start", "[planner][calibration]") {
  Calibration truth = cpu_figures();
  truth.constants = {{"matmul_efficiency", 0.55},          {"gemm_half_size", 48},
                     {"attention_efficiency", 0.12},       {"memory_efficiency", 0.4},
                     {"network_efficiency", 0.3},          {"collective_base_latency_s", 60e-6},
                     {"hop_latency_pcie_s", 10e-6},        {"shared_core_latency_s", 2e-3},
                     {"layer_overhead_s", 3e-4},           {"attention_score_s", 2e-8},
                     {"routing_assignment_s", 5e-7},       {"host_bytes_per_param", 20}};
  // A wider model with a longer sequence: its FLOPs per attention score differ from tiny's, which is what
  // tells the attention efficiency from the cost per score.
  JobConfig wide = tiny(1, 1, 1, 1, 0);
  wide.model.hidden = 256, wide.model.heads = 4, wide.model.kv_heads = 2, wide.training.seq_len = 128;
  JobConfig moe = tiny(2, 1, 1, 1, 1);
  moe.model.experts = 8, moe.model.top_k = 2, moe.model.moe_ffn_hidden = 128, moe.parallel.ep = 2;
  std::vector<MeasuredRun> runs = {
      synthetic(wide, truth, "wide one rank"),            synthetic(moe, truth, "moe ep2"),
      synthetic(tiny(1, 1, 1, 1, 0), truth, "one rank"),          synthetic(tiny(2, 2, 1, 1, 0), truth, "tp2"),
      synthetic(tiny(2, 1, 2, 1, 0), truth, "pp2 1f1b"),          synthetic(tiny(2, 1, 1, 2, 0), truth, "cp2"),
      synthetic(tiny(2, 1, 1, 1, 3), truth, "dp2 zero3"),         synthetic(tiny(4, 2, 1, 1, 1), truth, "tp2 dp2 shared"),
      synthetic(tiny(2, 1, 2, 1, 0, "zb"), truth, "pp2 zb")};
  const CalibrationFit fit = calibrate(runs, cpu_figures());
  REQUIRE(fit.after_ms.size() == runs.size());
  double before = 0;
  for (std::size_t i = 0; i < runs.size(); ++i) {
    INFO(runs[i].path << ": measured " << runs[i].step_ms << " ms, before " << fit.before_ms[i] << ", after "
                      << fit.after_ms[i]);
    CHECK(std::fabs(fit.after_ms[i] / runs[i].step_ms - 1) < 0.01);
    before = std::max(before, std::fabs(fit.before_ms[i] / runs[i].step_ms - 1));
  }
  CHECK(before > 0.2);  // the start was wrong: the fit did the work
  // The kernel groups pin the compute constants down.
  CHECK(constant(fit.calibration, "matmul_efficiency") == Approx(0.55).epsilon(0.02));
  CHECK(constant(fit.calibration, "attention_efficiency") == Approx(0.12).epsilon(0.02));
  CHECK(constant(fit.calibration, "memory_efficiency") == Approx(0.4).epsilon(0.02));
  CHECK(constant(fit.calibration, "attention_score_s") == Approx(2e-8).epsilon(0.02));
  CHECK(constant(fit.calibration, "routing_assignment_s") == Approx(5e-7).epsilon(0.05));
  CHECK(constant(fit.calibration, "host_bytes_per_param") == Approx(20).epsilon(0.05));
  CHECK(fit.calibration.fitted_runs == int(runs.size()));
  CHECK(fit.calibration.device == "cpu");
  CHECK(fit.calibration.gflops_per_cpu == 80);  // the figures are kept

  // A run of another device type is refused.
  std::vector<MeasuredRun> mixed = runs;
  mixed.back().cfg.training.device = "cuda";
  CHECK_THROWS_WITH(calibrate(mixed, cpu_figures()), Contains("calibrate runs of one device type together"));
}
