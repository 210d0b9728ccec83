// Benchmark (not a test): wall time of `search` for Llama 3 405B on 16,384 H100s (issue 7 target: < 2 s on
// the 2-core build machine), plus 8,192 GPUs, the 128K-token setting, 131,072 GPUs and 512 and 1,024 layers.
// Prints the top layouts and how many schedule tables and simulations each search took.
// Run: build/planner/meshrun-bench-planner [repeats]   (numbers recorded in docs/planner.md)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <iostream>

#include "../tests/planner/reference_models.hpp"
#include "meshrun/planner.hpp"

using namespace meshrun::planner;

int main(int argc, char** argv) {
  const int repeats = argc > 1 ? std::max(1, std::atoi(argv[1])) : 3;
  struct Case { const char* name; int gpus, cp, seq, batch, layers; } cases[] = {
      {"405B, 16,384 GPUs, seq 8,192", 16384, 1, 8192, 2048, 126},
      {"405B, 8,192 GPUs, seq 8,192", 8192, 1, 8192, 2048, 126},
      {"405B, 16,384 GPUs, seq 131,072", 16384, 16, 131072, 128, 126},
      {"405B, 131,072 GPUs, seq 8,192, 128M-token batch", 131072, 1, 8192, 16384, 126},
      {"405B with 512 layers, 16,384 GPUs, seq 8,192", 16384, 1, 8192, 2048, 512},
      {"405B with 1,024 layers (the limit), 16,384 GPUs, seq 8,192", 16384, 1, 8192, 2048, 1024},
  };
  for (const Case& c : cases) {
    auto job = testing::llama3_405b_job(c.gpus, 8, c.cp, 16, c.seq, c.batch);
    job.model.layers = c.layers;
    double best = 1e30, total = 0;
    SearchResult r;
    for (int i = 0; i < repeats; ++i) {
      auto t0 = std::chrono::steady_clock::now();
      r = search(job, 5);
      double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      best = std::min(best, s);
      total += s;
    }
    std::printf("%s: search best %.3f s, mean %.3f s over %d runs (%lld schedule tables, %lld simulations)\n",
                c.name, best, total / repeats, repeats, (long long)r.pipeline_tables, (long long)r.pipeline_simulations);
    print_search_table(std::cout, r);
    std::cout << "\n";
  }
}
