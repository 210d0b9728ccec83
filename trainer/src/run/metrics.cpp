#include "metrics.hpp"

#include "kernel_times.hpp"

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "meshrun/json.hpp"

namespace meshrun::train::cli {

namespace {

// The integer after "key": in a line we wrote, or -1.
long long field_int(const std::string& line, const char* key) {
  const std::string k = std::string("\"") + key + "\":";
  const auto at = line.find(k);
  return at == std::string::npos ? -1 : std::atoll(line.c_str() + at + k.size());
}

// Keeps what a run resumed after step `start` does not redo: run records of runs that started before it,
// and records of steps <= start. Lines of other kinds or unknown shape are dropped with the steps they
// cannot be placed by.
void truncate_metrics(const std::string& path, int start) {
  std::ifstream is(path);
  if (!is) return;
  std::string kept, line;
  while (std::getline(is, line)) {
    const long long run_start = field_int(line, "start_step");
    const long long step = field_int(line, "step");
    if (line.find("\"record\":\"run\"") != std::string::npos ? run_start >= 0 && run_start < start
                                                              : step >= 0 && step <= start)
      kept += line + "\n";
  }
  is.close();
  std::ofstream os(path, std::ios::trunc);
  os << kept;
}

}  // namespace

MetricsTarget metrics_target(const std::string& flag, bool disabled, const JobConfig& cfg) {
  namespace fs = std::filesystem;
  if (disabled) return {"", "--no-metrics"};
  if (!flag.empty()) return {flag, "--metrics"};
  if (!cfg.job.output_dir.empty())
    return {(fs::path(cfg.job.output_dir) / "metrics.jsonl").string(), "job.output_dir"};
  if (!cfg.checkpoint.dir.empty())
    return {(fs::path(cfg.checkpoint.dir) / "metrics.jsonl").string(), "checkpoint.dir"};
  return {"", "no --metrics, job.output_dir or checkpoint.dir"};
}

std::string MetricsFile::open(const std::string& path, int start) {
  std::error_code ec;
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent, ec);
  if (start > 0) truncate_metrics(path, start);
  f_ = std::fopen(path.c_str(), start > 0 ? "a" : "w");
  path_ = path;
  if (f_) return "";
  const std::string why = std::strerror(errno);
  return "cannot write metrics file " + path + " (" + why + "); check the directory or pass --metrics FILE";
}

void MetricsFile::write_line(const std::string& line) {
  const bool ok = std::fprintf(f_, "%s\n", line.c_str()) >= 0 && std::fflush(f_) == 0;
  if (!ok && !failed_) {  // a full disk: said once, training goes on
    failed_ = true;
    std::printf("meshrun-train: warning: cannot write the metrics file %s (%s); records from here on may be missing, "
                "training continues\n", path_.c_str(), std::strerror(errno));
    std::fflush(stdout);
  }
  if (ok) failed_ = false;
}

