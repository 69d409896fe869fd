// The rotation-boundary rows' K and V maxima (FinishRowSlack): taken by the
// fused pass as it reads each marked cell, or read by FinishRowSlack itself
// for a backend whose pass takes none, against the logical case's own
// values (the builder leaves junk in unused slots and permutes the pages),
// in both layouts and at one and three threads; and the rows' slack sized
// from either alike, one row by hand.
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

}  // namespace
}  // namespace testing
}  // namespace attnaudit
