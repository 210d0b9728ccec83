// search(): validity of what it returns, drop accounting, where the Table 4 layouts rank, and the same
// ranking as the exhaustive path.
#include <catch2/catch.hpp>

#include <set>
#include <sstream>
#include <tuple>

#include "meshrun/config.hpp"
#include "cost.hpp"  // detail::search (internal): the exhaustive path
#include "meshrun/planner.hpp"
#include "reference_models.hpp"

using namespace meshrun::planner;
using meshrun::JobConfig;

namespace {
// Every returned setting must pass the mesh validator and fit.
void check_returned(const JobConfig& base, const SearchResult& r) {
  std::vector<meshrun::Problem> problems;
  meshrun::Cluster cluster = meshrun::resolve_cluster(base.cluster, &problems);
  REQUIRE(problems.empty());
  std::set<std::tuple<int, int, int, int, int>> shapes;
  double previous = 0;
  for (const Estimate& e : r.top) {
    JobConfig cfg = base;
    cfg.training.micro_batch_size = e.micro_batch_size;
    cfg.parallel.pipeline_schedule = meshrun::pipeline_schedule_name(e.schedule);  // virtual stages > 1 go with interleaved only
    INFO("tp " << e.layout.tp << " cp " << e.layout.cp << " pp " << e.layout.pp << " dp " << e.layout.dp);
    CHECK(meshrun::validate(cfg, e.layout, cluster).empty());
    CHECK(e.layout.world() == cluster.gpus());
    CHECK(e.fits);
    CHECK(e.step_time_s >= previous);  // fastest first
    previous = e.step_time_s;
    CHECK(shapes.insert({e.layout.tp, e.layout.cp, e.layout.pp, e.layout.dp, e.layout.ep}).second);
  }
}

// 1-based rank of a mesh shape in a full search, 0 if absent.
int rank_of(const SearchResult& r, int tp, int cp, int pp) {
  for (size_t i = 0; i < r.top.size(); ++i)
    if (r.top[i].layout.tp == tp && r.top[i].layout.cp == cp && r.top[i].layout.pp == pp) return int(i) + 1;
  return 0;
}
}  // namespace

TEST_CASE("search for Llama 3 405B on 16,384 GPUs returns valid, fitting, ranked layouts", "[planner][search]") {
  JobConfig job = testing::llama3_405b_job(16384, 8, 1, 16, 8192, 2048);
  SearchResult r = search(job, 10);
  REQUIRE(r.top.size() == 10);
  check_returned(job, r);
  CHECK(r.world == 16384);
  CHECK(r.dropped_settings[int(Drop::memory)] > 0);
  CHECK(r.dropped_settings[int(Drop::validator)] == 0);  // the search's rules mirror the mesh validator
  CHECK(r.dropped_meshes[int(Drop::heads_tp)] > 0);      // e.g. tp = 16 does not divide 8 KV heads
  int64_t dropped = 0;
  for (int64_t d : r.dropped_settings) dropped += d;
  CHECK(r.feasible + dropped == r.settings);
  for (const Estimate& e : r.top) CHECK(e.layout.tp <= 8);  // TP stays inside the NVLink domain
  // The order comes from the template and is kept.
  CHECK(r.top.front().layout.order.str() == "tp-cp-ep-pp-dp");
}

