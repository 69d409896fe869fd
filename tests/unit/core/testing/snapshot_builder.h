// The one test-only builder of decode snapshots in attnaudit's layout, used
// by every test of core/ (and the fingerprint fixture).
//
// Two ways in, one layout routine:
//   - LogicalCase + PagingOptions: a test states the *logical* truth (per
//     row, the K/V of its cached tokens in logical order with their global
//     positions, the queries, the attention variant) and how it is laid out
//     (page size, NHD/HND, page placement, spare pages, junk in unused
//     slots, engine page ids, CP sharding). The oracles (attention_oracle.h)
//     read the LogicalCase only, never the paged Snapshot, so they check the
//     library's gather independently.
//   - SnapshotSpec: a quick, valid snapshot from a handful of shape knobs
//     with deterministic uniform content, for tests that then corrupt it
//     field by field (the validation tests). It is turned into a LogicalCase
//     and PagingOptions and laid out by the same routine.
//
// Values in a LogicalCase are the values *as stored* (already representable
// in their dtype; fp8 entries are decoded fp8 values before the scale), so
// building a snapshot never rounds them; SnapshotSpec content is rounded to
// its dtypes when stored. Everything here is deterministic for a given seed,
// single-threaded, and reports misuse through gtest-free asserts
// (std::abort): those are bugs in the test.
#ifndef ATTNAUDIT_TESTS_UNIT_CORE_TESTING_SNAPSHOT_BUILDER_H_
#define ATTNAUDIT_TESTS_UNIT_CORE_TESTING_SNAPSHOT_BUILDER_H_

#include <cstdint>
#include <vector>

#include "core/rope/rope.h"
#include "core/snapshot/snapshot.h"
#include "core/tensor/dtype.h"
#include "core/tensor/tensor.h"

namespace attnaudit {
namespace testing {

// SplitMix64: a tiny, portable generator (the same stream on every
// platform and standard library, unlike std::normal_distribution).
class TestRng {
 public:
  explicit TestRng(uint64_t seed) : state_(seed) {}
  uint64_t Next();
  double Uniform(double lo, double hi);        // [lo, hi)
  int64_t UniformInt(int64_t lo, int64_t hi);  // [lo, hi]
  double Normal();                             // Box-Muller, mean 0, variance 1

 private:
  uint64_t state_;
};

// ---------------------------------------------------------------------------
// Tensors.

// A new tensor of `dtype` holding `values` (one per element, row-major; the
// conversion is the library's StoreFromDouble, so values that are not
// representable are rounded).
Tensor MakeFloatTensor(DType dtype, std::vector<int64_t> shape,
                       const std::vector<double>& values);
// i32, i64 or bool (0/1) elements.
Tensor MakeIntTensor(DType dtype, std::vector<int64_t> shape,
                     const std::vector<int64_t>& values);
Tensor MakeBoolTensor(std::vector<int64_t> shape,
                      const std::vector<bool>& values);
// All elements of a floating tensor as doubles.
std::vector<double> ToDoubles(const Tensor& t);
// Element `flat` of an i32/i64/bool tensor.
void SetInt(Tensor* t, int64_t flat, int64_t value);
int64_t GetInt(const Tensor& t, int64_t flat);
// Element `flat` of a floating tensor (rounded to its dtype).
void SetFloat(Tensor* t, int64_t flat, double value);
// Every element of a floating tensor: deterministic values in [-1, 1).
void FillUniform(Tensor* t, uint64_t seed);

// `x` rounded to `dtype` (f64: unchanged), and the same for every value.
double RoundValue(double x, DType dtype);
void RoundTo(std::vector<double>* values, DType dtype);

inline int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// ---------------------------------------------------------------------------
// Logical case -> paged snapshot.

// The logical truth of one snapshot. Shapes: q [B, Sq, Hq, D];
// k[b], v[b] [L_b, Hkv, D] in logical token order; positions[b] [L_b]
// strictly increasing; query_positions [B, Sq], each one of the row's
// positions.
struct LogicalCase {
  int64_t batch = 1;
  int64_t queries = 1;
  int64_t q_heads = 1;
  int64_t kv_heads = 1;
  int64_t head_dim = 8;
  DType q_dtype = DType::kF32;
  DType kv_dtype = DType::kF32;
  std::vector<double> q;
  std::vector<std::vector<double>> k, v;
  std::vector<std::vector<int64_t>> positions;
  std::vector<int64_t> query_positions;
  // fp8 dequantisation scales: empty (none), 1 entry (per tensor) or Hkv.
  std::vector<float> k_scale, v_scale;

