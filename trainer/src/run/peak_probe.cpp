#include "peak_probe.hpp"

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "meshrun/device/backend.hpp"
#include "meshrun/kernels/cpu.hpp"
#include "meshrun/planner_catalogue.hpp"

namespace meshrun::train::cli {

namespace {

// The probe's product: y[256, 512] = x[256, 512] · W[512, 512]ᵀ, 134 MFLOP a call, a mid-size shape of
// the kernel's blocking (docs/kernels.md), warm in cache after the first call.
constexpr std::int64_t kRows = 256, kIn = 512, kOut = 512;

}  // namespace

template <class T>
double probe_flops_per_s(double seconds) {
  std::vector<T> x(kRows * kIn), w(kOut * kIn), y(kRows * kOut);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<T>((i % 17) * 0.01);
  for (std::size_t i = 0; i < w.size(); ++i) w[i] = static_cast<T>((i % 13) * 0.01);
  kernels::cpu::linear_forward(y.data(), x.data(), w.data(), kRows, kIn, kOut);  // warm-up: pages, caches
  using clock = std::chrono::steady_clock;
  const auto t0 = clock::now();
  double elapsed = 0;
  long calls = 0;
  while (calls < 3 || elapsed < seconds) {
    kernels::cpu::linear_forward(y.data(), x.data(), w.data(), kRows, kIn, kOut);
    ++calls;
    elapsed = std::chrono::duration<double>(clock::now() - t0).count();
  }
  return 2.0 * kRows * kIn * kOut * static_cast<double>(calls) / elapsed;
}
template double probe_flops_per_s<float>(double);
template double probe_flops_per_s<double>(double);

PeakFlops measure_cpu_peak(MPI_Comm world, const std::string& dtype, double seconds) {
  MPI_Barrier(world);  // every rank measures at the same time
  const double mine = dtype == "fp64" ? probe_flops_per_s<double>(seconds) : probe_flops_per_s<float>(seconds);
  PeakFlops p;
  MPI_Allreduce(&mine, &p.flops_per_s, 1, MPI_DOUBLE, MPI_SUM, world);
  int ranks = 1;
  MPI_Comm_size(world, &ranks);
  char b[200];
  std::snprintf(b, sizeof b, "measured: %d rank%s at once, %s matmul %s (%s kernel)", ranks, ranks == 1 ? "" : "s",
                dtype == "fp64" ? "fp64" : "fp32", kProbeShape, kernels::cpu::matmul_isa_name(kernels::cpu::matmul_isa()));
  p.source = b;
  return p;
}

PeakFlops catalogue_gpu_peak(MPI_Comm world) {
  const std::string name = device::cuda_current_device_name();
  const planner::GpuPerf* gpu = planner::gpu_for_device_name(name);
  // Every rank's own device: a job whose GPUs are not all catalogued gets no peak (no MFU), not a guess.
  const int mine_known = gpu ? 1 : 0;
  int all_known = 0, ranks = 1;
  MPI_Allreduce(&mine_known, &all_known, 1, MPI_INT, MPI_MIN, world);
  MPI_Comm_size(world, &ranks);
  const double mine = gpu ? gpu->bf16_tflops * 1e12 : 0.0;
  PeakFlops p;
  MPI_Allreduce(&mine, &p.flops_per_s, 1, MPI_DOUBLE, MPI_SUM, world);
  char b[300];
  if (!all_known) {
    p.flops_per_s = 0;
    std::snprintf(b, sizeof b, "not known: %s%s%s is not in meshrun's GPU catalogue (planner/src/catalogue.cpp), so "
                  "MFU is not reported", name.empty() ? "the device" : "'", name.c_str(), name.empty() ? "" : "'");
  } else {
    std::snprintf(b, sizeof b, "catalogue: %s, %.0f TFLOP/s dense bf16 per GPU (data sheet) x %d GPU%s; rank 0's "
                  "device '%s'", gpu->name.c_str(), gpu->bf16_tflops, ranks, ranks == 1 ? "" : "s", name.c_str());
  }
  p.source = b;
  return p;
}

}  // namespace meshrun::train::cli
