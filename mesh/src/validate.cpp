// Layout checks. Each produces one line: what is wrong, then how to fix it.
#include <algorithm>
#include <string>

#include "meshrun/geometry.hpp"
#include "meshrun/layout.hpp"
#include "meshrun/schedule.hpp"

namespace meshrun {
namespace {

std::string s(int64_t v) { return std::to_string(v); }

// Divisors of n up to limit, for "use one of ..." suggestions.
std::string divisors(int64_t n, int64_t limit) {
  std::string out;
  for (int64_t d : divisors_up_to(n, limit)) out += (out.empty() ? "" : ", ") + s(d);
  return out;
}

}  // namespace

bool is_layout_rule(std::string_view name) {
  static constexpr std::string_view kLayoutRules[] = {"world-size", "tp-nvlink",     "ep-dp-cp",  "order",
                                                      "size",       "node-type",     "nvlink-domain", "zero-stage"};
  return std::find(std::begin(kLayoutRules), std::end(kLayoutRules), name) != std::end(kLayoutRules);
}

std::vector<Problem> validate(const JobConfig& cfg, const Layout& l, const Cluster& cluster,
                              std::vector<std::string>* checks_run) {
  std::vector<Problem> p;
  auto check = [&](const char* name) {
    if (checks_run) checks_run->push_back(name);
  };
  const ModelSpec& m = cfg.model;
  const TrainingSpec& t = cfg.training;

  check("world-size");
  if (l.world() != cluster.gpus())
    p.push_back({"world-size", "tp·cp·pp·dp = " + s(l.tp) + "·" + s(l.cp) + "·" + s(l.pp) + "·" + s(l.dp) + " = " +
                                   s(l.world()) + " ranks but the cluster has " + s(cluster.gpus()) + " GPUs (" +
                                   s(cluster.nodes) + " nodes × " + s(cluster.gpus_per_node) +
                                   "); set parallel.dp = \"auto\" or change the sizes or the node count"});

  check("model-shape");
  if (m.heads < 1 || m.kv_heads < 1 || m.hidden < 1 || m.layers < 1 || m.vocab < 1 || m.ffn_hidden < 1)
    p.push_back({"model-shape", "model sizes (layers, hidden, ffn_hidden, heads, kv_heads, vocab) must be positive; set each in [model]"});
  else {
    if (m.hidden % m.heads != 0)
      p.push_back({"model-shape", "model.hidden=" + s(m.hidden) + " is not divisible by model.heads=" + s(m.heads) +
                                      "; the head dimension must be a whole number"});
    if (m.heads % m.kv_heads != 0)
      p.push_back({"model-shape", "model.heads=" + s(m.heads) + " is not a multiple of model.kv_heads=" +
                                      s(m.kv_heads) + "; grouped-query attention shares each KV head among whole groups"});
  }

  check("heads-tp");
  if (m.heads > 0 && m.heads % l.tp != 0)
    p.push_back({"heads-tp", "model.heads=" + s(m.heads) + " is not divisible by tp=" + s(l.tp) +
                                 "; use a tp that divides the head count (" + divisors(m.heads, 64) + ")"});
  check("kv-heads-tp");
  if (m.kv_heads > 0 && m.kv_heads % l.tp != 0)
    p.push_back({"kv-heads-tp", "model.kv_heads=" + s(m.kv_heads) + " is not divisible by tp=" + s(l.tp) +
                                    "; each TP rank needs whole KV heads (GQA): use tp in {" +
                                    divisors(m.kv_heads, 64) + "}"});
  check("ffn-tp");
  if (m.ffn_hidden > 0 && m.ffn_hidden % l.tp != 0)
    p.push_back({"ffn-tp", "model.ffn_hidden=" + s(m.ffn_hidden) + " is not divisible by tp=" + s(l.tp) +
                               "; column-parallel MLP shards need equal widths"});
  check("vocab-tp");
  if (m.vocab > 0 && m.vocab % l.tp != 0)
    p.push_back({"vocab-tp", "model.vocab=" + s(m.vocab) + " is not divisible by tp=" + s(l.tp) +
                                 "; pad the vocabulary to a multiple of tp (vocab-parallel embedding)"});

  check("layers-pp");
  const int64_t chunks = int64_t(l.pp) * l.virtual_stages;
  if (m.layers > 0 && (chunks > int64_t(m.layers) + 2 || !chunk_layers(m.layers, static_cast<int>(chunks))))
    p.push_back({"layers-pp", "model.layers=" + s(m.layers) + " cannot be split over pp·virtual_stages = " + s(l.pp) +
                                  "·" + s(l.virtual_stages) + " = " + s(chunks) +
                                  " pipeline chunks; use a chunk count that divides the layers (" +
                                  divisors(m.layers, m.layers) + ") or layers+2 (first and last chunk one fewer)"});

  check("experts-ep");
  if (m.experts > 0 && m.experts % l.ep != 0)
    p.push_back({"experts-ep", "model.experts=" + s(m.experts) + " is not divisible by ep=" + s(l.ep) +
                                   "; use ep in {" + divisors(m.experts, m.experts) + "}"});
  if (m.experts == 0 && l.ep > 1)
    p.push_back({"experts-ep", "ep=" + s(l.ep) + " needs a mixture-of-experts model; set model.experts or use ep = 1"});
  if (m.experts > 0 && (m.top_k < 1 || m.top_k > m.experts))
    p.push_back({"experts-ep", "model.top_k=" + s(m.top_k) + " must be between 1 and model.experts=" + s(m.experts) + "; set the experts each token visits"});

  check("ep-dp-cp");
  if ((int64_t(l.dp) * l.cp) % l.ep != 0)
    p.push_back({"ep-dp-cp", "ep=" + s(l.ep) + " does not divide dp·cp = " + s(int64_t(l.dp) * l.cp) +
                                 "; expert parallelism folds into the data/context ranks of a stage: use ep in {" +
                                 divisors(int64_t(l.dp) * l.cp, 1 << 20) + "}"});

  // Batch, sequence and sequence-parallel splits: mesh's one batch geometry (geometry.hpp), also read by the
  // planner and the trainer.
  std::vector<Problem> batch_problems;
  const auto geometry = batch_geometry(t, l, &batch_problems);
  auto report = [&](const char* id) {
    check(id);
    for (const Problem& b : batch_problems)
      if (b.check == id) p.push_back(b);
  };
  report("seq-cp");
  report("seq-sp");

  check("tp-nvlink");
  int domain = cluster.nvlink_domain_gpus;
  if (domain > 1 && l.tp > domain)
    p.push_back({"tp-nvlink", "tp=" + s(l.tp) + " is larger than the " + s(domain) + "-GPU NVLink domain of " +
                                  cluster.type.name + "; TP traffic must stay on NVLink: use tp ≤ " + s(domain) +
                                  " and add pp or cp instead"});
  else if (domain > 1 && l.tp > cluster.gpus_per_node && domain % l.tp != 0)
    p.push_back({"tp-nvlink", "tp=" + s(l.tp) + " does not divide the " + s(domain) +
                                  "-GPU NVLink domain, so some TP groups would straddle two domains; use tp in {" +
                                  divisors(domain, domain) + "}"});
  else if (domain <= 1 && l.tp > cluster.gpus_per_node)
    p.push_back({"tp-nvlink", "tp=" + s(l.tp) + " spans more than one node (" + s(cluster.gpus_per_node) +
                                  " GPUs per node, no NVLink); use tp ≤ " + s(cluster.gpus_per_node)});
  else if (l.tp <= cluster.gpus_per_node && cluster.gpus_per_node % l.tp != 0)
    p.push_back({"tp-nvlink", "tp=" + s(l.tp) + " does not divide gpus_per_node=" + s(cluster.gpus_per_node) +
                                  ", so some TP groups would straddle two nodes; use tp in {" +
                                  divisors(cluster.gpus_per_node, 64) + "}"});

  report("batch-dp");
  // The pipeline schedule rule is check_schedule_spec's, shared with the generators and the planner. Without a
  // valid batch split it still checks schedule against virtual stages (with the schedule's fewest micro-batches).
  const auto known_kind = parse_pipeline_schedule(cfg.parallel.pipeline_schedule);
  const int least = known_kind ? min_microbatches(*known_kind, l.pp) : l.pp;
  const int64_t micro = geometry ? geometry->microbatches : least;
  check("pp-microbatches");
  check("interleaved");
  if (auto kind = parse_pipeline_schedule(cfg.parallel.pipeline_schedule); !kind)
    p.push_back({"interleaved", "parallel.pipeline_schedule = \"" + cfg.parallel.pipeline_schedule +
                                    "\" is not known; use \"gpipe\", \"1f1b\", \"interleaved\", \"zb\", \"zbv\" or \"dualpipev\""});
  else {
    ScheduleSpec spec{*kind, l.pp, l.virtual_stages, least};
    std::string why = check_schedule_spec(spec);  // schedule against virtual stages and pp
    const char* id = "interleaved";
    if (why.empty()) {
      spec.microbatches = int(std::min<int64_t>(micro, 1 << 30));
      why = check_schedule_spec(spec);
      if (l.pp > 1 && micro < least) id = "pp-microbatches";
    }
    if (!why.empty()) p.push_back({id, why});
  }
  return p;
}

}  // namespace meshrun