TEST_CASE("Table 4 layouts are in the search's top 5 for their setting", "[planner][search][table4]") {
  struct Row { int gpus, tp, cp, pp, seq, batch; } rows[] = {
      {8192, 8, 1, 16, 8192, 2048}, {16384, 8, 1, 16, 8192, 2048}, {16384, 8, 16, 16, 131072, 128}};
  for (const Row& row : rows) {
    JobConfig job = testing::llama3_405b_job(row.gpus, row.tp, row.cp, row.pp, row.seq, row.batch);
    SearchResult all = search(job, 1000);
    const int rank = rank_of(all, row.tp, row.cp, row.pp);
    INFO(row.gpus << " GPUs, seq " << row.seq << ": Table 4 layout ranks " << rank << " of " << all.feasible_meshes);
    REQUIRE(rank > 0);
    // The search reports the config's own shape's rank and gap without being asked for the full list.
    SearchResult five = search(job, 5);
    CHECK(five.config_rank == rank);
    CHECK(five.config_gap == Approx(all.top[rank - 1].step_time_s / all.top.front().step_time_s - 1));
    std::ostringstream table;
    print_search_table(table, five);
    CHECK(table.str().find("the template's own shape ranks " + std::to_string(rank) + " of ") != std::string::npos);
    CHECK(search_json(five).find("\"config_rank\":" + std::to_string(rank)) != std::string::npos);
    // Same GPUs, sequence length and global batch; every shape with its best setting (docs/planner.md,
    // "Top-5 criterion").
    CHECK(rank <= 5);
    CHECK(all.top[rank - 1].step_time_s <= 1.05 * all.top.front().step_time_s);
    // Its best setting there also matches the published throughput within ±10%.
    const double published[] = {430, 400, 380};
    CHECK(all.top[rank - 1].tflops_per_gpu == Approx(published[&row - rows]).epsilon(0.10));
  }
}

TEST_CASE("search: nothing fits on too few GPUs, and says so", "[planner][search]") {
  JobConfig job = testing::llama3_405b_job(8, 8, 1, 1, 8192, 16);
  SearchResult r = search(job, 5);
  CHECK(r.top.empty());
  CHECK(r.feasible == 0);
  CHECK(r.config_rank == 0);
  CHECK(r.dropped_settings[int(Drop::memory)] > 0);
  std::ostringstream table;
  print_search_table(table, r);
  CHECK(table.str().find("no setting fits") != std::string::npos);
  std::string json = search_json(r);
  CHECK(json.find("\"top\":[]") != std::string::npos);
  CHECK(json.find("\"reason\":\"memory\"") != std::string::npos);
}

TEST_CASE("search over an MoE model uses expert parallelism", "[planner][search][moe]") {
  JobConfig job;
  job.model = testing::mixtral_8x7b();
  job.cluster = testing::dgx("dgx-h100", 64);
  job.training.seq_len = 4096;
  job.training.global_batch_size = 256;
  job.training.device = "cuda";  // a GPU run: bf16 activations
  SearchResult r = search(job, 5);
  REQUIRE_FALSE(r.top.empty());
  check_returned(job, r);
  for (const Estimate& e : r.top) {
    CHECK(8 % e.layout.ep == 0);
    CHECK((e.layout.dp * e.layout.cp) % e.layout.ep == 0);
  }
  CHECK(r.top.front().layout.ep > 1);
  CHECK(search_json(r).find("\"ep\":") != std::string::npos);
}

TEST_CASE("search keeps the template's pipeline schedule family", "[planner][search]") {
  JobConfig job = testing::llama3_405b_job(16384, 8, 1, 16, 8192, 2048);
  job.parallel.virtual_stages = 1;
  job.parallel.pipeline_schedule = "zb";
  SearchResult r = search(job, 5);
  REQUIRE_FALSE(r.top.empty());
  for (const Estimate& e : r.top) {
    CHECK(e.layout.virtual_stages == 1);
    if (e.layout.pp > 1) CHECK(e.schedule == meshrun::PipelineSchedule::zero_bubble);
  }
}

TEST_CASE("search: bad input is a ConfigError", "[planner][search][errors]") {
  JobConfig job = testing::llama3_405b_job(16384, 8, 1, 16, 8192, 2048);
  job.parallel.order = "tp-xx-pp-dp";
  CHECK_THROWS_AS(search(job, 5), meshrun::ConfigError);
  job = testing::llama3_405b_job(16384, 8, 1, 16, 8192, 2048);
  job.cluster.node_type = "no-such-node";
  CHECK_THROWS_WITH(search(job, 5), Catch::Contains("node_type"));
}

