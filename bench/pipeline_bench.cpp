// Measured pipeline bubble against the schedule simulator's prediction (a benchmark, not a test).
//
//   mpirun -np PP meshrun-bench-pipeline TEMPLATE.toml [--steps N] [--set key=value ...]
//
// Trains the template as tp = 1, cp = 1, dp = 1, pp = the MPI world size, once per schedule (gpipe, 1f1b,
// interleaved with V = 2 where the layers allow, zb). For each, after one warm-up step, every rank
// records per step the time of its whole action list and the time inside its F, B and W (per chunk);
// each step is started by a barrier, so the makespan is the slowest rank's action list. Printed per
// schedule, averaged over the measured steps:
//   measured  = Σ_ranks (makespan − busy_r) / (pp · makespan), busy_r = the rank's F + B + W time,
//   simulated = the simulator's bubble_fraction for the same table with the measured per-chunk F, B, W
//               costs (per micro-batch) and free transfers (ranks share memory here),
//   unit      = the simulator with F = B = W = 1 per chunk (the textbook figure).
// The gap between measured and simulated is what the cost model leaves out: transfer latency, and on an
// oversubscribed machine (more ranks than cores) time a runnable rank waited for a core.
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "meshrun/config.hpp"
#include "meshrun/schedule.hpp"
#include "meshrun/train/comm_names.hpp"
#include "meshrun/train/data/data.hpp"
#include "meshrun/train/run/trainer.hpp"
#include "meshrun/comm/mpi.hpp"

using meshrun::comm::make_mpi_groups;

using namespace meshrun;
using namespace meshrun::train;

namespace {

struct Result {
  double measured = 0, simulated = 0, unit = 0, step_ms = 0;
  int peak_live = 0;
};

Result run_schedule(JobConfig cfg, const std::string& schedule, int V, int steps, int rank, int world) {
  cfg.parallel.pipeline_schedule = schedule;
  Layout layout;
  layout.pp = world;
  layout.virtual_stages = V;
  const RankGrid grid(layout);
  Groups groups = make_mpi_groups(MPI_COMM_WORLD, grid);
  const TokenFile file(cfg.data.path, cfg.data.token_dtype, cfg.model.vocab, cfg.training.seq_len,
                       cfg.training.global_batch_size);
  const BatchSchedule data(file, cfg.training.seq_len, cfg.training.global_batch_size, cfg.data.shuffle,
                           cfg.training.seed);
  Trainer<float> trainer(cfg, grid, rank, groups);
  trainer.init_params();
  const int chunks = world * V;
  const int m = static_cast<int>(trainer.geometry().microbatches);
  Result r;
  std::vector<double> f(chunks, 0.0), b(chunks, 0.0), w(chunks, 0.0);
  double idle_sum = 0, span_sum = 0;
  for (int s = 0; s <= steps; ++s) {
    MPI_Barrier(MPI_COMM_WORLD);
    const StepStats st = trainer.step(s, data);
    if (s == 0) continue;  // warm-up
    const PipelineTiming& t = st.pipeline;
    double span = 0, busy = t.compute_s(), busy_sum = 0;
    MPI_Allreduce(&t.total_s, &span, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    MPI_Allreduce(&busy, &busy_sum, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    idle_sum += world * span - busy_sum;
    span_sum += world * span;
    std::vector<double> cf(t.chunk_f_s), cb(t.chunk_b_s), cw(t.chunk_w_s);
    MPI_Allreduce(MPI_IN_PLACE, cf.data(), chunks, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);  // each chunk on one rank
    MPI_Allreduce(MPI_IN_PLACE, cb.data(), chunks, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    MPI_Allreduce(MPI_IN_PLACE, cw.data(), chunks, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    for (int c = 0; c < chunks; ++c) {
      f[c] += cf[c] / (double(m) * steps);
      b[c] += cb[c] / (double(m) * steps);
      w[c] += cw[c] / (double(m) * steps);
    }
    r.step_ms += st.ms / steps;
  }
  r.measured = idle_sum / span_sum;
  ScheduleCosts costs;
  costs.f = f;
  costs.b = b;
  costs.w = w;
  const Timeline sim = simulate_schedule(trainer.schedule(), costs);
  r.simulated = sim.bubble_fraction;
  r.peak_live = sim.peak_live_microbatches;
  r.unit = simulate_schedule(trainer.schedule(), ScheduleCosts{}).bubble_fraction;
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  if (argc < 2) {
    if (rank == 0) std::fprintf(stderr, "usage: mpirun -np PP meshrun-bench-pipeline TEMPLATE.toml [--steps N] [--set k=v ...]\n");
    MPI_Finalize();
    return 2;
  }
  int steps = 5;
  Config config = load_template(argv[1]);
  // A pipeline of pp ranks alone: no tensor or data parallelism in the measurement.
  for (const char* set : {"parallel.tp=1", "parallel.cp=1", "parallel.dp=1", "parallel.zero_stage=0",
                          "parallel.virtual_stages=1"})
    apply_set(config, set);
  for (int i = 2; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--steps") && i + 1 < argc) steps = std::max(1, std::atoi(argv[++i]));
    else if (!std::strcmp(argv[i], "--set") && i + 1 < argc) apply_set(config, argv[++i]);
  }
  JobConfig cfg = config.job;
  if (rank == 0 && !std::filesystem::exists(cfg.data.path) && !cfg.data.text.empty()) {
    std::filesystem::create_directories(std::filesystem::path(cfg.data.path).parent_path());
    tokenize_bytes({cfg.data.text}, cfg.data.path, cfg.data.token_dtype);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank == 0)
    std::printf("pipeline bubble, %s: %d layers, pp=%d, %d micro-batches of %d × %d tokens, %d steps after 1 warm-up\n",
                argv[1], cfg.model.layers, world, cfg.training.global_batch_size / cfg.training.micro_batch_size,
                cfg.training.micro_batch_size, cfg.training.seq_len, steps);
  if (rank == 0)
    std::printf("%-16s %9s %10s %10s %9s %6s\n", "schedule", "measured", "simulated", "unit-cost", "ms/step", "peak");
  struct Sched {
    const char* name;
    int V;
  };
  for (const Sched sc : {Sched{"gpipe", 1}, Sched{"1f1b", 1}, Sched{"interleaved", 2}, Sched{"zb", 1}}) {
    const int chunks = world * sc.V;
    const int micro = cfg.training.global_batch_size / cfg.training.micro_batch_size;
    if (!chunk_layers(cfg.model.layers, chunks) ||
        !check_schedule_spec(ScheduleSpec{*parse_pipeline_schedule(sc.name), world, sc.V, micro}).empty()) {
      if (rank == 0) std::printf("%-16s (skipped: %d layers or %d micro-batches do not fit)\n", sc.name, cfg.model.layers, micro);
      continue;
    }
    const Result r = run_schedule(cfg, sc.name, sc.V, steps, rank, world);
    const std::string label = sc.V > 1 ? std::string(sc.name) + " V=" + std::to_string(sc.V) : sc.name;
    if (rank == 0)
      std::printf("%-16s %9.3f %10.3f %10.3f %9.1f %6d\n", label.c_str(), r.measured, r.simulated, r.unit, r.step_ms,
                  r.peak_live);
  }
  MPI_Finalize();
  return 0;
}
