// meshrun-gpu-check: the one-GPU device check of docs/gpu.md. (a) every CUDA kernel against its CPU twin,
// (b) the tiny model's first losses on the GPU (bf16) against the CPU fp32 run, (c) throughput and MFU of
// a ~1B-parameter Llama-style model in bf16, with per-kernel-kind CUDA-event times. (b) and (c) train
// through meshrun-train's own code at world 1 (trainer/.../run/single_device.hpp): one model, whatever
// the backend.
// Exit 0 when every check passed, 1 when one failed, 2 for bad arguments or no usable GPU.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <exception>
#include <stdexcept>

#include "meshrun/device/check.hpp"
#include "meshrun/model_flops.hpp"
#include "meshrun/version.hpp"
#include "meshrun/train/run/single_device.hpp"

namespace mg = meshrun::device;
namespace mt = meshrun::train;

namespace {

void print_model(const char* what, const mg::ModelConfig& c) {
  std::printf("%s: vocab %lld, hidden %lld, layers %lld, heads %lld/%lld kv, ffn %lld, seq %lld, batch %lld: "
              "%.3fB parameters (%.3fB in matmuls), %.4g FLOP/step\n",
              what, (long long)c.vocab, (long long)c.hidden, (long long)c.layers, (long long)c.heads,
              (long long)c.kv_heads, (long long)c.ffn, (long long)c.seq, (long long)c.batch, mg::param_count(c) / 1e9,
              mg::matmul_param_count(c) / 1e9, mg::train_flops_per_step(c));
}

bool run_kernels(mg::Backend& gpu) {
  auto cpu = mg::make_cpu_backend("fp32");
  const double bound = mg::kernel_bound(gpu.precision());
  std::printf("== kernels: %s vs %s, bound ||gpu - cpu||_2 / ||cpu||_2 <= %g\n", gpu.name().c_str(),
              cpu->name().c_str(), bound);
  bool ok = true;
  for (const mg::KernelResult& r : mg::compare_kernels(gpu, *cpu, bound)) {
    std::printf("  %-48s max_abs %.3e  rel %.3e  %s\n", r.name.c_str(), r.max_abs, r.rel, r.pass() ? "PASS" : "FAIL");
    ok = ok && r.pass();
  }
  return ok;
}

// A fresh CUDA backend for a part that hands its backend to a trainer.
using MakeGpu = std::unique_ptr<mg::Backend> (*)();

bool run_tiny(MakeGpu make_gpu, int steps) {
  const mg::ModelConfig c = mg::tiny_model();
  print_model("== tiny model", c);
  const std::vector<double> a = mt::train_losses(make_gpu(), c, steps),
                            b = mt::train_losses(mg::make_cpu_backend("fp32"), c, steps);
  bool ok = true;
  for (int s = 0; s < steps; ++s) {
    const double rel = std::abs(a[s] - b[s]) / std::abs(b[s]);
    const bool pass = rel <= 1e-2;
    std::printf("  step %2d  loss gpu %.6f  cpu-fp32 %.6f  rel %.3e  %s\n", s + 1, a[s], b[s], rel,
                pass ? "PASS" : "FAIL");
    ok = ok && pass;
  }
  return ok;
}

void run_perf(MakeGpu make_gpu, const mg::CheckOptions& o) {
  const mg::ModelConfig& c = o.perf_model;
  print_model("== perf model", c);
  mt::SingleDeviceRun run(mt::single_device_config(c, o.perf_warmup + o.perf_steps, 3e-4, 3), make_gpu());
  mg::Backend& gpu = run.trainer().backend();
  double loss = 0;
  auto step = [&](int s) { loss = run.step(s).loss; };   // waits for the loss: host syncs every step
  for (int s = 0; s < o.perf_warmup; ++s) step(s);
  gpu.synchronize();
  const auto base = gpu.kernel_times();
  const auto t0 = std::chrono::steady_clock::now();
  for (int s = 0; s < o.perf_steps; ++s) step(o.perf_warmup + s);
  gpu.synchronize();
  const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const double flops = mg::train_flops_per_step(c) * o.perf_steps;
  const double tflops = flops / sec / 1e12;
  std::printf("  FLOP formula: %s\n", meshrun::kModelFlopFormula);
  std::printf("  %d steps in %.3f s: %.0f tokens/s, %.1f TFLOP/s, MFU %.1f%% of %.0f dense bf16 TFLOP/s; last loss %.4f\n",
              o.perf_steps, sec, double(c.tokens()) * o.perf_steps / sec, tflops, 100.0 * tflops / o.peak_tflops,
              o.peak_tflops, loss);
  std::printf("  %s\n", gpu.memory_report().c_str());
  std::printf("  CUDA-event time per kernel kind over the timed steps (ms, share of wall time):\n");
  for (const auto& [kind, ms] : gpu.kernel_times()) {
    double before = 0;
    for (const auto& [k0, ms0] : base)
      if (k0 == kind) before = ms0;
    std::printf("    %-24s %10.1f  %5.1f%%\n", kind.c_str(), ms - before, 100.0 * (ms - before) / (1e3 * sec));
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 2 && std::string(argv[1]) == "--version") {
    std::printf("meshrun-gpu-check %s\n", meshrun::kVersion);
    return 0;
  }
  mg::CheckOptions o;
  try {
    o = mg::parse_check_args(argc, argv);
    if (std::string p = o.perf_model.problem(); !p.empty()) throw std::invalid_argument("perf model: " + p);
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "meshrun-gpu-check: %s\n", e.what());
    return 2;
  }
  if (o.help) {
    std::printf("%s\n", mg::kCheckUsage);
    return 0;
  }
  if (o.dry_run) {
    print_model("tiny model", mg::tiny_model());
    print_model("perf model", o.perf_model);
    std::printf("FLOP formula: %s\n", meshrun::kModelFlopFormula);
    std::printf("parts: kernels %s, tiny %s (%d steps), perf %s (%d steps after %d warm-up)\n", o.kernels ? "yes" : "no",
                o.tiny ? "yes" : "no", o.tiny_steps, o.perf ? "yes" : "no", o.perf_steps, o.perf_warmup);
    return 0;
  }
  std::string why;
  const int visible = mg::cuda_device_count(&why);
  if (visible == 0) {
    std::fprintf(stderr, "meshrun-gpu-check: no CUDA device: %s\n", why.c_str());
    return 2;
  }
  static int device = 0;
  std::unique_ptr<mg::Backend> gpu;
  try {
    device = mg::task_cuda_device(visible);
    gpu = mg::make_cuda_backend(mg::Precision::cuda("bf16", "fp32", "fp32"), device);
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "meshrun-gpu-check: %s\n", e.what());
    return 2;
  }
  const MakeGpu make_gpu = [] { return mg::make_cuda_backend(mg::Precision::cuda("bf16", "fp32", "fp32"), device); };
  std::printf("device: %s\n", gpu->name().c_str());
  // Each part reports its own error and the next one still runs: one short GPU lease should show them all.
  bool ok = true;
  auto part = [&](const char* name, auto&& body) {
    try {
      ok = body() && ok;
    } catch (const std::exception& e) {
      std::printf("  %s: ERROR %s\n", name, e.what());
      ok = false;
    }
  };
  if (o.kernels) part("kernels", [&] { return run_kernels(*gpu); });
  if (o.tiny) part("tiny", [&] { return run_tiny(make_gpu, o.tiny_steps); });
  if (o.perf) part("perf", [&] {
    run_perf(make_gpu, o);
    return true;
  });
  std::printf("meshrun-gpu-check: %s\n", ok ? "all checks passed" : "a check FAILED");
  return ok ? 0 : 1;
}