TEST_CASE("axis links agree with the mesh rank map's groups", "[planner][links]") {
  // The planner classifies rank 0's group by its largest member; the rank map enumerates every group.
  const char* orders[] = {"tp-cp-ep-dp-pp", "tp-cp-pp-dp", "tp-dp-cp-pp", "pp-dp-cp-tp"};
  for (const char* order : orders)
    for (int ep : {1, 2, 4}) {
      JobConfig job;
      job.model = testing::mixtral_8x7b();
      job.cluster = testing::dgx("dgx-h100", 64);
      job.parallel.tp = 2, job.parallel.cp = 2, job.parallel.pp = 2, job.parallel.ep = ep;
      job.parallel.order = order;
      job.training.seq_len = 4096;
      job.training.global_batch_size = 64;
      Estimate e = estimate(job);
      std::vector<meshrun::Problem> problems;
      meshrun::Cluster cluster = meshrun::resolve_cluster(job.cluster, &problems);
      meshrun::RankMap map(e.layout, cluster);
      auto slowest = [&](meshrun::GroupKind kind) {
        meshrun::Link worst = meshrun::Link::self;
        for (const auto& g : map.grid().groups(kind)) worst = std::max(worst, map.link_of(g));
        return worst;
      };
      INFO("order " << order << ", ep " << ep);
      CHECK(e.links.tp == slowest(meshrun::GroupKind::tp));
      CHECK(e.links.cp == slowest(meshrun::GroupKind::cp));
      CHECK(e.links.pp == slowest(meshrun::GroupKind::pp));
      CHECK(e.links.dp == slowest(meshrun::GroupKind::dp_cp));
      CHECK(e.links.ep == slowest(meshrun::GroupKind::ep));
      CHECK(e.links.edp == slowest(meshrun::GroupKind::edp));
    }
}

TEST_CASE("ring islands agree with the rank map's placement", "[planner][links]") {
  // The planner counts the NVLink domains (nodes without NVLink) of rank 0's groups arithmetically where it
  // can; here every group is enumerated through the rank map instead.
  int checked = 0;
  for (const char* node_type : {"dgx-h100", "gb200-nvl72"})
    for (const char* order : {"tp-cp-ep-dp-pp", "tp-cp-pp-dp", "tp-dp-cp-pp", "pp-dp-cp-tp", "dp-tp-pp-cp"})
      for (int tp : {1, 2, 4})
        for (int cp : {1, 2, 4}) {
          JobConfig job;
          job.model = testing::mixtral_8x7b();
          const bool rack = std::string(node_type) == "gb200-nvl72";
          job.cluster = testing::dgx(node_type, rack ? 288 : 128);
          if (rack) job.cluster.gpus_per_node = 4, job.cluster.nodes = 72;
          job.parallel.tp = tp, job.parallel.cp = cp, job.parallel.pp = 2, job.parallel.ep = 2;
          job.parallel.order = order;
          job.training.seq_len = 4096;
          job.training.global_batch_size = 576;
          job.training.recompute = "full";
          Estimate e;
          try {
            e = estimate(job);
          } catch (const meshrun::ConfigError&) {
            continue;  // e.g. tp across NVLink domains
          }
          std::vector<meshrun::Problem> problems;
          meshrun::Cluster cluster = meshrun::resolve_cluster(job.cluster, &problems);
          meshrun::RankMap map(e.layout, cluster);
          auto islands = [&](meshrun::GroupKind kind) {
            std::set<int> seen;
            for (int r : map.grid().group_of(0, kind)) {
              const meshrun::Placement p = map.placement(r);
              seen.insert(cluster.nvlink_domain_gpus > 1 ? cluster.nvlink_domain_of(p.node, p.local_rank) : p.node);
            }
            return int(seen.size());
          };
          INFO(node_type << " order " << order << " tp " << tp << " cp " << cp << " dp " << e.layout.dp);
          CHECK(e.links.tp_islands == islands(meshrun::GroupKind::tp));
          CHECK(e.links.cp_islands == islands(meshrun::GroupKind::cp));
          CHECK(e.links.dp_islands == islands(meshrun::GroupKind::dp_cp));
          CHECK(e.links.ep_islands == islands(meshrun::GroupKind::ep));
          CHECK(e.links.edp_islands == islands(meshrun::GroupKind::edp));
          ++checked;
        }
  CHECK(checked > 40);
}

