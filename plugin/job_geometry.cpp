#include "job_geometry.hpp"

#include "meshrun/bounded_file.hpp"

#include <unistd.h>  // environ

#include <algorithm>
#include <charconv>
#include <fstream>
#include <iterator>
#include <numeric>
#include <set>
#include <sstream>

namespace meshrun::plugin {
namespace {

// A single positive integer, else 0 (ranges, lists and garbage are "unknown").
int count(std::string_view s) {
  int v = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  return (ec == std::errc() && end == s.data() + s.size() && v > 0) ? v : 0;
}

// "4" -> {4, 4}; "2-4" -> {2, 4}; else {0, 0}.
std::pair<int, int> count_range(std::string_view s) {
  size_t dash = s.find('-');
  if (dash == std::string_view::npos) {
    int v = count(s);
    return {v, v};
  }
  int lo = count(s.substr(0, dash)), hi = count(s.substr(dash + 1));
  return lo > 0 && hi >= lo ? std::pair<int, int>{lo, hi} : std::pair<int, int>{0, 0};
}

// "gpu:8", "gpu:h100:8", "gpu:h100:8,nic:1" -> 8.
int gres_gpus(std::string_view s) {
  while (!s.empty()) {
    size_t comma = s.find(',');
    std::string_view item = s.substr(0, comma);
    if (item.substr(0, 4) == "gpu:" || item == "gpu") {
      size_t colon = item.rfind(':');
      return colon == std::string_view::npos ? 1 : count(item.substr(colon + 1));
    }
    if (comma == std::string_view::npos) break;
    s.remove_prefix(comma + 1);
  }
  return 0;
}

// "[type:]N" -> N.
int typed_count(std::string_view s) {
  size_t colon = s.rfind(':');
  return count(colon == std::string_view::npos ? s : s.substr(colon + 1));
}

// Short options that take a value (22.05 --help): srun's differ (-W, -r, -T take values there).
bool short_takes_value(char c, bool srun) {
  std::string_view letters = srun ? "AbcCdDeGiJLmMnNopqrStTwWx" : "AabBcCDdeFGiJLMmNnopqStwx";
  return letters.find(c) != std::string_view::npos;
}

// Long options that take no value or only an attached optional one; every other long option given
// without '=' consumes the next token.
bool long_without_value(std::string_view name) {
  static const std::set<std::string_view> names = {
      "contiguous", "exclusive", "get-user-env", "help", "hold", "ignore-pbs", "no-kill", "no-requeue",
      "overcommit", "oversubscribe", "parsable", "quiet", "reboot", "requeue", "spread-job", "test-only",
      "usage", "use-min-nodes", "verbose", "version", "wait", "nice", "propagate", "mesh-dry-run", "mesh-off",
      "no-shell", "bell", "no-bell", "x11", "exact", "label", "unbuffered", "kill-on-bad-exit", "preserve-env",
      "disable-status", "no-allocate", "pty", "multi-prog", "overlap", "immediate", "kill-command", "whole",
      "test-only", "quit-on-interrupt", "send-libs"};
  return names.count(name) > 0;
}

struct Setter {
  JobGeometry* g;
  std::set<std::string> seen;  // keys set so far (for "command line wins over #SBATCH")
  bool only_new = false;
  void set(const std::string& key, int* field, int v) {
    if (only_new && seen.count(key)) return;
    *field = v;
    seen.insert(key);
  }
  void apply(std::string_view name, std::string_view value) {
    if (name == "N" || name == "nodes") {
      if (only_new && seen.count("nodes")) return;
      auto [lo, hi] = count_range(value);
      g->nodes_min = lo;
      g->nodes_max = hi;
      set("nodes", &g->nodes, lo == hi ? lo : 0);
    }
    else if (name == "n" || name == "ntasks") set("ntasks", &g->ntasks, count(value));
    else if (name == "ntasks-per-node") set("ntasks-per-node", &g->ntasks_per_node, count(value));
    else if (name == "gpus-per-node") set("gpus-per-node", &g->gpus_per_node, typed_count(value));
    else if (name == "gres") set("gpus-per-node", &g->gpus_per_node, gres_gpus(value));
    else if (name == "G" || name == "gpus") set("gpus", &g->gpus_total, typed_count(value));
    else if (name == "m" || name == "distribution") g->distribution = value;
    else if (name == "w" || name == "nodelist" || name == "x" || name == "exclude" || name == "r" ||
             name == "relative" || name == "F" || name == "nodefile")
      g->opaque = (name.size() == 1 ? "-" : "--") + std::string(name);
  }
};

// Walks getopt-style tokens; returns the index of the first non-option token (args.size() if none).
size_t walk(const std::vector<std::string>& args, Setter& s) {
  size_t i = 0;
  while (i < args.size()) {
    std::string_view a = args[i];
    if (a == "--") return i + 1;
    if (a.size() > 2 && a.substr(0, 2) == "--") {
      std::string_view body = a.substr(2);
      size_t eq = body.find('=');
      if (eq != std::string_view::npos) {
        if (body.substr(0, eq) == "wrap") s.g->wrap = true;
        s.apply(body.substr(0, eq), body.substr(eq + 1));
        i += 1;
      } else if (long_without_value(body)) {
        if (body == "multi-prog") s.g->opaque = "--multi-prog";
        i += 1;
      } else if (i + 1 < args.size() && !args[i + 1].empty() && args[i + 1][0] == '-') {
        i += 1;  // an unknown flag: never swallow the next option
      } else {
        if (body == "wrap") s.g->wrap = true;
        if (i + 1 < args.size()) s.apply(body, args[i + 1]);
        i += 2;
      }
    } else if (a.size() > 1 && a[0] == '-') {
      // Short options may be bundled ("-vN2"); the first value-taking letter ends the bundle.
      size_t k = 1;
      for (; k < a.size(); ++k) {
        char c = a[k];
        if (!short_takes_value(c, s.g->srun)) continue;
        std::string_view name = a.substr(k, 1);
        if (k + 1 < a.size()) {
          s.apply(name, a.substr(k + 1));
          i += 1;
        } else {
          if (i + 1 < args.size()) s.apply(name, args[i + 1]);
          i += 2;
        }
        break;
      }
      if (k == a.size()) i += 1;
    } else {
      return i;  // the script: sbatch stops parsing options here
    }
  }
  return i;
}

}  // namespace

void parse_job_args(const std::string& program, const std::vector<std::string>& args, JobGeometry* g) {
  g->srun = program == "srun";
  g->operand_required = program != "salloc";
  Setter s{g, {}, false};
  size_t operand = walk(args, s);
  if (operand < args.size()) g->operand = args[operand];
  // srun A : B (a heterogeneous step): each component has its own shape.
  if (g->srun && std::find(args.begin() + static_cast<long>(operand), args.end(), ":") != args.end())
    g->opaque = "':' (a heterogeneous step)";
}

void apply_sbatch_lines(std::string_view text, const std::vector<std::string>& cmdline, JobGeometry* g) {
  // First collect which keys the command line set, so #SBATCH lines cannot override them.
  JobGeometry scratch;
  scratch.srun = g->srun;
  Setter probe{&scratch, {}, false};
  walk(cmdline, probe);
  Setter s{g, probe.seen, true};
  std::istringstream in{std::string(text)};
  std::string line;
  bool first = true;
  while (std::getline(in, line)) {
    if (first && line.rfind("#!", 0) == 0) { first = false; continue; }
    first = false;
    size_t p = line.find_first_not_of(" \t");
    if (p == std::string::npos) continue;
    if (line[p] != '#') break;  // sbatch stops at the first command
    if (line.compare(p, 7, "#SBATCH") != 0) continue;
    std::istringstream words(line.substr(p + 7));
    std::vector<std::string> tokens;
    for (std::string w; words >> w;) {
      if (w[0] == '#') break;  // trailing comment
      tokens.push_back(w);
    }
    walk(tokens, s);
  }
}

bool task_shape(const JobGeometry& g, TaskShape* out, std::string* why) {
  why->clear();
  if (g.operand_required && g.operand.empty() && !g.wrap) return false;  // script on stdin, or the command line was not understood
  if (g.nodes_min > 0 && g.nodes == 0) return false;  // a node range: see range_shapes()
  TaskShape t;
  t.nodes = g.nodes;
  if (g.ntasks > 0) {
    t.tasks = g.ntasks;
    if (t.nodes == 0 && g.ntasks_per_node > 0) t.nodes = (g.ntasks + g.ntasks_per_node - 1) / g.ntasks_per_node;
    if (t.nodes == 0) return false;  // Slurm picks the node count: leave the check to srun
  } else {
    if (t.nodes == 0) t.nodes = 1;
    t.tasks = t.nodes * (g.ntasks_per_node > 0 ? g.ntasks_per_node : 1);
  }
  if (t.tasks % t.nodes != 0) {
    *why = std::to_string(t.tasks) + " tasks do not spread evenly over " + std::to_string(t.nodes) +
           " nodes; meshrun places ranks in equal blocks per node: use --ntasks-per-node";
    return false;
  }
  t.tasks_per_node = t.tasks / t.nodes;
  if (g.ntasks_per_node > 0 && g.ntasks > 0 && g.ntasks_per_node != t.tasks_per_node) {
    *why = "--ntasks=" + std::to_string(g.ntasks) + " and --ntasks-per-node=" + std::to_string(g.ntasks_per_node) +
           " disagree over " + std::to_string(t.nodes) + " nodes; give one of them";
    return false;
  }
  t.gpus_per_node = g.gpus_per_node > 0 ? g.gpus_per_node : (g.gpus_total > 0 ? g.gpus_total / t.nodes : 0);
  *out = t;
  return true;
}

bool range_shapes(const JobGeometry& g, int limit, std::vector<TaskShape>* shapes) {
  shapes->clear();
  if (g.nodes_min <= 0 || g.nodes_max < g.nodes_min || g.nodes_max - g.nodes_min >= limit) return false;
  for (int n = g.nodes_min; n <= g.nodes_max; ++n) {
    JobGeometry one = g;
    one.nodes = n;
    TaskShape t;
    std::string why;
    if (task_shape(one, &t, &why)) shapes->push_back(t);
  }
  return true;
}

namespace {
int env_count(const std::map<std::string, std::string>& env, const char* name) {
  auto it = env.find(name);
  return it == env.end() ? 0 : count(it->second);
}
}  // namespace

bool srun_step_shape(const JobGeometry& g, const std::map<std::string, std::string>& env, TaskShape* out,
                     std::string* why) {
  why->clear();
  std::string dist = g.distribution;
  std::string dist_source = "--distribution=" + dist;
  if (dist.empty() && env.count("SLURM_DISTRIBUTION")) {
    dist = env.at("SLURM_DISTRIBUTION");
    dist_source = "SLURM_DISTRIBUTION=" + dist;
  }
  if (*why = distribution_problem(dist, dist_source); !why->empty()) return false;
  if (!g.opaque.empty()) return false;
  if (!env.count("SLURM_JOB_ID")) return task_shape(g, out, why);  // srun allocates: its arguments say it all
  if (g.operand.empty() || (g.nodes_min > 0 && g.nodes == 0)) return false;  // unparsed, or a node range
  TaskShape t;
  t.nodes = g.nodes > 0 ? g.nodes : env_count(env, "SLURM_NNODES");
  if (t.nodes <= 0) t.nodes = env_count(env, "SLURM_JOB_NUM_NODES");
  if (t.nodes <= 0) return false;
  t.tasks = g.ntasks > 0 ? g.ntasks : env_count(env, "SLURM_NTASKS");
  if (t.tasks <= 0) t.tasks = env_count(env, "SLURM_NPROCS");
  if (t.tasks <= 0) {
    int per_node = g.ntasks_per_node > 0 ? g.ntasks_per_node : env_count(env, "SLURM_NTASKS_PER_NODE");
    t.tasks = t.nodes * std::max(per_node, 1);
  }
  if (g.nodes <= 0 && t.tasks < t.nodes) t.nodes = t.tasks;  // "can't run 1 processes on 2 nodes"
  if (t.tasks % t.nodes != 0) {
    *why = std::to_string(t.tasks) + " tasks do not spread evenly over " + std::to_string(t.nodes) +
           " nodes; meshrun places ranks in equal blocks per node: use -n and -N with tasks a multiple of nodes";
    return false;
  }
  t.tasks_per_node = t.tasks / t.nodes;
  t.gpus_per_node = g.gpus_per_node > 0 ? g.gpus_per_node : (g.gpus_total > 0 ? g.gpus_total / t.nodes : 0);
  if (t.gpus_per_node <= 0) {
    auto it = env.find("SLURM_GPUS_PER_NODE");
    if (it != env.end()) t.gpus_per_node = typed_count(it->second);
  }
  *out = t;
  return true;
}

std::vector<std::vector<std::string>> het_components(const std::vector<std::string>& args) {
  std::vector<std::vector<std::string>> out(1);
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == ":" && i > 0 && i + 1 < args.size() && !args[i + 1].empty() && args[i + 1][0] == '-') {
      out.emplace_back();
      continue;
    }
    out.back().push_back(args[i]);
  }
  return out;
}