  double softmax_scale = 0;  // 0: 1/sqrt(D)
  int64_t sliding_window = 0;
  SlidingWindowConvention window_convention =
      SlidingWindowConvention::kHuggingFace;
  double softcap = 0;
  std::vector<float> sinks;  // empty or [Hq]
  bool lse_includes_sinks = false;
  RopeConfig rope;  // copied into the snapshot verbatim
  DType output_dtype = DType::kInvalid;

  int64_t SeqLen(int64_t b) const {
    return static_cast<int64_t>(positions[b].size());
  }
  int64_t MaxSeqLen() const;
  double EffectiveScale() const;
};

// How the logical case is laid out in the page pool.
struct PagingOptions {
  int64_t page_size = 2;
  KvLayout layout = KvLayout::kNHD;
  bool permute_pages = false;
  uint64_t permutation_seed = 1;
  // Explicit physical page of every logical block, [B][blocks]; overrides
  // permute_pages. Rows may share a page when the positions (and the
  // caller's K/V) agree. Pages not named stay unreferenced (positions -1).
  std::vector<std::vector<int32_t>> page_of_block;
  int64_t spare_pages = 0;          // unreferenced pages after the named ones
  int64_t extra_blocks = 0;         // block_table columns past the longest row
  bool junk_unused_slots = true;    // garbage K/V in unused slots (else 0)
  double junk_value = 123.0;        // K junk
  double junk_v_value = -456.0;     // V junk
  DType index_dtype = DType::kI64;  // block_table, positions, lens
  bool key_rope_positions = false;  // send key_rope_positions explicitly
  // Engine page ids: page i gets id page_id_base + 7 * i; block_table then
  // holds ids. 0: no page_ids tensor.
  int64_t page_id_base = 0;
  // Context parallelism.
  CpSharding sharding = CpSharding::kNone;
  int64_t cp_world_size = 1;
  int64_t interleave_size = 1;
  // Explicit owners [B][blocks] (kExplicitOwners); empty: random owners
  // drawn from owner_seed.
  std::vector<std::vector<int32_t>> block_owners;
  uint64_t owner_seed = 7;
};

// Lays out `c` as a snapshot. Engine outputs are left absent.
Snapshot BuildSnapshot(const LogicalCase& c, const PagingOptions& options);

// ---------------------------------------------------------------------------
// Quick valid snapshots.

// Default (SnapshotSpec{}): the RL-Kernel harness decode fixture
// (docs/RL_KERNEL_HARNESS.md) adapted to a pool: B=2, Sq=2, Hq=4, Hkv=2,
// D=8, P=2, kv_seq_lens [6, 6], positions 0..5 in every row, query
// positions [[4,5],[4,5]], fp32 q/K/V uniform in [-1, 1), i32 indices, each
// row with its own 3 pages (6 pages), physically permuted.
// shared_prefix_blocks = 3 gives the harness's exact table: both rows on
// the same 3 pages. The defaults and the documented knobs give snapshots
// that ValidateSnapshot accepts (the validate tests assert that); anything
// else is the caller's responsibility.
struct SnapshotSpec {
  std::vector<int64_t> seq_lens = {6, 6};  // one entry per row: B
  int64_t queries = 2;                     // Sq
  int64_t q_heads = 4;
  int64_t kv_heads = 2;
  int64_t head_dim = 8;
  int64_t page_size = 2;
  // Row b, logical token i has global position offset + stride * i.
  int64_t position_offset = 0;
  int64_t position_stride = 1;  // > 1: gapped positions (evicted cache)
  // Empty: each row queries its last `queries` tokens.
  std::vector<std::vector<int64_t>> query_positions;
  // The first this-many logical blocks of every row use the same pages
  // (prefix sharing across rows; positions agree by construction).
  int64_t shared_prefix_blocks = 0;
  int64_t spare_pages = 0;   // pages no row references (positions -1)
  int64_t extra_blocks = 0;  // block_table columns past the longest row
  bool permute_pages = true;
  uint64_t seed = 17;
  KvLayout kv_layout = KvLayout::kNHD;
  DType q_dtype = DType::kF32;
  DType kv_dtype = DType::kF32;
  DType index_dtype = DType::kI32;  // block_table, lengths, positions
  bool with_key_rope_positions = true;
  // page_ids[i] = 1000 + 7 * i and block_table holds those ids.
  bool with_page_ids = false;
};

Snapshot BuildSnapshot(const SnapshotSpec& spec);

// ---------------------------------------------------------------------------
// Reading and editing a built snapshot.

// Index into k_pages/v_pages of the page holding row b's logical block j
// (follows page_ids when present; -1 when no page has the id).
int64_t PageOfBlock(const Snapshot& s, int64_t b, int64_t j);

// Flat element index of (page, slot, kv head, d) in k_pages/v_pages.
int64_t KvIndex(const Snapshot& s, int64_t page, int64_t slot, int64_t head,
                int64_t d);

// Engine out [B,Sq,Hq,D], lse [B,Sq,Hq] (zero-filled, `dtype` for out).
void AddEngineOutputs(Snapshot* s, DType dtype = DType::kF32);

// lm_head [vocab, Hq*D], selected ids (b * Sq + q) % vocab, all-active mask.
void AddLogprobInputs(Snapshot* s, int64_t vocab = 11);

// Explicit CP owners: owners[b][j] for the active blocks, -1 in the tail.
void SetExplicitOwners(Snapshot* s, int64_t world,
                       const std::vector<std::vector<int64_t>>& owners);

// ---------------------------------------------------------------------------
// Ready-made logical cases.

// Shape and content knobs of a random case.
struct RandomCaseOptions {
  int64_t batch = 2;
  int64_t queries = 1;
  int64_t q_heads = 4;
  int64_t kv_heads = 2;
  int64_t head_dim = 8;
  std::vector<int64_t> seq_lens;  // [B]; empty: every row 12 tokens
  int64_t position_offset = 0;
  int64_t max_gap = 0;  // consecutive positions differ by 1 + U[0, max_gap]
  // Queries: the row's last Sq positions, or (spread_queries) Sq random
  // distinct positions of the row, sorted, the last one always included.
  bool spread_queries = false;
  DType q_dtype = DType::kF32;
  DType kv_dtype = DType::kF32;
  bool fp8_per_head_scales = true;  // fp8 only: [Hkv] scales, else []
  double q_std = 1.0;
  double kv_std = 1.0;
  uint64_t seed = 1;
};

// Random q/K/V (normal, rounded to their dtypes), positions and queries.
// fp8 K/V carry scales: stored = fp8(x / scale), so the dequantised
// values stay near kv_std.
LogicalCase RandomCase(const RandomCaseOptions& options);

// The diagnosis tests' case: B=2, Hq=8, Hkv=2, D=32, rows of 70 and 61
// tokens, bf16 q/K/V and output, q scaled by 2 (attention peaked enough to
// give keys distinct weights).
LogicalCase PeakedBf16Case(uint64_t seed);

// The decode fixture of the RL-Kernel harness (docs/RL_KERNEL_HARNESS.md,
// "Acceptance fixture"), adapted: B=2, Sq=2, Hq=4, Hkv=2, D=8, fp32,
// positions offset+0..5 in both rows, queries [[4,5],[4,5]] (+offset).
// Our generator replaces torch.randn(seed 17); the shapes and semantics
// are the harness's.
LogicalCase SeedFixture(int64_t position_offset = 0, uint64_t seed = 17);
// The fixture's paging: P=2, three pages, logical page i at physical page
// page_order[i], explicit CP owners [[0,1,0]]*2 with world size 2.
PagingOptions SeedFixturePaging(std::vector<int32_t> page_order = {0, 1, 2});

// The post-RoPE equivalent of a case whose q and/or K are pre-RoPE: rotates
// them with the library's fp32 RopeTable and rounds once to the declared
// RoPE output dtypes, exactly as an engine that cached post-RoPE values
// would have stored them, and marks both post-RoPE. Requires non-fp8 K
// (fp8 scales would be folded differently). Aborts on an invalid RoPE
// config.
LogicalCase PostRopeEquivalent(const LogicalCase& c);

namespace builder_internal {
// Aborts with `what` when !ok: test-construction errors are bugs in the
// test itself.
void Require(bool ok, const char* what);
}  // namespace builder_internal

}  // namespace testing
}  // namespace attnaudit

#endif  // ATTNAUDIT_TESTS_UNIT_CORE_TESTING_SNAPSHOT_BUILDER_H_
