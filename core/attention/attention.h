// R and P for one validated snapshot, computed in one fused pass over the
// KV pages (each K/V row is read and widened once, and shared by all query
// heads of its GQA group and all Sq queries).
//
// R, the reference: logical full-prefill attention over the logically
// gathered, visible keys, accumulated in fp64 (an fp64 online softmax
// across blocks, whose rescaling error is ~1e-16 relative), LSE in natural
// log of the scaled (and soft-capped) scores. R.out is NOT rounded.
// P, the replay: per unit (logical block) partial states in fp32 (out
// normalised within the unit, lse), merged in the tree over the unit
// indices (core/attention/merge_tree.h) with the shared merge step, sinks
// merged last, downcast once at the final write to the output dtype.
// Both report the LSE the way the engine declared it: over keys only, or
// including sinks when snapshot.engine_lse_includes_sinks.
//
// PreparedAttention owns the RoPE'd queries and, when the cache is pre-RoPE,
// a rotated fp32 copy of the referenced K pages; it borrows the snapshot
// (which must outlive it). Compute is thread-safe for concurrent calls on a
// const PreparedAttention.
#ifndef ATTNAUDIT_CORE_ATTENTION_ATTENTION_H_
#define ATTNAUDIT_CORE_ATTENTION_ATTENTION_H_

#include <atomic>
#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "core/attention/units.h"
#include "core/simd/abs_max.h"
#include "core/snapshot/snapshot.h"
#include "core/validate/validate.h"

