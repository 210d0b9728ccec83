// meshrun-bench-device: the figures of this machine that the planner's CPU model starts from (issue 30,
// docs/planner.md "Calibration"), printed as a calibration file for `meshrun plan --calibration`:
//   mpirun -np 2 build/bench/meshrun-bench-device > cpu.toml      [--cpus N] [--seconds S]
// Every rank measures at once (as meshrun-train's ranks run): meshrun-train's own MFU probe (its matmul
// kernel at 256 × 512 × 512, trainer/src/run/peak_probe.hpp) in fp32 and fp64, a streaming copy of 64 MiB, and with two or more ranks a
// ping-pong between ranks 0 and 1 (4 MiB messages for bandwidth, 8 bytes for latency) and meshrun-train's own
// all-reduce (comm/src/mpi.cpp: an all-to-all of blocks, an ordered sum, an all-gather) of 4 MiB of fp32
// over every rank, the rate its TP, CP and DP collectives move data at. Figures per CPU
// assume one rank per CPU: run it with at most as many ranks as the node has CPUs.
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "../trainer/src/run/peak_probe.hpp"  // the MFU probe: the rate the planner starts from is the same measurement
#include "meshrun/comm/mpi.hpp"
#include "meshrun/kernels/cpu.hpp"

namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

double copy_gbps(double seconds) {
  const std::size_t bytes = 64u << 20;
  std::vector<char> a(bytes, 1), b(bytes, 2);
  long copies = 0;
  const auto t0 = Clock::now();
  while (copies < 3 || since(t0) < seconds) {
    std::memcpy(b.data(), a.data(), bytes);
    a[copies % bytes] = b[(copies * 7) % bytes];  // keep the copies observable
    ++copies;
  }
  return 2.0 * double(bytes) * double(copies) / since(t0) / 1e9;  // read + write
}

// One-way time of a message of `bytes` between ranks 0 and 1 (half the round trip), best of `reps`.
double one_way_s(int rank, std::size_t bytes, int reps) {
  std::vector<char> buf(bytes, 3);
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    MPI_Barrier(MPI_COMM_WORLD);
    const auto t0 = Clock::now();
    if (rank == 0) {
      MPI_Send(buf.data(), int(bytes), MPI_BYTE, 1, 0, MPI_COMM_WORLD);
      MPI_Recv(buf.data(), int(bytes), MPI_BYTE, 1, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    } else if (rank == 1) {
      MPI_Recv(buf.data(), int(bytes), MPI_BYTE, 0, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
      MPI_Send(buf.data(), int(bytes), MPI_BYTE, 0, 0, MPI_COMM_WORLD);
    }
    best = std::min(best, since(t0) / 2);
  }
  return best;
}

// Bus bandwidth of meshrun's all-reduce over every rank, NCCL's definition (2·(n−1)/n of the buffer per
// second, what each rank's link carries in a ring): the median of `reps`. It includes what the trainer's
// collectives pay per call besides the transfer (their staging buffers are allocated per call).
double all_reduce_bus_gbps(std::size_t bytes, int reps) {
  meshrun::comm::MpiComm world(MPI_COMM_WORLD, false);
  std::vector<float> buf(bytes / sizeof(float), 1.0f);
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    MPI_Barrier(MPI_COMM_WORLD);
    const auto t0 = Clock::now();
    world.all_reduce(buf.data(), std::int64_t(buf.size()));
    t.push_back(since(t0));
    std::fill(buf.begin(), buf.end(), 1.0f);  // the sums stay finite
  }
  std::sort(t.begin(), t.end());
  const double n = world.size();
  return 2.0 * (n - 1) / n * double(bytes) / t[t.size() / 2] / 1e9;
}

