// Batch geometry: how one optimizer step's global batch is cut over the layout, computed once here and
// read by mesh's validation, the planner, the trainer and its data reader.
//
// Data-parallel rank d takes sequences [d·B/DP, (d+1)·B/DP) of the step's B; they run as
// micro-batches of `micro_batch_size` sequences, in order. Context-parallel ranks share sequences (they
// split positions, not samples): with CP > 1 a sequence of S tokens is cut into 2·CP chunks and CP rank
// r holds chunks r and 2·CP−1−r (zigzag, so causal attention work is equal across ranks). Sequence
// parallelism splits a micro-batch's rows (sequences × local positions) over the TP ranks.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "meshrun/job.hpp"
#include "meshrun/layout.hpp"

namespace meshrun {

struct BatchGeometry {
  std::int64_t global_batch = 0;           // B, sequences per optimizer step
  std::int64_t seq_len = 0;                // S, tokens per sequence
  std::int64_t micro_batch_size = 0;       // sequences per micro-batch
  int dp = 1, cp = 1, tp = 1;
  bool sequence_parallel = false;

  std::int64_t sequences_per_dp_rank = 0;  // B / DP
  std::int64_t microbatches = 0;           // per step per DP rank: B / (DP · micro_batch_size)
  std::int64_t tokens_per_cp_rank = 0;     // S / CP
  std::int64_t rows_per_microbatch = 0;    // micro_batch_size · S / CP (rows one CP rank computes)
  std::int64_t rows_per_sp_rank = 0;       // rows_per_microbatch / TP with sequence parallelism, else all

  // Global sequence index (step·B + …) of sequence b of micro-batch j on data-parallel rank d.
  std::int64_t sequence_index(std::int64_t step, int dp_rank, std::int64_t microbatch, std::int64_t b) const {
    return step * global_batch + dp_rank * sequences_per_dp_rank + microbatch * micro_batch_size + b;
  }
  // Global positions, in order, of the tokens CP rank r holds of every sequence (tokens_per_cp_rank).
  std::vector<std::int32_t> cp_positions(int cp_rank) const;
};

// The geometry of a training setup on a layout, or nullopt with every problem appended to *problems, each
// "<problem>; <fix>" with the check id mesh's validation reports: batch-dp (non-positive sizes, B not a
// multiple of DP·micro_batch_size), seq-cp (S not a multiple of 2·CP when CP > 1), seq-sp (a CP rank's
// S/CP tokens not divisible by TP under sequence parallelism).
std::optional<BatchGeometry> batch_geometry(const TrainingSpec& training, const Layout& layout,
                                            std::vector<Problem>* problems);
// The same with the first problem's line in *error.
std::optional<BatchGeometry> batch_geometry(const TrainingSpec& training, const Layout& layout, std::string* error);

// Rows of one chunk of meshrun-train's fused LM head + cross-entropy: the logits of `rows` rows over a rank's
// `local_vocab` are computed (and recomputed in the backward) a chunk at a time, never stored for a whole
// micro-batch; a chunk of logits holds about as many values as the head's input (rows x hidden), at least one
// row, at most all of them. The trainer's buffers and the planner's memory estimate both use it.
std::int64_t head_chunk_rows(std::int64_t rows, std::int64_t hidden, std::int64_t local_vocab);

}  // namespace meshrun