// Issue 31: the planner simulates the step's schedule table, micro-batches × pp·virtual_stages slots; past
// kMaxScheduleSlots (the bound of `meshrun plan --schedule`) estimate() refuses in one line before anything is
// generated and the search skips those settings, not the whole search. Before, a 2^30 batch grew to gigabytes.
TEST_CASE("huge batches: estimate refuses past the schedule bound, the search skips those settings", "[planner][search]") {
  // Table 4's 8K shape: dp 128, pp 16 × 8 virtual stages = 128 chunks.
  JobConfig job = testing::llama3_405b_job(16384, 8, 1, 16, 8192, 512 * 128);  // 512 micro-batches: 65,536 slots
  CHECK(meshrun::kMaxScheduleSlots == 65536);
  CHECK_NOTHROW(estimate(job));  // at the bound
  job.training.global_batch_size = (512 + 16) * 128;  // the next valid count (interleaved: a multiple of pp)
  CHECK_THROWS_WITH(estimate(job), Catch::Contains("67584 schedule slots; the planner simulates at most 65536") &&
                                       !Catch::Contains("\n"));
  job.training.global_batch_size = int64_t(1) << 30;
  CHECK_THROWS_WITH(estimate(job), Catch::Contains("gives 8388608 micro-batches per step"));
  {  // at pp = 1 nothing is simulated: any batch is estimated
    JobConfig flat = job;
    flat.parallel.pp = 1, flat.parallel.virtual_stages = 1, flat.parallel.pipeline_schedule = "1f1b";
    CHECK(estimate(flat).micro_batches == (int64_t(1) << 30) / 2048);
  }

  SearchResult r = search(job, 5);
  CHECK(r.dropped_settings[int(Drop::schedule_size)] > 0);
  REQUIRE(!r.top.empty());  // pp = 1 settings are still searched
  check_returned(job, r);
  for (const Estimate& e : r.top)
    CHECK((e.layout.pp == 1 || int64_t(e.micro_batches) * e.layout.pp * e.layout.virtual_stages <= 65536));
  int64_t dropped = 0;
  for (int64_t d : r.dropped_settings) dropped += d;
  CHECK(r.feasible + dropped == r.settings);
  std::ostringstream table;
  print_search_table(table, r);
  CHECK(table.str().find("schedule too long to simulate (micro-batches × pp·virtual_stages over 65536 slots)") !=
        std::string::npos);

  // Where nothing is left and settings were skipped for their schedule, the table names them, not "add GPUs" alone.
  JobConfig few = job;
  few.cluster = testing::dgx("dgx-h100", 16);  // 405B at pp = 1 does not fit 16 GPUs
  few.parallel.tp = 8, few.parallel.pp = 2, few.parallel.virtual_stages = 1, few.parallel.pipeline_schedule = "1f1b";
  SearchResult none = search(few, 5);
  CHECK(none.top.empty());
  CHECK(none.dropped_settings[int(Drop::schedule_size)] > 0);
  std::ostringstream text;
  print_search_table(text, none);
  CHECK(text.str().find("no setting left: ") != std::string::npos);
  CHECK(text.str().find("lower training.global_batch_size to search them") != std::string::npos);
}