std::string het_shape_problem(const std::vector<TaskShape>& comps, int group, const std::string& flags,
                              TaskShape* total, bool node_runs) {
  auto s = [](long long v) { return std::to_string(v); };
  TaskShape t;
  bool same = true;
  for (const auto& c : comps) {
    t.nodes += c.nodes;
    t.tasks += c.tasks;
    same = same && c.tasks_per_node == comps.front().tasks_per_node;
  }
  t.tasks_per_node = comps.empty() ? 0 : comps.front().tasks_per_node;
  t.gpus_per_node = comps.empty() ? 0 : comps.front().gpus_per_node;
  if (same) {
    *total = t;
    return "";
  }
  // A fitting shape: p tasks on every node, p the components' common divisor (a multiple of tp·cp·pp).
  group = std::max(group, 1);
  long long p = 0;
  for (const auto& c : comps) p = std::gcd(p, static_cast<long long>(c.tasks));
  if (p % group != 0) p = group;
  std::string sizes, per_node, fix;
  long long world = 0;
  for (size_t i = 0; i < comps.size(); ++i) {
    const auto& c = comps[i];
    sizes += (i ? (i + 1 == comps.size() ? " and " : ", ") : "") + s(c.tasks) + " tasks on " + s(c.nodes) +
             (c.nodes == 1 ? " node" : " nodes");
    per_node += (i ? (i + 1 == comps.size() ? " and " : ", ") : "") + s(c.tasks_per_node);
    const long long n = (c.tasks + p - 1) / p * p;
    world += n;
    fix += std::string(i ? " : " : "") + "-N" + s(n / p) + " --ntasks-per-node=" + s(p) +
           (i == 0 && !flags.empty() ? " " + flags : "");
  }
  const std::string layout = " (" + s(world) + " ranks: tp·cp·pp = " + s(group) + ", dp = " + s(world / group) + ")";
  if (node_runs)
    return "a heterogeneous step whose nodes run " + per_node + " tasks: meshrun places all components' ranks as "
           "one block map, so every node needs the same task count; give every component --ntasks-per-node=" +
           s(p) + " and -N = its tasks / " + s(p);
  return "a heterogeneous step with components of " + sizes + " (" + per_node +
         " tasks per node): meshrun places all components' ranks as one block map, so every component needs the "
         "same tasks per node; e.g. srun " + fix + layout;
}

