// Context-parallel (CP) shards and the replay schedule: which tokens each
// rank holds, how a rank's shard is cut into chunks, and what every rank
// does at every step of a `ring` or a `partials` replay
// (docs/NUMERICS.md, "Context parallelism"; docs/ARCHITECTURE.md, "CP
// replay").
//
// Shards. A rank's shard of row b is the row's units (core/attention/
// units.h) whose rank is that rank, in ascending unit order; its local
// length is their token count. Unequal and empty shards, and rows shorter
// than the world size, are normal. A shard is cut into chunks: consecutive
// units of at most page_size tokens together (a unit is never split, and
// no unit is longer than a page), so a chunk is one TokenRun
// (core/attention/unit_states.h) for the unit kernel.
//
// Ring. Rows are replayed in passes (consecutive rows whose step message
// fits the message budget). A pass runs C x W steps, C = the most chunks of
// any (row of the pass, rank): every rank runs the same number of steps,
// sized by the longest shard. Step s of a pass is chunk c = s / W, round
// r = s % W (chunk-major, round-minor). In round r rank k holds chunk c of
// the shard of rank (k - r) mod W -- the SOURCE rank, whose shard length
// masks the step (a chunk past a short shard is empty). Round 0 fills the
// slot from the rank's own shard; rounds 0 .. W-2 send the held chunk to
// rank k + 1, which holds it in the next round; round W-1 sends nothing.
// Slots are keyed on a global step counter (across passes): step s uses
// slot s % 2 and receives into slot (s + 1) % 2, so any W works, odd W
// included (the step after a last round is a local fill, which no sender
// writes). A slot is granted back to the sender (a credit) only after its
// last read: after step s the rank grants slot s % 2 for step s + 2 when
// that step receives.
// Work: the (row, KV head) items with (b * Hkv + g) % W == k belong to rank
// k, which computes, at every step, the unit states of the held chunk for
// its items.
//
// Partials. One round: every rank reads its own shard, chunk by chunk, and
// computes its units' states for every (row, KV head); nothing moves
// between ranks until the partials are gathered (core/cp/replay).
//
// Pure values and functions: no threads, no transport, no I/O. Safe to
// share between threads once built.
#ifndef ATTNAUDIT_CORE_CP_SCHEDULE_SCHEDULE_H_
#define ATTNAUDIT_CORE_CP_SCHEDULE_SCHEDULE_H_

#include <cstdint>
#include <vector>

#include "core/attention/units.h"

namespace attnaudit {

// Units [unit_begin, unit_end) of CpShards::rank_units[b] (one rank's
// shard), `tokens` tokens in all (<= page_size).
struct CpChunk {
  int32_t unit_begin = 0;
  int32_t unit_end = 0;
  int32_t tokens = 0;
};

struct CpShards {
  int64_t world = 1;
  int64_t page_size = 1;
  // [B][units of the row]: the row's unit indices grouped by rank (rank 0
  // first), ascending within a rank; rank k's are
  // [unit_begin[b][k], unit_begin[b][k + 1]).
  std::vector<std::vector<int32_t>> rank_units;
  std::vector<std::vector<int32_t>> unit_begin;  // [B][W + 1]
  std::vector<std::vector<int64_t>> tokens;      // [B][W] local lengths
  // [B][...] every rank's chunks, grouped by rank like rank_units; rank k's
  // are [chunk_begin[b][k], chunk_begin[b][k + 1]).
  std::vector<std::vector<CpChunk>> chunks;
  std::vector<std::vector<int32_t>> chunk_begin;  // [B][W + 1]

