// The pure parts of meshrun-train's run observation: the straggler verdict (trainer/src/run/stragglers.cpp),
// how a rank is named (heartbeat.cpp), MFU (step_log.cpp).
#include <cmath>
#include <catch2/catch.hpp>

#include "../../trainer/src/run/heartbeat.hpp"
#include "../../trainer/src/run/step_log.hpp"
#include "../../trainer/src/run/stragglers.hpp"
#include "meshrun/model_flops.hpp"
#include "meshrun/train/run/trainer.hpp"

using namespace meshrun;
using namespace meshrun::train::cli;

TEST_CASE("stragglers: the rank past the margin above the median compute is named, slowest first", "[observe]") {
  // 10 steps; compute seconds per rank over the window, waits beside them.
  const std::vector<double> compute{0.30, 0.31, 0.62, 0.29, 0.45};
  const std::vector<double> wait{0.50, 0.50, 0.10, 0.52, 0.30};
  const StragglerReport r = judge_stragglers(compute, wait, 10, 0.3);
  CHECK(r.median_compute_ms == Approx(31.0));
  CHECK(r.median_wait_ms == Approx(50.0));
  REQUIRE(r.slow.size() == 2);  // 62 and 45 ms > 31 × 1.3 = 40.3 ms
  CHECK(r.slow[0].rank == 2);
  CHECK(r.slow[0].compute_ms == Approx(62.0));
  CHECK(r.slow[0].wait_ms == Approx(10.0));
  CHECK(r.slow[1].rank == 4);
  // A wider margin keeps only rank 2; equal ranks name nobody.
  CHECK(judge_stragglers(compute, wait, 10, 0.5).slow.size() == 1);
  CHECK(judge_stragglers({0.2, 0.2, 0.2, 0.2}, {0, 0, 0, 0}, 10, 0.0).slow.empty());
}

TEST_CASE("stragglers: the line names rank, node, host and coordinates", "[observe]") {
  StragglerReport r;
  r.first_step = 41;
  r.last_step = 50;
  r.median_compute_ms = 30.0;
  r.median_wait_ms = 35.0;
  const Straggler s{3, 60.0, 4.0};
  std::vector<RankPlace> places(4);
  places[3] = {"n3", "lab", Coord{1, 0, 0, 1, 0, 0}};
  CHECK(straggler_line(r, s, places, 0.3) ==
        "meshrun-train: straggler at steps 41-50: rank 3 on node n3 (host lab, pp 0 dp 1 tp 1 cp 0) computes 60.0 ms "
        "per step, the median rank 30.0 ms (+100%, training.straggler_margin = 30%); it waits 4.0 ms per step in "
        "communication, the median rank 35.0 ms");
  // Without Slurm the node is the host: named once.
  CHECK(describe_rank(0, {"vm", "vm", Coord{}}) == "rank 0 on node vm (pp 0 dp 0 tp 0 cp 0)");
}

TEST_CASE("MFU: model FLOPs of a step over the peak, from the shared formula", "[observe]") {
  JobConfig cfg;
  cfg.model.layers = 4;
  cfg.model.hidden = 128;
  cfg.model.heads = 4;
  cfg.model.kv_heads = 2;
  cfg.model.ffn_hidden = 352;
  cfg.model.vocab = 256;
  cfg.training.seq_len = 64;
  cfg.training.global_batch_size = 16;
  const Utilization u = utilization(cfg, 1e11, "test");
  // templates/tiny.toml's model: 770,048 matmul weights, 1024 tokens per step (docs/gpu.md works it by hand).
  CHECK(u.flops_per_step == Approx(6.0 * 770048 * 1024 + 6.0 * 4 * 64 * 4 * 32 * 1024));
  CHECK(u.mfu(u.flops_per_step / 1e11) == Approx(1.0));
  CHECK(u.mfu(2 * u.flops_per_step / 1e11) == Approx(0.5));
  CHECK(std::isnan(Utilization{1e9, 0, ""}.mfu(1.0)));  // no peak (a GPU outside the catalogue): no MFU, null
}

TEST_CASE("expert_rank_imbalance: the busiest EP rank's rows over the mean rank's, summed over layers", "[observe]") {
  // 2 layers × 4 experts, 2 per EP rank (experts 0-1 on rank 0, 2-3 on rank 1).
  const std::vector<double> tokens{10, 10, 10, 10,   // layer 0: balanced, 20 and 20
                                   30, 10, 0, 0};    // layer 1: 40 and 0
  // (20 + 40) / (20 + 20) = 1.5; the hottest single expert (30 over a mean of 10) would say 3.
  CHECK(meshrun::train::expert_rank_imbalance(tokens, 4, 2) == Approx(1.5));
  CHECK(meshrun::train::expert_rank_imbalance(tokens, 4, 1) == Approx((10 + 30) / 20.0));  // one expert per rank
  CHECK(meshrun::train::expert_rank_imbalance(tokens, 4, 4) == Approx(1.0));  // one rank holds them all
  CHECK(meshrun::train::expert_rank_imbalance({}, 4, 2) == 0);
}
