// The pipeline runtime: executes one pipeline rank's action list (meshrun/schedule.hpp) over the stages
// it holds. Nothing else decides the order of forwards, backwards and transfers. Sends are non-blocking
// and held by the sending slot until it is freed; a receive blocks, and the time spent blocked is what
// the runtime reports as waiting (the measured bubble). Transfers carry one fixed tag: a receive takes
// the next message from its peer, so the list must pair sends and receives per peer in order, which
// validate_schedule checks and every generated table does (NCCL matches by that order alone).
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include "meshrun/schedule.hpp"
#include "meshrun/train/comm_names.hpp"
#include "meshrun/train/parallel/stage.hpp"

namespace meshrun::train {

struct PipelineTiming {
  double wait_s = 0;                 // blocked in receives
  double f_s = 0, b_s = 0, w_s = 0;  // inside forwards, input backwards (and fused BW), weight backwards
  int f = 0, b = 0, w = 0;           // how many of each ran
  double total_s = 0;                // the whole action list
  // Per chunk (index = chunk; zero for chunks on other ranks): time in its F, B and W, for the simulator.
  std::vector<double> chunk_f_s, chunk_b_s, chunk_w_s;
  double compute_s() const { return f_s + b_s + w_s; }
};

class PipelineRuntime {
 public:
  // stages[c]: the stage of chunk c if this rank holds it, else nullptr. pp: the pipeline group, whose
  // rank r is pipeline rank r; prev/next: this rank's ring neighbours in it (from mesh's
  // RankGrid::ring_peers). placement: where the schedule puts the chunks; a transfer goes to the rank of
  // the chunk that consumes it, which must be prev or next, and a table whose peer says otherwise is
  // refused. Two consecutive chunks held here hand over in memory (Stage::take_input and
  // take_output_gradient), which the table lists no transfer for. load(mb, ids, targets): the
  // micro-batch's tokens (chunk 0 and last).
  using Loader = std::function<void(int mb, Buf ids, Buf targets)>;  // int32 backend buffers [n]
  // known_done, known_done_forward: sends_known_received of this rank's list (all of it; forward only).
  PipelineRuntime(std::vector<Stage*> stages, Comm& pp, int prev, int next, ChunkPlacement placement,
                  std::vector<int> known_done, std::vector<int> known_done_forward);

  // Runs `actions`; returns each micro-batch's Σ cross-entropy (non-zero on the last chunk's rank only).
  // forward_only (evaluation): only the F actions and activation transfers of `actions` run (every rank
  // drops the same gradient transfers, so the pairs stay matched), and a slot is freed once its activation
  // is sent or, on the last chunk, its loss computed: no gradient is computed or accumulated.
  std::vector<double> run(const std::vector<Action>& actions, int microbatches, const Loader& load,
                          double loss_scale, PipelineTiming* timing, bool forward_only = false);

 private:
  Stage& stage(int chunk, const Action& a);
  Stage* held(int chunk) const;  // nullptr when the chunk is on another rank or outside the model
  int peer(const Action& a, int consumer_chunk) const;
  std::vector<Stage*> stages_;
  Comm& pp_;
  int prev_, next_;
  ChunkPlacement placement_;
  std::vector<int> known_done_, known_done_forward_;
};

}  // namespace meshrun::train
