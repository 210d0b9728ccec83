// The trainer's side of the "hf" load-balancing loss check (router_aux_check.py): one fp64 step of a small
// MoE model on one process, 2 micro-batches, 3 layers, with model.router_aux = "hf" (coefficient unset: the
// convention's default) and "meshrun". Writes every router's logits of the hf run (the forward of step 1
// depends only on the initialization, so both runs see the same logits) and both runs' aux_loss.
// usage: router_aux_dump OUT_FILE
#include <cstdio>
#include <filesystem>
#include <map>
#include <utility>
#include <vector>

#include "fixture.hpp"
#include "meshrun/train/comm_names.hpp"
#include "meshrun/train/data/data.hpp"
#include "meshrun/train/run/trainer.hpp"

using namespace meshrun;
using namespace meshrun::train;

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: router_aux_dump OUT_FILE\n");
    return 2;
  }
  const std::string dir = std::filesystem::temp_directory_path().string() + "/meshrun-router-aux";
  JobConfig cfg = test::small_config(test::make_token_file(dir, 64));
  cfg.model.layers = 3;
  cfg.model.experts = 4;
  cfg.model.top_k = 2;
  cfg.model.moe_ffn_hidden = 32;
  cfg.training.dtype = "fp64";
  cfg.training.micro_batch_size = 4;  // 8 sequences: 2 micro-batches
  const TokenFile file(cfg.data.path, cfg.data.token_dtype, cfg.model.vocab, cfg.training.seq_len, cfg.training.global_batch_size);
  const BatchSchedule sched(file, cfg.training.seq_len, cfg.training.global_batch_size, cfg.data.shuffle, cfg.training.seed);
  const RankGrid grid(Layout{});
  std::map<std::pair<int, int>, std::vector<double>> logits;  // (micro-batch, layer) -> [T, E]
  double aux[2] = {0, 0};
  for (int hf = 1; hf >= 0; --hf) {
    cfg.model.router_aux = hf ? "hf" : "meshrun";
    Groups g = make_local_groups();
    Trainer<double>::TestFaults observe;
    if (hf) observe.router_logits = [&](int layer, int mb, const std::vector<double>& l) { logits[{mb, layer}] = l; };
    Trainer<double> t(cfg, grid, 0, g, observe);
    t.init_params();
    aux[hf] = t.step(0, sched).aux_loss;
  }
  std::FILE* f = std::fopen(argv[1], "w");
  if (!f) return 1;
  std::fprintf(f, "experts %d top_k %d layers %d microbatches %zu tokens %d\n", cfg.model.experts, cfg.model.top_k,
               cfg.model.layers, logits.size() / cfg.model.layers, cfg.training.micro_batch_size * cfg.training.seq_len);
  std::fprintf(f, "aux_hf %.17g\naux_meshrun %.17g\n", aux[1], aux[0]);
  for (const auto& [key, v] : logits) {
    std::fprintf(f, "logits %d %d", key.first, key.second);
    for (double x : v) std::fprintf(f, " %.17g", x);
    std::fprintf(f, "\n");
  }
  std::fclose(f);
  std::filesystem::remove(cfg.data.path);
  return 0;
}