void MetricsFile::write_run(const JobConfig& cfg, const Layout& layout, const RunFacts& run, const Utilization& u) {
  const ModelSpec& m = cfg.model;
  std::string line;
  JsonWriter w(line);
  w.begin_object()
      .field("record", "run")
      .field("schema", kMetricsSchema)
      .field("start_step", run.start_step)
      .field("steps", cfg.training.steps)
      .field("device", cfg.training.device)
      .field("backend", run.backend)
      .field("dtype", cfg.training.dtype)
      .field("param_dtype", cfg.training.param_dtype)
      .field("grad_dtype", cfg.training.grad_dtype)
      .field("optim_dtype", cfg.training.optim_dtype)
      .field("params", run.params)
      .field("seq_len", cfg.training.seq_len)
      .field("global_batch_size", cfg.training.global_batch_size)
      .field("micro_batch_size", cfg.training.micro_batch_size);
  w.key("host").begin_object()
      .field("nodes", run.nodes)
      .field("ranks_per_node", run.ranks_per_node)
      .field("node_cpus", run.node_cpus)
      .end_object();
  w.key("model").begin_object()
      .field("name", m.name)
      .field("layers", m.layers)
      .field("hidden", m.hidden)
      .field("ffn_hidden", m.ffn_hidden)
      .field("heads", m.heads)
      .field("kv_heads", m.kv_heads)
      .field("vocab", m.vocab)
      .field("mlp", m.mlp)
      .field("tied_embeddings", m.tied_embeddings)
      .field("experts", m.experts)
      .field("top_k", m.top_k)
      .field("moe_ffn_hidden", m.moe_ffn_hidden)
      .end_object();
  w.key("layout").begin_object()
      .field("tp", layout.tp)
      .field("cp", layout.cp)
      .field("pp", layout.pp)
      .field("dp", layout.dp)
      .field("ep", layout.ep)
      .field("zero", layout.zero_stage)
      .field("sp", layout.sequence_parallel)
      .field("order", layout.order.str())
      .field("cp_comm", cfg.parallel.cp_comm)
      .field("schedule", run.schedule)
      .field("virtual_stages", layout.virtual_stages)
      .field("microbatches", run.microbatches)
      .field("world", run.world)
      .end_object();
  w.field("model_flops_per_step", u.flops_per_step)
      .field("peak_flops", u.peak_flops)
      .field("peak_source", u.peak_source)
      .end_object();
  write_line(line);
}

void MetricsFile::write_step(const StepStats& st, std::int64_t memory_bytes, bool experts, const Utilization& u,
                             double elapsed_s) {
  std::string line;
  JsonWriter w(line);
  w.begin_object()
      .field("record", "step")
      .field("step", st.step)
      .field("loss", st.loss)
      .field("grad_norm", st.grad_norm)
      .field("lr", st.lr)
      .field("tokens_per_s", st.tokens_per_s)
      .field("mfu", u.mfu(st.ms / 1000.0))
      .field("ms_per_step", st.ms)
      .field("elapsed_s", elapsed_s)
      .field("memory_bytes", memory_bytes)
      .field("pipeline_wait_ms", st.pipeline.wait_s * 1000.0)
      .field("pipeline_compute_ms", st.pipeline.compute_s() * 1000.0)
      .field("comm_exposed_ms", st.comm_exposed_ms);
  if (experts)
    w.field("aux_loss", st.aux_loss)
        .field("expert_tokens_max", st.expert_tokens_max)
        .field("expert_tokens_mean", st.expert_tokens_mean)
        .field("expert_rank_imbalance", st.expert_rank_imbalance)
        .field("a2a_bytes", st.a2a_bytes);
  if (st.eval_loss >= 0) w.field("eval_loss", st.eval_loss);  // steps that evaluated data.valid
  if (!st.kernel_ms.empty()) {
    w.key("kernel_ms").begin_object();
    for (std::size_t i = 0; i < st.kernel_ms.size(); ++i) w.field(kernel_kinds()[i], st.kernel_ms[i]);
    w.end_object();
  }
  w.end_object();
  write_line(line);
}

void MetricsFile::write_straggler(const StragglerReport& r, const Straggler& s, const RankPlace& place) {
  std::string line;
  JsonWriter w(line);
  w.begin_object()
      .field("record", "straggler")
      .field("step", r.last_step)
      .field("first_step", r.first_step)
      .field("rank", s.rank)
      .field("node", place.node)
      .field("host", place.host)
      .field("pp", place.coord.pp)
      .field("dp", place.coord.dp)
      .field("tp", place.coord.tp)
      .field("cp", place.coord.cp)
      .field("compute_ms", s.compute_ms)
      .field("median_compute_ms", r.median_compute_ms)
      .field("wait_ms", s.wait_ms)
      .field("median_wait_ms", r.median_wait_ms)
      .end_object();
  write_line(line);
}

void MetricsFile::close() {
  if (f_) std::fclose(f_);
  f_ = nullptr;
}

}  // namespace meshrun::train::cli