std::string distribution_problem(const std::string& dist, const std::string& source) {
  // "block", "block:cyclic", "block:block,Pack", "*:..." (the default) place ranks in blocks per node; the part
  // after ':' is about sockets inside a node.
  const std::string node_part = dist.substr(0, dist.find_first_of(":,"));
  if (dist.empty() || node_part == "block" || node_part == "*" || node_part.empty()) return "";
  std::string shown = source.size() > 80 ? source.substr(0, 60) + "…" : source;
  return shown + " places tasks on nodes out of rank order; meshrun's rank map is Slurm's block distribution "
         "(rank r on node r / tasks-per-node): use --distribution=block (the default) or leave it unset";
}

std::vector<std::string> read_own_cmdline() {
  std::ifstream in("/proc/self/cmdline", std::ios::binary);
  std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::string> args;
  size_t start = 0;
  while (start < all.size()) {
    size_t end = all.find('\0', start);
    if (end == std::string::npos) end = all.size();
    args.push_back(all.substr(start, end - start));
    start = end + 1;
  }
  return args;
}

std::string read_file_head(const std::string& path, size_t limit) {
  // Only a regular file: a FIFO would block here (sbatch reports such a script itself).
  std::string error;
  if (!meshrun::check_regular_file(path, "batch script", &error)) return "";
  std::ifstream in(path, std::ios::binary);
  std::string text(limit, '\0');
  in.read(text.data(), static_cast<std::streamsize>(limit));
  text.resize(static_cast<size_t>(in.gcount()));
  return text;
}

