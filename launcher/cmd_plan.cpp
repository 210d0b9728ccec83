// meshrun plan: the dry run. Resolves a template (plus flags) into a layout, checks it, and prints where every
// rank will sit. Exit 0 when valid; 2 with one line per problem on stderr (and nothing on stdout) otherwise.
#include <charconv>
#include <unistd.h>

#include <cmath>
#include <numeric>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <new>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "commands.hpp"
#include "meshrun/resolve.hpp"
#include "meshrun/site_policy.hpp"
#include "meshrun/bridges.hpp"
#include "launch_common.hpp"
#include "meshrun/geometry.hpp"
#include "config_flags.hpp"
#include "meshrun/json.hpp"
#include "meshrun/topology.hpp"
#include "plan_render.hpp"
#include "svg.hpp"
#ifdef MESHRUN_HAVE_PLANNER
#include "meshrun/planner.hpp"
#include "meshrun/planner_calibration.hpp"
#endif

extern char** environ;

namespace {

const char* kPlanHelp =
    "usage: meshrun plan [TEMPLATE.toml] [options]\n"
    "\n"
    "Dry-run a layout: resolved values and their sources, checks, the rank -> node/GPU/coordinates table,\n"
    "every axis's groups and whether they stay on NVLink or cross the network. Submits nothing.\n"
    "\n"
    "options:\n"
    "  --format table|json|svg  output format (default table)\n"
    "  --all                    print every node (the table shows the first two and the last by default)\n"
    "  --estimate               add memory and step-time estimates\n"
    "  --search [--top N]       rank every valid layout for this model and cluster by estimated step time\n"
    "  --schedule               add the pipeline schedule: a timeline per pp rank (unit costs F = B = W = 1),\n"
    "                           its bubble_fraction and peak_live_microbatches (json: per-rank action lists)\n"
    "  --max-width N            with --schedule (table): the timeline in panels of at most N characters a line\n"
    "  --topology FILE.xml      use this hwloc XML node topology for every node (NIC and CPU set per rank)\n"
    "  --calibration FILE       the device's figures and fitted constants for --estimate/--search (the same as\n"
    "                           --set planner.calibration=FILE; needed for meshrun-train's CPU backend)\n"
    "  --calibrate RUN.jsonl... [-o FILE]  fit the planner's constants to meshrun-train metrics files, starting\n"
    "                           from --calibration FILE; print every run's error before and after and write the\n"
    "                           fitted calibration to FILE (else stdout)\n"
    "  --for megatron|torchtitan  plan for that framework (as the template's job.trainer does): its rules, and\n"
    "                           the flags that make it build this rank map (the words `meshrun exec --for`\n"
    "                           appends; with a template also the model's and batch flags). Alone: the flags\n"
    "                           on one line; with --estimate, --schedule, --search or --format json: the plan\n"
    "                           with the flags and the framework's estimate\n"
    "%s"
    "\n"
    "examples:\n"
    "  meshrun plan templates/llama3-405b.toml\n"
    "  meshrun plan templates/llama3-8b.toml --mesh-tp 4 --mesh-dp auto --format json\n"
    "  meshrun plan templates/tiny.toml --nodes 2 --gpus-per-node 4 --set parallel.pp=2\n"
    "  meshrun plan templates/llama3-70b.toml --schedule --format svg > 70b.svg\n"
    "\n"
    "exit status: 0 valid, 2 invalid input (reasons on stderr, nothing on stdout)\n";

// The job the planner estimates for a framework: the model it builds (Megatron pads the vocabulary to a
// multiple of 128 × `tp`) and the logits it keeps (the full logits of a micro-batch until its backward, where
// meshrun-train fuses the head with the loss). Without a framework, the job itself.
meshrun::JobConfig framework_job(meshrun::JobConfig job, std::optional<meshrun::Framework> f, int tp) {
  if (!f) return job;
  job.planner.fused_head = false;
  if (*f == meshrun::Framework::megatron) job.model.vocab = static_cast<int64_t>(meshrun::megatron_padded_vocab(job.model.vocab, tp));
  return job;
}

int fail(const std::string& msg) {
  std::fputs(meshrun::message_lines("meshrun plan: ", msg).c_str(), stderr);
  return 2;
}

#ifdef MESHRUN_HAVE_PLANNER
// meshrun plan --calibrate: fit, print every run before and after, write the file. Throws ConfigError.
int plan_calibrate(const std::vector<std::string>& paths, const std::string& base_path, const std::string& out) {
  using namespace meshrun;
  const planner::Calibration base = planner::load_calibration(base_path);
  std::vector<planner::MeasuredRun> runs;
  for (const std::string& p : paths) runs.push_back(planner::read_measured_run(p));
  const planner::CalibrationFit fit = planner::calibrate(runs, base);
  std::printf("calibration of %s from %zu run%s (base %s); fitted:", base.device.c_str(), runs.size(),
              runs.size() == 1 ? "" : "s", base_path.c_str());
  for (const std::string& name : fit.fitted)
    for (const auto& [k, v] : fit.calibration.constants)
      if (k == name) std::printf(" %s %.4g", k.c_str(), v);
  std::printf("\n%-40s %12s %8s %12s %8s %12s %8s\n", "run (median of steps 2..N)", "measured ms", "spread",
              "before ms", "error", "after ms", "error");
  double before = 0, after = 0;
  for (std::size_t i = 0; i < runs.size(); ++i) {
    const double m = runs[i].step_ms, b = fit.before_ms[i], a = fit.after_ms[i];
    before += std::fabs(b / m - 1), after += std::fabs(a / m - 1);
    std::string name = runs[i].path;
    if (name.size() > 40) name = "…" + name.substr(name.size() - 39);
    std::printf("%-40s %12.2f %7.1f%% %12.2f %+7.1f%% %12.2f %+7.1f%%\n", name.c_str(), m, 100 * runs[i].step_ms_spread,
                b, 100 * (b / m - 1), a, 100 * (a / m - 1));
  }
  std::printf("mean absolute error: %.1f%% before, %.1f%% after\n", 100 * before / runs.size(), 100 * after / runs.size());
  // Where the fitted model still misses: each run's parts (meshrun-train's kernel_ms groups, and the step
  // less them) against the estimate's.
  std::printf("%-40s %8s %8s %8s %8s %8s   (after the fit, estimate / measured - 1)\n", "run: by part", "matmul",
              "attn", "elemwise", "optim", "outside");
  for (std::size_t i = 0; i < runs.size(); ++i) {
    std::string name = runs[i].path;
    if (name.size() > 40) name = "…" + name.substr(name.size() - 39);
    std::printf("%-40s", name.c_str());
    for (double e : fit.after_part_errors[i])
      std::isnan(e) ? std::printf(" %8s", "-") : std::printf(" %+7.1f%%", 100 * e);
    std::printf("\n");
  }
  if (!fit.unconstrained.empty()) {
    std::string names;
    for (const std::string& n : fit.unconstrained) names += (names.empty() ? "" : ", ") + n;
    std::printf("not fitted (no run depends on them; kept as the base file or the device's default sets them): %s\n",
                names.c_str());
  }
  std::string header = "meshrun planner calibration: meshrun plan --calibrate over " + std::to_string(runs.size()) +
                       " run(s), starting from " + base_path + "\nruns:";
  for (const auto& r : runs) header += " " + r.path;
  const std::string text = planner::calibration_toml(fit.calibration, header);
  if (out.empty()) {
    std::fputs(text.c_str(), stdout);
    return 0;
  }
  std::ofstream f(out);
  if (!(f << text) || !(f.flush()))
    throw ConfigError("--calibrate: cannot write " + out + "; check the directory");
  std::printf("wrote %s\n", out.c_str());
  return 0;
}
#endif

}  // namespace

