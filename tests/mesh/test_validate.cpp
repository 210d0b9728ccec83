// Every validation check fires, with a message that names the problem and a fix; valid layouts pass.
#include <algorithm>
#include <catch2/catch.hpp>

#include "meshrun/layout.hpp"

using namespace meshrun;

namespace {

JobConfig base() {
  JobConfig c;
  c.cluster.nodes = 2;
  c.cluster.node_type = "dgx-h100";
  c.model.layers = 8;
  c.model.hidden = 256;
  c.model.ffn_hidden = 512;
  c.model.heads = 8;
  c.model.kv_heads = 8;
  c.model.vocab = 512;
  c.parallel.tp = 2;
  c.parallel.pp = 2;
  c.training.seq_len = 128;
  c.training.global_batch_size = 32;
  return c;
}

// Problems of a config, or a single "resolve" problem if it doesn't resolve.
std::vector<Problem> problems_of(const JobConfig& cfg) {
  std::vector<Problem> p;
  Cluster c = resolve_cluster(cfg.cluster, &p);
  auto l = resolve_layout(cfg.parallel, c.gpus(), &p);
  if (!l || !p.empty()) return p;
  return validate(cfg, *l, c);
}

void expect_problem(const JobConfig& cfg, const std::string& check, const std::string& text) {
  auto p = problems_of(cfg);
  INFO("expected check " << check);
  bool found = false;
  for (const auto& x : p) {
    INFO(x.check << ": " << x.message);
    if (x.check == check && x.message.find(text) != std::string::npos) found = true;
    REQUIRE(x.message.find('\n') == std::string::npos);  // one line each
    REQUIRE(x.message.find("; ") != std::string::npos);  // problem; fix
  }
  REQUIRE(found);
}

}  // namespace

TEST_CASE("the base layout is valid and every check runs", "[validate]") {
  JobConfig cfg = base();
  std::vector<Problem> p;
  Cluster c = resolve_cluster(cfg.cluster, &p);
  auto l = resolve_layout(cfg.parallel, c.gpus(), &p);
  REQUIRE(l);
  REQUIRE(l->dp == 4);
  std::vector<std::string> checks;
  REQUIRE(validate(cfg, *l, c, &checks).empty());
  REQUIRE(checks.size() >= 15);
}

