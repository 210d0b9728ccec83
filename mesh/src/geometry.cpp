#include "meshrun/geometry.hpp"

#include <algorithm>

namespace meshrun {

std::vector<std::int32_t> BatchGeometry::cp_positions(int cp_rank) const {
  std::vector<std::int32_t> pos;
  pos.reserve(static_cast<std::size_t>(tokens_per_cp_rank));
  if (cp == 1) {
    for (std::int64_t i = 0; i < seq_len; ++i) pos.push_back(static_cast<std::int32_t>(i));
    return pos;
  }
  const std::int64_t chunk = seq_len / (2 * cp);
  for (std::int64_t c : {std::int64_t(cp_rank), std::int64_t(2 * cp - 1 - cp_rank)})
    for (std::int64_t i = 0; i < chunk; ++i) pos.push_back(static_cast<std::int32_t>(c * chunk + i));
  return pos;
}

std::optional<BatchGeometry> batch_geometry(const TrainingSpec& t, const Layout& l, std::vector<Problem>* problems) {
  const auto s = [](std::int64_t v) { return std::to_string(v); };
  std::vector<Problem> found;
  if (t.global_batch_size < 1 || t.micro_batch_size < 1)
    found.push_back({"batch-dp", "training.global_batch_size and micro_batch_size must be positive; set both in [training]"});
  if (t.seq_len < 1)
    found.push_back({"seq-cp", "training.seq_len=" + s(t.seq_len) + " must be positive; set the tokens per sequence"});
  if (l.dp < 1 || l.cp < 1 || l.tp < 1) found.push_back({"batch-dp", "parallel.tp, cp and dp must be positive"});
  if (!found.empty()) {
    if (problems) problems->insert(problems->end(), found.begin(), found.end());
    return std::nullopt;
  }
  BatchGeometry g;
  g.global_batch = t.global_batch_size;
  g.seq_len = t.seq_len;
  g.micro_batch_size = t.micro_batch_size;
  g.dp = l.dp;
  g.cp = l.cp;
  g.tp = l.tp;
  g.sequence_parallel = l.sequence_parallel && l.tp > 1;
  const std::int64_t per_step = std::int64_t(l.dp) * t.micro_batch_size;
  if (g.global_batch % per_step != 0)
    found.push_back({"batch-dp", "training.global_batch_size=" + s(g.global_batch) +
                                     " is not divisible by dp·micro_batch_size = " + s(l.dp) + "·" +
                                     s(t.micro_batch_size) + " = " + s(per_step) +
                                     "; use a global batch that is a multiple of " + s(per_step)});
  if (l.cp > 1 && g.seq_len % (2 * l.cp) != 0)
    found.push_back({"seq-cp", "training.seq_len=" + s(g.seq_len) + " is not divisible by 2·cp = " + s(2 * l.cp) +
                                   "; the load-balanced causal split gives each CP rank two chunks: use a multiple of " +
                                   s(2 * l.cp)});
  if (g.sequence_parallel && (g.seq_len / l.cp) % l.tp != 0)
    found.push_back({"seq-sp", "sequence parallelism splits the " + s(g.seq_len / l.cp) +
                                   " tokens of each CP rank over tp=" + s(l.tp) +
                                   "; use a seq_len divisible by cp·tp = " + s(std::int64_t(l.cp) * l.tp)});
  if (!found.empty()) {
    if (problems) problems->insert(problems->end(), found.begin(), found.end());
    return std::nullopt;
  }
  g.sequences_per_dp_rank = g.global_batch / l.dp;
  g.microbatches = g.sequences_per_dp_rank / g.micro_batch_size;
  g.tokens_per_cp_rank = g.seq_len / l.cp;
  g.rows_per_microbatch = g.micro_batch_size * g.tokens_per_cp_rank;
  g.rows_per_sp_rank = g.sequence_parallel ? g.rows_per_microbatch / l.tp : g.rows_per_microbatch;
  return g;
}

std::optional<BatchGeometry> batch_geometry(const TrainingSpec& t, const Layout& l, std::string* error) {
  std::vector<Problem> problems;
  auto g = batch_geometry(t, l, &problems);
  if (!g && error) *error = problems.empty() ? "invalid batch geometry" : problems.front().message;
  return g;
}

std::int64_t head_chunk_rows(std::int64_t rows, std::int64_t hidden, std::int64_t local_vocab) {
  if (rows <= 0) return 0;
  if (local_vocab <= 0) return rows;
  const std::int64_t r = (rows * hidden + local_vocab - 1) / local_vocab;
  return std::clamp<std::int64_t>(r, 1, rows);
}

}  // namespace meshrun