int cmd_plan(int argc, char** argv) {
  using namespace meshrun;
  std::vector<std::string> args(argv + 1, argv + argc);
  ConfigRequest req;
  std::string format = "table", topology_xml;
  bool all = false, estimate = false, search = false, schedule = false, calibrate = false;
  int max_width = 0;  // --max-width: the schedule's text in panels
  std::vector<std::string> calibrate_runs;
  std::string calibration, calibrate_out;
  std::optional<Framework> framework;
  int top = 10;
  try {
    for (size_t i = 0; i < args.size();) {
      const std::string& a = args[i];
      if (a == "--help" || a == "-h") {
        std::printf(kPlanHelp, cli::config_flags_help());
        return 0;
      }
      if (cli::take_config_flag(args, i, req)) continue;
      std::string v;
      if (cli::take_value(args, i, "--format", &v)) {
        format = v;
        if (format != "table" && format != "json" && format != "svg")
          throw ConfigError("--format " + format + ": unknown format; use table, json or svg");
        continue;
      }
      if (cli::take_value(args, i, "--topology", &v)) { topology_xml = v; continue; }
      if (cli::take_value(args, i, "--calibration", &v)) {
        calibration = v;
        req.sets.push_back("planner.calibration=\"" + v + "\"");
        continue;
      }
      if (cli::take_value(args, i, "-o", &v) || cli::take_value(args, i, "--output", &v)) { calibrate_out = v; continue; }
      if (a == "--calibrate") {
        calibrate = true;
        for (++i; i < args.size() && !args[i].empty() && args[i][0] != '-'; ++i) calibrate_runs.push_back(args[i]);
        if (calibrate_runs.empty()) throw ConfigError("--calibrate needs metrics files: --calibrate RUN.jsonl ... (meshrun-train --metrics FILE)");
        continue;
      }
      if (cli::take_value(args, i, "--for", &v)) {
        framework = parse_framework(v);
        if (!framework) throw ConfigError("--for " + v + ": unknown framework; use megatron or torchtitan");
        continue;
      }
      if (cli::take_value(args, i, "--top", &v)) {
        try {
          top = std::stoi(v);
        } catch (...) {
          top = 0;
        }
        if (top < 1) throw ConfigError("--top " + v + ": expected a positive count");
        continue;
      }
      if (a == "--all") { all = true; ++i; continue; }
      if (a == "--estimate") { estimate = true; ++i; continue; }
      if (a == "--search") { search = true; ++i; continue; }
      if (a == "--schedule") { schedule = true; ++i; continue; }
      if (cli::take_value(args, i, "--max-width", &v)) {
        int n = 0;
        const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), n);
        if (ec != std::errc() || end != v.data() + v.size() || n < 1 || n > 1000000)
          throw ConfigError("--max-width " + v + ": expected a line width in characters, 1 to 1000000 (e.g. --max-width 120)");
        max_width = n;
        continue;
      }
      if (!a.empty() && a[0] == '-') throw ConfigError("unknown option '" + a + "'; see 'meshrun plan --help'");
      if (!req.template_path.empty())
        throw ConfigError("more than one template ('" + req.template_path + "' and '" + a + "'); give one");
      req.template_path = a;
      ++i;
    }
    if (!calibrate_out.empty() && !calibrate) throw ConfigError("-o FILE is where --calibrate writes; give --calibrate RUN.jsonl ...");
    if (calibrate) {
      if (!req.template_path.empty() || schedule || search || estimate || framework)
        throw ConfigError("--calibrate reads the runs' own configs from their metrics; leave out the template and "
                          "--estimate/--search/--schedule/--for");
      if (calibration.empty())
        throw ConfigError("--calibrate starts from a calibration file: give --calibration FILE (for the CPU: `mpirun -np 2 "
                          "meshrun-bench-device > cpu.toml`; for a GPU a file with [planner] device = \"h100-sxm\")");
#ifdef MESHRUN_HAVE_PLANNER
      return plan_calibrate(calibrate_runs, calibration, calibrate_out);
#else
      throw ConfigError("--calibrate needs the planner, which this build does not include");
#endif
    }
    if (framework && format == "svg")
      throw ConfigError("--for with --format svg: the drawing has no place for the framework's flags; use --format "
                        "table or json with --for, or leave --for out for the drawing");
    if (max_width > 0 && (!schedule || format != "table"))
      throw ConfigError("--max-width folds the text timeline of --schedule; give --schedule with --format table (the "
                        "default), or leave --max-width out");
    if (schedule && search)
      throw ConfigError("--schedule shows the template's own layout and --search ranks other layouts; use one of them");
    // Without a template there is no model and no batch: the dry run checks the layout alone (as the plugin
    // does for --mesh-* flags without --mesh-template), and what needs a model is refused.
    if (req.template_path.empty() && (schedule || search || estimate))
      throw ConfigError(std::string(schedule ? "--schedule" : search ? "--search" : "--estimate") +
                        " needs a template: it is about a model's steps; give TEMPLATE.toml (e.g. templates/llama3-8b.toml)");
  } catch (const ConfigError& e) {
    return fail(e.what());
  }

  auto env = environment_map(environ);
  req.environment = &env;
  Config cfg;
  try {
    cfg = build_config(req);
  } catch (const ConfigError& e) {
    return fail(e.what());
  }

  // The program the plan is for: --for, else the template's job.trainer (meshrun: meshrun-train). --for alone
  // prints that framework's flags and nothing else, as `meshrun exec --for` appends them.
  const bool flags_only = framework && !schedule && !search && !estimate && format == "table";
  if (!framework && !req.template_path.empty()) framework = parse_framework(cfg.job.job.trainer);

  std::vector<Problem> problems;
  Cluster cluster = resolve_cluster(cfg.job.cluster, &problems);