bool own_submission_shape(TaskShape* shape, std::string* why, JobGeometry* geometry, std::vector<TaskShape>* het) {
  why->clear();
  std::vector<std::string> argv = read_own_cmdline();
  if (argv.empty()) return false;
  std::string prog = argv[0].substr(argv[0].rfind('/') + 1);
  std::vector<std::string> args(argv.begin() + 1, argv.end());
  JobGeometry geo;
  parse_job_args(prog, args, &geo);
  if (prog == "sbatch" && !geo.wrap && !geo.operand.empty())
    apply_sbatch_lines(read_file_head(geo.operand, 1 << 20), args, &geo);
  if (geometry) *geometry = geo;
  if (prog == "srun") {
    std::map<std::string, std::string> env;
    for (char** e = ::environ; e && *e; ++e) {
      std::string_view kv = *e;
      size_t eq = kv.find('=');
      if (eq != std::string_view::npos && kv.substr(0, 6) == "SLURM_")
        env.emplace(std::string(kv.substr(0, eq)), std::string(kv.substr(eq + 1)));
    }
    const auto comps = het_components(args);
    if (comps.size() == 1 || !het) return srun_step_shape(geo, env, shape, why);
    // A heterogeneous step: each component's shape from its own arguments. Inside an allocation srun's
    // defaults are the job's, not a component's, so there each component must give -n and -N (or
    // --ntasks-per-node); otherwise the shape is left to local_user_init.
    const bool in_alloc = env.count("SLURM_JOB_ID") > 0;
    env.erase("SLURM_JOB_ID");
    het->clear();
    for (const auto& c : comps) {
      JobGeometry g;
      parse_job_args("srun", c, &g);
      if (in_alloc && (g.ntasks == 0 || (g.nodes == 0 && g.ntasks_per_node == 0))) return false;
      TaskShape t;
      if (!srun_step_shape(g, env, &t, why)) return false;
      het->push_back(t);
    }
    return false;  // the caller combines the components (het_shape_problem)
  }
  if (*why = distribution_problem(geo.distribution, "--distribution=" + geo.distribution); !why->empty()) return false;
  return task_shape(geo, shape, why);
}

}  // namespace meshrun::plugin