  int64_t batch() const { return static_cast<int64_t>(tokens.size()); }
  int64_t Chunks(int64_t b, int64_t rank) const {
    return chunk_begin[b][rank + 1] - chunk_begin[b][rank];
  }
  // Chunk c of rank's shard of row b; null past the shard's end.
  const CpChunk* Chunk(int64_t b, int64_t rank, int64_t c) const;
  // The unit indices of a chunk of row b.
  const int32_t* ChunkUnits(int64_t b, const CpChunk& chunk) const {
    return rank_units[b].data() + chunk.unit_begin;
  }
};

// Groups each row's units (PreparedAttention::units) by rank and cuts the
// shards into chunks. world >= 1; every unit's rank must lie in
// [0, world) and its count in [1, page_size] (true of PlanUnits' output
// for a validated snapshot).
CpShards PlanShards(const std::vector<std::vector<KvUnit>>& units,
                    int64_t world, int64_t page_size);

enum class CpReplayStrategy : int { kRing = 0, kPartials = 1 };

// "ring" / "partials".
const char* CpReplayStrategyName(CpReplayStrategy strategy);

// Rows [row_begin, row_end) replayed together, `chunks` chunk steps of
// `rounds` rounds each, from global step first_step on.
struct CpPass {
  int64_t row_begin = 0;
  int64_t row_end = 0;
  int64_t chunks = 0;
  int64_t first_step = 0;
};

struct CpStep {
  int64_t pass = 0;
  int64_t chunk = 0;
  int64_t round = 0;
};

class CpSchedule {
 public:
  // token_bytes: what one token costs in a step message (its K and V rows
  // and position); message_budget: the most bytes one step's message may
  // hold (rows are grouped into passes under it; a row whose chunk alone
  // is larger gets a pass of its own). kv_heads: Hkv, for the work items.
  CpSchedule(const CpShards& shards, CpReplayStrategy strategy,
             int64_t kv_heads, int64_t token_bytes, int64_t message_budget);

  CpReplayStrategy strategy() const { return strategy_; }
  const CpShards& shards() const { return *shards_; }
  int64_t world() const { return shards_->world; }
  int64_t kv_heads() const { return kv_heads_; }
  int64_t rounds() const { return rounds_; }
  int64_t steps() const { return steps_; }
  const std::vector<CpPass>& passes() const { return passes_; }
  // Upper bound of a step message's payload over every pass (the
  // transport's slot size): rows of a pass x page_size x token_bytes.
  int64_t max_message_bytes() const { return max_message_bytes_; }

  CpStep StepAt(int64_t step) const;
  // The rank whose shard rank `rank` holds in `round`: (rank - round) mod W.
  int64_t SourceRank(int64_t rank, int64_t round) const;
  static int64_t Slot(int64_t step) { return step % 2; }
  // Whether the slot of `step` is filled by a receive (round > 0), or by
  // the rank itself from its own shard (round 0).
  bool Receives(int64_t step) const;
  // Whether the chunk held at `step` is sent on to rank + 1 (for step + 1).
  bool Sends(int64_t step) const;
  // Whether, after `step`, the rank grants its slot Slot(step) to the
  // previous rank for step + 2 (that step receives). Before step 0 a rank
  // grants the steps in {0, 1} that receive.
  bool GrantsAfter(int64_t step) const;
  // The rank computing the states of KV head g of row b: ring
  // (b * Hkv + g) mod W; partials: every rank computes its own units, so
  // this is only meaningful for the ring.
  int64_t ItemOwner(int64_t b, int64_t g) const;

  // Visits the units of row b in the order the ring's owner rank of KV
  // head g folds them (the chunks it receives, round by round): the ring's
  // engine order. fn(unit index).
  template <typename Fn>
  void ForEachUnitInRingOrder(int64_t b, int64_t g, Fn&& fn) const;

 private:
  const CpShards* shards_;
  CpReplayStrategy strategy_;
  int64_t kv_heads_;
  int64_t rounds_;
  int64_t steps_ = 0;
  int64_t max_message_bytes_ = 0;
  std::vector<CpPass> passes_;
  std::vector<int64_t> pass_of_row_;
};

template <typename Fn>
void CpSchedule::ForEachUnitInRingOrder(int64_t b, int64_t g, Fn&& fn) const {
  const int64_t owner = ItemOwner(b, g);
  const CpPass& pass = passes_[pass_of_row_[b]];
  for (int64_t c = 0; c < pass.chunks; ++c) {
    for (int64_t r = 0; r < world(); ++r) {
      const CpChunk* chunk = shards_->Chunk(b, SourceRank(owner, r), c);
      if (chunk == nullptr) continue;
      const int32_t* units = shards_->ChunkUnits(b, *chunk);
      for (int32_t i = 0; i < chunk->unit_end - chunk->unit_begin; ++i) {
        fn(units[i]);
      }
    }
  }
}

}  // namespace attnaudit

#endif  // ATTNAUDIT_CORE_CP_SCHEDULE_SCHEDULE_H_
