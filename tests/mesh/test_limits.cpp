// The limits of meshrun/limits.hpp: 64-bit products, bounded divisor searches, hostlist sizes computed before
// expanding, and the largest allowed values still accepted.
#include <catch2/catch.hpp>

#include <numeric>

#include "meshrun/config.hpp"
#include "meshrun/hostlist.hpp"
#include "meshrun/layout.hpp"
#include "meshrun/limits.hpp"

using namespace meshrun;

namespace {
std::string error_of(std::string_view toml) {
  Config cfg;
  try {
    apply_toml_text(cfg, toml, "t.toml", SourceKind::template_file);
    check_limits(cfg);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}
std::string repeat(const std::string& s, int n, const std::string& sep) {
  std::string out;
  for (int i = 0; i < n; ++i) out += (i ? sep : "") + s;
  return out;
}
bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }
}  // namespace

TEST_CASE("cluster GPUs and layout world are 64-bit products", "[limits]") {
  Cluster c;
  c.nodes = 65536;
  c.gpus_per_node = 65536;
  CHECK(c.gpus() == int64_t(1) << 32);
  Layout l;
  l.tp = l.pp = 65536;
  CHECK(l.world() == int64_t(1) << 32);
  l.cp = l.dp = 1 << 24;
  CHECK(limits::product({l.tp, l.cp, l.pp, l.dp}) == INT64_MAX);  // saturates instead of wrapping
  CHECK(limits::product({1 << 12, 1 << 12}) == limits::kWorld);
}

TEST_CASE("resolve_cluster refuses sizes beyond the limits before naming any host", "[limits]") {
  std::vector<Problem> p;
  ClusterSpec s;
  s.nodes = 16384;
  s.gpus_per_node = 1024;  // exactly 2^24 GPUs: allowed
  Cluster c = resolve_cluster(s, &p);
  CHECK(p.empty());
  CHECK(c.gpus() == limits::kWorld);
  CHECK(c.hosts.size() == 16384);
  s.nodes = 16385;
  c = resolve_cluster(s, &p);
  REQUIRE(p.size() == 1);
  CHECK(has(p[0].message, "cluster.nodes × gpus_per_node = 16385 × 1024 = 16778240 GPUs is more than 16777216"));
  CHECK(c.hosts.empty());
  p.clear();
  s.nodes = 1000000000;  // the bad_alloc reproducer, built in code past the config layer
  s.gpus_per_node = 1;
  c = resolve_cluster(s, &p);
  REQUIRE(p.size() == 1);
  CHECK(has(p[0].message, "cluster.nodes = 1000000000 is larger than 4194304"));
  CHECK(c.hosts.empty());
  p.clear();
  s.nodes = 1;
  s.gpus_per_node = 1025;
  resolve_cluster(s, &p);
  REQUIRE(p.size() == 1);
  CHECK(has(p[0].message, "cluster.gpus_per_node = 1025 is larger than 1024"));
}

TEST_CASE("resolve_layout refuses a world or pipeline beyond the limits", "[limits]") {
  std::vector<Problem> p;
  LayoutSpec s;
  s.tp = 1 << 12;
  s.cp = 1 << 12;  // dp = auto
  auto l = resolve_layout(s, limits::kWorld, &p);
  REQUIRE(l);
  CHECK(l->dp == 1);
  CHECK(l->world() == limits::kWorld);
  s.dp = 2;
  CHECK_FALSE(resolve_layout(s, limits::kWorld, &p));
  REQUIRE(p.size() == 1);
  CHECK(has(p[0].message, "tp·cp·pp·dp = 4096·4096·1·2 is more than 16777216 ranks"));
  p.clear();
  s = {};
  s.tp = s.cp = s.pp = s.dp = 1 << 24;  // each within the per-key bound, the product overflows int64
  CHECK_FALSE(resolve_layout(s, 8, &p));
  REQUIRE(p.size() == 2);  // the ranks, and pp alone makes 2^24 pipeline chunks
  CHECK(has(p[0].message, "is more than 16777216 ranks"));
  CHECK(has(p[1].message, "pipeline chunks is more than 1024"));
  p.clear();
  CHECK_FALSE(resolve_layout({}, int64_t(1) << 32, &p));  // the 65536 × 65536 cluster
  REQUIRE(p.size() == 1);
  CHECK(has(p[0].message, "the job has 4294967296 GPUs"));
  p.clear();
  s = {};
  s.pp = 2;
  s.virtual_stages = 512;  // 1024 chunks: allowed
  CHECK(resolve_layout(s, 2, &p));
  s.virtual_stages = 1073741824;
  CHECK_FALSE(resolve_layout(s, 2, &p));
  REQUIRE(p.size() == 1);
  CHECK(has(p[0].message, "pp·virtual_stages = 2·1073741824 = 2147483648 pipeline chunks is more than 1024"));
}

