// search(): enumerate every valid setting, drop what cannot run or fit (counted by reason), rank the rest.
// Loops go from the coarsest choice (tp) to the finest (recompute) and prune as early as a rule allows;
// the rules mirror mesh's validate(), which still checks every setting that becomes a shape's best.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <optional>
#include <queue>
#include <set>
#include <string>
#include <tuple>

#include "cost.hpp"
#include "meshrun/config.hpp"

namespace meshrun::planner {

const char* drop_reason(Drop d) {
  switch (d) {
    case Drop::heads_tp: return "tp does not divide heads, kv_heads, ffn_hidden or vocab";
    case Drop::tp_nvlink: return "tp does not fit the NVLink domain or node";
    case Drop::seq_cp: return "seq_len not divisible by 2·cp";
    case Drop::cp_alltoall:
      return "all-to-all CP (parallel.cp_comm) over a group that does not divide cp, or the heads or kv heads per tp rank";
    case Drop::batch_dp: return "global batch not divisible by dp";
    case Drop::layers_pp: return "layers cannot be split over pp·virtual_stages";
    case Drop::microbatches: return "too few micro-batches for the pipeline (< pp, or not a multiple of pp when interleaved)";
    case Drop::schedule_size: {
      static const std::string why = "schedule too long to simulate (micro-batches × pp·virtual_stages over " +
                                     std::to_string(kMaxScheduleSlots) + " slots)";
      return why.c_str();
    }
    case Drop::memory: return "does not fit in GPU memory";
    case Drop::validator: return "rejected by the mesh validator";
    case Drop::count_: break;
  }
  return "?";
}

namespace {

using namespace detail;

std::vector<int> divisors(int64_t n) {
  std::vector<int> d;
  for (int64_t i = 1; i * i <= n; ++i)
    if (n % i == 0) {
      d.push_back(int(i));
      if (i * i != n) d.push_back(int(n / i));
    }
  std::sort(d.begin(), d.end());
  return d;
}

// A pipeline choice for a given pp: (schedule, virtual stages, stage layers).
struct PipeChoice {
  PipelineSchedule schedule;
  int v;
  StageLayers layers;
};

struct Candidate {
  Setting setting;
  StageLayers layers;
  double bound = 0;  // lower bound of the full step: the step without the simulated idle plus its lower bound
  int index = 0;     // enumeration order within the shape: of equal steps, the earlier setting wins
};

struct Shape {  // a mesh shape (tp, cp, pp, dp, ep) and its fitting settings, cheapest bound first
  Layout layout;
  AxisLinks links;
  std::vector<Candidate> candidates;
};

struct Best {
  Setting setting;
  StageLayers layers;
  AxisLinks links;
  Cost cost;
  double step = 0;
  int index = 0;
};

bool tp_fits(int tp, const Cluster& c) {  // mirrors validate()'s "tp-nvlink"
  const int domain = c.nvlink_domain_gpus;
  if (domain > 1) return tp <= domain && (tp > c.gpus_per_node || c.gpus_per_node % tp == 0);
  return tp <= c.gpus_per_node && c.gpus_per_node % tp == 0;
}

}  // namespace

SearchResult search(const JobConfig& cfg, int top_n) { return detail::search(cfg, top_n, SearchPath::pruned); }

namespace detail {

SearchResult search(const JobConfig& cfg, int top_n, SearchPath path) {
  const bool exhaustive = path == SearchPath::exhaustive;
  const auto started = std::chrono::steady_clock::now();
  Resolved r = resolve(cfg);
  const Cluster& cluster = r.cluster;
  CostModel model(cfg, r.hardware);
  model.use_simulated_live_slots(exhaustive);
  const ModelSpec& m = cfg.model;
  const TrainingSpec& t = cfg.training;
  std::vector<Problem> problems;
  LayoutSpec base_spec = cfg.parallel;
  base_spec.tp = base_spec.cp = base_spec.pp = base_spec.ep = base_spec.virtual_stages = 1;
  base_spec.dp = 0;
  base_spec.zero_stage = 0;
  auto base = resolve_layout(base_spec, cluster.gpus(), &problems);  // parses the order
  if (!base) throw ConfigError(problems.front().message);
  if (t.seq_len < 1 || t.global_batch_size < 1 || m.layers < 1 || m.heads < 1)
    throw ConfigError("training.seq_len, training.global_batch_size, model.layers and model.heads must be positive");

  // The schedule is the trainer's, not a knob: the search varies virtual stages within its family
  // (1f1b and interleaved are one family), and keeps gpipe, zb, zbv or dualpipev as they are.
  PipelineSchedule family = *parse_pipeline_schedule(cfg.parallel.pipeline_schedule);
  if (family == PipelineSchedule::one_f_one_b) family = PipelineSchedule::interleaved;

  SearchResult res;
  const int world = cluster.gpus();
  res.world = world;
  auto drop_mesh = [&](Drop d) { ++res.dropped_meshes[int(d)]; };
  auto drop = [&](Drop d, int64_t n) {
    res.dropped_settings[int(d)] += n;
    res.settings += n;
  };
  TrainingSpec batch_spec = t;  // the micro-batch size varies: mesh's batch_geometry cuts the batch for each
  JobConfig check_cfg = cfg;  // the validator reads the micro-batch size and the schedule from the config
  // A setting the search keeps must pass the mesh validator; a refusal is counted and the setting dropped.
  auto valid = [&](const Setting& s) {
    check_cfg.training.micro_batch_size = int(s.batch.micro_batch_size);
    check_cfg.parallel.pipeline_schedule = pipeline_schedule_name(s.schedule);
    if (validate(check_cfg, s.layout, cluster).empty()) return true;
    --res.feasible;
    ++res.dropped_settings[int(Drop::validator)];
    return false;
  };
  std::vector<Shape> shapes;

  for (int tp : divisors(world)) {
    if (m.heads % tp || m.kv_heads % tp || m.ffn_hidden % tp || m.vocab % tp) { drop_mesh(Drop::heads_tp); continue; }
    if (!tp_fits(tp, cluster)) { drop_mesh(Drop::tp_nvlink); continue; }
    for (int cp : divisors(world / tp)) {
      if (cp > 1 && t.seq_len % (2 * cp)) { drop_mesh(Drop::seq_cp); continue; }
      // meshrun-train's rule cp-alltoall: the all-to-all group divides cp and the rank's heads and kv heads.
      if (cp > 1 && !cp_alltoall_fits(cfg.parallel, cp, m.heads / tp, m.kv_heads / tp)) { drop_mesh(Drop::cp_alltoall); continue; }
      const bool sp = tp > 1 && (t.seq_len / cp) % tp == 0;
      for (int pp : divisors(world / tp / cp)) {
        const int dp = world / tp / cp / pp;
        if (t.global_batch_size % dp) { drop_mesh(Drop::batch_dp); continue; }
        std::vector<PipeChoice> pipes;  // valid schedules for this pp
        if (pp == 1) {
          pipes.push_back({PipelineSchedule::one_f_one_b, 1, *stage_layers(m.layers, 1, 1, ChunkPlacement::looped)});
        } else {
          // zbv and dualpipev always run two chunks per rank in a V; the others start from one.
          const int v1 = scheduled_virtual_stages(family, 1);
          auto l1 = stage_layers(m.layers, pp, v1, chunk_placement(family));
          if (!l1) { drop_mesh(Drop::layers_pp); continue; }
          if (family == PipelineSchedule::interleaved) {  // 1F1B is its v = 1 case; v only where the layers split
            pipes.push_back({PipelineSchedule::one_f_one_b, 1, *l1});
            // Only chunk counts pp·v that divide layers or layers + 2 can split: O(√layers) candidates.
            std::set<int> vs;
            for (int64_t n : {int64_t(m.layers), int64_t(m.layers) + 2})
              for (int c : divisors(n))
                if (c % pp == 0 && c / pp >= 2) vs.insert(c / pp);
            for (int v : vs)
              if (auto lv = stage_layers(m.layers, pp, v, ChunkPlacement::looped))
                pipes.push_back({PipelineSchedule::interleaved, v, *lv});
          } else {
            pipes.push_back({family, v1, *l1});
          }
        }
        const std::vector<int> micro_batches = divisors(t.global_batch_size / dp);
        const int64_t dpcp = int64_t(dp) * cp;
        const int zero_max = dpcp > 1 ? 3 : 0;  // ZeRO over one rank is plain data parallelism
        const int64_t per_pipe = int64_t(zero_max + 1) * 3;
        for (int ep : divisors(dpcp)) {
          if (ep > 1 && (m.experts == 0 || m.experts % ep)) continue;  // not an EP degree for this model
          ++res.meshes;
          Layout layout = *base;
          layout.tp = tp, layout.cp = cp, layout.pp = pp, layout.dp = dp, layout.ep = ep;
          layout.sequence_parallel = sp;
          const AxisLinks links = axis_links(layout, cluster, cp_alltoall_group(cfg.parallel, cp));
          // Every fitting setting of this shape, costed without its simulated pipeline idle; with that idle's
          // lower bound (no simulation) this bounds its step from below. Simulations wait for the second pass.
          Shape shape{layout, links, {}};
          int index = 0;
          for (int mb : micro_batches) {
            batch_spec.micro_batch_size = mb;
            Setting one{layout, setting_batch(batch_spec, layout), family, Recompute::none};
            const int micro = int(one.batch.microbatches);
            // One layer's costs depend on the shape and the micro-batch size only (layer_cost).
            const LayerCost layer = model.layer_cost(one, links);
            for (const PipeChoice& pc : pipes) {
              // mesh's schedule rule (micro-batches against pp, interleaved's multiple of pp)
              if (!check_schedule_spec({pc.schedule, pp, pc.v, micro}).empty()) { drop(Drop::microbatches, per_pipe); continue; }
              // The schedule bound --schedule and --estimate refuse at: this candidate is skipped, not the search.
              if (!schedule_within_bound(t.global_batch_size, mb, dp, pp, pc.v)) { drop(Drop::schedule_size, per_pipe); continue; }
              // The idle's lower bound depends on the pipeline's costs, which no ZeRO stage changes: once per
              // recomputation choice.
              double idle_bound[3] = {-1, -1, -1};
              for (int zero = 0; zero <= zero_max; ++zero)
                for (Recompute rc : {Recompute::none, Recompute::selective, Recompute::full}) {
                  // meshrun-train's rule recompute-experts: no full recomputation of expert layers.
                  if (rc == Recompute::full && m.experts > 0) continue;
                  ++res.settings;
                  Candidate cand{one, pc.layers, 0, index++};
                  cand.setting.layout.virtual_stages = pc.v;
                  cand.setting.layout.zero_stage = zero;
                  cand.setting.schedule = pc.schedule;
                  cand.setting.recompute = rc;
                  Cost cost;
                  model.memory(cand.setting, pc.layers, &cost);
                  if (cost.memory.total() > model.capacity_bytes()) { ++res.dropped_settings[int(Drop::memory)]; continue; }
                  ++res.feasible;
                  if (!exhaustive) {
                    const PipelineCosts pipeline = model.time_before_bubble(cand.setting, pc.layers, links, layer, &cost);
                    double& idle = idle_bound[int(rc)];
                    if (idle < 0) idle = model.bubble_lower_bound(cand.setting, pipeline);
                    // Less a hair: step() sums the same parts in another order than the bound.
                    cand.bound = (cost.time.step() + idle) * (1 - 1e-12);
                  }
                  shape.candidates.push_back(cand);
                }
            }
          }
          if (shape.candidates.empty()) continue;
          if (!exhaustive)
            std::sort(shape.candidates.begin(), shape.candidates.end(), [](const Candidate& x, const Candidate& y) {
              return x.bound != y.bound ? x.bound < y.bound : x.index < y.index;
            });
          shapes.push_back(std::move(shape));
        }
      }
    }
  }

  // A setting's full step: memory, the step without the idle, the simulated idle.
  auto cost_of = [&](const Shape& shape, const Candidate& cand) {
    Best b{cand.setting, cand.layers, shape.links, {}, 0, cand.index};
    model.memory(cand.setting, cand.layers, &b.cost);
    model.time(cand.setting, cand.layers, shape.links, &b.cost);
    b.step = b.cost.time.step();
    return b;
  };
  // Of two settings of one shape the faster is better, of equal steps the earlier one.
  auto better = [](const Best& x, const Best& y) { return x.step != y.step ? x.step < y.step : x.index < y.index; };
  const LayoutSpec& own = cfg.parallel;
  const int64_t own_inner = int64_t(own.tp) * own.cp * own.pp;
  const int64_t own_dp = own.dp > 0 ? own.dp : (own_inner > 0 ? world / own_inner : 0);
  auto is_own = [&](const Shape& x) {
    const Layout& l = x.layout;
    return l.tp == own.tp && l.cp == own.cp && l.pp == own.pp && l.dp == own_dp && l.ep == own.ep;
  };
  std::vector<Best> bests;
  int64_t slower_shapes = 0;  // feasible, but slower than the top and than the own shape (pruned path)
  const double inf = std::numeric_limits<double>::infinity();

  if (exhaustive) {
    // Every setting costed in full and checked by the validator; a shape's best is its fastest valid one.
    for (Shape& shape : shapes) {
      std::optional<Best> best;
      for (const Candidate& cand : shape.candidates) {
        if (!valid(cand.setting)) continue;
        Best b = cost_of(shape, cand);
        if (!best || better(b, *best)) best = b;
      }
      if (best) bests.push_back(*best);
    }
  } else {
    // Second pass. A shape's best: its candidates simulated in order of their bound until the bound passes
    // the best full step (a setting whose bound equals it may still tie, and win by coming first); each
    // new best confirmed by the mesh validator. Shapes go in order of their cheapest bound, the config's own
    // first (the rank report compares every shape with it); once a shape's bound passes both the top_n-th
    // best step and the own shape's, neither it nor any later shape can enter the top or pass the own
    // shape, so those are only confirmed feasible. A shape between the two (its bound past the top, below
    // the own shape's step) needs only one setting faster than the own shape to be counted ahead of it.
    // `enough`: a shape that cannot enter the top only has to be placed against the own shape, so its first
    // valid setting faster than that ends the search (its step then stands for the shape's, which is no
    // slower; either way it ranks ahead of the own shape and outside the top).
    auto best_of = [&](Shape& shape, double stop_at, double enough) -> std::optional<Best> {
      std::optional<Best> best;
      for (const Candidate& cand : shape.candidates) {
        if (cand.bound > std::min(stop_at, best ? best->step : stop_at)) break;
        Best b = cost_of(shape, cand);
        if (best && !better(b, *best)) continue;
        if (!valid(cand.setting)) continue;
        best = b;
        if (best->step < enough) break;
      }
      return best;
    };
    std::sort(shapes.begin(), shapes.end(),
              [](const Shape& x, const Shape& y) { return x.candidates.front().bound < y.candidates.front().bound; });
    double own_step = inf;
    for (Shape& shape : shapes)
      if (is_own(shape))
        if (auto b = best_of(shape, inf, -inf)) bests.push_back(*b), own_step = b->step;
    const size_t keep = size_t(std::max(1, top_n));
    std::priority_queue<double> top_steps;  // the `keep` fastest bests so far, slowest on top
    for (const Best& b : bests) top_steps.push(b.step);
    for (Shape& shape : shapes) {
      if (is_own(shape)) continue;
      const double cut = top_steps.size() < keep ? inf : top_steps.top();
      const double stop_at = own_step < inf ? std::max(cut, own_step) : cut;
      if (shape.candidates.front().bound > stop_at) {
        for (const Candidate& cand : shape.candidates)
          if (valid(cand.setting)) { ++slower_shapes; break; }
        continue;
      }
      // Outside the top when even its bound is slower than the top's slowest (then stop_at is the own step).
      const double enough = shape.candidates.front().bound > cut ? own_step : -inf;
      if (auto b = best_of(shape, stop_at, enough)) {
        bests.push_back(*b);
        top_steps.push(b->step);
        if (top_steps.size() > keep) top_steps.pop();
      } else {
        // Every candidate up to the cut was refused by the validator: the shape counts only if one is valid.
        for (const Candidate& cand : shape.candidates)
          if (cand.bound > stop_at && valid(cand.setting)) { ++slower_shapes; break; }
      }
    }
  }
  res.feasible_meshes = int64_t(bests.size()) + slower_shapes;
  // Fastest first; equal steps by memory, then by shape, so the order never depends on the path.
  std::sort(bests.begin(), bests.end(), [](const Best& a, const Best& b) {
    if (a.step != b.step) return a.step < b.step;
    if (a.cost.memory.total() != b.cost.memory.total()) return a.cost.memory.total() < b.cost.memory.total();
    const Layout &x = a.setting.layout, &y = b.setting.layout;
    return std::tie(x.tp, x.cp, x.pp, x.dp, x.ep) < std::tie(y.tp, y.cp, y.pp, y.dp, y.ep);
  });
  // The config's own shape (dp = 0 means the rest of the world), for the near-tie report.
  for (size_t i = 0; i < bests.size(); ++i) {
    const Layout& b = bests[i].setting.layout;
    if (b.tp == own.tp && b.cp == own.cp && b.pp == own.pp && b.dp == own_dp && b.ep == own.ep) {
      res.config_rank = int64_t(i) + 1;
      res.config_gap = bests[i].step / bests.front().step - 1;
      break;
    }
  }
  const size_t n = std::min(bests.size(), size_t(std::max(1, top_n)));
  for (size_t i = 0; i < n; ++i) {
    const Best& b = bests[i];
    res.top.push_back(make_estimate(b.setting, r.hardware, b.links, b.layers, b.cost, model));
  }
  res.elapsed_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  res.pipeline_tables = model.pipeline().tables();
  res.pipeline_simulations = model.pipeline().simulations();
  return res;
}

}  // namespace detail
}  // namespace meshrun::planner