namespace attnaudit {

struct PreparedAttention {
  const Snapshot* snapshot = nullptr;
  const ResolvedLayout* layout = nullptr;
  SnapshotDims dims;
  std::vector<double> q;  // [B,Sq,Hq,D] post-RoPE, as the engine's dtype
  std::vector<int64_t> query_positions;  // [B,Sq]
  // K source: the snapshot's pages, or `rotated_k` (f32 NHD) when the cache
  // was pre-RoPE.
  std::vector<float> rotated_k;
  const void* k_data = nullptr;
  DType k_dtype = DType::kInvalid;
  KvLayout k_layout = KvLayout::kNHD;
  const void* v_data = nullptr;
  DType v_dtype = DType::kInvalid;
  KvLayout v_layout = KvLayout::kNHD;
  std::vector<double> k_scale;  // [Hkv], 1 when absent or already applied
  std::vector<double> v_scale;  // [Hkv]
  double softmax_scale = 1;
  double softcap = 0;
  int64_t window = 0;             // 0: none
  bool window_inclusive = false;  // FlashAttention left window convention
  std::vector<double> sinks;      // [Hq] or empty
  bool lse_includes_sinks = false;
  DType output_dtype = DType::kF32;
  // When attnaudit rotated q or K itself (a pre-RoPE snapshot): a bound on
  // |our score - the engine's| that its own RoPE arithmetic may cause (its
  // libm, its inverse frequencies; docs/NUMERICS.md, "RoPE tables"), and
  // max |v| (V scale applied) over the referenced pages, through which a
  // score error moves the output. Both 0 for a post-RoPE snapshot.
  double rope_score_uncertainty = 0;
  // The same added over the rotary pairs in quadrature: its typical size,
  // for the statistical detector's noise.
  double rope_score_noise = 0;
  double value_max = 0;
  // Rotation-boundary ambiguity (a pre-RoPE snapshot whose engine declared
  // its arithmetic): a rotated element of q or K whose unrounded value lies
  // within two libms' cos/sin (and fp32 arithmetic order) of a rounding
  // boundary of the rotation dtype may be stored one ulp away by the engine
  // (RopeTable::RotationAmbiguity). Per (b, s, h) row [B * Sq * Hq]: a bound,
  // in nats, on how far such flips move any of the row's scores from ours;
  // empty when no element is ambiguous, and until FinishRowSlack (below)
  // has sized it after the pass. `row_value_max` [Hkv]: max |v| (V
  // scale applied) of each KV head's referenced keys, through which the
  // row's scores move its output (set with row_score_uncertainty).
  std::vector<double> row_score_uncertainty;
  std::vector<double> row_value_max;
  // [B * Sq * Hq] when row_score_uncertainty is set: 1 where the row's own
  // q has an ambiguous element (a shift of all its scores, which the
  // statistical detector cannot tell from a bias; it leaves these rows
  // out). A key's ambiguity moves one key's score of many and stays in.
  std::vector<uint8_t> row_query_ambiguous;
  // What the slack is made of, from PrepareAttention until FinishRowSlack:
  // `slack_q_gap` [B * Sq * Hq * D] each rotated q element's gap (0: clear;
  // empty when none is ambiguous), `slack_key_head_score` [Hkv] the most an
  // ambiguous key's score moves per KV head (empty when none is), and
  // `slack_cells` [B * Hkv] the (row, KV head) cells whose K and V maxima
  // the slack is sized with (empty when no element is ambiguous). The
  // maxima are taken by the fused pass as it reads the cells anyway: a
  // read of its own cost a pre-RoPE snapshot a fifth of its audit.
  std::vector<float> slack_q_gap;
  std::vector<double> slack_key_head_score;
  // [N * P * Hkv] (slot-major) each rotated key's own score move before the
  // scale (0: clear), when slack_key_head_score is set.
  std::vector<float> slack_key_score;
  std::vector<uint8_t> slack_cells;
  // What the report says of them: the ambiguous rotated elements of q and
  // of K, and the rows they widen.
  int64_t ambiguous_q_elements = 0;
  int64_t ambiguous_k_elements = 0;
  int64_t ambiguous_rows = 0;
  DType rotation_dtype = DType::kInvalid;
  // P's units (core/attention/units.h) per row, and for each logical block
  // the first of its units: block_unit_begin[b][blk] .. [blk + 1].
  std::vector<std::vector<KvUnit>> units;
  std::vector<std::vector<int32_t>> block_unit_begin;
};

// Whether a key at global position `key_pos` is visible to a query at
// `query_pos` (causal, and within the sliding window when there is one;
// docs/NUMERICS.md, "Snapshot semantics").
inline bool KeyVisible(const PreparedAttention& p, int64_t key_pos,
                       int64_t query_pos) {
  if (key_pos < 0 || key_pos > query_pos) return false;
  if (p.window <= 0) return true;
  const int64_t distance = query_pos - key_pos;
  return p.window_inclusive ? distance <= p.window : distance < p.window;
}

// Element offset of (page, slot, KV head, 0) in a page pool of `layout`.
inline int64_t KvSlotOffset(KvLayout layout, const SnapshotDims& d,
                            int64_t page, int64_t slot, int64_t head) {
  if (layout == KvLayout::kNHD) {
    return ((page * d.page_size + slot) * d.kv_heads + head) * d.head_dim;
  }
  return ((page * d.kv_heads + head) * d.page_size + slot) * d.head_dim;
}

// Applies RoPE (fp32, one cast after) and resolves scales and variants.
absl::StatusOr<PreparedAttention> PrepareAttention(const Snapshot& snapshot,
                                                   const ResolvedLayout& layout,
                                                   int threads);

struct AttentionResults {
  std::vector<double> reference_out;  // [B,Sq,Hq,D]
  std::vector<double> reference_lse;  // [B,Sq,Hq]
  std::vector<double> replay_out;     // rounded to the output dtype
  std::vector<double> replay_lse;     // fp32 values
  // [B][Sq][k] the logical block of each unit merged, ascending (a block
  // appears once per unit: once without CP). Cleared unless requested.
  std::vector<std::vector<std::vector<int32_t>>> merge_orders;
  int64_t max_merged_blocks = 0;  // units merged, the most of any query
  int64_t max_visible_keys = 0;
  // Some active K or V value read by the pass was not finite (the pass is
  // the audit's only read of the cache; ValidateSnapshot with
  // ValueScan::kAll locates the value for the error message).
  bool kv_non_finite = false;
  // [B * Hkv] when PreparedAttention::slack_cells is set: per marked cell
  // the largest finite |k| per dim (K scale not applied; the rotated pool
  // for a pre-RoPE cache) and |v| of the active keys of the row's blocks.
  // Empty when no cell is marked, or from a backend whose pass does not
  // take them (FinishRowSlack then reads them itself).
  std::vector<AbsMaxima> slack_key_maxima;
  std::vector<AbsMaxima> slack_value_maxima;
  double seconds = 0;
};

// Sizes the rotation-boundary rows' slack (row_score_uncertainty,
// row_value_max, row_query_ambiguous, ambiguous_rows) once the K and V
// maxima of PreparedAttention::slack_cells are known: those `results`
// carries, or else its own read of the cells (`threads` as ComputeAttention
// takes them). A no-op when no cell is marked. Call after the pass, before
// the verdict reads the rows.
void FinishRowSlack(const AttentionResults& results, int threads,
                    PreparedAttention* p);

// Which halves of the fused pass run; benchmarks time R and P apart. The
// skipped half's outputs stay zero.
enum class AttentionPasses { kBoth, kReferenceOnly, kReplayOnly };
struct UnitStates;  // core/attention/unit_states.h

struct AttentionRunOptions {
  int threads = 0;
  bool record_merge_orders = true;
  const std::atomic<bool>* cancelled = nullptr;
  AttentionPasses passes = AttentionPasses::kBoth;
  // When set, also every unit's P state (and R's, when its has_reference is
  // set on entry) for the CP replays and the diagnosis; sized here and
  // wholly written on success (states no query sees are empty). After an
  // error (a cancelled run) their content is unspecified.
  UnitStates* unit_states = nullptr;
};
absl::StatusOr<AttentionResults> ComputeAttention(
    const PreparedAttention& prepared, const AttentionRunOptions& options);

// The fields of AttentionResults that follow from the layout alone (no KV
// read): merge_orders (kept only when record_merge_orders),
// max_merged_blocks and max_visible_keys, exactly as ComputeAttention
// reports them. For backends whose pass runs elsewhere (kernels/).
void SummariseUnits(const PreparedAttention& prepared, bool record_merge_orders,
                    AttentionResults* results);

}  // namespace attnaudit

#endif  // ATTNAUDIT_CORE_ATTENTION_ATTENTION_H_
