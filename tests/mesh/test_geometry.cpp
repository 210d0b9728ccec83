// Batch geometry: one definition of how a step's batch is cut, checked exhaustively on small shapes.
#include <catch2/catch.hpp>

#include <algorithm>
#include <set>
#include <string>

#include "meshrun/geometry.hpp"

using namespace meshrun;

namespace {
TrainingSpec training(int B, int mbs, int S) {
  TrainingSpec t;
  t.global_batch_size = B;
  t.micro_batch_size = mbs;
  t.seq_len = S;
  return t;
}
}  // namespace

TEST_CASE("every sequence of a step goes to exactly one (dp rank, micro-batch, slot)", "[geometry]") {
  for (int dp : {1, 2, 3, 4})
    for (int mbs : {1, 2, 4})
      for (int B : {12, 24}) {
        Layout l;
        l.dp = dp;
        std::string err;
        const auto g = batch_geometry(training(B, mbs, 16), l, &err);
        if (B % (dp * mbs) != 0) {
          CHECK_FALSE(g);
          CHECK(err.find("not divisible by dp·micro_batch_size") != std::string::npos);
          continue;
        }
        REQUIRE(g);
        CHECK(g->sequences_per_dp_rank == B / dp);
        CHECK(g->microbatches == B / (dp * mbs));
        for (int step : {0, 3}) {
          std::set<std::int64_t> seen;
          for (int d = 0; d < dp; ++d)
            for (std::int64_t j = 0; j < g->microbatches; ++j)
              for (std::int64_t b = 0; b < mbs; ++b) seen.insert(g->sequence_index(step, d, j, b));
          CHECK(seen.size() == std::size_t(B));
          CHECK(*seen.begin() == std::int64_t(step) * B);
          CHECK(*seen.rbegin() == std::int64_t(step + 1) * B - 1);
        }
      }
}

TEST_CASE("context-parallel ranks split positions zigzag, with equal causal work", "[geometry][cp]") {
  for (int cp : {1, 2, 4, 8}) {
    Layout l;
    l.cp = cp;
    std::string err;
    const auto g = batch_geometry(training(4, 1, 64), l, &err);
    REQUIRE(g);
    CHECK(g->tokens_per_cp_rank == 64 / cp);
    std::vector<int> all;
    std::set<long> work;  // Σ (position + 1): the keys a rank's queries attend under the causal mask
    for (int r = 0; r < cp; ++r) {
      const auto pos = g->cp_positions(r);
      CHECK(pos.size() == std::size_t(64 / cp));
      long w = 0;
      for (int p : pos) w += p + 1;
      work.insert(w);
      all.insert(all.end(), pos.begin(), pos.end());
    }
    std::sort(all.begin(), all.end());
    for (int i = 0; i < 64; ++i) CHECK(all[i] == i);
    CHECK(work.size() == 1);  // the same for every rank
  }
  Layout l;
  l.cp = 3;
  std::string err;
  CHECK_FALSE(batch_geometry(training(4, 1, 64), l, &err));
  CHECK(err.find("2·cp = 6") != std::string::npos);
}

TEST_CASE("sequence parallelism splits a micro-batch's rows over tp", "[geometry][sp]") {
  Layout l;
  l.tp = 4;
  l.sequence_parallel = true;
  std::string err;
  auto g = batch_geometry(training(8, 2, 8), l, &err);  // 16 rows over 4 ranks
  REQUIRE(g);
  CHECK(g->rows_per_microbatch == 16);
  CHECK(g->rows_per_sp_rank == 4);
  // Megatron's rule, per sequence: each CP rank's S/cp tokens split over tp (not just a micro-batch's rows).
  g = batch_geometry(training(8, 2, 6), l, &err);  // 12 rows would split, 6 tokens per sequence do not
  CHECK_FALSE(g);
  CHECK(err.find("over tp=4") != std::string::npos);
  std::vector<Problem> all;
  CHECK_FALSE(batch_geometry(training(7, 2, 6), l, &all));  // two problems at once, each with its check id
  REQUIRE(all.size() == 2);
  CHECK(all[0].check == "batch-dp");
  CHECK(all[1].check == "seq-sp");
  l.sequence_parallel = false;
  g = batch_geometry(training(8, 1, 6), l, &err);
  REQUIRE(g);
  CHECK(g->rows_per_sp_rank == 6);
  CHECK_FALSE(batch_geometry(training(0, 1, 6), l, &err));
  CHECK(err.find("must be positive") != std::string::npos);
}