namespace {
// A template as `meshrun plan T.toml --set ...` reads it (no site file).
JobConfig template_job(const std::string& name, std::vector<std::string> sets = {}) {
  meshrun::ConfigRequest req;
  req.template_path = std::string(MESHRUN_SOURCE_DIR) + "/templates/" + name + ".toml";
  req.use_site = false;
  req.sets = std::move(sets);
  return meshrun::build_config(req).job;
}

// Everything the ranked list shows of one entry, compared exactly: both paths cost a setting with the same
// functions, so a difference is a different setting or a different (mis)costing, not rounding.
void require_same(const Estimate& a, const Estimate& b) {
  REQUIRE(a.layout.tp == b.layout.tp);
  REQUIRE(a.layout.cp == b.layout.cp);
  REQUIRE(a.layout.pp == b.layout.pp);
  REQUIRE(a.layout.dp == b.layout.dp);
  REQUIRE(a.layout.ep == b.layout.ep);
  REQUIRE(a.layout.virtual_stages == b.layout.virtual_stages);
  REQUIRE(a.layout.zero_stage == b.layout.zero_stage);
  REQUIRE(a.layout.sequence_parallel == b.layout.sequence_parallel);
  REQUIRE(a.schedule == b.schedule);
  REQUIRE(a.micro_batch_size == b.micro_batch_size);
  REQUIRE(a.recompute == b.recompute);
  REQUIRE(a.step_time_s == b.step_time_s);
  REQUIRE(a.time.pp_bubble == b.time.pp_bubble);
  REQUIRE(a.memory.total() == b.memory.total());
  REQUIRE(a.memory.activations == b.memory.activations);
  REQUIRE(a.memory_stage == b.memory_stage);
}
}  // namespace

TEST_CASE("search: the pruned path ranks exactly as the exhaustive one", "[planner][search][exhaustive]") {
  // The exhaustive path costs every fitting setting in full (simulated bubble, live slots from the simulated
  // tables, every setting validated) and ranks every shape; the search simulates only what its bounds
  // cannot rule out and takes live slots in closed form. Templates of every schedule family, dense and MoE,
  // 8 to 1,024 GPUs (405B on 128 nodes: its 16,384 GPUs take the exhaustive path minutes).
  struct Case {
    const char* name;
    std::vector<std::string> sets;
  };
  const std::vector<Case> cases = {
      {"llama3-8b", {}},
      {"llama3-70b", {}},
      {"llama3-70b", {"parallel.pipeline_schedule=zb", "parallel.virtual_stages=1"}},
      {"llama3-70b", {"parallel.pipeline_schedule=gpipe", "parallel.virtual_stages=1", "training.global_batch_size=256"}},
      {"mixtral-8x7b", {}},
      {"llama3-405b", {"cluster.nodes=128", "cluster.hostlist=", "training.global_batch_size=512"}},
      {"llama3-405b-128k", {"cluster.nodes=128", "cluster.hostlist=", "training.global_batch_size=32"}},
  };
  for (const Case& c : cases) {
    std::string label = c.name;
    for (const auto& s : c.sets) label += " " + s;
    INFO(label);
    const JobConfig job = template_job(c.name, c.sets);
    const SearchResult all = detail::search(job, 1 << 30, detail::SearchPath::exhaustive);
    REQUIRE(all.top.size() > 5);
    REQUIRE(int64_t(all.top.size()) == all.feasible_meshes);
    for (int top : {1, 5, 1 << 30}) {
      INFO("--top " << top);
      const SearchResult fast = detail::search(job, top, detail::SearchPath::pruned);
      REQUIRE(fast.top.size() == std::min(all.top.size(), size_t(top)));
      for (size_t i = 0; i < fast.top.size(); ++i) {
        INFO("entry " << i + 1);
        require_same(fast.top[i], all.top[i]);
      }
      REQUIRE(fast.config_rank == all.config_rank);
      REQUIRE(fast.config_gap == all.config_gap);
      REQUIRE(fast.meshes == all.meshes);
      REQUIRE(fast.settings == all.settings);
      REQUIRE(fast.feasible == all.feasible);
      REQUIRE(fast.feasible_meshes == all.feasible_meshes);
      REQUIRE(fast.dropped_meshes == all.dropped_meshes);
      REQUIRE(fast.dropped_settings == all.dropped_settings);
      if (top == 5) REQUIRE(fast.pipeline_simulations < all.pipeline_simulations);  // it did prune
    }
  }
}