long mem_total_kib() {
  std::ifstream f("/proc/meminfo");
  std::string key;
  long kib = 0;
  while (f >> key >> kib)
    if (key == "MemTotal:") return kib;
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  double seconds = 0.5;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if ((a == "--cpus" || a == "--seconds") && i + 1 < argc) {
      char* end = nullptr;
      const double v = std::strtod(argv[++i], &end);
      if (!end || *end || !(v > 0) || v > 1e6) {
        if (rank == 0) std::fprintf(stderr, "meshrun-bench-device: %s %s: expected a positive number\n", a.c_str(), argv[i]);
        MPI_Finalize();
        return 2;
      }
      (a == "--cpus" ? void(cpus = long(v)) : void(seconds = v));
    } else {
      if (rank == 0)
        std::fprintf(stderr, "meshrun-bench-device: unknown argument '%s'; usage: mpirun -np 2 meshrun-bench-device "
                             "[--cpus N] [--seconds S] > cpu.toml\n", a.c_str());
      MPI_Finalize();
      return 2;
    }
  }
  if (rank == 0 && size > cpus)
    std::fprintf(stderr, "meshrun-bench-device: warning: %d ranks on %ld CPUs share cores; the per-CPU figures are low\n",
                 size, cpus);
  struct Figures { double f32, f64, mem; } mine{}, sum{};
  MPI_Barrier(MPI_COMM_WORLD);
  using meshrun::train::cli::probe_flops_per_s;
  mine.f32 = probe_flops_per_s<float>(seconds) / 1e9;
  MPI_Barrier(MPI_COMM_WORLD);
  mine.f64 = probe_flops_per_s<double>(seconds) / 1e9;
  MPI_Barrier(MPI_COMM_WORLD);
  mine.mem = copy_gbps(seconds);
  MPI_Reduce(&mine, &sum, 3, MPI_DOUBLE, MPI_SUM, 0, MPI_COMM_WORLD);
  double link_gbps = 0, latency_s = 0, collective_gbps = 0;
  if (size >= 2) {
    const std::size_t big = 4u << 20;
    link_gbps = double(big) / one_way_s(rank, big, 20) / 1e9;
    latency_s = one_way_s(rank, 8, 200);
    collective_gbps = all_reduce_bus_gbps(big, 21);
  }
  if (rank == 0) {
    if (size < 2) {
      std::fprintf(stderr, "meshrun-bench-device: one rank measures no MPI link; run it as mpirun -np 2 meshrun-bench-device\n");
      MPI_Finalize();
      return 2;
    }
    std::printf("# meshrun planner calibration: this machine's figures, measured by meshrun-bench-device (%d ranks at once,\n"
                "# %.2f s per figure); constants not yet fitted: meshrun plan --calibrate RUN.jsonl ... --calibration THIS\n",
                size, seconds);
    std::printf("[planner]\ndevice = \"cpu\"\nnode_cpus = %ld\n", cpus);
    std::printf("gflops_per_cpu = %.4g         # fp32 matmul kernel (%s), %s (meshrun-train's MFU probe)\n",
                sum.f32 / size, meshrun::kernels::cpu::matmul_isa_name(meshrun::kernels::cpu::matmul_isa()),
                meshrun::train::cli::kProbeShape);
    std::printf("gflops_per_cpu_fp64 = %.4g\n", sum.f64 / size);
    std::printf("memory_gbps_per_cpu = %.4g    # 64 MiB memcpy, read + write\n", sum.mem / size);
    std::printf("link_gbps = %.4g              # MPI ping-pong of 4 MiB between ranks 0 and 1, one way\n", link_gbps);
    std::printf("collective_gbps = %.4g        # meshrun-train's all-reduce of 4 MiB fp32 over %d ranks, bus bandwidth\n",
                collective_gbps, size);
    std::printf("memory_gib = %.4g\n", double(mem_total_kib()) / (1 << 20));
    std::printf("collective_base_latency_s = %.3g  # MPI ping-pong of 8 bytes, one way (a starting point for the fit)\n",
                latency_s);
  }
  MPI_Finalize();
  return 0;
}
