// Test-only builder of small, valid decode snapshots in attnaudit's layout.
//
// A test describes the *logical* truth of a snapshot in a LogicalCase: per
// batch row, the K/V of its cached tokens in logical order with their global
// positions, the queries and their positions, and the attention variant.
// BuildSnapshot then lays that truth out the way an engine would: a shared
// page pool (NHD or HND), a block table with -1 tails, per-slot positions
// with -1 for unused slots, optionally permuted pages, spare (unreferenced)
// pages and junk in unused slots, engine page ids, and a CP sharding rule.
// The oracles (attention_oracle.h) read the LogicalCase only, never the
// paged Snapshot, so they check the library's gather independently.
//
// Values in a LogicalCase are the values *as stored* (already representable
// in their dtype; fp8 entries are decoded fp8 values before the scale), so
// building a snapshot never rounds. RandomCase produces such values.
// Everything here is deterministic for a given seed, single-threaded, and
// reports misuse through gtest-free asserts (std::abort): test bugs only.
#ifndef ATTNAUDIT_TESTS_UNIT_CORE_TESTING_SNAPSHOT_BUILDER_H_
#define ATTNAUDIT_TESTS_UNIT_CORE_TESTING_SNAPSHOT_BUILDER_H_

#include <cstdint>
#include <vector>

#include "core/rope/rope.h"
#include "core/snapshot/snapshot.h"
#include "core/tensor/dtype.h"

namespace attnaudit {
namespace testutil {

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
  // permute_pages. Pages not named stay unreferenced (positions -1).
  std::vector<std::vector<int32_t>> page_of_block;
  int64_t spare_pages = 0;          // unreferenced pages, junk content
  int64_t extra_blocks = 0;         // block_table columns past the longest row
  bool junk_unused_slots = true;    // garbage K/V in unused slots
  double junk_value = 123.0;        // K junk; V junk is -456
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

// The decode fixture of the seed harness (shared/reference/
// seed1_rl_kernel.md §4), adapted: B=2, Sq=2, Hq=4, Hkv=2, D=8, fp32,
// positions offset+0..5 in both rows, queries [[4,5],[4,5]] (+offset).
// Our generator replaces torch.randn(seed 17); the shapes and semantics
// are the harness's.
LogicalCase SeedFixture(int64_t position_offset = 0, uint64_t seed = 17);
// The fixture's paging: P=2, three pages, logical page i at physical page
// page_order[i], explicit CP owners [[0,1,0]]*2 with world size 2.
PagingOptions SeedFixturePaging(std::vector<int32_t> page_order = {0, 1, 2});

// Rounds every value of `values` to `dtype` in place (float rounding).
void RoundTo(std::vector<double>* values, DType dtype);

// The post-RoPE equivalent of a case whose q and/or K are pre-RoPE: rotates
// them with the library's fp32 RopeTable and rounds once to the declared
// RoPE output dtypes, exactly as an engine that cached post-RoPE values
// would have stored them, and marks both post-RoPE. Requires non-fp8 K
// (fp8 scales would be folded differently). Aborts on an invalid RoPE
// config.
LogicalCase PostRopeEquivalent(const LogicalCase& c);

// Writes values [n] into a new tensor of `dtype` (values must be exactly
// representable; the conversion is the library's StoreFromDouble).
Tensor MakeFloatTensor(DType dtype, std::vector<int64_t> shape,
                       const std::vector<double>& values);
Tensor MakeIntTensor(DType dtype, std::vector<int64_t> shape,
                     const std::vector<int64_t>& values);
Tensor MakeBoolTensor(std::vector<int64_t> shape,
                      const std::vector<bool>& values);
// All elements of a floating tensor as doubles.
std::vector<double> ToDoubles(const Tensor& t);

}  // namespace testutil
}  // namespace attnaudit

#endif  // ATTNAUDIT_TESTS_UNIT_CORE_TESTING_SNAPSHOT_BUILDER_H_
