#include "step_log.hpp"

#include <sys/resource.h>

#include <cmath>
#include <cstdio>
#include <filesystem>

#include "meshrun/model_flops.hpp"

namespace meshrun::train::cli {

namespace {

std::int64_t max_rss_bytes() {
  struct rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  return static_cast<std::int64_t>(u.ru_maxrss) * 1024;  // Linux reports KiB
}

}  // namespace

std::string mib(std::int64_t bytes) {
  char b[32];
  std::snprintf(b, sizeof b, "%.2f MiB", static_cast<double>(bytes) / (1024.0 * 1024.0));
  return b;
}

void print_run_banner(const JobConfig& cfg, const Layout& layout, std::int64_t params, PipelineSchedule schedule,
                      std::int64_t microbatches) {
  std::printf("meshrun-train: %s, %lld parameters, %s; layout tp=%d cp=%d pp=%d dp=%d ep=%d zero=%d sp=%s on %d ranks (%s)\n",
              cfg.model.name.c_str(), static_cast<long long>(params), cfg.training.dtype.c_str(),
              layout.tp, layout.cp, layout.pp, layout.dp, layout.ep, layout.zero_stage, layout.sequence_parallel ? "on" : "off",
              static_cast<int>(layout.world()), layout.order.str().c_str());
  if (layout.pp > 1)
    std::printf("meshrun-train: pipeline %s, %d stages × %d virtual, %lld micro-batches per step\n",
                pipeline_schedule_name(schedule), layout.pp, layout.virtual_stages,
                static_cast<long long>(microbatches));
  std::fflush(stdout);
}

Utilization utilization(const JobConfig& cfg, double peak_flops, std::string peak_source) {
  const double tokens = static_cast<double>(cfg.training.global_batch_size) * static_cast<double>(cfg.training.seq_len);
  return {model_flops_per_token(cfg.model, cfg.training.seq_len) * tokens, peak_flops, std::move(peak_source)};
}

void print_utilization(const Utilization& u, const std::string& metrics_path, const std::string& metrics_why) {
  if (u.peak_flops <= 0)
    std::printf("meshrun-train: MFU n/a: peak %s\n", u.peak_source.c_str());
  else
    std::printf("meshrun-train: MFU = %.4g GFLOP of model FLOPs per step (6·N_matmul·tokens + causal attention, "
              "the planner's formula) / step time / peak %.4g GFLOP/s (%s)\n",
              u.flops_per_step / 1e9, u.peak_flops / 1e9, u.peak_source.c_str());
  if (!metrics_path.empty()) std::printf("meshrun-train: metrics: %s (%s)\n", metrics_path.c_str(), metrics_why.c_str());
  else std::printf("meshrun-train: metrics: not written (%s)\n", metrics_why.c_str());
  std::fflush(stdout);
}

std::string duration_text(double seconds) {
  char b[48];
  const long long s = static_cast<long long>(seconds + 0.5);
  if (seconds < 60) std::snprintf(b, sizeof b, "%.1f s", seconds);
  else if (s < 3600) std::snprintf(b, sizeof b, "%lldm %02llds", s / 60, s % 60);
  else std::snprintf(b, sizeof b, "%lldh %02lldm", s / 3600, (s % 3600) / 60);
  return b;
}

namespace {
std::string mfu_text(double mfu) {
  if (std::isnan(mfu)) return "n/a";
  char b[32];
  std::snprintf(b, sizeof b, "%.1f%%", 100.0 * mfu);
  return b;
}
}  // namespace

void print_step(const StepStats& st, const JobConfig& cfg, bool first, const Progress& p, const Utilization& u) {
  std::printf("step %5d/%d | loss %.4f | grad_norm %.4f | lr %.3e | %.0f tok/s global | MFU %s | %.1f ms/step",
              st.step, cfg.training.steps, st.loss, st.grad_norm, st.lr, st.tokens_per_s,
              mfu_text(u.mfu(st.ms / 1000.0)).c_str(), st.ms);
  if (st.eval_loss >= 0) std::printf(" | eval_loss %.4f", st.eval_loss);
  if (cfg.model.experts > 0)
    std::printf(" | aux %.5f | expert tokens max %.0f mean %.1f | a2a %s", st.aux_loss, st.expert_tokens_max,
                st.expert_tokens_mean, mib(st.a2a_bytes).c_str());
  std::printf(" | %s elapsed", duration_text(p.elapsed_s).c_str());
  if (p.steps_left > 0 && p.steps_done > 0)
    std::printf(", ETA %s", duration_text(p.elapsed_s / p.steps_done * p.steps_left).c_str());
  std::printf("\n");
  if (cfg.model.experts > 0 && (first || st.step == cfg.training.steps)) {  // per-expert load
    std::string load;
    for (std::size_t i = 0; i < st.expert_tokens.size(); ++i)
      load += (i % cfg.model.experts ? " " : i ? " | " : "") + std::to_string(std::llround(st.expert_tokens[i]));
    std::printf("meshrun-train: step %d assignments per expert (layers 0..%d): %s\n", st.step,
                cfg.model.layers - 1, load.c_str());
  }
}

void print_run_summary(const JobConfig& cfg, int first_step, const Progress& p, const Utilization& u,
                       double last_loss, const std::string& checkpoint) {
  const double tokens = static_cast<double>(p.steps_done) * static_cast<double>(cfg.training.global_batch_size) *
                        static_cast<double>(cfg.training.seq_len);
  std::printf("meshrun-train: finished steps %d..%d (%d in this run) in %s from the first step to the end, saves "
              "included: %.0f tokens, %.0f tok/s (all ranks, mean), MFU %s (mean); last loss %.4f; %s\n",
              first_step + 1, first_step + p.steps_done, p.steps_done, duration_text(p.elapsed_s).c_str(), tokens,
              p.elapsed_s > 0 ? tokens / p.elapsed_s : 0.0, mfu_text(u.mfu(p.elapsed_s / p.steps_done)).c_str(), last_loss,
              checkpoint.empty() ? "no checkpoint.dir: nothing saved to resume from"
                                 : ("latest checkpoint " + checkpoint).c_str());
  std::fflush(stdout);
}

void print_memory(const MemoryReport& m, int zero_stage, std::int64_t activation_bytes) {
  std::printf("meshrun-train: memory per rank (ZeRO-%d): params %s, grads %s, optimizer %s, transient peak %s, "
              "total %s; activations %s; process max RSS %s\n",
              zero_stage, mib(m.params).c_str(), mib(m.grads).c_str(), mib(m.optimizer).c_str(),
              mib(m.transient_peak).c_str(), mib(m.total()).c_str(),
              mib(activation_bytes).c_str(), mib(max_rss_bytes()).c_str());
}

void print_checkpoint_committed(const SaveResult& r, int step, int signal_lead_s) {
  std::string removed;
  for (const auto& p : r.removed)
    removed += (removed.empty() ? (r.removing_in_background ? "; removing " : "; removed ") : ", ") + std::filesystem::path(p).filename().string();
  if (r.removing_in_background) removed += " in the background";
  char async[96] = "";
  if (r.background) std::snprintf(async, sizeof async, "; async: training waited %.3f s of it", r.stall_seconds);
  std::printf("meshrun-train: checkpoint committed: %s (%d shards, %s, %.3f s); latest = step-%d%s%s\n", r.path.c_str(),
              r.files, mib(r.bytes_total).c_str(), r.seconds, step, removed.c_str(), async);
  if (!r.background && r.seconds > signal_lead_s)  // a signal's save is synchronous: this is its cost
    std::printf("meshrun-train: warning: this save took %.1f s, longer than checkpoint.signal_lead_s = %d s; a save "
                "asked for by the signal may not finish before the time limit: raise checkpoint.signal_lead_s\n",
                r.seconds, signal_lead_s);
  std::fflush(stdout);
}

}  // namespace meshrun::train::cli
