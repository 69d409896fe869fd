// Combines of a context-parallel (CP) replay's unit states into results,
// and the per-rank partials the audit compares an engine's own against
// (docs/NUMERICS.md, "Context parallelism").
//
//  - Deterministic: every query's unit states merged in P's tree over the
//    unit indices (core/attention/merge_tree.h), then FinishReplayState --
//    exactly P's arithmetic, so the result equals the single-rank replay
//    bit for bit, for every world size, strategy and sharding.
//  - Engine order: the order the engine's own design combines in. Ring:
//    the owner rank's single online softmax, folding units in the order the
//    ring hands them to it (chunk by chunk, round by round). Partials: each
//    rank folds its own units in ascending order into its partial, then the
//    W partials are merged at once with MergeStates in rank order (the
//    combine of vLLM's decode context parallelism).
//  - Reference rank partials: R's unit states of one rank's units folded in
//    ascending order in fp64 (MergeIntoReference): what an exact engine's
//    partial for that rank is.
//  - Engine partials merged: the engine's own per-rank partials merged by
//    the replay's fp32 routine, then sinks and the final rounding: what the
//    engine's combine step should have produced from them.
//
// Partials are in value space (V scale applied), LSE over the rank's keys
// only (natural log, no sinks); a query that sees none of a rank's keys has
// out 0 and lse -inf. Results are [B, Sq, Hq, D] out and [B, Sq, Hq] lse.
// Pure functions (up to `threads` threads); thread-safe.
#ifndef ATTNAUDIT_CORE_CP_REPLAY_COMBINE_H_
#define ATTNAUDIT_CORE_CP_REPLAY_COMBINE_H_

#include <cstdint>
#include <vector>

#include "core/attention/attention.h"
#include "core/attention/unit_states.h"
#include "core/cp/schedule/schedule.h"
#include "core/snapshot/snapshot.h"
#include "core/tensor/tensor.h"

namespace attnaudit {

struct CpCombined {
  std::vector<double> out;  // rounded to the output dtype
  std::vector<double> lse;  // fp32 values, the LSE the engine declared
};

CpCombined CombineDeterministic(const PreparedAttention& prepared,
                                const UnitStates& states, int threads);

CpCombined CombineEngineOrder(const PreparedAttention& prepared,
                              const CpSchedule& schedule,
                              const UnitStates& states, int threads);

struct CpRankPartial {
  std::vector<double> out;    // [B, Sq, Hq, D], fp64, V scale applied
  std::vector<double> lse;    // [B, Sq, Hq], -inf where the rank has no key
  int64_t max_units = 0;      // most units merged for one query
  int64_t max_tokens = 0;     // the rank's longest shard (local length)
  int64_t empty_queries = 0;  // (b, sq, h) with no visible key of the rank
};

// `states` must hold R's unit states (has_reference).
CpRankPartial ReferenceRankPartial(const PreparedAttention& prepared,
                                   const CpShards& shards,
                                   const UnitStates& states, int64_t rank,
                                   int threads);

// rank_out [W, B, Sq, Hq, D] and rank_lse [W, B, Sq, Hq] as the snapshot
// carries them (any floating dtype; LSE in `base`, converted at the edge).
CpCombined MergeEnginePartials(const PreparedAttention& prepared,
                               const Tensor& rank_out, const Tensor& rank_lse,
                               LseBase base, int threads);

}  // namespace attnaudit

#endif  // ATTNAUDIT_CORE_CP_REPLAY_COMBINE_H_
