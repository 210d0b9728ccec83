// The `ranks` and `groups` of `meshrun plan --format json` (the bulk of its output) for 131,072 GPUs
// (llama3-405b on 16,384 DGX H100: TP 8 × PP 16 × DP 1024), written two ways: meshrun's streaming
// JsonWriter (mesh/include/meshrun/json.hpp, what plan_render.cpp does) and an nlohmann::ordered_json
// document built and dumped. Both give the same bytes (checked, mode `check`). One mode per process so
// the peak RSS (getrusage) is that mode's.
// usage: meshrun-bench-json writer|nlohmann|check [ROUNDS]     (bench/json_bench.sh runs all three)
#include <sys/resource.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include <nlohmann/json.hpp>

#include "meshrun/json.hpp"
#include "meshrun/rank_map.hpp"

using namespace meshrun;

namespace {

RankMap make_map() {
  Layout l;
  l.tp = 8;
  l.pp = 16;
  l.dp = 1024;
  l.order = *parse_order("tp-cp-pp-dp", nullptr);
  Cluster c;
  c.nodes = 16384;
  c.gpus_per_node = 8;
  c.nvlink_domain_gpus = 8;
  c.type = *find_node_type("dgx-h100");
  for (int n = 0; n < c.nodes; ++n) {
    char h[16];
    std::snprintf(h, sizeof h, "node%05d", n);
    c.hosts.push_back(h);
  }
  return RankMap(l, c);
}

std::string with_writer(const RankMap& map) {
  std::string out;
  JsonWriter j(out);
  j.begin_object();
  j.key("ranks").begin_array();
  for (int r = 0; r < map.world(); ++r) {
    const Coord x = map.coords(r);
    const Placement p = map.placement(r);
    j.begin_object();
    j.field("rank", r).field("node", p.node).field("host", map.host(r)).field("local_rank", p.local_rank);
    j.field("gpu", p.gpu).field("tp", x.tp).field("cp", x.cp).field("pp", x.pp).field("dp", x.dp).field("ep", x.ep);
    j.end_object();
  }
  j.end_array();
  j.key("groups").begin_object();
  for (GroupKind k : kGroupKinds) {
    j.key(group_name(k)).begin_array();
    summarize_group(map, k, [&](const std::vector<int>& g) { j.int_array(g); });
    j.end_array();
  }
  j.end_object();
  j.end_object();
  return out;
}

std::string with_nlohmann(const RankMap& map) {
  nlohmann::ordered_json doc = nlohmann::ordered_json::object();
  nlohmann::ordered_json& ranks = doc["ranks"] = nlohmann::ordered_json::array();
  for (int r = 0; r < map.world(); ++r) {
    const Coord x = map.coords(r);
    const Placement p = map.placement(r);
    ranks.push_back({{"rank", r}, {"node", p.node}, {"host", map.host(r)}, {"local_rank", p.local_rank},
                     {"gpu", p.gpu}, {"tp", x.tp}, {"cp", x.cp}, {"pp", x.pp}, {"dp", x.dp}, {"ep", x.ep}});
  }
  nlohmann::ordered_json& groups = doc["groups"] = nlohmann::ordered_json::object();
  for (GroupKind k : kGroupKinds) {
    nlohmann::ordered_json& list = groups[group_name(k)] = nlohmann::ordered_json::array();
    summarize_group(map, k, [&](const std::vector<int>& g) { list.push_back(g); });
  }
  return doc.dump();
}

}  // namespace

int main(int argc, char** argv) {
  const char* mode = argc > 1 ? argv[1] : "check";
  const int rounds = argc > 2 ? std::atoi(argv[2]) : 3;
  const RankMap map = make_map();
  if (!std::strcmp(mode, "check")) {
    const bool same = with_writer(map) == with_nlohmann(map);
    std::printf("check: writer and nlohmann output %s\n", same ? "identical" : "DIFFER");
    return same ? 0 : 1;
  }
  const bool writer = !std::strcmp(mode, "writer");
  if (!writer && std::strcmp(mode, "nlohmann")) {
    std::fprintf(stderr, "usage: meshrun-bench-json writer|nlohmann|check [ROUNDS]\n");
    return 2;
  }
  double best = 1e30;
  std::size_t bytes = 0;
  for (int i = 0; i < rounds; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    const std::string s = writer ? with_writer(map) : with_nlohmann(map);
    best = std::min(best, std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    bytes = s.size();
  }
  rusage ru{};
  ::getrusage(RUSAGE_SELF, &ru);
  std::printf("%-9s %d ranks, %.1f MB of JSON: best of %d %.0f ms, peak RSS %.0f MiB\n", mode, map.world(),
              static_cast<double>(bytes) / 1e6, rounds, best, static_cast<double>(ru.ru_maxrss) / 1024.0);
  return 0;
}
