#include "meshrun/geometry.hpp"

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

std::optional<BatchGeometry> batch_geometry(const TrainingSpec& t, const Layout& l, std::string* error) {
  auto fail = [&](std::string msg) -> std::optional<BatchGeometry> {
    if (error) *error = std::move(msg);
    return std::nullopt;
  };
  const auto s = [](std::int64_t v) { return std::to_string(v); };
  if (t.global_batch_size < 1 || t.micro_batch_size < 1)
    return fail("training.global_batch_size and micro_batch_size must be positive; set both in [training]");
  if (t.seq_len < 1)
    return fail("training.seq_len=" + s(t.seq_len) + " must be positive; set the tokens per sequence");
  if (l.dp < 1 || l.cp < 1 || l.tp < 1) return fail("parallel.tp, cp and dp must be positive");
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
    return fail("training.global_batch_size=" + s(g.global_batch) + " is not divisible by dp·micro_batch_size = " +
                s(l.dp) + "·" + s(t.micro_batch_size) + " = " + s(per_step) +
                "; use a global batch that is a multiple of " + s(per_step));
  if (l.cp > 1 && g.seq_len % (2 * l.cp) != 0)
    return fail("training.seq_len=" + s(g.seq_len) + " is not divisible by 2·cp = " + s(2 * l.cp) +
                " (each context-parallel rank holds two of 2·cp equal chunks); use a multiple of " + s(2 * l.cp));
  g.sequences_per_dp_rank = g.global_batch / l.dp;
  g.microbatches = g.sequences_per_dp_rank / g.micro_batch_size;
  g.tokens_per_cp_rank = g.seq_len / l.cp;
  g.rows_per_microbatch = g.micro_batch_size * g.tokens_per_cp_rank;
  if (g.sequence_parallel && g.rows_per_microbatch % l.tp != 0)
    return fail("sequence parallelism needs micro_batch_size·seq_len/cp = " + s(g.rows_per_microbatch) +
                " divisible by tp=" + s(l.tp) + "; change seq_len or micro_batch_size");
  g.rows_per_sp_rank = g.sequence_parallel ? g.rows_per_microbatch / l.tp : g.rows_per_microbatch;
  return g;
}

}  // namespace meshrun
