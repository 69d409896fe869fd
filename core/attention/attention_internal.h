// Between attention.cc (work items, results, orchestration) and
// attention_pass.cc (the per-target fused R + P kernel). Not a public API.
#ifndef ATTNAUDIT_CORE_ATTENTION_ATTENTION_INTERNAL_H_
#define ATTNAUDIT_CORE_ATTENTION_ATTENTION_INTERNAL_H_

#include <atomic>
#include <cstdint>
#include <vector>

#include "core/attention/attention.h"
#include "core/attention/merge_step.h"
#include "core/attention/merge_tree.h"
#include "core/attention/prefetch_cursor.h"
#include "core/attention/unit_states.h"

namespace attnaudit {
namespace attention_internal {

// What one call of ComputeAttention shares with its work items.
struct PassContext {
  const PreparedAttention& p;
  AttentionResults* results;  // null for ComputeRunStates
  bool reference;             // run R's online softmax into the scratch
  bool replay;                // compute P's unit states
  bool fold_replay;           // merge them in the scratch's merge trees
  UnitStates* unit_states;    // store unit states here when not null
  // Set by any work item that widened a non-finite K or V value; the
  // caller then locates it (the message must not depend on scheduling).
  std::atomic<bool>* kv_non_finite;
  // [B][Sq]: the keys each query sees, summed over the row's blocks by the
  // row's item with g0 == 0 (so no two threads write one count); null when
  // not counted.
  int64_t* visible_keys = nullptr;
};

// One merge of a unit's state on its way up its row's merge tree (fp32)
// into a pending left node, decided before the unit's values are
// accumulated: merge_step's weights and cases (MergeInto's arithmetic), or
// zeros when both states are empty. (kCopy: no merge.)
struct FoldRow {
  enum Kind : uint8_t { kCopy, kMerge, kZero } kind = kCopy;
  bool use_acc = false;   // merge: the left node takes part
  bool use_next = false;  // merge: the carried state takes part
  merge_step::PairWeights w{};
};

// The merge of a state with lse `unit_lse` into a left node (`started`,
// lse `acc_lse`) or none: the plan for its elements, and the merged lse in
// *new_lse.
inline FoldRow PlanFold(bool started, float acc_lse, float unit_lse,
                        float* new_lse) {
  FoldRow f;
  if (!started) {
    *new_lse = unit_lse;
    return f;
  }
  f.w = merge_step::Weights(acc_lse, unit_lse);
  *new_lse = merge_step::Lse(f.w);
  if (f.w.m == merge_step::F::NegInf()) {
    f.kind = FoldRow::kZero;
    return f;
  }
  f.kind = FoldRow::kMerge;
  f.use_acc = merge_step::UsesAcc(f.w);
  f.use_next = merge_step::UsesNext(f.w);
  return f;
}

// One pending left node a unit's state is merged with.
struct TreeStep {
  const float* left;
  FoldRow fold;
};

// Where a unit's state goes in its row's merge tree: merged with
// steps[0, n)'s left nodes in turn, then written to dest.
struct LeafPlan {
  const TreeStep* steps = nullptr;
  int n = 0;
  float* dest = nullptr;
};

// Per-thread buffers, grown on demand and reused across work items and
// audits (so a steady stream of audits allocates nothing here).
struct Scratch {
  // K/V of the heads of one sweep over a page, [head][slot][D]; f64 only
  // for f64 pages. At most sweep_heads heads per sweep, so the buffers stay
  // in L2 whatever the page size.
  std::vector<float> sweep_k32, sweep_v32;
  std::vector<double> sweep_k64, sweep_v64;
  int64_t sweep_heads = 1;
  std::vector<int64_t> positions;      // [P]
  std::vector<int32_t> visible;        // [Sq][P] indices of visible slots
  std::vector<int64_t> visible_count;  // [Sq]
  std::vector<double> q64;             // [rows][D]
  std::vector<float> q32;              // [rows][D]
  std::vector<double> ref_m, ref_l, ref_acc;       // [rows], [rows], [rows][D]
  std::vector<merge_tree::MergeTree> rep_tree;     // [rows] P's merge
  std::vector<LeafPlan> rep_plan;                  // [group]
  std::vector<TreeStep> rep_steps;                 // [group][tree levels]
  std::vector<const float*> rep_lefts;             // [group][tree levels]
  std::vector<float> rep_left_lse;                 // [group][tree levels]
  std::vector<float> rep_new_lse;                  // [group]
  std::vector<float> rep_discard;                  // [D] an empty unit's out
  std::vector<double> s64, e64;                    // [group][P]
  std::vector<float> s32, e32;                     // [group][P]
  std::vector<float> blk_sum, blk_lse;             // [group]
  std::vector<double> ref_unit_sum, ref_unit_lse;  // [group]
  std::vector<float*> keep32;   // [group] where P's unit states go
  std::vector<double*> keep64;  // [group] where R's unit states go
  PrefetchCursor prefetch;      // the next block's page, paced over this one's
};

// Runs the blocks of work item (b, KV heads [g0, g1)) through the fused
// pass, leaving each row's running R and P state in `scratch` (sized and
// loaded with the item's queries by attention.cc). Dispatches to the best
// SIMD target of this CPU; every target computes the same bits.
void RunPassItem(const PassContext& ctx, int64_t b, int64_t g0, int64_t g1,
                 Scratch& scratch);

// The states of `run`'s units for item (b, [g0, g1)) into ctx.unit_states.
void RunStates(const PassContext& ctx, const TokenRun& run, int64_t b,
               int64_t g0, int64_t g1, Scratch& scratch);

// Sizes the scratch for item (b, [g0, g1)) and loads its query rows,
// ordered (sq, query head within the range).
void PrepareItem(const PreparedAttention& p, int64_t b, int64_t g0, int64_t g1,
                 Scratch& sc);

// Folds KV head g of the first n slots of `page` whose positions are
// active (>= 0) into the rotation-boundary slack's maxima (K as the pass
// reads it, V as stored; PreparedAttention::slack_cells). The pass calls it
// on each marked cell's page just read; FinishRowSlack on what it reads
// itself, so both take the same keys.
void FoldSlackMaxima(const PreparedAttention& p, int64_t page, int64_t n,
                     const int64_t* positions, int64_t g, AbsMaxima* key,
                     AbsMaxima* value);

// Whether key position `key_pos` is visible to a query at `query_pos`.
inline bool Visible(const PreparedAttention& p, int64_t key_pos,
                    int64_t query_pos) {
  return KeyVisible(p, key_pos, query_pos);
}

}  // namespace attention_internal
}  // namespace attnaudit

#endif  // ATTNAUDIT_CORE_ATTENTION_ATTENTION_INTERNAL_H_
