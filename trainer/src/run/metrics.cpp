#include "metrics.hpp"

#include <cstdlib>
#include <fstream>

#include "meshrun/json.hpp"

namespace meshrun::train::cli {

namespace {

// Keeps the metrics lines of steps <= `step` (a resumed run rewrites the steps after its checkpoint).
void truncate_metrics(const std::string& path, int step) {
  std::ifstream is(path);
  if (!is) return;
  std::string kept, line;
  while (std::getline(is, line)) {
    const auto at = line.find("\"step\":");
    if (at == std::string::npos) continue;
    if (std::atoi(line.c_str() + at + 7) <= step) kept += line + "\n";
  }
  is.close();
  std::ofstream os(path, std::ios::trunc);
  os << kept;
}

}  // namespace

std::string MetricsFile::open(const std::string& path, int start) {
  if (start > 0) truncate_metrics(path, start);
  f_ = std::fopen(path.c_str(), start > 0 ? "a" : "w");
  return f_ ? "" : "cannot write metrics file " + path + "; check the directory";
}

void MetricsFile::write(const StepStats& st, std::int64_t memory_bytes, bool experts) {
  std::string line;
  JsonWriter w(line);
  w.begin_object()
      .field("step", st.step)
      .field("loss", st.loss)
      .field("grad_norm", st.grad_norm)
      .field("lr", st.lr)
      .field("tokens_per_s", st.tokens_per_s)
      .field("ms_per_step", st.ms)
      .field("memory_bytes", memory_bytes)
      .field("pipeline_wait_ms", st.pipeline.wait_s * 1000.0)
      .field("pipeline_compute_ms", st.pipeline.compute_s() * 1000.0)
      .field("comm_exposed_ms", st.comm_exposed_ms);
  if (experts)
    w.field("aux_loss", st.aux_loss)
        .field("expert_tokens_max", st.expert_tokens_max)
        .field("expert_tokens_mean", st.expert_tokens_mean)
        .field("a2a_bytes", st.a2a_bytes);
  w.end_object();
  std::fprintf(f_, "%s\n", line.c_str());
  std::fflush(f_);
}

void MetricsFile::close() {
  if (f_) std::fclose(f_);
  f_ = nullptr;
}

}  // namespace meshrun::train::cli