#ifdef MESHRUN_HAVE_PLANNER
  if (search) {
    // [search] The planner ranks every valid layout for the model, cluster and batch; the template's own
    // layout does not matter here, so only the cluster must be valid. For a framework, the model it builds:
    // Megatron's vocabulary padded for every tp the search may pick (a multiple of 128 × each of them: the
    // NVLink domain's and the node's GPU counts), and full logits kept until the backward.
    if (!problems.empty()) return fail(problems.front().message);
    try {
      JobConfig job = framework_job(cfg.job, framework, std::lcm(std::max(cluster.nvlink_domain_gpus, 1),
                                                                   std::max(cluster.gpus_per_node, 1)));
      auto result = planner::search(job, top);
      std::string text = format == "json" ? planner::search_json(result) + "\n" : "";
      if (format != "json") {
        std::ostringstream o;
        planner::print_search_table(o, result);
        text = o.str();
      }
      std::fputs(text.c_str(), stdout);
    } catch (const ConfigError& e) {
      return fail(e.what());
    }
    return 0;
  }
#else
  if (search || estimate) return fail("--estimate/--search need the planner, which this build does not include");
#endif
  // Without a template the layout's rules alone; a template's model gets the rules of the program it is for:
  // the bundled trainer's, or a framework's (--for, job.trainer). The site's [env] policy applies as at
  // submission.
  const bool layout_only = req.template_path.empty();
  const RuleSet rules = layout_only                         ? RuleSet::layout
                        : framework == Framework::megatron   ? RuleSet::megatron
                        : framework == Framework::torchtitan ? RuleSet::torchtitan
                                                             : RuleSet::trainer;
  const EnvPolicy policy = env_inputs(cfg).policy;
  // Out of memory is one line naming the sizes, here and below (the output's size follows the input).
  auto out_of_memory = [&] {
    return fail("out of memory (std::bad_alloc) building the plan of " + std::to_string(cluster.gpus()) +
                " GPUs (cluster.nodes " + std::to_string(cluster.nodes) + " × cluster.gpus_per_node " +
                std::to_string(cluster.gpus_per_node) + ")" + (schedule ? " with --schedule" : "") +
                "; lower cluster.nodes or run where more memory is allowed");
  };
  Resolution res;
  try {
    res = resolve_job(cfg, {rules, 0, &policy});  // its warnings walk the rank map's groups
  } catch (const std::bad_alloc&) {
    return out_of_memory();
  }
  if (!res.ok()) {
    std::string where = req.template_path.empty() ? "" : " (" + req.template_path + ")";
    for (const auto& p : res.problems)
      std::fprintf(stderr, "meshrun plan: invalid layout%s: %s\n", cut_long_values(where).c_str(),
                   cut_long_values(p.message).c_str());
    return 2;
  }
  // A job of meshrun-train names input files: a missing one is refused here as meshrun-train would refuse it.
  if (rules == RuleSet::trainer)
    if (auto missing = input_file_problems(cfg.job, launch::data_key_location(cfg)); !missing.empty())
      return fail(cut_lines(missing));
  const std::optional<Layout>& layout = res.layout;
  const std::vector<std::string>& checks = res.checks;

  std::optional<FrameworkFlags> flags;  // the framework's, when the plan is for one
  if (framework) {
    std::optional<BatchGeometry> geometry;
    if (!layout_only) {
      std::string why;
      geometry = batch_geometry(cfg.job.training, *layout, &why);
      if (!geometry) return fail(why);
    }
    flags = framework_flags(*framework, cfg.job, *layout, geometry ? &*geometry : nullptr);
    if (!flags->refusal.empty()) return fail(std::string("--for ") + framework_key(*framework) + ": " + flags->refusal);
    if (flags_only) {  // one shell-quoted line
      std::printf("%s\n", launch::shell_join(flags->flags).c_str());
      return 0;
    }
  }
  // The vocabulary Megatron builds (padded for this tp), shown beside its flags and used by its estimate.
  const long long padded_vocab =
      framework == Framework::megatron ? megatron_padded_vocab(cfg.job.model.vocab, layout->tp) : cfg.job.model.vocab;

