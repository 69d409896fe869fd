// Shards and the ring schedule (core/cp/schedule) against independent
// statements of what they must be: the local-length formulas engines use
// (vLLM's for token interleaving with any interleave size, the page
// formula for page interleaving), every (source rank, chunk) held exactly
// once per rank, masks by the source rank's shard, and the slot protocol
// simulated step by step (no slot is overwritten before its last read, for
// odd W too).
#include "core/cp/schedule/schedule.h"

#include <algorithm>
#include <array>
#include <map>
#include <set>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace attnaudit {
namespace {

// Units of one row of L tokens at positions 0..L-1 with page size P under
// token interleaving (I, W): per block, runs of tokens with one owner.
std::vector<KvUnit> TokenUnits(int64_t L, int64_t P, int64_t I, int64_t W) {
  std::vector<KvUnit> out;
  for (int64_t t = 0; t < L; ++t) {
    const int32_t rank = static_cast<int32_t>((t / I) % W);
    const int32_t block = static_cast<int32_t>(t / P);
    if (out.empty() || out.back().block != block || out.back().rank != rank) {
      out.push_back({block, static_cast<int32_t>(t % P), 0, rank});
    }
    ++out.back().count;
  }
  return out;
}

std::vector<KvUnit> PageUnits(int64_t L, int64_t P, int64_t W) {
  std::vector<KvUnit> out;
  for (int64_t blk = 0; blk * P < L; ++blk) {
    out.push_back({static_cast<int32_t>(blk), 0,
                   static_cast<int32_t>(std::min(P, L - blk * P)),
                   static_cast<int32_t>(blk % W)});
  }
  return out;
}

// vLLM's local sequence length of rank r (decode context parallelism).
int64_t VllmLocalLen(int64_t x, int64_t I, int64_t W, int64_t r) {
  const int64_t base = x / I / W * I;
  const int64_t remainder = x - base * W;
  return base + std::clamp<int64_t>(remainder - r * I, 0, I);
}

// Page interleaving: full super-pages plus the rank's part of the rest.
int64_t PageLocalLen(int64_t x, int64_t P, int64_t W, int64_t r) {
  const int64_t super = W * P;
  return x / super * P + std::clamp<int64_t>(x % super - r * P, 0, P);
}

TEST(CpShardsTest, LocalLengthsMatchTheEngineFormulas) {
  for (int64_t W : {1, 2, 3, 4, 5, 8}) {
    for (int64_t P : {1, 4, 16}) {
      for (int64_t L : {1, 2, 3, 7, 16, 33, 100, 257}) {
        for (int64_t I : {int64_t{1}, int64_t{3}, P}) {
          const CpShards s = PlanShards({TokenUnits(L, P, I, W)}, W, P);
          for (int64_t r = 0; r < W; ++r) {
            EXPECT_EQ(s.tokens[0][r], VllmLocalLen(L, I, W, r))
                << "token W=" << W << " P=" << P << " L=" << L << " I=" << I
                << " r=" << r;
          }
        }
        const CpShards s = PlanShards({PageUnits(L, P, W)}, W, P);
        for (int64_t r = 0; r < W; ++r) {
          EXPECT_EQ(s.tokens[0][r], PageLocalLen(L, P, W, r))
              << "page W=" << W << " P=" << P << " L=" << L << " r=" << r;
        }
      }
    }
  }
}

TEST(CpShardsTest, ChunksCoverEachShardInOrderWithoutSplittingUnits) {
  for (int64_t W : {1, 3, 8}) {
    for (int64_t I : {1, 3, 5, 16}) {
      const int64_t P = 16;
      const std::vector<KvUnit> units = TokenUnits(203, P, I, W);
      const CpShards s = PlanShards({units}, W, P);
      for (int64_t r = 0; r < W; ++r) {
        std::vector<int32_t> seen;
        int64_t tokens = 0;
        for (int64_t c = 0; c < s.Chunks(0, r); ++c) {
          const CpChunk* chunk = s.Chunk(0, r, c);
          ASSERT_NE(chunk, nullptr);
          EXPECT_LE(chunk->tokens, P);
          EXPECT_GT(chunk->tokens, 0);
          int64_t sum = 0;
          for (int32_t i = chunk->unit_begin; i < chunk->unit_end; ++i) {
            const int32_t u = s.rank_units[0][i];
            EXPECT_EQ(units[u].rank, r);
            sum += units[u].count;
            seen.push_back(u);
          }
          EXPECT_EQ(sum, chunk->tokens);
          tokens += sum;
        }
        EXPECT_EQ(s.Chunk(0, r, s.Chunks(0, r)), nullptr);
        EXPECT_EQ(tokens, s.tokens[0][r]);
        EXPECT_TRUE(std::is_sorted(seen.begin(), seen.end()));
        // All of the rank's units, each once.
        int64_t want = 0;
        for (const KvUnit& u : units) want += u.rank == r;
        EXPECT_EQ(static_cast<int64_t>(seen.size()), want);
      }
    }
  }
}

// Rows of different lengths: a short row leaves ranks empty.
std::vector<std::vector<KvUnit>> Rows(int64_t P, int64_t I, int64_t W) {
  return {TokenUnits(2, P, I, W), TokenUnits(45, P, I, W),
          TokenUnits(17, P, I, W), TokenUnits(1, P, I, W)};
}

TEST(CpScheduleTest, EveryRankHoldsEveryChunkOfEverySourceOnce) {
  for (int64_t W : {1, 2, 3, 4, 5, 8}) {
    const int64_t P = 4;
    const CpShards shards = PlanShards(Rows(P, 3, W), W, P);
    // Two rows per pass.
    const CpSchedule ring(shards, CpReplayStrategy::kRing, 2, 10, 2 * P * 10);
    EXPECT_EQ(ring.rounds(), W);
    EXPECT_EQ(ring.passes().size(), 2u);
    std::map<std::tuple<int64_t, int64_t, int64_t, int64_t>, int> held;
    for (int64_t s = 0; s < ring.steps(); ++s) {
      const CpStep step = ring.StepAt(s);
      const CpPass& pass = ring.passes()[step.pass];
      EXPECT_EQ(step.round, (s - pass.first_step) % W);
      for (int64_t k = 0; k < W; ++k) {
        const int64_t src = ring.SourceRank(k, step.round);
        EXPECT_EQ((src + step.round) % W, k);
        ++held[{step.pass, k, src, step.chunk}];
      }
    }
    for (size_t pi = 0; pi < ring.passes().size(); ++pi) {
      const CpPass& pass = ring.passes()[pi];
      // Sized by the longest shard of the pass: every rank, same steps.
      int64_t longest = 0;
      for (int64_t b = pass.row_begin; b < pass.row_end; ++b) {
        for (int64_t r = 0; r < W; ++r) {
          longest = std::max(longest, shards.Chunks(b, r));
        }
      }
      EXPECT_EQ(pass.chunks, longest);
      for (int64_t k = 0; k < W; ++k) {
        for (int64_t src = 0; src < W; ++src) {
          for (int64_t c = 0; c < pass.chunks; ++c) {
            EXPECT_EQ((held[{static_cast<int64_t>(pi), k, src, c}]), 1)
                << "W=" << W << " pass " << pi << " rank " << k << " src "
                << src << " chunk " << c;
          }
        }
      }
    }
  }
}

TEST(CpScheduleTest, RingOrderVisitsEveryUnitOnceStartingWithTheOwnShard) {
  for (int64_t W : {2, 3, 5}) {
    const int64_t P = 4;
    const std::vector<std::vector<KvUnit>> rows = Rows(P, 1, W);
    const CpShards shards = PlanShards(rows, W, P);
    const CpSchedule ring(shards, CpReplayStrategy::kRing, 3, 10, 1 << 20);
    for (int64_t b = 0; b < static_cast<int64_t>(rows.size()); ++b) {
      for (int64_t g = 0; g < 3; ++g) {
        std::vector<int32_t> order;
        ring.ForEachUnitInRingOrder(b, g,
                                    [&](int32_t u) { order.push_back(u); });
        std::vector<int32_t> sorted = order;
        std::sort(sorted.begin(), sorted.end());
        ASSERT_EQ(sorted.size(), rows[b].size());
        for (size_t i = 0; i < sorted.size(); ++i) {
          EXPECT_EQ(sorted[i], static_cast<int32_t>(i));
        }
        if (!order.empty() && shards.tokens[b][ring.ItemOwner(b, g)] > 0) {
          EXPECT_EQ(rows[b][order[0]].rank, ring.ItemOwner(b, g));
        }
      }
    }
  }
}

// Simulates the slots of every rank through the whole schedule, in
// lock-step: a step reads its slot (compute and forwarding send); a send
// writes the next rank's other slot and needs that rank's grant; a local
// fill writes the own slot. No write may hit a slot whose content has a
// read still to come, and every receive must find the right message.
TEST(CpScheduleTest, SlotsAreNeverOverwrittenBeforeTheirLastRead) {
  for (int64_t W : {1, 2, 3, 4, 5, 7, 8}) {
    const int64_t P = 4;
    const CpShards shards = PlanShards(Rows(P, 1, W), W, P);
    const CpSchedule ring(shards, CpReplayStrategy::kRing, 2, 10, 3 * P * 10);
    // content[k][slot]: the step whose data the slot holds (-1 none);
    // granted[k][slot]: the step the slot is granted for.
    std::vector<std::array<int64_t, 2>> content(W, {-1, -1});
    std::vector<std::array<int64_t, 2>> granted(W, {-1, -1});
    for (int64_t k = 0; k < W; ++k) {
      for (int64_t t = 0; t < 2; ++t) {
        if (ring.Receives(t)) granted[k][t % 2] = t;
      }
    }
    for (int64_t s = 0; s < ring.steps(); ++s) {
      const int64_t slot = CpSchedule::Slot(s);
      for (int64_t k = 0; k < W; ++k) {
        if (!ring.Receives(s)) {
          // A local fill: nobody may have a grant for this slot and step.
          EXPECT_LT(granted[k][slot], s) << "W=" << W << " step " << s;
          content[k][slot] = s;
        }
        EXPECT_EQ(content[k][slot], s)
            << "W=" << W << " rank " << k << " step " << s;
      }
      for (int64_t k = 0; k < W; ++k) {
        if (!ring.Sends(s)) continue;
        const int64_t next = (k + 1) % W;
        const int64_t to = CpSchedule::Slot(s + 1);
        ASSERT_EQ(granted[next][to], s + 1) << "W=" << W << " step " << s;
        // The slot's previous content was read at step s - 1 at the latest.
        EXPECT_LT(content[next][to], s);
        content[next][to] = s + 1;
      }
      for (int64_t k = 0; k < W; ++k) {
        if (ring.GrantsAfter(s)) granted[k][slot] = s + 2;
      }
    }
  }
}

TEST(CpScheduleTest, PartialsRunOneRoundAndNeverSend) {
  const int64_t P = 4;
  const CpShards shards = PlanShards(Rows(P, 3, 4), 4, P);
  const CpSchedule partials(shards, CpReplayStrategy::kPartials, 2, 10,
                            1 << 20);
  EXPECT_EQ(partials.rounds(), 1);
  int64_t longest = 0;
  for (int64_t b = 0; b < shards.batch(); ++b) {
    for (int64_t r = 0; r < 4; ++r) {
      longest = std::max(longest, shards.Chunks(b, r));
    }
  }
  EXPECT_EQ(partials.steps(), longest);
  for (int64_t s = 0; s < partials.steps(); ++s) {
    EXPECT_FALSE(partials.Sends(s));
    EXPECT_FALSE(partials.Receives(s));
    EXPECT_FALSE(partials.GrantsAfter(s));
  }
}

}  // namespace
}  // namespace attnaudit
