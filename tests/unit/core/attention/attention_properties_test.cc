// Properties of R and P that hold by construction of the contract
// (docs/DESIGN.md §2), checked without any oracle: physical layout, CP
// ownership, threads and batch neighbours never change the results; page
// size changes R only by fp64 reassociation; pre-RoPE input equals its
// post-RoPE equivalent; GQA maps query head h to KV head h / group.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/tensor/dtype.h"
#include "gtest/gtest.h"
#include "tests/unit/core/attention/run_attention.h"
#include "tests/unit/core/testing/snapshot_builder.h"

namespace attnaudit {
namespace testing {
namespace {

AttentionResults MustRun(const Snapshot& s, int threads = 2) {
  absl::StatusOr<AttentionRun> run = RunAttention(s, threads);
  EXPECT_TRUE(run.ok()) << run.status();
  if (!run.ok()) return {};
  return run->results;
}

// Bitwise: doubles compared with ==, which also rejects NaN.
void ExpectIdentical(const AttentionResults& a, const AttentionResults& b,
                     const std::string& what) {
  EXPECT_EQ(a.reference_out, b.reference_out) << what << ": R.out";
  EXPECT_EQ(a.reference_lse, b.reference_lse) << what << ": R.lse";
  EXPECT_EQ(a.replay_out, b.replay_out) << what << ": P.out";
  EXPECT_EQ(a.replay_lse, b.replay_lse) << what << ": P.lse";
  EXPECT_EQ(a.merge_orders, b.merge_orders) << what << ": merge orders";
  EXPECT_EQ(a.max_merged_blocks, b.max_merged_blocks) << what;
  EXPECT_EQ(a.max_visible_keys, b.max_visible_keys) << what;
}

LogicalCase Case(uint64_t seed, DType kv = DType::kBF16, int64_t sq = 2) {
  RandomCaseOptions o;
  o.batch = 3;
  o.queries = sq;
  o.q_heads = 8;
  o.kv_heads = 2;
  o.head_dim = 64;
  o.seq_lens = {70, 33, 5};
  o.max_gap = 2;
  o.position_offset = 4096;
  o.spread_queries = true;
  o.kv_dtype = kv;
  o.seed = seed;
  LogicalCase c = RandomCase(o);
  c.sliding_window = 40;  // makes some leading blocks invisible
  return c;
}

TEST(AttentionPropertiesTest, PhysicalLayoutNeverChangesRorP) {
  for (DType kv : {DType::kBF16, DType::kF8E4M3, DType::kF32}) {
    const LogicalCase c = Case(11, kv);
    PagingOptions base;
    base.page_size = 16;
    const AttentionResults want = MustRun(BuildSnapshot(c, base));
    for (int variant = 0; variant < 6; ++variant) {
      PagingOptions p = base;
      p.permute_pages = true;
      p.permutation_seed = 100 + variant;
      p.layout = variant % 2 ? KvLayout::kHND : KvLayout::kNHD;
      p.spare_pages = variant;
      p.extra_blocks = variant % 3;
      p.junk_value = variant % 2 ? 3e4 : -7.0;
      p.index_dtype = variant % 2 ? DType::kI32 : DType::kI64;
      p.key_rope_positions = variant % 3 == 2;
      p.page_id_base = variant >= 3 ? 1000 : 0;
      ExpectIdentical(MustRun(BuildSnapshot(c, p)), want,
                      absl::StrCat(DTypeName(kv), " layout variant ", variant));
    }
  }
}

// bf16 pages are read in place, every other dtype through a widened copy:
// the same values held as f32 must give the same bits, in both layouts and
// with a head dimension that leaves vector tails.
TEST(AttentionPropertiesTest, Bf16PagesReadInPlaceEqualTheirF32Widening) {
  for (int64_t head_dim : {64, 20}) {
    RandomCaseOptions o;
    o.batch = 2;
    o.queries = 2;
    o.q_heads = 6;
    o.kv_heads = 3;
    o.head_dim = head_dim;
    o.seq_lens = {45, 19};
    o.spread_queries = true;
    o.kv_dtype = DType::kBF16;
    o.seed = 31;
    LogicalCase bf16 = RandomCase(o);
    for (auto* rows : {&bf16.k, &bf16.v}) {
      for (std::vector<double>& row : *rows) RoundTo(&row, DType::kBF16);
    }
    LogicalCase f32 = bf16;
    f32.kv_dtype = DType::kF32;
    for (KvLayout layout : {KvLayout::kNHD, KvLayout::kHND}) {
      PagingOptions p;
      p.page_size = 5;
      p.permute_pages = true;
      p.layout = layout;
      ExpectIdentical(
          MustRun(BuildSnapshot(bf16, p)), MustRun(BuildSnapshot(f32, p)),
          absl::StrCat("D=", head_dim, " layout ", static_cast<int>(layout)));
    }
  }
}

// fp8 pages are widened by moving bits and one exact power-of-two scaling
// (WidenF8, core/simd/simd-inl.h): with every finite code of both formats
// among the K and V values (subnormals and the largest included), they
// must compute what f32 pages holding the same values do, bit for bit.
// D = 20 also sends each row's last 4 values through the padded tail.
TEST(AttentionPropertiesTest, Fp8WideningIsExactForEveryFiniteCode) {
  for (DType fp8 : {DType::kF8E4M3, DType::kF8E5M2}) {
    std::vector<double> codes;
    for (int code = 0; code < 256; ++code) {
      const uint8_t byte = static_cast<uint8_t>(code);
      const float x =
          fp8 == DType::kF8E4M3 ? F8E4M3ToFloat(byte) : F8E5M2ToFloat(byte);
      if (std::isfinite(x)) codes.push_back(x);
    }
    RandomCaseOptions o;
    o.batch = 1;
    o.q_heads = 4;
    o.kv_heads = 2;
    o.head_dim = 20;
    o.seq_lens = {13};  // 13 * 2 * 20 = 520 values per tensor: every code
    o.kv_dtype = fp8;
    o.fp8_per_head_scales = false;
    o.q_std = 1e-3;  // keeps the scores of the largest codes moderate
    o.seed = 5;
    LogicalCase pages = RandomCase(o);
    pages.k_scale.clear();
    pages.v_scale.clear();
    size_t next = 0;
    for (auto* rows : {&pages.k, &pages.v}) {
      for (std::vector<double>& row : *rows) {
        for (double& x : row) x = codes[next++ % codes.size()];
      }
    }
    ASSERT_GE(next, 2 * codes.size());
    LogicalCase f32 = pages;
    f32.kv_dtype = DType::kF32;
    PagingOptions p;
    p.page_size = 4;
    ExpectIdentical(MustRun(BuildSnapshot(pages, p)),
                    MustRun(BuildSnapshot(f32, p)),
                    std::string(DTypeName(fp8)));
  }
}

// Shardings that keep every logical block on one rank leave P's units the
// blocks themselves: R and P are those of the same cache without CP.
TEST(AttentionPropertiesTest, ShardingsThatKeepBlocksWholeNeverChangeRorP) {
  const LogicalCase c = Case(12);
  PagingOptions base;
  base.page_size = 8;
  base.permute_pages = true;
  const AttentionResults want = MustRun(BuildSnapshot(c, base));
  for (int64_t world = 1; world <= 4; ++world) {
    for (CpSharding sharding :
         {CpSharding::kExplicitOwners, CpSharding::kPageInterleaved}) {
      PagingOptions p = base;
      p.sharding = sharding;
      p.cp_world_size = world;
      p.owner_seed = static_cast<uint64_t>(world * 10);
      ExpectIdentical(MustRun(BuildSnapshot(c, p)), want,
                      absl::StrCat("world ", world, " sharding ",
                                   static_cast<int>(sharding)));
    }
  }
}

// Token interleaving below the page size splits a block among ranks: P's
// units become each rank's runs of the block (so that any CP replay can
// rebuild P from unit states), R is unchanged, and P moves only by the
// extra fp32 merges.
TEST(AttentionPropertiesTest, TokenInterleavingMergesOneStatePerRankRun) {
  const LogicalCase c = Case(12);
  PagingOptions base;
  base.page_size = 8;
  base.permute_pages = true;
  const AttentionResults whole = MustRun(BuildSnapshot(c, base));
  for (int64_t world = 2; world <= 4; ++world) {
    for (int64_t interleave : {1, 3}) {
      PagingOptions p = base;
      p.sharding = CpSharding::kTokenInterleaved;
      p.cp_world_size = world;
      p.interleave_size = interleave;
      const std::string what =
          absl::StrCat("world ", world, " interleave ", interleave);
      const AttentionResults got = MustRun(BuildSnapshot(c, p));
      EXPECT_EQ(got.reference_out, whole.reference_out) << what;
      EXPECT_EQ(got.reference_lse, whole.reference_lse) << what;
      for (size_t i = 0; i < got.replay_lse.size(); ++i) {
        EXPECT_NEAR(got.replay_lse[i], whole.replay_lse[i], 2e-6) << what;
      }
      // Units by hand: within a block, a new unit starts wherever the owner
      // (position / interleave) % world changes.
      for (int64_t b = 0; b < c.batch; ++b) {
        for (int64_t sq = 0; sq < c.queries; ++sq) {
          const int64_t qpos = c.query_positions[b * c.queries + sq];
          std::vector<int32_t> want;
          for (int64_t blk = 0; blk * 8 < c.SeqLen(b); ++blk) {
            const int64_t end = std::min<int64_t>(c.SeqLen(b), blk * 8 + 8);
            int64_t run_owner = -1;
            bool run_seen = false;
            for (int64_t t = blk * 8; t <= end; ++t) {
              const int64_t owner =
                  t < end ? (c.positions[b][t] / interleave) % world : -1;
              if (t == end || (t > blk * 8 && owner != run_owner)) {
                if (run_seen) want.push_back(static_cast<int32_t>(blk));
                run_seen = false;
              }
              if (t == end) break;
              run_owner = owner;
              const int64_t pos = c.positions[b][t];
              run_seen = run_seen || (pos <= qpos && qpos - pos < 40);
            }
          }
          EXPECT_EQ(got.merge_orders[b][sq], want) << what << " row " << b;
        }
      }
    }
  }
}

TEST(AttentionPropertiesTest, ThreadCountNeverChangesRorP) {
  const LogicalCase c = Case(13);
  PagingOptions p;
  p.page_size = 4;
  const Snapshot s = BuildSnapshot(c, p);
  const AttentionResults want = MustRun(s, 1);
  for (int threads : {2, 3, 8}) {
    ExpectIdentical(MustRun(s, threads), want,
                    absl::StrCat(threads, " threads"));
  }
}

// A row's results do not depend on the other rows of the batch.
TEST(AttentionPropertiesTest, RowsAreIndependentOfTheirNeighbours) {
  const LogicalCase c = Case(14);
  PagingOptions p;
  p.page_size = 16;
  const AttentionResults all = MustRun(BuildSnapshot(c, p));
  const int64_t per_q = c.q_heads * c.head_dim;
  for (int64_t b = 0; b < c.batch; ++b) {
    LogicalCase one = c;
    one.batch = 1;
    one.q.assign(c.q.begin() + b * c.queries * per_q,
                 c.q.begin() + (b + 1) * c.queries * per_q);
    one.k = {c.k[b]};
    one.v = {c.v[b]};
    one.positions = {c.positions[b]};
    one.query_positions.assign(c.query_positions.begin() + b * c.queries,
                               c.query_positions.begin() + (b + 1) * c.queries);
    const AttentionResults r = MustRun(BuildSnapshot(one, p));
    const size_t n_out = static_cast<size_t>(c.queries * per_q);
    const size_t n_lse = static_cast<size_t>(c.queries * c.q_heads);
    for (size_t i = 0; i < n_out; ++i) {
      ASSERT_EQ(r.reference_out[i], all.reference_out[b * n_out + i]) << b;
      ASSERT_EQ(r.replay_out[i], all.replay_out[b * n_out + i]) << b;
    }
    for (size_t i = 0; i < n_lse; ++i) {
      ASSERT_EQ(r.reference_lse[i], all.reference_lse[b * n_lse + i]) << b;
      ASSERT_EQ(r.replay_lse[i], all.replay_lse[b * n_lse + i]) << b;
    }
    EXPECT_EQ(r.merge_orders[0], all.merge_orders[b]);
  }
}

// GQA: query head h reads KV head h / (Hq / Hkv). Expanding the KV heads
// (repeat_interleave, as the RL-Kernel harness does) to MHA gives identical
// results.
TEST(AttentionPropertiesTest, GqaEqualsRepeatInterleavedMha) {
  for (int64_t group : {4, 7}) {
    RandomCaseOptions o;
    o.batch = 2;
    o.queries = 2;
    o.kv_heads = 2;
    o.q_heads = 2 * group;
    o.head_dim = 64;
    o.seq_lens = {40, 19};
    o.seed = 15 + group;
    const LogicalCase gqa = RandomCase(o);
    LogicalCase mha = gqa;
    mha.kv_heads = gqa.q_heads;
    const int64_t D = gqa.head_dim;
    for (int64_t b = 0; b < gqa.batch; ++b) {
      mha.k[b].clear();
      mha.v[b].clear();
      for (int64_t t = 0; t < gqa.SeqLen(b); ++t) {
        for (int64_t h = 0; h < gqa.q_heads; ++h) {
          const int64_t src = (t * gqa.kv_heads + h / group) * D;
          mha.k[b].insert(mha.k[b].end(), gqa.k[b].begin() + src,
                          gqa.k[b].begin() + src + D);
          mha.v[b].insert(mha.v[b].end(), gqa.v[b].begin() + src,
                          gqa.v[b].begin() + src + D);
        }
      }
    }
    PagingOptions p;
    p.page_size = 16;
    const AttentionResults a = MustRun(BuildSnapshot(gqa, p));
    const AttentionResults m = MustRun(BuildSnapshot(mha, p));
    EXPECT_EQ(a.reference_out, m.reference_out) << group;
    EXPECT_EQ(a.reference_lse, m.reference_lse) << group;
    EXPECT_EQ(a.replay_out, m.replay_out) << group;
    EXPECT_EQ(a.replay_lse, m.replay_lse) << group;
  }
}

// Page size changes only the blocking of R's fp64 online softmax (the
// scores are the same fp64 dot products): R agrees within 1e-13 relative.
TEST(AttentionPropertiesTest, PageSizeChangesRonlyByFp64Rounding) {
  const LogicalCase c = Case(16, DType::kF16);
  PagingOptions base;
  base.page_size = 1;
  const AttentionResults want = MustRun(BuildSnapshot(c, base));
  double max_v = 0;
  for (const auto& row : c.v) {
    for (double x : row) max_v = std::max(max_v, std::fabs(x));
  }
  for (int64_t page : {2, 3, 16, 64, 128}) {
    PagingOptions p = base;
    p.page_size = page;
    p.permute_pages = true;
    const AttentionResults r = MustRun(BuildSnapshot(c, p));
    for (size_t i = 0; i < want.reference_out.size(); ++i) {
      ASSERT_NEAR(r.reference_out[i], want.reference_out[i], 1e-13 * max_v)
          << "page " << page << " i=" << i;
    }
    for (size_t i = 0; i < want.reference_lse.size(); ++i) {
      ASSERT_NEAR(r.reference_lse[i], want.reference_lse[i],
                  1e-13 * std::max(1.0, std::fabs(want.reference_lse[i])))
          << "page " << page << " i=" << i;
    }
    EXPECT_EQ(r.max_visible_keys, want.max_visible_keys);
  }
}

// Pre-RoPE q and K vs the same values rotated (library RopeTable, fp32,
// one cast) and declared post-RoPE: identical R and P, bit for bit.
TEST(AttentionPropertiesTest, PreRopeEqualsItsPostRopeEquivalent) {
  struct Variant {
    RopeStyle style;
    int64_t rotary_dim;
    RopeScalingType scaling;
    DType q_dtype, kv_dtype, q_out;
  };
  const std::vector<Variant> variants = {
      {RopeStyle::kNeox, 0, RopeScalingType::kNone, DType::kF32, DType::kF32,
       DType::kInvalid},
      {RopeStyle::kNeox, 0, RopeScalingType::kLlama3, DType::kBF16,
       DType::kBF16, DType::kInvalid},
      {RopeStyle::kGptj, 32, RopeScalingType::kNone, DType::kF32, DType::kF16,
       DType::kBF16},
      {RopeStyle::kNeox, 48, RopeScalingType::kYarn, DType::kF32, DType::kBF16,
       DType::kF32},
  };
  uint64_t seed = 40;
  for (const Variant& v : variants) {
    RandomCaseOptions o;
    o.batch = 2;
    o.queries = 3;
    o.q_heads = 8;
    o.kv_heads = 2;
    o.head_dim = 64;
    o.seq_lens = {50, 21};
    o.position_offset = 4096;
    o.max_gap = 3;
    o.spread_queries = true;
    o.q_dtype = v.q_dtype;
    o.kv_dtype = v.kv_dtype;
    o.seed = ++seed;
    LogicalCase pre = RandomCase(o);
    pre.rope.q_state = pre.rope.k_state = RopeState::kPreRope;
    pre.rope.style = v.style;
    pre.rope.rotary_dim = v.rotary_dim;
    pre.rope.theta = 1e6;
    pre.rope.scaling.type = v.scaling;
    pre.rope.scaling.factor = 8;
    pre.rope.q_output_dtype = v.q_out;
    pre.output_dtype = DType::kBF16;
    const LogicalCase post = PostRopeEquivalent(pre);
    for (KvLayout layout : {KvLayout::kNHD, KvLayout::kHND}) {
      PagingOptions p;
      p.page_size = 16;
      p.layout = layout;
      p.permute_pages = true;
      ExpectIdentical(MustRun(BuildSnapshot(pre, p)),
                      MustRun(BuildSnapshot(post, p)),
                      absl::StrCat("rope variant ", seed));
    }
  }
}

// Merge orders, by hand: P = 4, positions 0..9, queries at 4 and 9 with an
// HF window of 3. Query 4 sees 2, 3, 4 (blocks 0 and 1); query 9 sees
// 7, 8, 9 (blocks 1 and 2).
TEST(AttentionPropertiesTest, MergeOrdersByHand) {
  RandomCaseOptions o;
  o.batch = 1;
  o.queries = 2;
  o.q_heads = 2;
  o.kv_heads = 1;
  o.seq_lens = {10};
  o.seed = 3;
  LogicalCase c = RandomCase(o);
  c.query_positions = {4, 9};
  c.sliding_window = 3;
  PagingOptions p;
  p.page_size = 4;
  p.permute_pages = true;
  const AttentionResults r = MustRun(BuildSnapshot(c, p));
  using Orders = std::vector<std::vector<std::vector<int32_t>>>;
  EXPECT_EQ(r.merge_orders, (Orders{{{0, 1}, {1, 2}}}));
  EXPECT_EQ(r.max_merged_blocks, 2);
  EXPECT_EQ(r.max_visible_keys, 3);
}

TEST(AttentionPropertiesTest, SeedFixtureMergeOrders) {
  const AttentionResults r =
      MustRun(BuildSnapshot(SeedFixture(), SeedFixturePaging({2, 0, 1})));
  using Orders = std::vector<std::vector<std::vector<int32_t>>>;
  EXPECT_EQ(r.merge_orders,
            (Orders{{{0, 1, 2}, {0, 1, 2}}, {{0, 1, 2}, {0, 1, 2}}}));
  EXPECT_EQ(r.max_merged_blocks, 3);
  EXPECT_EQ(r.max_visible_keys, 6);
}

TEST(AttentionPropertiesTest, CancellationStopsTheComputation) {
  const Snapshot s = BuildSnapshot(Case(17), PagingOptions{});
  std::atomic<bool> cancelled{true};
  absl::StatusOr<AttentionRun> run = RunAttention(s, 2, &cancelled);
  ASSERT_FALSE(run.ok());
  EXPECT_EQ(run.status().code(), absl::StatusCode::kCancelled);
  cancelled = false;
  EXPECT_TRUE(RunAttention(s, 2, &cancelled).ok());
}

}  // namespace
}  // namespace testing
}  // namespace attnaudit
