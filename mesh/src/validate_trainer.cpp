// The bundled trainer's rules (layout.hpp, validate_trainer): in mesh_core, so that meshrun-train (and the
// single-process trainer of meshrun-gpu-check) check the same ones the dry run, the launcher and the plugin do.
#include <algorithm>
#include <array>
#include <cmath>
#include <filesystem>
#include <sstream>
#include <string>

#include "meshrun/layout.hpp"
#include "meshrun/schedule.hpp"

namespace meshrun {

namespace {
std::string s(int64_t v) { return std::to_string(v); }
std::string number(double v) {
  std::ostringstream o;
  o << v;
  return o.str();
}
}  // namespace

int cp_alltoall_group(const LayoutSpec& spec, int cp) {
  if (spec.cp_comm == "alltoall") return cp;
  if (spec.cp_comm == "alltoall+ring") return spec.cp_alltoall;
  return 1;
}

bool cp_alltoall_fits(const LayoutSpec& spec, int cp, int heads_per_tp, int kv_heads_per_tp) {
  if (cp <= 1) return true;
  const int g = cp_alltoall_group(spec, cp);
  if (spec.cp_comm == "alltoall+ring" && (g < 2 || g >= cp)) return false;
  return g >= 1 && cp % g == 0 && heads_per_tp % g == 0 && kv_heads_per_tp % g == 0;
}

CpAlltoallPlace cp_alltoall_place(int cp, int group, int cp_index) {
  const int groups = cp / group, g = cp_index / group, place = cp_index % group;
  return {g * group, ((g - 1 + groups) % groups) * group + place, ((g + 1) % groups) * group + place};
}

std::string parse_data_split(const std::string& text, std::array<double, 3>* weights) {
  const std::string fix = "; give one to three comma-separated weights >= 0 (train,valid,test), e.g. \"969,30,1\"";
  std::array<double, 3> w{0, 0, 0};
  std::size_t start = 0;
  int n = 0;
  while (true) {
    const std::size_t comma = text.find(',', start);
    const std::string field = text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    if (n == 3) return "data.split = \"" + text + "\" has more than three parts" + fix;
    // A plain decimal number: digits with at most one '.', as Megatron's [.0-9]+ reads them.
    const bool digits = !field.empty() && field.find_first_not_of("0123456789.") == std::string::npos &&
                        std::count(field.begin(), field.end(), '.') <= 1 && field != ".";
    if (!digits) return "data.split = \"" + text + "\": part " + std::to_string(n + 1) + " \"" + field + "\" is not a number" + fix;
    try {
      w[static_cast<std::size_t>(n++)] = std::stod(field);
    } catch (const std::exception&) {  // out of range: more digits than a double holds
      return "data.split = \"" + text + "\": part " + std::to_string(n) + " is too large" + fix;
    }
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  double sum = 0;
  for (double x : w) sum += x;
  if (!(sum > 0) || !std::isfinite(sum)) return "data.split = \"" + text + "\" has no positive weight" + fix;
  if (w[0] == 0) return "data.split = \"" + text + "\" gives training nothing; give the first (train) part a weight > 0";
  for (double& x : w) x /= sum;  // Megatron's normalize
  *weights = w;
  return "";
}

std::pair<std::int64_t, std::int64_t> data_split_range(const std::array<double, 3>& w, int part, std::int64_t n) {
  double lo = 0;  // the running sum, added in order as Megatron's expansion is
  for (int i = 0; i < part; ++i) lo += w[static_cast<std::size_t>(i)];
  const double hi = lo + w[static_cast<std::size_t>(part)];
  if (!(hi > lo)) return {0, 0};  // Megatron: no dataset for this part
  // std::nearbyint rounds half to even in the default rounding mode, as Python's round does.
  const auto at = [n](double f) { return static_cast<std::int64_t>(std::nearbyint(f * static_cast<double>(n))); };
  return {at(lo), at(hi)};
}

bool is_trainer_rule(std::string_view name) {
  static constexpr std::string_view kTrainerRules[] = {"rope-head-dim", "expert-width-tp",         "trainer-mlp",
                                                       "cp-comm",       "trainer-tied-embeddings", "pipeline-schedule",
                                                       "router-aux-pp", "data-blend",              "data-source",
                                                       "data-split",    "eval-valid",    "recompute-experts",       "cp-alltoall"};
  return std::find(std::begin(kTrainerRules), std::end(kTrainerRules), name) != std::end(kTrainerRules);
}

std::vector<Problem> validate_trainer(const JobConfig& cfg, const Layout& l, std::vector<std::string>* checks_run) {
  std::vector<Problem> p;
  auto check = [&](const char* name) {
    if (checks_run) checks_run->push_back(name);
  };
  const ModelSpec& m = cfg.model;
  check("rope-head-dim");
  if (m.heads > 0 && m.hidden > 0 && m.hidden % m.heads == 0 && m.head_dim() % 2 != 0)
    p.push_back({"rope-head-dim", "the head dimension model.hidden/model.heads = " + s(m.head_dim()) +
                                      " is odd; rotary embeddings rotate pairs of dimensions: use an even head dimension"});
  check("expert-width-tp");
  if (m.experts > 0 && m.expert_ffn() % l.tp != 0)
    p.push_back({"expert-width-tp", "the expert width (model.moe_ffn_hidden, or ffn_hidden when 0) = " + s(m.expert_ffn()) +
                                        " is not divisible by tp=" + s(l.tp) + "; expert MLPs are split over TP like the "
                                        "dense one: use a tp that divides it"});
  check("trainer-mlp");
  if (m.mlp != "swiglu")
    p.push_back({"trainer-mlp", "model.mlp = \"" + m.mlp + "\": meshrun-train builds the Llama SwiGLU MLP; set "
                                    "model.mlp = \"swiglu\", or set job.trainer = \"megatron\" (Megatron-LM builds GELU MLPs; "
                                    "its flags: meshrun plan --for megatron)"});
  check("trainer-tied-embeddings");
  if (m.tied_embeddings)
    p.push_back({"trainer-tied-embeddings", "model.tied_embeddings = true: meshrun-train keeps Llama's untied LM head; "
                                                "set it to false, or set job.trainer = \"megatron\" (Megatron-LM ties them; its "
                                                "flags: meshrun plan --for megatron)"});
  check("cp-comm");
  const std::string& cc = cfg.parallel.cp_comm;
  const bool cc_known = cc == "ring" || cc == "allgather" || cc == "alltoall" || cc == "alltoall+ring";
  if (!cc_known)
    p.push_back({"cp-comm", "parallel.cp_comm = \"" + cc + "\" is unknown; use \"ring\", \"allgather\", \"alltoall\" or "
                            "\"alltoall+ring\""});
  // All-to-all CP scatters the rank's attention heads over a group of CP ranks (all of them, or
  // parallel.cp_alltoall consecutive ones under alltoall+ring); at cp = 1 every cp_comm setting is moot.
  check("cp-alltoall");
  const int a2a_group = cp_alltoall_group(cfg.parallel, l.cp);
  if (cc_known && l.cp > 1) {
    const int A = cfg.parallel.cp_alltoall;
    if (cc == "alltoall+ring" && (A < 2 || A >= l.cp || l.cp % A != 0))
      p.push_back({"cp-alltoall", "parallel.cp_comm = \"alltoall+ring\" at cp=" + s(l.cp) + " with parallel.cp_alltoall = " +
                                      s(A) + ": set cp_alltoall to the CP ranks of one all-to-all group, a divisor of cp "
                                      "from 2 to cp/2 (the ring runs across cp/cp_alltoall groups), or use \"alltoall\""});
    else if (cc != "alltoall+ring" && A != 0)
      p.push_back({"cp-alltoall", "parallel.cp_alltoall = " + s(A) + " applies only to parallel.cp_comm = \"alltoall+ring\", "
                                      "not \"" + cc + "\": remove it or set cp_comm = \"alltoall+ring\""});
    else if (a2a_group > 1 && m.heads > 0 && m.kv_heads > 0 && m.heads % l.tp == 0 && m.kv_heads % l.tp == 0 &&
             ((m.heads / l.tp) % a2a_group != 0 || (m.kv_heads / l.tp) % a2a_group != 0))
      p.push_back({"cp-alltoall", "parallel.cp_comm = \"" + cc + "\" scatters each rank's attention heads over " +
                                      s(a2a_group) + " CP ranks, but its heads (model.heads/tp = " + s(m.heads / l.tp) +
                                      ") and kv heads (model.kv_heads/tp = " + s(m.kv_heads / l.tp) +
                                      ") are not both divisible by " + s(a2a_group) + ": use \"ring\" or \"allgather\", "
                                      "a smaller all-to-all group, or a smaller tp"});
  }
  check("pipeline-schedule");
  if (!parse_pipeline_schedule(cfg.parallel.pipeline_schedule))
    p.push_back({"pipeline-schedule", "parallel.pipeline_schedule = \"" + cfg.parallel.pipeline_schedule +
                                          "\" is unknown; use gpipe, 1f1b, interleaved, zb, zbv or dualpipev"});
  check("router-aux-pp");
  if (m.experts > 0 && m.router_aux == "hf" && l.pp > 1)
    p.push_back({"router-aux-pp", "model.router_aux = \"hf\" pools the router statistics over all layers, which meshrun-train "
                                  "does not pass between pipeline stages: use parallel.pp = 1 or model.router_aux = \"meshrun\""});
  check("recompute-experts");
  if (m.experts > 0 && cfg.training.recompute == "full")
    p.push_back({"recompute-experts", "training.recompute = \"full\" with model.experts: meshrun-train does not rerun an "
                                      "expert layer's routing and dispatch in the backward; use \"selective\" (norm "
                                      "outputs and the SwiGLU outputs, the experts' too) or \"none\""});
  // Data keys (docs/trainer.md, "Data"): checkable before the job starts; the files themselves are read by
  // meshrun-train.
  const DataSpec& d = cfg.data;
  check("data-source");
  if (!d.blend.empty() && (!d.path.empty() || !d.text.empty()))
    p.push_back({"data-source", std::string("data.blend and data.") + (d.path.empty() ? "text" : "path") +
                                    " are both set; the blend replaces data.path: remove one of them"});
  check("data-blend");
  for (const auto* blend : {&d.blend, &d.valid}) {
    const char* key = blend == &d.blend ? "data.blend" : "data.valid";
    double sum = 0;
    std::string bad;
    for (std::size_t i = 0; i < blend->size() && bad.empty(); ++i) {
      const BlendEntry& e = (*blend)[i];
      if (e.path.empty()) bad = "entry " + std::to_string(i) + " has an empty path; name a dataset there";
      else if (!std::isfinite(e.weight) || e.weight < 0)
        bad = "entry " + std::to_string(i) + " (" + e.path + ") has weight " + number(e.weight) +
              "; weights are finite and >= 0: fix that weight";
      else sum += e.weight;
    }
    if (!bad.empty())
      p.push_back({"data-blend", std::string(key) + " " + bad});
    else if (!blend->empty() && !(sum > 0 && std::isfinite(sum)))
      p.push_back({"data-blend", std::string(key) + "'s weights sum to " + number(sum) +
                                     ", not a positive number; give at least one dataset a positive weight"});
  }
  check("data-split");
  std::array<double, 3> split{0, 0, 0};
  if (!d.split.empty()) {
    if (const std::string why = parse_data_split(d.split, &split); !why.empty()) p.push_back({"data-split", why});
    else if (!d.valid.empty())
      p.push_back({"data-split", "data.split = \"" + d.split + "\" and data.valid both name validation data; keep one "
                                 "(data.split cuts it from the training datasets, data.valid names other files)"});
  }
  check("eval-valid");
  const bool split_validates = split[1] > 0;
  if (cfg.training.eval_interval > 0 && d.valid.empty() && !split_validates)
    p.push_back({"eval-valid", "training.eval_interval = " + s(cfg.training.eval_interval) + " needs validation data; " +
                                   (d.split.empty() ? std::string("set data.valid to a path or a blend, or data.split")
                                                    : "data.split = \"" + d.split + "\" gives it no part; give its second "
                                                      "(valid) part a weight > 0") +
                                   " (or eval_interval = 0)"});
  else if (cfg.training.eval_interval == 0 && !d.valid.empty())
    p.push_back({"eval-valid", "data.valid is set but training.eval_interval = 0, so it is never read; set "
                               "training.eval_interval to the steps between evaluations, or remove data.valid"});
  return p;
}

std::vector<std::string> data_input_problems(const DataSpec& d,
                                             const std::function<std::string(const std::string&)>& where) {
  namespace fs = std::filesystem;
  std::vector<std::string> p;
  auto exists = [](const std::string& f) {
    std::error_code ec;
    return fs::exists(f, ec);
  };
  auto at = [&](const std::string& key) {
    const std::string w = where ? where(key) : "";
    return w.empty() ? std::string() : w + ": ";
  };
  // A dataset path: the file, or a Megatron prefix whose PREFIX.bin is there.
  auto dataset = [&](const std::string& key, const std::string& path, const std::string& fix) {
    if (path.empty() || exists(path) || exists(path + ".bin")) return;
    p.push_back(at(key) + key + " = " + path + ": no such file (" + key + " is read, never written); " + fix);
  };
  dataset("data.path", d.path,
          std::string("point it at a token file or an indexed dataset (meshrun-tokenize makes one)") +
              (d.text.empty() ? "" : ", or remove data.path (--set data.path=) to train on data.text = " + d.text));
  for (const auto* blend : {&d.blend, &d.valid}) {
    const std::string key = blend == &d.blend ? "data.blend" : "data.valid";
    for (std::size_t i = 0; i < blend->size(); ++i)
      if (const std::string& f = (*blend)[i].path; !f.empty() && !exists(f) && !exists(f + ".bin"))
        p.push_back(at(key) + key + (blend->size() > 1 ? " entry " + std::to_string(i) : "") + ": token file " + f +
                    ": no such file (" + key + " is read, never written); point it at a token file or an indexed "
                    "dataset (meshrun-tokenize makes one)");
  }
  if (d.path.empty() && d.blend.empty() && !d.text.empty()) {
    std::size_t start = 0;
    while (start <= d.text.size()) {
      const std::size_t comma = d.text.find(',', start);
      const std::string part = d.text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
      if (!part.empty() && !exists(part))
        p.push_back(at("data.text") + "data.text input " + part +
                    ": no such file or directory; check data.text (UTF-8 files or directories, comma-separated)");
      if (comma == std::string::npos) break;
      start = comma + 1;
    }
    if (!d.tokenizer.empty() && !exists(d.tokenizer))
      p.push_back(at("data.tokenizer") + "data.tokenizer = " + d.tokenizer +
                  ": no such file or directory; point it at a tokenizer.json, a SentencePiece .model or a model "
                  "directory (or remove it for byte-level tokens)");
  }
  return p;
}

std::vector<std::string> checkpoint_input_problems(const CheckpointSpec& ck,
                                                   const std::function<std::string(const std::string&)>& where) {
  namespace fs = std::filesystem;
  std::vector<std::string> p;
  if (ck.finetune.empty()) return p;
  const std::string w = where ? where("checkpoint.finetune") : "";
  const std::string at = w.empty() ? "" : w + ": ";
  const std::string key = "checkpoint.finetune = " + ck.finetune;
  std::error_code ec;
  if (!ck.load.empty())
    p.push_back(at + key + " and checkpoint.load = " + ck.load + " both name the weights to start from; keep one");
  if (!fs::exists(ck.finetune, ec))
    p.push_back(at + key + ": no such directory; name a checkpoint.dir of an earlier run, or one of its step-N");
  else if (!fs::exists(fs::path(ck.finetune) / "latest", ec) && !fs::exists(fs::path(ck.finetune) / "manifest.json", ec))
    p.push_back(at + key + " is not a meshrun checkpoint (no latest, no manifest.json); name a checkpoint.dir or one "
                "of its step-N, or set checkpoint.load for a safetensors file or a Hugging Face directory");
  else if (!ck.dir.empty()) {
    // Lexically, after making both absolute: checkpoint.dir may not exist yet.
    const fs::path from = fs::absolute(ck.finetune, ec).lexically_normal(), dir = fs::absolute(ck.dir, ec).lexically_normal();
    const auto rel = from.lexically_relative(dir);
    const bool inside = !rel.empty() && *rel.begin() != "..";
    if (inside || fs::equivalent(from, dir, ec))
      p.push_back(at + key + " is inside checkpoint.dir = " + ck.dir + ", which this run writes and prunes "
                  "(checkpoint.keep); give the new run its own checkpoint.dir");
  }
  return p;
}

std::vector<std::string> input_file_problems(const JobConfig& job,
                                             const std::function<std::string(const std::string&)>& where) {
  std::vector<std::string> p = data_input_problems(job.data, where);
  for (std::string& line : checkpoint_input_problems(job.checkpoint, where)) p.push_back(std::move(line));
  return p;
}

}  // namespace meshrun