#ifdef MESHRUN_HAVE_PLANNER
  std::optional<planner::Estimate> est;
  if (estimate) {
    // The planner simulates the layout's schedule: its size is checked first, as --schedule's is.
    if (std::string why = planner::schedule_problem(cfg.job, *layout); !why.empty())
      return fail(cli::at_batch_origin(cfg, why));
    try {
      est = planner::estimate(framework_job(cfg.job, framework, layout->tp));
    } catch (const ConfigError& e) {
      return fail(e.what());
    }
  }
#endif

  // Everything below builds output whose size follows the input (a rank map row per GPU, a schedule slot per
  // micro-batch and chunk); the limits keep it in memory, and an allocation that still fails is one line.
  try {
    // [schedule] The layout's pipeline schedule; validate() applied the schedule rule, so it generates.
    std::optional<cli::ScheduleView> sched;
    // Its size is checked before anything is generated (a 2^30 batch would otherwise grow to gigabytes).
    if (schedule) {
      if (std::string why = cli::schedule_view_problem(cfg, *layout); !why.empty()) return fail(why);
      sched = cli::make_schedule_view(cfg.job, *layout);
      int least = 0;
      if (max_width > 0 && cli::schedule_panel_columns(*sched, max_width, &least) == 0)
        return fail("--max-width " + std::to_string(max_width) + " is narrower than the rank column and one time "
                    "column of this schedule (" + std::to_string(least) + " characters); give at least --max-width " +
                    std::to_string(least));
    }

    RankMap map(*layout, cluster);
    const std::vector<std::string>& warnings = res.warnings;

    cli::PlanView view{cfg, map, req.template_path, checks, warnings, all, rules, {}, {}};
    // [topology] per-rank NIC and CPU set columns from --topology FILE.xml.
    NodeTopology node_topo;
    if (!topology_xml.empty()) {
      try {
        TopologyRequest treq;
        treq.xml_path = topology_xml;
        treq.node_type = &cluster.type;
        node_topo = load_topology(treq);
      } catch (const TopologyError& e) {
        return fail(std::string("--topology: ") + e.what());
      }
      if (static_cast<int>(node_topo.gpus.size()) < cluster.gpus_per_node)
        return fail("--topology " + topology_xml + " has " + std::to_string(node_topo.gpus.size()) +
                    " GPU(s) but the cluster has " + std::to_string(cluster.gpus_per_node) +
                    " per node; pass that node type's export or set cluster.gpus_per_node");
      view.extra_columns = {"pci", "nic", "path", "numa", "cpus"};
      view.extra_cells = [&node_topo](int local_rank) {
        const RankDescription d = describe_rank(node_topo, local_rank);
        return std::vector<std::string>{d.gpu_pci, d.nic.empty() ? "-" : d.nic, d.nic_level.empty() ? "-" : d.nic_level,
                                        std::to_string(d.numa), d.cpus};
      };
    }
    // [/topology]

    if (format == "svg") {
      // [svg]
      render_svg(std::cout, map, cfg, sched ? &*sched : nullptr);
      return 0;
      // [/svg]
    }
    if (format == "json") {
      // Streamed: the text goes to stdout in pieces of about 1 MiB as it is written (a plan of 1,048,576 GPUs
      // is about 170 MB of JSON). Everything that can refuse the plan has been checked above; an allocation that
      // fails after the first piece leaves a truncated document, with the one line below and exit 2.
      constexpr size_t kPiece = size_t(1) << 20;
      std::string out;
      out.reserve(kPiece + 64 * 1024);
      auto flush = [&out] {
        if (out.size() < kPiece) return;
        std::fwrite(out.data(), 1, out.size(), stdout);
        out.clear();
      };
      JsonWriter j(out);
      j.begin_object();
      cli::render_plan_json_body(j, view, flush);
      if (flags) {
        j.key("framework").begin_object().field("name", framework_key(*framework)).field("program", framework_name(*framework));
        j.key("flags").begin_array();
        for (const std::string& w : flags->flags) j.value(w);
        j.end_array();
        if (!layout_only) j.field("vocab", static_cast<int64_t>(padded_vocab));
        j.end_object();
      }
      if (sched) {
        j.key("schedule");
        cli::render_schedule_json(j, *sched);
      }
#ifdef MESHRUN_HAVE_PLANNER
      if (estimate) {
        j.key("estimate").raw(planner::estimate_json(*est));
      }
#endif
      j.end_object();
      out += '\n';
      std::fwrite(out.data(), 1, out.size(), stdout);
      return 0;
    }
    std::ostringstream o;
    cli::render_plan_table(o, view);
    if (flags) {
      o << "\n" << framework_name(*framework) << " flags: " << launch::shell_join(flags->flags) << "\n";
      if (framework == Framework::megatron && !layout_only)
        o << "vocabulary " << cfg.job.model.vocab << (padded_vocab == cfg.job.model.vocab ? " (" : " padded to " + std::to_string(padded_vocab) + " (")
          << "Megatron-LM: a multiple of --make-vocab-size-divisible-by 128 × tp " << layout->tp << ")\n";
    }
#ifdef MESHRUN_HAVE_PLANNER
    if (estimate) {
      o << "\n";
      planner::print_estimate_table(o, *est);
    }
#endif
    if (sched) {
      o << "\n";
      cli::render_schedule_table(o, *sched, max_width);
    }
    std::fputs(o.str().c_str(), stdout);
    return 0;
  } catch (const std::bad_alloc&) {
    return out_of_memory();
  }
}
