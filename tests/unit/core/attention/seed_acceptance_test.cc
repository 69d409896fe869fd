// The decode acceptance cases of the RL-Kernel harness
// (docs/RL_KERNEL_HARNESS.md, "Acceptance cases"), adapted to attnaudit's
// layout: a shared page pool instead of per-row caches, our own deterministic
// generator instead of torch.randn. Case numbers are the table's. The harness
// compares an fp32 replay with an fp32 reference; here P (fp32) is compared
// with R (fp64), which is stricter on the reference side, with the harness's
// tolerances. Cases needing the pipeline (log-probs, prefix fingerprints, the
// non-finite rejection) live in tests/unit/core/audit.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "gtest/gtest.h"
#include "tests/unit/core/attention/run_attention.h"
#include "tests/unit/core/testing/attention_oracle.h"
#include "tests/unit/core/testing/snapshot_builder.h"

namespace attnaudit {
namespace testing {
namespace {

AttentionRun MustRun(const Snapshot& s) {
  absl::StatusOr<AttentionRun> run = RunAttention(s);
  EXPECT_TRUE(run.ok()) << run.status();
  return run.ok() ? *std::move(run) : AttentionRun{};
}

double MaxAbsDiff(const std::vector<double>& a, const std::vector<double>& b) {
  EXPECT_EQ(a.size(), b.size());
  double m = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    m = std::max(m, std::fabs(a[i] - b[i]));
  }
  return m;
}

std::vector<double> ToDouble(const std::vector<long double>& v) {
  return std::vector<double>(v.begin(), v.end());
}

// Replay vs reference within the harness's fp32 tolerance (1e-6 on out
// and lse, absolute), and the reference vs the long-double oracle.
void ExpectReplayMatchesReference(const LogicalCase& c,
                                  const AttentionResults& r) {
  EXPECT_LE(MaxAbsDiff(r.replay_out, r.reference_out), 1e-6);
  EXPECT_LE(MaxAbsDiff(r.replay_lse, r.reference_lse), 1e-6);
  const OracleResult o = OracleAttention(c);
  EXPECT_LE(MaxAbsDiff(r.reference_out, ToDouble(o.out)), 1e-12);
  EXPECT_LE(MaxAbsDiff(r.reference_lse, ToDouble(o.lse_declared)), 1e-12);
}

// Case 1: replay matches the full-prefill reference, for Sq = 2 and then
// for the last query alone (Sq = 1); provenance of the merge.
TEST(SeedAcceptanceTest, Case01ReplayMatchesReferenceForFewAndSingleQuery) {
  const LogicalCase c = SeedFixture();
  const AttentionRun run = MustRun(BuildSnapshot(c, SeedFixturePaging()));
  ExpectReplayMatchesReference(c, run.results);
  using Orders = std::vector<std::vector<std::vector<int32_t>>>;
  EXPECT_EQ(run.results.merge_orders,
            (Orders{{{0, 1, 2}, {0, 1, 2}}, {{0, 1, 2}, {0, 1, 2}}}));
  EXPECT_EQ(run.layout.block_owners,
            (std::vector<std::vector<int32_t>>{{0, 1, 0}, {0, 1, 0}}));

  // Sq = 1: keep only the last query of each row.
  LogicalCase last = c;
  last.queries = 1;
  last.q.clear();
  const int64_t per_q = c.q_heads * c.head_dim;
  for (int64_t b = 0; b < c.batch; ++b) {
    const auto first = c.q.begin() + (b * c.queries + 1) * per_q;
    last.q.insert(last.q.end(), first, first + per_q);
  }
  last.query_positions = {5, 5};
  const AttentionRun single = MustRun(BuildSnapshot(last, SeedFixturePaging()));
  ExpectReplayMatchesReference(last, single.results);
  // The last query's results are those of the two-query snapshot.
  for (int64_t b = 0; b < c.batch; ++b) {
    for (int64_t i = 0; i < per_q; ++i) {
      EXPECT_EQ(single.results.reference_out[b * per_q + i],
                run.results.reference_out[(b * 2 + 1) * per_q + i]);
    }
  }
}

// Case 3: physical page order (0,1,2) vs (2,0,1) changes nothing (the
// harness allows 1e-6; our fixed logical merge order makes it bitwise).
TEST(SeedAcceptanceTest, Case03InvariantToPhysicalPageOrder) {
  const LogicalCase c = SeedFixture();
  const AttentionRun a =
      MustRun(BuildSnapshot(c, SeedFixturePaging({0, 1, 2})));
  const AttentionRun b =
      MustRun(BuildSnapshot(c, SeedFixturePaging({2, 0, 1})));
  EXPECT_EQ(a.results.replay_out, b.results.replay_out);
  EXPECT_EQ(a.results.replay_lse, b.results.replay_lse);
  EXPECT_EQ(a.results.reference_out, b.results.reference_out);
  EXPECT_EQ(a.results.reference_lse, b.results.reference_lse);
}

// Cases 4 and 41: non-zero global position origins.
TEST(SeedAcceptanceTest, Case04And41NonZeroPositionOrigin) {
  for (int64_t offset : {128, 4096}) {
    const LogicalCase c = SeedFixture(offset);
    EXPECT_EQ(c.query_positions[1], offset + 5);
    const AttentionRun run = MustRun(BuildSnapshot(c, SeedFixturePaging()));
    ExpectReplayMatchesReference(c, run.results);
    // Same values at offset 0: attention depends on relative order only
    // (post-RoPE input), so the results are identical.
    const AttentionRun zero =
        MustRun(BuildSnapshot(SeedFixture(0), SeedFixturePaging()));
    EXPECT_EQ(run.results.reference_out, zero.results.reference_out);
    EXPECT_EQ(run.results.replay_out, zero.results.replay_out);
  }
}

// Case 6: a spare, unreferenced page full of junk (K 123, V -456) with
// -1 positions and a -1 block-table/owner column changes nothing.
TEST(SeedAcceptanceTest, Case06InactivePageContentIsIgnored) {
  const LogicalCase c = SeedFixture();
  PagingOptions spare = SeedFixturePaging();
  spare.spare_pages = 1;
  spare.extra_blocks = 1;
  spare.block_owners = {{0, 1, 0, -1}, {0, 1, 0, -1}};
  const Snapshot with_spare = BuildSnapshot(c, spare);
  ASSERT_EQ(with_spare.k_pages.dim(0), 7);
  EXPECT_EQ(with_spare.k_pages.FloatAt(with_spare.k_pages.num_elements() - 1),
            123.0f);
  const AttentionRun a = MustRun(with_spare);
  const AttentionRun b = MustRun(BuildSnapshot(c, SeedFixturePaging()));
  EXPECT_EQ(a.results.reference_out, b.results.reference_out);
  EXPECT_EQ(a.results.reference_lse, b.results.reference_lse);
  EXPECT_EQ(a.results.replay_out, b.results.replay_out);
  EXPECT_EQ(a.results.replay_lse, b.results.replay_lse);
}

// Case 7: per-row lengths [5, 6], queries [[3,4],[4,5]]; row 0's last page
// is partial (its second slot is -1 and holds junk).
TEST(SeedAcceptanceTest, Case07PerRowLengthsAndPartialLastPage) {
  LogicalCase c = SeedFixture();
  c.positions[0].pop_back();
  c.k[0].resize(static_cast<size_t>(5 * c.kv_heads * c.head_dim));
  c.v[0].resize(static_cast<size_t>(5 * c.kv_heads * c.head_dim));
  c.query_positions = {3, 4, 4, 5};
  const Snapshot s = BuildSnapshot(c, SeedFixturePaging());
  EXPECT_EQ(s.slot_positions.IntAt(5), -1);  // row 0, page 2, slot 1
  const AttentionRun run = MustRun(s);
  EXPECT_EQ(run.layout.seq_lens, (std::vector<int64_t>{5, 6}));
  ExpectReplayMatchesReference(c, run.results);
}

// Case 11: CP owners [[0,1,0]] vs all zeros: identical results, different
// provenance.
TEST(SeedAcceptanceTest, Case11EquivalentCpOwnership) {
  const LogicalCase c = SeedFixture();
  PagingOptions zeros = SeedFixturePaging();
  zeros.block_owners = {{0, 0, 0}, {0, 0, 0}};
  const AttentionRun a = MustRun(BuildSnapshot(c, SeedFixturePaging()));
  const AttentionRun b = MustRun(BuildSnapshot(c, zeros));
  EXPECT_EQ(a.results.replay_out, b.results.replay_out);
  EXPECT_EQ(a.results.replay_lse, b.results.replay_lse);
  EXPECT_EQ(a.results.reference_out, b.results.reference_out);
  EXPECT_EQ(b.layout.block_owners,
            (std::vector<std::vector<int32_t>>{{0, 0, 0}, {0, 0, 0}}));
  EXPECT_EQ(a.layout.block_owners,
            (std::vector<std::vector<int32_t>>{{0, 1, 0}, {0, 1, 0}}));
}

// Case 12: pre-RoPE q and K cache vs the same rotated in fp32 and declared
// post-RoPE (the harness's theta 1e6, NeoX, full rotary): equal.
TEST(SeedAcceptanceTest, Case12PreRopeMatchesEquivalentPostRope) {
  LogicalCase pre = SeedFixture();
  pre.rope.q_state = pre.rope.k_state = RopeState::kPreRope;
  pre.rope.theta = 1e6;
  const LogicalCase post = PostRopeEquivalent(pre);
  const AttentionRun a = MustRun(BuildSnapshot(pre, SeedFixturePaging()));
  const AttentionRun b = MustRun(BuildSnapshot(post, SeedFixturePaging()));
  EXPECT_LE(MaxAbsDiff(a.results.replay_out, b.results.replay_out), 1e-6);
  EXPECT_LE(MaxAbsDiff(a.results.replay_lse, b.results.replay_lse), 1e-6);
  EXPECT_EQ(a.results.reference_out, b.results.reference_out);  // bitwise
  EXPECT_EQ(a.results.replay_out, b.results.replay_out);
  // And the rotation did matter: the un-rotated snapshot differs.
  LogicalCase unrotated = pre;
  unrotated.rope.q_state = unrotated.rope.k_state = RopeState::kPostRope;
  const AttentionRun u = MustRun(BuildSnapshot(unrotated, SeedFixturePaging()));
  EXPECT_GT(MaxAbsDiff(u.results.reference_out, a.results.reference_out), 1e-3);
}

// Case 13: separate q and K RoPE output dtypes: fp32 q with a bf16 K/V
// cache, both pre-RoPE, vs q rotated in fp32 (kept fp32) and K rotated in
// fp32 then cast to bf16, declared post-RoPE.
TEST(SeedAcceptanceTest, Case13SeparateQAndKRopeOutputDtypes) {
  LogicalCase pre = SeedFixture();
  RoundTo(&pre.k[0], DType::kBF16);
  RoundTo(&pre.k[1], DType::kBF16);
  RoundTo(&pre.v[0], DType::kBF16);
  RoundTo(&pre.v[1], DType::kBF16);
  pre.kv_dtype = DType::kBF16;
  pre.rope.q_state = pre.rope.k_state = RopeState::kPreRope;
  pre.rope.theta = 1e6;
  pre.rope.q_output_dtype = DType::kF32;
  pre.rope.k_output_dtype = DType::kBF16;
  pre.output_dtype = DType::kF32;
  const LogicalCase post = PostRopeEquivalent(pre);
  EXPECT_EQ(post.q_dtype, DType::kF32);
  EXPECT_EQ(post.kv_dtype, DType::kBF16);
  // The post-RoPE q is fp32: not all of its values are bf16-representable.
  bool q_wider_than_bf16 = false;
  for (double x : post.q) {
    q_wider_than_bf16 |= RoundToDType(static_cast<float>(x), DType::kBF16) != x;
  }
  EXPECT_TRUE(q_wider_than_bf16);
  const AttentionRun a = MustRun(BuildSnapshot(pre, SeedFixturePaging()));
  const AttentionRun b = MustRun(BuildSnapshot(post, SeedFixturePaging()));
  EXPECT_LE(MaxAbsDiff(a.results.replay_out, b.results.replay_out), 1e-6);
  EXPECT_LE(MaxAbsDiff(a.results.replay_lse, b.results.replay_lse), 1e-6);
  EXPECT_EQ(a.results.reference_out, b.results.reference_out);
  EXPECT_EQ(a.results.reference_lse, b.results.reference_lse);
  ExpectReplayMatchesReference(post, a.results);
}

// Case 26: Qwen3-8B head layout (32 q heads, 8 KV heads, D 128), bf16
// q/K/V and output, P = 2, two pages, positions 0..3, query at 3, owners
// [[0,1]]. Out within 2 * eps_bf16 = 0.015625 (P is rounded once to bf16,
// R is not rounded at all); lse within 1e-6 (P's fp32 LSE vs R's fp64).
TEST(SeedAcceptanceTest, Case26Qwen3GqaHeadLayout) {
  RandomCaseOptions o;
  o.batch = 1;
  o.queries = 1;
  o.q_heads = 32;
  o.kv_heads = 8;
  o.head_dim = 128;
  o.seq_lens = {4};
  o.q_dtype = o.kv_dtype = DType::kBF16;
  o.seed = 26;
  LogicalCase c = RandomCase(o);
  c.output_dtype = DType::kBF16;
  PagingOptions p;
  p.page_size = 2;
  p.page_of_block = {{0, 1}};
  p.sharding = CpSharding::kExplicitOwners;
  p.cp_world_size = 2;
  p.block_owners = {{0, 1}};
  const AttentionRun run = MustRun(BuildSnapshot(c, p));
  const AttentionResults& r = run.results;
  EXPECT_LE(MaxAbsDiff(r.replay_out, r.reference_out),
            2 * DTypeEpsilon(DType::kBF16));
  EXPECT_LE(MaxAbsDiff(r.replay_lse, r.reference_lse), 1e-6);
  // Sharper: P is R rounded to bf16 up to fp32 noise, i.e. within one
  // bf16 ulp of R's own rounding.
  for (size_t i = 0; i < r.reference_out.size(); ++i) {
    const double rounded =
        RoundToDType(static_cast<float>(r.reference_out[i]), DType::kBF16);
    EXPECT_LE(UlpDistance(r.replay_out[i], rounded, DType::kBF16), 1u) << i;
  }
  const OracleResult oracle = OracleAttention(c);
  EXPECT_LE(MaxAbsDiff(r.reference_out, ToDouble(oracle.out)), 1e-12);
}

}  // namespace
}  // namespace testing
}  // namespace attnaudit
