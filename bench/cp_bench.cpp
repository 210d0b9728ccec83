// Context-parallel load balance (a benchmark, not a test).
//
//   mpirun -np CP meshrun-bench-cp TEMPLATE.toml [--seq 2048,4096,8192] [--comm ring|allgather] [--set k=v ...]
//
// Trains the template as tp = pp = dp = 1, cp = the MPI world size, one micro-batch of one sequence per
// step, 2 steps (the first a warm-up), at each sequence length. Per CP rank it prints the measured time in
// attention (forward + backward, K/V communication included) and the visible (query, key) pairs the
// runtime counted — equal across ranks by construction of the zigzag split — beside the max/min work
// ratio a contiguous split (rank r holds [r·S/cp, (r+1)·S/cp)) would have.
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include "meshrun/config.hpp"
#include "meshrun/train/comm_names.hpp"
#include "meshrun/train/parallel/context_parallel.hpp"
#include "meshrun/train/data/data.hpp"
#include "meshrun/train/run/trainer.hpp"
#include "meshrun/comm/mpi.hpp"

using meshrun::comm::make_mpi_groups;

using namespace meshrun;
using namespace meshrun::train;

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  if (argc < 2) {
    if (rank == 0) std::fprintf(stderr, "usage: mpirun -np CP meshrun-bench-cp TEMPLATE.toml [--seq 2048,4096] [--comm ring|allgather]\n");
    MPI_Finalize();
    return 2;
  }
  Config config = load_template(argv[1]);
  for (const char* set : {"parallel.tp=1", "parallel.pp=1", "parallel.dp=1", "parallel.zero_stage=0",
                          "parallel.virtual_stages=1", "training.global_batch_size=1", "training.micro_batch_size=1"})
    apply_set(config, set);
  std::vector<int> seqs{2048, 4096, 8192};
  for (int i = 2; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--seq") && i + 1 < argc) {
      seqs.clear();
      std::stringstream ss(argv[++i]);
      for (std::string x; std::getline(ss, x, ',');) seqs.push_back(std::stoi(x));
    } else if (!std::strcmp(argv[i], "--comm") && i + 1 < argc) {
      apply_set(config, std::string("parallel.cp_comm=") + argv[++i]);
    } else if (!std::strcmp(argv[i], "--set") && i + 1 < argc) {
      apply_set(config, argv[++i]);
    }
  }
  JobConfig cfg = config.job;
  if (rank == 0 && !std::filesystem::exists(cfg.data.path) && !cfg.data.text.empty()) {
    std::filesystem::create_directories(std::filesystem::path(cfg.data.path).parent_path());
    tokenize_bytes({cfg.data.text}, cfg.data.path, cfg.data.token_dtype);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank == 0)
    std::printf("context parallelism, %s: cp=%d, %s attention, %d layers, one sequence per step, step 2 measured\n",
                argv[1], world, cfg.parallel.cp_comm.c_str(), cfg.model.layers);
  for (int S : seqs) {
    cfg.training.seq_len = S;
    Layout layout;
    layout.cp = world;
    const RankGrid grid(layout);
    Groups groups = make_mpi_groups(MPI_COMM_WORLD, grid);
    const TokenFile file(cfg.data.path, cfg.data.token_dtype, cfg.model.vocab, S, 1);
    const BatchSchedule data(file, S, 1, cfg.data.shuffle, cfg.training.seed);
    Trainer<float> trainer(cfg, grid, rank, groups);
    trainer.init_params();
    trainer.step(0, data);
    const double s0 = trainer.attention_seconds();
    const std::int64_t p0 = trainer.attention_pairs();
    MPI_Barrier(MPI_COMM_WORLD);
    const StepStats st = trainer.step(1, data);
    double secs = trainer.attention_seconds() - s0;
    std::int64_t pairs = trainer.attention_pairs() - p0;
    std::vector<double> all_s(world);
    std::vector<std::int64_t> all_p(world);
    MPI_Gather(&secs, 1, MPI_DOUBLE, all_s.data(), 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
    MPI_Gather(&pairs, 1, MPI_INT64_T, all_p.data(), 1, MPI_INT64_T, 0, MPI_COMM_WORLD);
    if (rank != 0) continue;
    const auto naive = causal_pairs_per_rank(S, world, false);
    std::printf("seq %6d | step %7.1f ms | attention ms per rank:", S, st.ms);
    for (double x : all_s) std::printf(" %7.1f", x * 1000);
    std::printf(" (max/min %.2f) | pairs per rank equal: %s | contiguous split work max/min %.1f\n",
                *std::max_element(all_s.begin(), all_s.end()) / *std::min_element(all_s.begin(), all_s.end()),
                std::all_of(all_p.begin(), all_p.end(), [&](std::int64_t x) { return x == all_p[0]; }) ? "yes" : "NO",
                double(*std::max_element(naive.begin(), naive.end())) / double(*std::min_element(naive.begin(), naive.end())));
  }
  MPI_Finalize();
  return 0;
}