TEST_CASE("each validation error fires with its message", "[validate]") {
  JobConfig c = base();
  SECTION("world size != product") {
    c.parallel.dp = 3;
    expect_problem(c, "world-size", "= 12 ranks but the cluster has 16 GPUs");
  }
  SECTION("dp auto on an indivisible world") {
    c.parallel.tp = 3;
    expect_problem(c, "world-size", "multiple of tp·cp·pp = 6");
  }
  SECTION("heads % tp") {
    c.model.heads = 6;
    c.model.kv_heads = 6;
    c.model.hidden = 240;
    c.parallel.tp = 4;
    expect_problem(c, "heads-tp", "model.heads=6 is not divisible by tp=4");
  }
  SECTION("kv_heads vs tp (GQA)") {
    c.model.kv_heads = 2;
    c.parallel.tp = 4;
    c.parallel.pp = 1;
    expect_problem(c, "kv-heads-tp", "model.kv_heads=2 is not divisible by tp=4");
  }
  SECTION("layers vs pp × virtual stages") {
    c.model.layers = 7;
    expect_problem(c, "layers-pp", "model.layers=7 cannot be split over pp·virtual_stages = 2·1");
  }
  SECTION("experts % ep") {
    c.model.experts = 6;
    c.parallel.ep = 4;
    expect_problem(c, "experts-ep", "model.experts=6 is not divisible by ep=4");
  }
  SECTION("ep without experts") {
    c.parallel.ep = 2;
    expect_problem(c, "experts-ep", "needs a mixture-of-experts model");
  }
  SECTION("ep must divide dp·cp") {
    c.model.experts = 8;
    c.parallel.ep = 8;
    expect_problem(c, "ep-dp-cp", "ep=8 does not divide dp·cp = 4");
  }
  SECTION("sequence length % 2·cp") {
    c.parallel.cp = 2;
    c.training.seq_len = 102;
    expect_problem(c, "seq-cp", "training.seq_len=102 is not divisible by 2·cp = 4");
  }
  SECTION("TP larger than the NVLink domain") {
    c.parallel.tp = 16;
    c.parallel.pp = 1;
    c.model.heads = 16;
    c.model.kv_heads = 16;
    expect_problem(c, "tp-nvlink", "tp=16 is larger than the 8-GPU NVLink domain");
  }
  SECTION("TP straddling nodes") {
    c.cluster.node_type = "generic";
    c.cluster.gpus_per_node = 6;
    c.parallel.tp = 4;
    c.parallel.pp = 1;
    c.parallel.dp = 3;
    c.training.global_batch_size = 30;
    expect_problem(c, "tp-nvlink", "tp=4 does not divide gpus_per_node=6");
  }
  SECTION("global batch % (dp × micro-batch)") {
    c.training.global_batch_size = 30;
    c.training.micro_batch_size = 2;
    expect_problem(c, "batch-dp", "training.global_batch_size=30 is not divisible by dp·micro_batch_size = 4·2 = 8");
  }
  SECTION("fewer micro-batches than pipeline stages") {
    c.training.global_batch_size = 4;
    expect_problem(c, "pp-microbatches", "only 1 micro-batches per step for pp=2");
  }
  SECTION("interleaving without a pipeline") {
    c.parallel.pp = 1;
    c.parallel.virtual_stages = 2;
    c.parallel.pipeline_schedule = "interleaved";
    expect_problem(c, "interleaved", "needs a pipeline");
  }
  SECTION("virtual stages without the interleaved schedule") {
    c.parallel.virtual_stages = 2;
    expect_problem(c, "interleaved", "parallel.virtual_stages=2 needs pipeline_schedule = \"interleaved\"");
    c.parallel.pipeline_schedule = "zb";
    expect_problem(c, "interleaved", "(\"zb\" runs one chunk per pipeline rank)");
  }
  SECTION("the interleaved schedule with one chunk per rank") {
    c.parallel.pipeline_schedule = "interleaved";
    expect_problem(c, "interleaved", "needs parallel.virtual_stages ≥ 2");
  }
  SECTION("interleaved micro-batches not a multiple of pp") {
    c.parallel.pipeline_schedule = "interleaved";
    c.parallel.virtual_stages = 2;
    c.training.global_batch_size = 12;  // dp 4: 3 micro-batches per step on 2 stages
    expect_problem(c, "interleaved", "micro-batches per step (3) to be a multiple of pp=2");
  }
  SECTION("the schedule rule holds even when the batch split is wrong") {
    c.parallel.virtual_stages = 2;
    c.training.global_batch_size = 30;
    expect_problem(c, "batch-dp", "not divisible by dp·micro_batch_size");
    expect_problem(c, "interleaved", "needs pipeline_schedule = \"interleaved\"");
  }
  SECTION("negative sizes") {
    c.parallel.cp = -1;
    expect_problem(c, "size", "parallel.cp=-1 must be a positive integer");
  }
  SECTION("unknown node type") {
    c.cluster.node_type = "dgx-h1000";
    expect_problem(c, "node-type", "unknown cluster.node_type 'dgx-h1000'");
  }
}

TEST_CASE("Llama 3's uneven pipeline split", "[validate]") {
  auto v = chunk_layers(126, 16);
  REQUIRE(v);
  REQUIRE(v->front() == 7);
  REQUIRE(v->back() == 7);
  REQUIRE((*v)[1] == 8);
  int total = 0;
  for (int x : *v) total += x;
  REQUIRE(total == 126);
  // One layer per chunk (Llama 3 405B: pp 16 × 8 virtual stages): the first chunk holds only the embedding
  // and the last only the output head.
  auto one = chunk_layers(126, 128);
  REQUIRE(one);
  REQUIRE(one->size() == 128);
  REQUIRE(one->front() == 0);
  REQUIRE(one->back() == 0);
  REQUIRE(std::count(one->begin(), one->end(), 1) == 126);
  REQUIRE_FALSE(chunk_layers(126, 256));  // 128 is not a multiple of 256
  REQUIRE_FALSE(chunk_layers(1, 2));      // two chunks cannot both give up a layer
  REQUIRE(chunk_layers(32, 4) == std::vector<int>{8, 8, 8, 8});
  REQUIRE_FALSE(chunk_layers(7, 2));
  REQUIRE_FALSE(chunk_layers(3, 4));
}
