#include "launch_common.hpp"

#include <unistd.h>

#include <charconv>
#include <filesystem>
#include <sstream>
#include <string_view>

#include "config_flags.hpp"
#include "meshrun/resolve.hpp"
#include "meshrun/site_policy.hpp"
#include "plan_render.hpp"

namespace meshrun::launch {

bool parse_launch_args(const std::vector<std::string>& args, const std::string& name, const std::string& example,
                       LaunchArgs& out, const std::function<bool(const std::vector<std::string>&, size_t&)>& own) {
  for (size_t i = 0; i < args.size();) {
    const std::string& a = args[i];
    if (a == "--help" || a == "-h") return false;
    if (a == "--") {
      out.command.assign(args.begin() + static_cast<long>(i) + 1, args.end());
      if (out.command.empty()) throw ConfigError("nothing after '--'; give the command each rank runs");
      break;
    }
    if (cli::take_config_flag(args, i, out.req)) continue;
    if (a == "--dry-run") {
      out.dry_run = true;
      ++i;
      continue;
    }
    std::string v;
    if (cli::take_value(args, i, "--plugin", &v)) {
      if (v != "auto" && v != "yes" && v != "no") throw ConfigError("--plugin " + v + ": use auto, yes or no");
      out.plugin_mode = v;
      continue;
    }
    if (own && own(args, i)) continue;
    if (!a.empty() && a[0] == '-') throw ConfigError("unknown option '" + a + "'; see 'meshrun " + name + " --help'");
    if (!out.req.template_path.empty())
      throw ConfigError("more than one template ('" + out.req.template_path + "' and '" + a + "'); give one");
    out.req.template_path = a;
    ++i;
  }
  if (out.req.template_path.empty()) throw ConfigError("missing TEMPLATE.toml; e.g. " + example);
  return true;
}
namespace {

// Keys each validation check reads, to name their sources when the check fails.
std::vector<std::string> keys_of_check(const std::string& check) {
  if (check == "world-size")
    return {"parallel.tp", "parallel.cp", "parallel.pp", "parallel.dp", "cluster.nodes", "cluster.gpus_per_node",
            "cluster.hostlist", "cluster.node_type"};
  if (check == "heads-tp") return {"model.heads", "parallel.tp"};
  if (check == "kv-heads-tp") return {"model.kv_heads", "parallel.tp"};
  if (check == "ffn-tp") return {"model.ffn_hidden", "parallel.tp"};
  if (check == "vocab-tp") return {"model.vocab", "parallel.tp"};
  if (check == "model-shape") return {"model.hidden", "model.heads", "model.kv_heads"};
  if (check == "layers-pp") return {"model.layers", "parallel.pp", "parallel.virtual_stages"};
  if (check == "experts-ep") return {"model.experts", "model.top_k", "parallel.ep"};
  if (check == "ep-dp-cp") return {"parallel.ep", "parallel.dp", "parallel.cp"};
  if (check == "seq-cp") return {"training.seq_len", "parallel.cp"};
  if (check == "seq-sp") return {"training.seq_len", "parallel.cp", "parallel.tp", "parallel.sequence_parallel"};
  if (check == "tp-nvlink")
    return {"parallel.tp", "cluster.gpus_per_node", "cluster.node_type", "cluster.nvlink_domain_gpus"};
  if (check == "batch-dp" || check == "pp-microbatches")
    return {"training.global_batch_size", "training.micro_batch_size", "parallel.dp", "parallel.pp",
            "parallel.virtual_stages"};
  if (check == "interleaved")
    return {"parallel.pipeline_schedule", "parallel.virtual_stages", "parallel.pp", "training.global_batch_size",
            "training.micro_batch_size", "parallel.dp"};
  if (check == "hostlist") return {"cluster.hostlist", "cluster.nodes"};
  if (check == "nvlink-domain") return {"cluster.nvlink_domain_gpus", "cluster.gpus_per_node", "cluster.node_type"};
  if (check == "node-type") return {"cluster.node_type"};
  if (check == "order") return {"parallel.order"};
  if (check == "size" || check == "zero-stage")
    return {"parallel.tp", "parallel.cp", "parallel.pp", "parallel.dp", "parallel.ep", "parallel.virtual_stages",
            "parallel.zero_stage"};
  return {};
}

std::string sources_of(const Config& cfg, const std::string& check) {
  std::string out;
  for (const auto& key : keys_of_check(check)) {
    auto it = cfg.origins.find(key);
    if (it == cfg.origins.end()) continue;  // defaults are not a layer worth naming
    out += (out.empty() ? "" : "; ") + key + "=" + value_text(cfg.job, key) + " from " + it->second.str();
  }
  return out.empty() ? "" : " [" + out + "]";
}

[[noreturn]] void fail(const Config& cfg, const std::vector<Problem>& problems) {
  const Problem& p = problems.front();
  std::string more = problems.size() > 1 ? " (+" + std::to_string(problems.size() - 1) +
                                               " more; `meshrun plan` lists them all)"
                                         : "";
  throw ConfigError("invalid layout: " + p.message + sources_of(cfg, p.check) + more);
}

}  // namespace

std::function<std::string(const std::string&)> data_key_location(const Config& cfg) {
  // A file's line:column; a --set or flag names itself in the message already.
  return [&cfg](const std::string& key) {
    const Origin o = cfg.origin_of(key);
    return o.kind == SourceKind::template_file || o.kind == SourceKind::site ? o.where : std::string();
  };
}

std::vector<std::string> overrides_as_sets(const ConfigRequest& r) {
  std::vector<std::string> out;
  for (const auto& f : r.flags) out.insert(out.end(), {"--set", f.key + "=" + f.value});
  for (const auto& s : r.sets) out.insert(out.end(), {"--set", s});
  return out;
}

std::vector<std::string> site_options(const ConfigRequest& r) {
  if (!r.use_site) return {"--no-site"};
  if (!r.site_path.empty()) return {"--site", std::filesystem::absolute(r.site_path).lexically_normal().string()};
  return {};
}

bool is_trainer_command(const std::vector<std::string>& command) {
  return command.empty() || starts_with_dash(command.front()) ||
         std::filesystem::path(command.front()).filename() == "meshrun-train";
}

Resolved resolve(const Config& cfg, bool trainer_job) {
  // A job of meshrun-train gets its rules, as the trainer will check them; the job's [env] is checked against
  // the site's policy before anything is submitted or started.
  // A template for a framework (job.trainer) gets that framework's rules under its own command, and is no job
  // of meshrun-train; another program's job gets the model's rules.
  const EnvPolicy policy = env_inputs(cfg).policy;
  RuleSet rules = trainer_job ? RuleSet::trainer : RuleSet::model;
  if (const RuleSet named = rules_for_job(cfg.job, true); named != RuleSet::trainer) {
    if (trainer_job) throw ConfigError(meshrun_train_refusal(cfg.job, data_key_location(cfg)("job.trainer")));
    rules = named;
  }
  Resolution res = resolve_job(cfg, {rules, 0, &policy});
  if (!res.ok()) fail(cfg, res.problems);
  // meshrun-train's input files, before anything is submitted or started (one line per missing file).
  if (trainer_job)
    if (auto missing = input_file_problems(cfg.job, data_key_location(cfg)); !missing.empty())
      throw ConfigError(missing);
  Resolved r;
  r.cfg = cfg;
  r.cluster = std::move(res.cluster);
  r.layout = *res.layout;
  r.rules = res.rules;
  r.checks = std::move(res.checks);
  r.warnings = std::move(res.warnings);
  return r;
}

std::string plan_as_comment(const Resolved& r, const std::string& template_path) {
  RankMap map(r.layout, r.cluster);
  cli::PlanView view{r.cfg, map, template_path, r.checks, r.warnings, false, r.rules, {}, {}};
  std::ostringstream table;
  cli::render_plan_table(table, view);
  std::istringstream lines(table.str());
  std::string out, line;
  while (std::getline(lines, line)) out += line.empty() ? "#\n" : "# " + line + "\n";
  return out;
}

std::string shell_quote(const std::string& w) {
  if (w.empty()) return "''";
  bool safe = true;
  for (char c : w) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              std::string_view("@%+=:,./-_").find(c) != std::string_view::npos;
    if (!ok) { safe = false; break; }
  }
  if (safe) return w;
  std::string q = "'";
  for (char c : w) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

std::string shell_join(const std::vector<std::string>& words) {
  std::string s;
  for (const auto& w : words) s += (s.empty() ? "" : " ") + shell_quote(w);
  return s;
}

std::string self_path() {
  std::error_code ec;
  auto p = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? std::string("meshrun") : p.string();
}

std::string trainer_path() {
  std::string self = self_path();
  if (self == "meshrun") return "meshrun-train";
  std::filesystem::path dir = std::filesystem::path(self).parent_path();
  for (const auto& candidate : {dir / "meshrun-train", dir.parent_path() / "trainer" / "meshrun-train"}) {
    if (::access(candidate.c_str(), X_OK) == 0) return candidate.lexically_normal().string();
  }
  return "meshrun-train";
}

TaskContext context_from_mpirun(const std::map<std::string, std::string>& env) {
  TaskContext ctx;
  auto find = [&](const char* name) -> const std::string* {
    auto it = env.find(name);
    return it == env.end() || it->second.empty() ? nullptr : &it->second;
  };
  auto get = [&](const char* name) {
    const std::string* v = find(name);
    if (!v) throw ConfigError(std::string(name) + " is not set; mpirun (Open MPI) sets it for every rank");
    int out = 0;
    auto r = std::from_chars(v->data(), v->data() + v->size(), out);
    if (r.ec != std::errc() || r.ptr != v->data() + v->size() || out < 0)
      throw ConfigError(std::string(name) + "=" + *v + ": expected an integer ≥ 0");
    return out;
  };
  ctx.world = get("OMPI_COMM_WORLD_SIZE");
  ctx.rank = get("OMPI_COMM_WORLD_RANK");
  ctx.local_rank = get("OMPI_COMM_WORLD_LOCAL_RANK");
  ctx.local_world = get("OMPI_COMM_WORLD_LOCAL_SIZE");
  ctx.node_id = ctx.local_world > 0 ? ctx.rank / ctx.local_world : 0;
  ctx.omp_threads_given = find("OMP_NUM_THREADS") != nullptr;
  if (const std::string* id = find("OMPI_MCA_ess_base_jobid")) {
    uint32_t v = 0;
    std::from_chars(id->data(), id->data() + id->size(), v);
    ctx.job_id = v;
  }
  return ctx;
}

std::optional<std::string> find_in_path(const std::string& name, const std::map<std::string, std::string>& env) {
  auto it = env.find("PATH");
  std::string path = it == env.end() ? "/usr/local/bin:/usr/bin:/bin" : it->second;
  size_t pos = 0;
  while (pos <= path.size()) {
    size_t colon = path.find(':', pos);
    std::string dir = path.substr(pos, colon == std::string::npos ? std::string::npos : colon - pos);
    if (!dir.empty()) {
      std::string candidate = dir + "/" + name;
      if (::access(candidate.c_str(), X_OK) == 0) return candidate;
    }
    if (colon == std::string::npos) break;
    pos = colon + 1;
  }
  return std::nullopt;
}

}  // namespace meshrun::launch
