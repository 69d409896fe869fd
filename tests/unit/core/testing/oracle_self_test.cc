// Self-tests of the test helpers: the oracles against hand-computed values,
// and the snapshot builder against the validator and an independent gather.
#include <cmath>
#include <cstdint>
#include <vector>

#include "core/validate/validate.h"
#include "gtest/gtest.h"
#include "tests/unit/core/testing/attention_oracle.h"
#include "tests/unit/core/testing/rope_oracle.h"
#include "tests/unit/core/testing/snapshot_builder.h"

namespace attnaudit {
namespace testing {
namespace {

// One row, one query head, D = 2, keys at positions 0..n-1.
LogicalCase TinyCase(std::vector<std::vector<double>> keys,
                     std::vector<std::vector<double>> values,
                     std::vector<double> q) {
  LogicalCase c;
  c.head_dim = 2;
  c.softmax_scale = 1.0;
  c.q = q;
  c.k.resize(1);
  c.v.resize(1);
  c.positions.resize(1);
  for (size_t j = 0; j < keys.size(); ++j) {
    c.k[0].insert(c.k[0].end(), keys[j].begin(), keys[j].end());
    c.v[0].insert(c.v[0].end(), values[j].begin(), values[j].end());
    c.positions[0].push_back(static_cast<int64_t>(j));
  }
  c.query_positions = {static_cast<int64_t>(keys.size()) - 1};
  return c;
}

TEST(AttentionOracleTest, SingleKeyReturnsItsValueAndScore) {
  LogicalCase c = TinyCase({{2, 3}}, {{5, -7}}, {0.5, 1});
  const OracleResult r = OracleAttention(c);
  EXPECT_DOUBLE_EQ(static_cast<double>(r.out[0]), 5.0);
  EXPECT_DOUBLE_EQ(static_cast<double>(r.out[1]), -7.0);
  EXPECT_DOUBLE_EQ(static_cast<double>(r.lse_keys[0]), 4.0);  // 0.5*2 + 3
  EXPECT_EQ(r.visible[0], 1);
}

TEST(AttentionOracleTest, TwoKeysByHand) {
  // Scores 1 and 0: weights e/(e+1), 1/(e+1); lse = ln(e + 1).
  LogicalCase c = TinyCase({{1, 0}, {0, 1}}, {{1, 0}, {0, 1}}, {1, 0});
  const OracleResult r = OracleAttention(c);
  const double e = std::exp(1.0);
  EXPECT_NEAR(static_cast<double>(r.out[0]), e / (e + 1), 1e-15);
  EXPECT_NEAR(static_cast<double>(r.out[1]), 1 / (e + 1), 1e-15);
  EXPECT_NEAR(static_cast<double>(r.lse_keys[0]), std::log(e + 1), 1e-15);
}

TEST(AttentionOracleTest, SinkIsAnExtraDenominatorLogit) {
  LogicalCase c = TinyCase({{1, 0}, {0, 1}}, {{1, 0}, {0, 1}}, {1, 0});
  c.sinks = {0.5f};
  const OracleResult r = OracleAttention(c);
  const double e = std::exp(1.0), z = e + 1 + std::exp(0.5);
  EXPECT_NEAR(static_cast<double>(r.out[0]), e / z, 1e-15);
  EXPECT_NEAR(static_cast<double>(r.out[1]), 1 / z, 1e-15);
  EXPECT_NEAR(static_cast<double>(r.lse_keys[0]), std::log(e + 1), 1e-15);
  EXPECT_NEAR(static_cast<double>(r.lse_with_sinks[0]), std::log(z), 1e-15);
  // Declared: keys only unless the engine's LSE includes the sinks.
  EXPECT_EQ(r.lse_declared[0], r.lse_keys[0]);
  c.lse_includes_sinks = true;
  EXPECT_EQ(OracleAttention(c).lse_declared[0], r.lse_with_sinks[0]);
}

TEST(AttentionOracleTest, SoftCapAndScales) {
  LogicalCase c = TinyCase({{100, 0}}, {{1, 2}}, {1, 0});
  c.softcap = 10;
  EXPECT_NEAR(static_cast<double>(OracleAttention(c).lse_keys[0]),
              10 * std::tanh(10.0), 1e-15);
  c.softcap = 0;
  c.k_scale = {0.5f};
  c.v_scale = {4.0f};
  const OracleResult r = OracleAttention(c);
  EXPECT_DOUBLE_EQ(static_cast<double>(r.lse_keys[0]), 50.0);
  EXPECT_DOUBLE_EQ(static_cast<double>(r.out[1]), 8.0);
}

TEST(AttentionOracleTest, WindowConventionsDifferByOneKey) {
  std::vector<std::vector<double>> keys(10, {0, 0}), values(10, {1, 1});
  LogicalCase c = TinyCase(keys, values, {0, 0});  // query at position 9
  c.sliding_window = 3;
  EXPECT_EQ(OracleAttention(c).visible[0], 3);  // HF: 7, 8, 9
  c.window_convention = SlidingWindowConvention::kFlashLeft;
  EXPECT_EQ(OracleAttention(c).visible[0], 4);  // flash: 6..9
}

TEST(AttentionOracleTest, SeedFixtureMergeOrders) {
  const LogicalCase c = SeedFixture();
  using Orders = std::vector<std::vector<std::vector<int32_t>>>;
  EXPECT_EQ(OracleMergeOrders(c, 2),
            (Orders{{{0, 1, 2}, {0, 1, 2}}, {{0, 1, 2}, {0, 1, 2}}}));
  EXPECT_EQ(c.query_positions, (std::vector<int64_t>{4, 5, 4, 5}));
}

TEST(RopeOracleTest, PositionZeroIsIdentityAndNormIsPreserved) {
  RopeConfig config;
  const std::vector<long double> x = {1, -2, 3, 0.5, 7, -1};
  EXPECT_EQ(OracleRope(config, x, 0), x);
  const std::vector<long double> y = OracleRope(config, x, 1234);
  long double nx = 0, ny = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    nx += x[i] * x[i];
    ny += y[i] * y[i];
  }
  EXPECT_NEAR(static_cast<double>(nx), static_cast<double>(ny), 1e-15);
}

// The builder's snapshots validate, and gathering them through the
// validator's resolved layout gives back the logical truth.
TEST(SnapshotBuilderTest, RoundTripsThroughValidation) {
  for (int variant = 0; variant < 8; ++variant) {
    RandomCaseOptions o;
    o.batch = 3;
    o.queries = 2;
    o.seq_lens = {5, 16, 9};
    o.position_offset = variant * 1000;
    o.max_gap = variant % 3;
    o.spread_queries = variant % 2;
    o.kv_dtype = variant % 4 == 3 ? DType::kF8E4M3 : DType::kBF16;
    o.seed = 100 + variant;
    const LogicalCase c = RandomCase(o);
    PagingOptions p;
    p.page_size = 1 + variant;
    p.layout = variant % 2 ? KvLayout::kHND : KvLayout::kNHD;
    p.permute_pages = variant % 3 != 0;
    p.spare_pages = variant % 2;
    p.extra_blocks = variant % 3;
    p.index_dtype = variant % 2 ? DType::kI32 : DType::kI64;
    p.key_rope_positions = variant % 4 == 1;
    p.page_id_base = variant % 4 == 2 ? 50 : 0;
    p.sharding = variant % 2 ? CpSharding::kExplicitOwners
                             : CpSharding::kTokenInterleaved;
    p.cp_world_size = 1 + variant % 4;
    const Snapshot s = BuildSnapshot(c, p);
    const absl::StatusOr<ResolvedLayout> layout = ValidateSnapshot(s);
    ASSERT_TRUE(layout.ok())
        << "variant " << variant << ": " << layout.status();
    const std::vector<double> k_pool = ToDoubles(s.k_pages);
    const int64_t P = p.page_size, Hkv = c.kv_heads, D = c.head_dim;
    for (int64_t b = 0; b < c.batch; ++b) {
      ASSERT_EQ(layout->seq_lens[b], c.SeqLen(b));
      for (int64_t t = 0; t < c.SeqLen(b); ++t) {
        const int64_t page = layout->block_pages[b][t / P];
        EXPECT_EQ(s.slot_positions.IntAt(page * P + t % P), c.positions[b][t]);
        for (int64_t g = 0; g < Hkv; ++g) {
          const int64_t base = p.layout == KvLayout::kNHD
                                   ? ((page * P + t % P) * Hkv + g) * D
                                   : ((page * Hkv + g) * P + t % P) * D;
          for (int64_t i = 0; i < D; ++i) {
            ASSERT_EQ(k_pool[base + i], c.k[b][(t * Hkv + g) * D + i]);
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace testing
}  // namespace attnaudit