TEST_CASE("chunk_layers stays small and exact at the limits", "[limits]") {
  CHECK_FALSE(chunk_layers(2147483647, 3));  // overflowed (layers + 2) before
  CHECK_FALSE(chunk_layers(10, 2147483647));  // more chunks than layers + 2: no vector of that size
  auto v = chunk_layers(int(limits::kLayers), int(limits::kLayers) + 2);
  REQUIRE(v);
  CHECK(v->size() == size_t(limits::kLayers) + 2);
  CHECK(std::accumulate(v->begin(), v->end(), int64_t(0)) == limits::kLayers);
  CHECK_FALSE(chunk_layers(int(limits::kLayers) + 1, 1));
}

TEST_CASE("divisors are found in O(√n) and listed up to the limit", "[limits]") {
  CHECK(divisors_up_to(12, 12) == std::vector<int64_t>{1, 2, 3, 4, 6, 12});
  CHECK(divisors_up_to(36, 9) == std::vector<int64_t>{1, 2, 3, 4, 6, 9});
  CHECK(divisors_up_to(1, 64) == std::vector<int64_t>{1});
  CHECK(divisors_up_to(0, 64).empty());
  CHECK(divisors_up_to(2147483647, 2147483647) == std::vector<int64_t>{1, 2147483647});  // a prime: was 2^31 steps
  CHECK(divisors_up_to(int64_t(1) << 40, 4) == std::vector<int64_t>{1, 2, 4});
}

TEST_CASE("the largest world validates", "[limits]") {
  JobConfig cfg;
  cfg.cluster.nodes = 16384;
  cfg.cluster.gpus_per_node = 1024;
  cfg.training.global_batch_size = 1 << 24;
  std::vector<Problem> found;
  Cluster c = resolve_cluster(cfg.cluster, &found);
  auto l = resolve_layout(cfg.parallel, c.gpus(), &found);
  REQUIRE(found.empty());
  REQUIRE(l);
  CHECK(l->dp == 1 << 24);
  CHECK(validate(cfg, *l, c).empty());
}

TEST_CASE("validate does not overflow on what resolve_layout passes at the limits", "[limits]") {
  JobConfig cfg;
  cfg.model.layers = int(limits::kLayers);
  cfg.parallel.pp = 5;  // 65536 layers over 5 chunks: neither split exists
  std::vector<Problem> found;
  ClusterSpec cs;
  cs.gpus_per_node = 5;
  Cluster c = resolve_cluster(cs, &found);
  auto l = resolve_layout(cfg.parallel, c.gpus(), &found);
  REQUIRE(l);
  auto p = validate(cfg, *l, c);
  bool layers = false;
  for (const auto& x : p) layers |= x.check == "layers-pp" && has(x.message, "(1, 2, 4, 8, 16, 32, 64");
  CHECK(layers);
}

TEST_CASE("hostlist sizes are computed before expanding", "[limits][hostlist]") {
  std::string err;
  auto size = [&](const std::string& e) { return *hostlist_size(e, &err); };
  CHECK(size("a[8-10],b").hosts == 4);
  CHECK(size("a[8-10],b").bytes == 2 + 2 + 3 + 1);
  CHECK(size("r[1-2]-n[01-02]").bytes == 4 * 6);
  CHECK(size("n[001-100]").bytes == 100 * 4);
  CHECK(size("n[9-10] m").bytes == 2 + 3 + 1);
  // The computed size is the expansion's, on a few shapes.
  for (const char* e : {"node[001-003,7],gpu-[1-2]-ib", "x[98-102]y[7,9]", "a b,c", "n[0-0]", "[1-3]"}) {
    auto hosts = expand_hostlist(e, &err);
    REQUIRE(hosts);
    int64_t bytes = 0;
    for (const auto& h : *hosts) bytes += int64_t(h.size());
    CHECK(size(e).hosts == int64_t(hosts->size()));
    CHECK(size(e).bytes == bytes);
  }

  // The audit's three: bytes, one bracket, top-level items.
  const std::string bytes = std::string(200, 'x') + "[1-4194304]";
  const std::string bracket = "n[" + repeat("0-4194303", 16, ",") + "]";
  const std::string items = repeat("n[0-4194303]", 16, ",");
  CHECK(size(bytes).hosts == 4194304);     // exactly the host limit: the bytes refuse it
  CHECK(size(bytes).bytes == 867109824);   // 200 · 4194304 + the digits of 1..4194304
  CHECK(size(bracket).hosts == 16 * 4194304);
  CHECK(size(items).hosts == 16 * 4194304);
  for (const auto& e : {bytes, bracket, items}) {
    CHECK_FALSE(check_hostlist(e, &err));
    CHECK_FALSE(expand_hostlist(e, &err));
  }
  CHECK(has((check_hostlist(bytes, &err), err), "867109824 bytes of host names, more than the 67108864"));
  CHECK(has((check_hostlist(items, &err), err), "expands to 67108864 hosts, more than the 4194304"));
  CHECK(size("n[0-4294967295][0-4294967295][0-4294967295]").hosts == INT64_MAX);  // saturates, no wrap
  CHECK(size("n[0-18446744073709551615]").hosts == INT64_MAX);
  CHECK_FALSE(check_hostlist("n[0-18446744073709551615]", &err));
  // At the limit: accepted (arithmetic only; nothing expanded here).
  CHECK(check_hostlist("n[0-4194303]", &err));
  CHECK(check_hostlist("n[0-2097151],m[0-2097151]", &err));
  CHECK_FALSE(check_hostlist("n[0-2097151],m[0-2097152]", &err));
}

