// The rotation-boundary rows' K and V maxima (FinishRowSlack): taken by the
// fused pass as it reads each marked cell, or read by FinishRowSlack itself
// for a backend whose pass takes none, against the logical case's own
// values (the builder leaves junk in unused slots and permutes the pages),
// in both layouts and at one and three threads; and the rows' slack sized
// from either alike, one row by hand. Then a row's own bound
// (BoundRowSlack) against every flip of its ambiguous q elements, replayed
// in long double, with and without a sink: it holds, and a heavy key that
// takes no weight no longer widens it.
#include "core/attention/row_slack.h"

#include <cmath>
#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "core/attention/attention.h"
#include "core/tensor/dtype.h"
#include "core/validate/validate.h"
#include "gtest/gtest.h"
#include "tests/unit/core/testing/snapshot_builder.h"

namespace attnaudit {
namespace testing {
namespace {

constexpr int64_t kHeadDim = 16;
constexpr int64_t kQHeads = 8;
constexpr int64_t kKvHeads = 2;

LogicalCase Case() {
  RandomCaseOptions o;
  o.batch = 3;
  o.q_heads = kQHeads;
  o.kv_heads = kKvHeads;
  o.head_dim = kHeadDim;
  o.seq_lens = {37, 16, 50};  // partly filled last pages of 8 slots
  o.kv_dtype = DType::kBF16;
  o.kv_std = 2.0;
  o.seed = 5;
  return RandomCase(o);
}

// The largest |k| (is_key) or |v| of row b's tokens, KV head g, per dim.
std::vector<double> LogicalMaxima(const LogicalCase& c, int64_t b, int64_t g,
                                  bool is_key) {
  const std::vector<double>& x = is_key ? c.k[b] : c.v[b];
  std::vector<double> m(kHeadDim, 0.0);
  for (int64_t t = 0; t < c.SeqLen(b); ++t) {
    for (int64_t i = 0; i < kHeadDim; ++i) {
      m[i] = std::max(m[i], std::fabs(x[(t * kKvHeads + g) * kHeadDim + i]));
    }
  }
  return m;
}

class RowSlackTest
    : public ::testing::TestWithParam<std::tuple<KvLayout, int>> {};

TEST_P(RowSlackTest, PassAndOwnReadTakeTheRowsOwnMaxima) {
  const auto [kv_layout, threads] = GetParam();
  const LogicalCase c = Case();
  PagingOptions paging;
  paging.page_size = 8;
  paging.layout = kv_layout;
  paging.permute_pages = true;
  paging.spare_pages = 2;
  const Snapshot s = BuildSnapshot(c, paging);
  absl::StatusOr<ResolvedLayout> layout = ValidateSnapshot(s);
  ASSERT_TRUE(layout.ok()) << layout.status();
  absl::StatusOr<PreparedAttention> prepared =
      PrepareAttention(s, *layout, threads);
  ASSERT_TRUE(prepared.ok()) << prepared.status();
  PreparedAttention p = *std::move(prepared);
  ASSERT_TRUE(p.slack_cells.empty());  // a post-RoPE cache: none pending

  // Cells (row 0, head 1), (row 2, heads 0 and 1); an ambiguous q element
  // in row 0 query head 5 (KV head 1), dim 3, and in row 2 heads 0 and 6.
  p.slack_cells = {0, 1, 0, 0, 1, 1};
  p.slack_q_gap.assign(3 * kQHeads * kHeadDim, 0.0f);
  p.slack_q_gap[(0 * kQHeads + 5) * kHeadDim + 3] = 0.01f;
  p.slack_q_gap[(2 * kQHeads + 0) * kHeadDim + 5] = 0.02f;
  p.slack_q_gap[(2 * kQHeads + 6) * kHeadDim + 0] = 0.03f;
  p.ambiguous_q_elements = 3;
  p.rotation_dtype = DType::kBF16;

  AttentionRunOptions options;
  options.threads = threads;
  absl::StatusOr<AttentionResults> results = ComputeAttention(p, options);
  ASSERT_TRUE(results.ok()) << results.status();
  ASSERT_EQ(results->slack_key_maxima.size(), 6u);
  for (int64_t cell = 0; cell < 6; ++cell) {
    if (!p.slack_cells[cell]) continue;
    const int64_t b = cell / kKvHeads;
    const int64_t g = cell % kKvHeads;
    const std::vector<double> k = LogicalMaxima(c, b, g, true);
    const std::vector<double> v = LogicalMaxima(c, b, g, false);
    for (int64_t i = 0; i < kHeadDim; ++i) {
      EXPECT_EQ(results->slack_key_maxima[cell].At(i), static_cast<float>(k[i]))
          << "cell " << cell << " dim " << i;
      EXPECT_EQ(results->slack_value_maxima[cell].At(i),
                static_cast<float>(v[i]))
          << "cell " << cell << " dim " << i;
    }
  }

  PreparedAttention from_pass = p;
  PreparedAttention from_read = p;
  FinishRowSlack(*results, threads, &from_pass);
  FinishRowSlack(AttentionResults{}, threads, &from_read);
  EXPECT_EQ(from_pass.row_score_uncertainty, from_read.row_score_uncertainty);
  EXPECT_EQ(from_pass.row_value_max, from_read.row_value_max);
  EXPECT_EQ(from_pass.row_query_ambiguous, from_read.row_query_ambiguous);
  EXPECT_EQ(from_pass.ambiguous_rows, 3);

  // Row 0, head 5: 0.01 times KV head 1's largest |k_3| over its marked
  // cells (rows 0 and 2), widened by two bf16 ulps, times the scale.
  const double k3 = std::max(LogicalMaxima(c, 0, 1, true)[3],
                             LogicalMaxima(c, 2, 1, true)[3]);
  const double want = static_cast<double>(0.01f) * k3 *
                      (1.0 + 2.0 * DTypeEpsilon(DType::kBF16)) *
                      p.softmax_scale;
  EXPECT_DOUBLE_EQ(from_pass.row_score_uncertainty[5], want);
  EXPECT_EQ(from_pass.row_query_ambiguous[5], 1);
  EXPECT_EQ(from_pass.row_score_uncertainty[4], 0.0);  // no gap of its own
  // V: KV head 0's value max comes from row 2 alone (its only marked cell).
  std::vector<double> v0 = LogicalMaxima(c, 2, 0, false);
  EXPECT_EQ(from_pass.row_value_max[0],
            static_cast<float>(*std::max_element(v0.begin(), v0.end())));
}

INSTANTIATE_TEST_SUITE_P(LayoutsAndThreads, RowSlackTest,
                         ::testing::Combine(::testing::Values(KvLayout::kNHD,
                                                              KvLayout::kHND),
                                            ::testing::Values(1, 3)));

// One row's exact attention (long double) with q shifted by `shift`.
struct Exact {
  long double lse = 0;  // over keys and the sink, or keys only
  std::vector<long double> out;
};
Exact ExactRow(const LogicalCase& c, const std::vector<double>& q,
               const std::vector<double>& shift, double scale, bool sink,
               double sink_logit, bool lse_with_sink) {
  const int64_t D = c.head_dim;
  std::vector<long double> z;
  for (int64_t t = 0; t < c.SeqLen(0); ++t) {
    long double dot = 0;
    for (int64_t i = 0; i < D; ++i) {
      dot += (static_cast<long double>(q[i]) + shift[i]) * c.k[0][t * D + i];
    }
    z.push_back(dot * scale);
  }
  long double m = sink ? sink_logit : -INFINITY;
  for (long double x : z) m = std::max(m, x);
  long double keys = 0;
  for (long double x : z) keys += std::exp(x - m);
  const long double all = keys + (sink ? std::exp(sink_logit - m) : 0.0L);
  Exact e;
  e.lse = m + std::log(lse_with_sink ? all : keys);
  e.out.assign(D, 0.0L);
  for (size_t t = 0; t < z.size(); ++t) {
    for (int64_t i = 0; i < D; ++i) {
      e.out[i] += std::exp(z[t] - m) / all * c.v[0][t * D + i];
    }
  }
  return e;
}

// One row of one head (D 8) over `keys` keys.
RandomCaseOptions OneRow(int64_t keys) {
  RandomCaseOptions o;
  o.batch = 1;
  o.q_heads = 1;
  o.kv_heads = 1;
  o.head_dim = 8;
  o.seq_lens = {keys};
  return o;
}

class BoundRowSlackTest : public ::testing::TestWithParam<bool> {};

TEST_P(BoundRowSlackTest, HoldsForEveryFlipAndIgnoresAnUnweightedHeavyKey) {
  const bool sink = GetParam();
  RandomCaseOptions o = OneRow(24);
  o.q_std = 2.0;
  o.seed = 11;
  LogicalCase c = RandomCase(o);
  // Key 5: |k_3| of 400, its score far below the others' (no weight).
  for (int64_t i = 0; i < 8; ++i) {
    c.k[0][5 * 8 + i] = c.q[i] > 0 ? -300.0 : 300.0;
  }
  c.k[0][5 * 8 + 3] = 400.0;
  if (sink) {
    c.sinks = {1.5f};
    c.lse_includes_sinks = false;
  }
  const Snapshot s = BuildSnapshot(c, PagingOptions{});
  absl::StatusOr<ResolvedLayout> layout = ValidateSnapshot(s);
  ASSERT_TRUE(layout.ok()) << layout.status();
  absl::StatusOr<PreparedAttention> prepared = PrepareAttention(s, *layout, 1);
  ASSERT_TRUE(prepared.ok()) << prepared.status();
  PreparedAttention p = *std::move(prepared);
  const std::vector<float> gaps = {0, 0, 0, 0.0625f, 0, 0.03125f, 0, 0};
  p.slack_cells = {1};
  p.slack_q_gap = gaps;
  p.ambiguous_q_elements = 2;
  p.rotation_dtype = DType::kBF16;
  FinishRowSlack(AttentionResults{}, 1, &p);
  const RowSlackBound bound = BoundRowSlack(p, 0);
  ASSERT_TRUE(bound.bounded);

  const double scale = p.softmax_scale;
  const Exact base =
      ExactRow(c, p.q, std::vector<double>(8, 0.0), scale, sink, 1.5, false);
  long double worst_lse = 0, worst_out = 0;
  for (int a = -1; a <= 1; ++a) {
    for (int b = -1; b <= 1; ++b) {
      std::vector<double> shift(8, 0.0);
      shift[3] = a * gaps[3];
      shift[5] = b * gaps[5];
      const Exact e = ExactRow(c, p.q, shift, scale, sink, 1.5, false);
      worst_lse = std::max(worst_lse, std::fabs(e.lse - base.lse));
      for (int64_t i = 0; i < 8; ++i) {
        worst_out = std::max(worst_out, std::fabs(e.out[i] - base.out[i]));
      }
    }
  }
  EXPECT_GT(worst_lse, 0.0L);
  EXPECT_LE(worst_lse, bound.lse);
  EXPECT_LE(worst_out, bound.out);
  // Within a small factor of what a flip does; the shared bound counts key
  // 5's |k_3| of 400 at full weight: over a hundred times wider.
  EXPECT_LE(bound.lse, 4.0 * static_cast<double>(worst_lse));
  EXPECT_GT(p.row_score_uncertainty[0], 100.0 * bound.lse);

  // Key 5's rotated elements ambiguous too (a pre-qk cache): its own move
  // counts at its weight, none; the KV head's worst key for every key would
  // add its whole move to the LSE.
  const int64_t page_size = PagingOptions{}.page_size;
  const int64_t slot5 =
      PageOfBlock(s, 0, 5 / page_size) * page_size + 5 % page_size;
  p.slack_key_head_score = {50.0};
  p.slack_key_score.assign(s.slot_positions.num_elements(), 0.0f);
  p.slack_key_score[slot5] = 50.0f;
  const RowSlackBound own = BoundRowSlack(p, 0);
  EXPECT_LE(own.lse, 1.01 * bound.lse);
  p.slack_key_score.clear();
  EXPECT_GT(BoundRowSlack(p, 0).lse, 50.0 * p.softmax_scale);
}

TEST(BoundRowSlackTest, SoftCappedOrUnmarkedRowsAreNotBounded) {
  const LogicalCase c = RandomCase(OneRow(10));
  const Snapshot plain = BuildSnapshot(c, PagingOptions{});
  absl::StatusOr<ResolvedLayout> layout = ValidateSnapshot(plain);
  ASSERT_TRUE(layout.ok()) << layout.status();
  absl::StatusOr<PreparedAttention> p = PrepareAttention(plain, *layout, 1);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_FALSE(BoundRowSlack(*p, 0).bounded);  // nothing pending
  p->slack_cells = {1};
  p->slack_q_gap.assign(8, 0.01f);
  p->rotation_dtype = DType::kBF16;
  EXPECT_TRUE(BoundRowSlack(*p, 0).bounded);
  EXPECT_FALSE(BoundRowSlack(*p, 1).bounded);  // no such row
  p->softcap = 30.0;
  EXPECT_FALSE(BoundRowSlack(*p, 0).bounded);
}

INSTANTIATE_TEST_SUITE_P(WithAndWithoutSink, BoundRowSlackTest,
                         ::testing::Bool());

}  // namespace
}  // namespace testing
}  // namespace attnaudit
