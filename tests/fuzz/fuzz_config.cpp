// Target 1: template text + --set overrides -> config -> validation -> rank map (what `meshrun plan` does).
// Input: leading lines "--set section.key=value" (at most 8), the rest is the template's TOML.
// Contracts: only ConfigError escapes; a failed layer leaves every value unchanged; a layout that validates
// fills the cluster (world = nodes · gpus_per_node) and its rank map is a bijection of [0, world) onto the
// coordinate grid whose groups partition the world.
#include <map>
#include <set>

#include "fuzz_common.hpp"
#include "meshrun/config.hpp"
#include "meshrun/layout.hpp"
#include "meshrun/resolve.hpp"
#include "meshrun/rank_map.hpp"

using namespace meshrun;

namespace {

constexpr int kMaxCheckedWorld = 1 << 12;  // the exhaustive map checks are O(world); larger maps are sampled

std::map<std::string, std::string> snapshot(const JobConfig& job) {
  std::map<std::string, std::string> s;
  for (const KeyInfo& k : config_keys())
    if (k.type != ValueType::table) s[k.key] = value_text(job, k.key);
  return s;
}

void check_rank_map(const Layout& layout, const Cluster& cluster) {
  const RankMap map(layout, cluster);
  const int world = map.world();
  FUZZ_CHECK(world == layout.world() && world == cluster.gpus(), "world " + std::to_string(world));
  const int step = world <= kMaxCheckedWorld ? 1 : world / kMaxCheckedWorld;
  for (int r = 0; r < world; r += step) {
    const Coord c = map.coords(r);
    FUZZ_CHECK(c.tp >= 0 && c.tp < layout.tp && c.cp >= 0 && c.cp < layout.cp && c.pp >= 0 && c.pp < layout.pp &&
                   c.dp >= 0 && c.dp < layout.dp && c.ep >= 0 && c.ep < layout.ep,
               "coordinates of rank " + std::to_string(r) + " out of range");
    FUZZ_CHECK(map.grid().rank(c) == r, "coords -> rank does not invert rank -> coords at " + std::to_string(r));
    const Placement p = map.placement(r);
    FUZZ_CHECK(p.node >= 0 && p.node < cluster.nodes && p.local_rank >= 0 && p.local_rank < cluster.gpus_per_node,
               "placement of rank " + std::to_string(r));
    FUZZ_CHECK(map.rank_at(p.node, p.local_rank) == r, "rank_at(placement) at " + std::to_string(r));
  }
  if (world > kMaxCheckedWorld) return;
  for (GroupKind kind : kGroupKinds) {
    std::vector<int> seen(static_cast<size_t>(world), 0);
    const int size = map.grid().group_size(kind);
    for (const auto& g : map.grid().groups(kind)) {
      FUZZ_CHECK(static_cast<int>(g.size()) == size, std::string(group_name(kind)) + " group size");
      for (int r : g) {
        FUZZ_CHECK(r >= 0 && r < world, "group member out of range");
        ++seen[static_cast<size_t>(r)];
      }
    }
    for (int r = 0; r < world; ++r)
      FUZZ_CHECK(seen[static_cast<size_t>(r)] == 1, std::string(group_name(kind)) + " groups do not partition the world");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view in(reinterpret_cast<const char*>(data), size);
  std::vector<std::string> sets;
  while (sets.size() < 8 && in.substr(0, 6) == "--set ") {
    const size_t nl = in.find('\n');
    sets.emplace_back(in.substr(6, nl == in.npos ? in.npos : nl - 6));
    in = nl == in.npos ? std::string_view() : in.substr(nl + 1);
  }
  Config cfg;
  try {
    apply_toml_text(cfg, in, "fuzz.toml", SourceKind::template_file);
  } catch (const ConfigError& e) {
    FUZZ_CHECK(fuzz::bounded_lines_message(e.what(), 9), "ConfigError message (at most 8 problems and a count)");
    FUZZ_CHECK(snapshot(cfg.job) == snapshot(Config{}.job), "a failed template changed the defaults");
    return 0;
  }
  for (const std::string& s : sets) {
    const auto before = snapshot(cfg.job);
    try {
      apply_set(cfg, s);
    } catch (const ConfigError& e) {
      FUZZ_CHECK(fuzz::one_line_message(e.what(), s.find('\n') != s.npos), "ConfigError message");
      FUZZ_CHECK(snapshot(cfg.job) == before, "a failed --set " + s + " changed a value");
    }
  }
  try {
    std::vector<Problem> problems;
    const Cluster cluster = resolve_cluster(cfg.job.cluster, &problems);
    if (!problems.empty()) return 0;
    FUZZ_CHECK(static_cast<int>(cluster.hosts.size()) == cluster.nodes, "one host name per node");
    const auto layout = resolve_layout(cfg.job.parallel, cluster.gpus(), &problems);
    if (!layout || !problems.empty()) return 0;
    if (!validate(cfg.job, *layout, cluster).empty()) return 0;
    layout_warnings(cfg.job, *layout, cluster);
    check_rank_map(*layout, cluster);
  } catch (const ConfigError& e) {
    FUZZ_CHECK(fuzz::one_line_message(e.what(), true), "ConfigError message");
  }
  return 0;
}