TEST_CASE("an expanded hostlist joined with commas expands to itself", "[hostlist]") {
  std::string err;
  for (const char* e : {"node[001-003,7],gpu-[1-2]-ib", "r[1-2]-n[01-02] x", "a,b,c", "n[0098-0102]"}) {
    auto hosts = expand_hostlist(e, &err);
    REQUIRE(hosts);
    std::string joined;
    for (const auto& h : *hosts) joined += (joined.empty() ? "" : ",") + h;
    CHECK(expand_hostlist(joined, &err) == hosts);
  }
}

TEST_CASE("every key that enters a product is bounded where it is read", "[limits][config]") {
  CHECK(has(error_of("[cluster]\nnodes = 65536\ngpus_per_node = 65536\n"),
            "t.toml:3:17: cluster.gpus_per_node = 65536 is larger than 1024"));
  CHECK(has(error_of("[parallel]\ncp = 1073741824\n"), "t.toml:2:6: parallel.cp = 1073741824 is larger than 16777216"));
  CHECK(has(error_of("[parallel]\nvirtual_stages = 1073741824\n"), "parallel.virtual_stages = 1073741824 is larger than 1024"));
  CHECK(has(error_of("[model]\nlayers = 2147483647\n"), "t.toml:2:10: model.layers = 2147483647 is larger than 1024"));
  CHECK(has(error_of("[model]\nexperts = 2147483647\n"), "model.experts = 2147483647 is larger than 65536"));
  CHECK(has(error_of("[cluster]\nnodes = 100000000\n"), "cluster.nodes = 100000000 is larger than 4194304"));
  CHECK(has(error_of("[training]\nseq_len = 16777217\n"), "training.seq_len = 16777217 is larger than 16777216"));
  CHECK(has(error_of("[cluster]\nhostlist = \"n[0-4194303],m1\"\n"),
            "t.toml:2:12: cluster.hostlist: expands to 4194305 hosts, more than the 4194304"));
  // Products: located at the largest factor.
  CHECK(has(error_of("[parallel]\ntp = 65536\npp = 65536\ndp = 1\n"),
            "t.toml:2:6: parallel.tp × parallel.cp × parallel.pp × parallel.dp = 65536 × 1 × 65536 × 1 = "
            "4294967296 ranks is more than 16777216"));
  CHECK(has(error_of("[cluster]\nnodes = 4194304\ngpus_per_node = 8\n"),
            "t.toml:2:9: cluster.nodes × cluster.gpus_per_node = 4194304 × 8 = 33554432 GPUs is more than 16777216"));
  CHECK(has(error_of("[parallel]\npp = 4\nvirtual_stages = 257\n"), "= 1028 pipeline chunks is more than 1024"));
  // The largest allowed values pass.
  CHECK(error_of("[cluster]\nnodes = 16384\ngpus_per_node = 1024\n[parallel]\ntp = 4096\ncp = 4096\n") == "");
  CHECK(error_of("[parallel]\npp = 2\nvirtual_stages = 512\n[model]\nlayers = 1024\nexperts = 65536\n") == "");
  CHECK(error_of("[cluster]\nnodes = 4194304\ngpus_per_node = 4\nhostlist = \"n[0-4194303]\"\n") == "");
  CHECK(error_of("[training]\nseq_len = 16777216\nglobal_batch_size = 1073741824\n") == "");
}

TEST_CASE("Slurm task counts: one parser for N(xR),M", "[hostlist]") {
  using meshrun::parse_task_counts;
  const auto runs = parse_task_counts("2(x3),1");
  REQUIRE(runs);
  REQUIRE(runs->size() == 2);
  CHECK((*runs)[0].count == 2);
  CHECK((*runs)[0].repeat == 3);
  CHECK((*runs)[1].count == 1);
  CHECK((*runs)[1].repeat == 1);
  CHECK(meshrun::tasks_on_node(*runs, 0) == 2);
  CHECK(meshrun::tasks_on_node(*runs, 2) == 2);
  CHECK(meshrun::tasks_on_node(*runs, 3) == 1);
  CHECK(meshrun::tasks_on_node(*runs, 4) == -1);
  CHECK(parse_task_counts("8")->front().count == 8);
  for (const char* bad : {"", "x", "2(x0)", "2(x3", "2(y3)", "-1", "2,,3", "2(x3)junk", "99999999999"})
    CHECK_FALSE(parse_task_counts(bad));
  // A huge repeat stays a count, never an expansion.
  CHECK(parse_task_counts("4(x2000000000)")->front().repeat == 2000000000);
}
