#include "core/pairs/pairs.h"

#include <cmath>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/core/testing/attention_oracle.h"
#include "tests/unit/core/testing/snapshot_builder.h"

namespace attnaudit {
namespace {

using ::attnaudit::testing::BuildSnapshot;
using ::attnaudit::testing::LogicalCase;
using ::attnaudit::testing::MakeFloatTensor;
using ::attnaudit::testing::OracleAttention;
using ::attnaudit::testing::PagingOptions;
using ::attnaudit::testing::RandomCase;
using ::attnaudit::testing::RandomCaseOptions;
using ::attnaudit::testing::RoundValue;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// Two bf16 decode rows (40 and 33 keys), Hq 8, Hkv 2, D 32.
LogicalCase Tokens(int64_t q_heads = 8, int64_t kv_heads = 2,
                   int64_t queries = 1) {
  RandomCaseOptions o;
  o.batch = 2;
  o.queries = queries;
  o.q_heads = q_heads;
  o.kv_heads = kv_heads;
  o.head_dim = 32;
  o.seq_lens = {40, 33};
  o.q_dtype = DType::kBF16;
  o.kv_dtype = DType::kBF16;
  o.q_std = 2.0;  // peaked enough that inputs move the output
  o.seed = 5;
  LogicalCase c = RandomCase(o);
  c.output_dtype = DType::kBF16;
  return c;
}

// One side's snapshot of `c`: its own attention (the oracle's, rounded to
// bf16) as engine.out, pages scattered or not, NHD or HND.
Snapshot Side(const LogicalCase& c, bool scattered = false,
              KvLayout layout = KvLayout::kNHD,
              std::vector<std::string> ids = {"req-a", "req-b"}) {
  PagingOptions paging;
  paging.page_size = 16;
  paging.permute_pages = scattered;
  paging.layout = layout;
  Snapshot s = BuildSnapshot(c, paging);
  const std::vector<long double> out = OracleAttention(c).out;
  s.engine.out =
      MakeFloatTensor(DType::kBF16, {c.batch, c.queries, c.q_heads, c.head_dim},
                      std::vector<double>(out.begin(), out.end()));
  s.labels.request_ids = std::move(ids);
  s.labels.layer = 3;
  return s;
}

AuditReport Report(Verdict verdict, double tolerance = 0) {
  AuditReport r;
  r.verdict = verdict;
  ComparisonResult c;
  c.comparison = Comparison::kEngineVsReference;
  c.has_out = true;
  c.out.tolerance = tolerance;
  r.comparisons.push_back(c);
  if (verdict == Verdict::kDrift) {
    Diagnosis d;
    d.hypothesis = "stale-page";
    d.summary = "block 1 read stale";
    r.diagnoses.push_back(d);
  }
  return r;
}

std::vector<std::string> Verdicts(const PairReport& report) {
  std::vector<std::string> out;
  for (const RowPair& r : report.rows) {
    out.emplace_back(PairVerdictName(r.verdict));
  }
  return out;
}

TEST(PairsTest, IdenticalSidesAreConsistent) {
  const LogicalCase c = Tokens();
  // Scattered NHD pages against contiguous HND ones: the same rows.
  absl::StatusOr<PairReport> report = ComparePairs(
      Side(c, true), Side(c, false, KvLayout::kHND), nullptr, nullptr);
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_THAT(Verdicts(*report), ElementsAre("consistent", "consistent"));
  EXPECT_EQ(report->verdict(), PairVerdict::kConsistent);
  EXPECT_EQ(report->layer, 3);
  EXPECT_EQ(report->rows[0].request_id, "req-a");
  EXPECT_EQ(report->rows[0].position, 39);
  EXPECT_EQ(report->rows[1].position, 32);
  EXPECT_EQ(report->rows[0].keys_compared, 40);
  EXPECT_EQ(report->rows[1].keys_compared, 33);
  for (const RowPair& r : report->rows) {
    EXPECT_TRUE(r.out_bitwise);
    EXPECT_EQ(r.q_ulps, 0);
    EXPECT_EQ(r.kv_ulps, 0);
    EXPECT_EQ(r.input_effect, 0);
    EXPECT_GT(r.noise, 0);  // 4 ulps of the largest output
    EXPECT_EQ(r.InputsDiffering(), "");
  }
}

TEST(PairsTest, OutputsOneUlpApartWithTheSameInputsAreWithinNoise) {
  const LogicalCase c = Tokens();
  Snapshot trainer = Side(c);
  // The trainer's first output element one bf16 ulp away.
  const double x = trainer.engine.out.DoubleAt(0);
  const double ulp = std::ldexp(1.0, std::ilogb(x) - 7);
  StoreFromDouble(trainer.engine.out.mutable_raw(), DType::kBF16, 0, x + ulp);
  const AuditReport pass = Report(Verdict::kPass, 1e-2);
  absl::StatusOr<PairReport> report =
      ComparePairs(Side(c, true), trainer, &pass, &pass);
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_THAT(Verdicts(*report), ElementsAre("within-noise", "consistent"));
  const RowPair& r = report->rows[0];
  EXPECT_FALSE(r.out_bitwise);
  EXPECT_DOUBLE_EQ(r.out_max_abs, ulp);
  EXPECT_GT(r.out_max_ulps, 0);
  EXPECT_LE(r.out_max_ulps, 1);
  EXPECT_EQ(r.noise, 1e-2);  // the audits' tolerance
  EXPECT_EQ(report->rollout_verdict, Verdict::kPass);
}

TEST(PairsTest, AQueryThatDiffersUpstreamIsInputsDiffer) {
  const LogicalCase c = Tokens();
  LogicalCase t = c;
  testing::TestRng rng(11);
  for (double& q : t.q) {
    q = RoundValue(q * (1 + 0.05 * rng.Normal()), DType::kBF16);
  }
  absl::StatusOr<PairReport> report =
      ComparePairs(Side(c, true), Side(t), nullptr, nullptr);
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_THAT(Verdicts(*report), ElementsAre("inputs-differ", "inputs-differ"));
  for (const RowPair& r : report->rows) {
    EXPECT_GT(r.q_ulps, kInputRoundingUlps);
    EXPECT_EQ(r.kv_ulps, 0);
    EXPECT_GT(r.input_effect, r.noise);
    EXPECT_EQ(r.InputsDiffering(), "q");
  }
}

TEST(PairsTest, OnlyTheOlderPrefixDifferingIsStalePrefixKv) {
  const LogicalCase c = Tokens();
  LogicalCase r = c;
  for (int64_t i = 0; i < 16 * 2 * 32; ++i) {  // row 1's first page of K
    r.k[1][i] = RoundValue(r.k[1][i] * 1.5, DType::kBF16);
  }
  absl::StatusOr<PairReport> report =
      ComparePairs(Side(r, true), Side(c), nullptr, nullptr);
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_THAT(Verdicts(*report), ElementsAre("consistent", "stale-prefix-kv"));
  const RowPair& row = report->rows[1];
  EXPECT_EQ(row.q_ulps, 0);
  EXPECT_EQ(row.newest_kv_ulps, 0);
  EXPECT_GT(row.kv_ulps, kInputRoundingUlps);
  EXPECT_EQ(row.InputsDiffering(), "K/V");
  EXPECT_EQ(report->verdict(), PairVerdict::kStalePrefixKv);
}

TEST(PairsTest, KeysDifferingUpToTheNewestAreInputsDiffer) {
  const LogicalCase c = Tokens();
  LogicalCase r = c;
  for (double& k : r.k[1]) k = RoundValue(k * 1.5, DType::kBF16);
  absl::StatusOr<PairReport> report =
      ComparePairs(Side(r, true), Side(c), nullptr, nullptr);
  ASSERT_TRUE(report.ok()) << report.status();
  const RowPair& row = report->rows[1];
  EXPECT_GT(row.newest_kv_ulps, kInputRoundingUlps);
  EXPECT_EQ(PairVerdictName(row.verdict), "inputs-differ");
}

TEST(PairsTest, ADriftingSideNamesItsSide) {
  const LogicalCase c = Tokens();
  const Snapshot rollout = Side(c, true), trainer = Side(c);
  const AuditReport pass = Report(Verdict::kPass, 1e-3);
  const AuditReport drift = Report(Verdict::kDrift, 1e-3);
  absl::StatusOr<PairReport> r = ComparePairs(rollout, trainer, &drift, &pass);
  absl::StatusOr<PairReport> t = ComparePairs(rollout, trainer, &pass, &drift);
  absl::StatusOr<PairReport> b = ComparePairs(rollout, trainer, &drift, &drift);
  ASSERT_TRUE(r.ok() && t.ok() && b.ok());
  EXPECT_THAT(Verdicts(*r), ElementsAre("rollout-drift", "rollout-drift"));
  EXPECT_THAT(Verdicts(*t), ElementsAre("trainer-drift", "trainer-drift"));
  EXPECT_THAT(Verdicts(*b), ElementsAre("both-drift", "both-drift"));
  EXPECT_EQ(r->rollout_diagnosis, "stale-page: block 1 read stale");
  EXPECT_EQ(r->trainer_diagnosis, "");
  EXPECT_EQ(t->trainer_verdict, Verdict::kDrift);
}

TEST(PairsTest, TheEffectUsesTheRolloutsParameters) {
  const LogicalCase c = Tokens();
  LogicalCase t = c;
  t.softcap = 5.0;  // declared by the trainer only; its inputs are the same
  Snapshot trainer = Side(t);
  absl::StatusOr<PairReport> report =
      ComparePairs(Side(c, true), trainer, nullptr, nullptr);
  ASSERT_TRUE(report.ok()) << report.status();
  for (const RowPair& r : report->rows) EXPECT_EQ(r.input_effect, 0);
  // Its output (a capped attention) differs; its inputs do not.
  EXPECT_THAT(Verdicts(*report), ElementsAre("within-noise", "within-noise"));
}

TEST(PairsTest, RowsAreJoinedByRequestIdAndPosition) {
  const LogicalCase c = Tokens();
  absl::StatusOr<PairReport> report = ComparePairs(
      Side(c, true, KvLayout::kNHD, {"req-x", "req-b"}),
      Side(c, false, KvLayout::kNHD, {"req-b", "req-a"}), nullptr, nullptr);
  ASSERT_TRUE(report.ok()) << report.status();
  // req-b at 32 both sides: rollout row 1; the trainer's req-b is its row 0
  // but at position 39, so it does not pair. Nothing pairs.
  EXPECT_TRUE(report->rows.empty());
  EXPECT_EQ(report->verdict(), std::nullopt);
  EXPECT_EQ(report->unmatched_rollout, 2);
  EXPECT_EQ(report->unmatched_trainer, 2);

  report = ComparePairs(Side(c, true, KvLayout::kNHD, {"req-a", "req-x"}),
                        Side(c, false, KvLayout::kNHD, {"req-a", "req-y"}),
                        nullptr, nullptr);
  ASSERT_TRUE(report.ok()) << report.status();
  ASSERT_EQ(report->rows.size(), 1u);
  EXPECT_EQ(report->rows[0].request_id, "req-a");
  EXPECT_EQ(report->rows[0].rollout_row, 0);
  EXPECT_EQ(report->rows[0].trainer_row, 0);
  EXPECT_EQ(report->unmatched_rollout, 1);
  EXPECT_EQ(report->unmatched_trainer, 1);
}

TEST(PairsTest, SnapshotsThatCannotBePairedAreRefused) {
  const LogicalCase c = Tokens();
  Snapshot unlabelled = Side(c);
  unlabelled.labels.request_ids.clear();
  absl::StatusOr<PairReport> report =
      ComparePairs(unlabelled, Side(c), nullptr, nullptr);
  EXPECT_EQ(report.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(report.status().message(),
              HasSubstr("labels.request_ids: empty; rows are paired by "
                        "request id (rollout snapshot)"));

  const LogicalCase two = Tokens(8, 2, /*queries=*/2);
  report = ComparePairs(Side(c), Side(two), nullptr, nullptr);
  EXPECT_EQ(report.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(report.status().message(), HasSubstr("query_positions"));
  EXPECT_THAT(report.status().message(), HasSubstr("trainer snapshot"));

  report = ComparePairs(Side(c), Side(Tokens(4, 2)), nullptr, nullptr);
  EXPECT_EQ(report.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(report.status().message(), HasSubstr("engine.out: row shapes"));

  report = ComparePairs(Side(c), Side(Tokens(8, 4)), nullptr, nullptr);
  EXPECT_EQ(report.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(report.status().message(), HasSubstr("k_pages"));

  Snapshot pre = Side(c);
  pre.rope.k_state = RopeState::kPreRope;
  report = ComparePairs(Side(c), pre, nullptr, nullptr);
  EXPECT_THAT(report.status().message(), HasSubstr("rope.k_state"));

  Snapshot pre_q = Side(c);
  pre_q.rope.q_state = RopeState::kPreRope;
  report = ComparePairs(Side(c), pre_q, nullptr, nullptr);
  EXPECT_THAT(report.status().message(), HasSubstr("rope.q_state"));
}

TEST(PairsTest, PreRopeQueriesOnBothSidesAreComparedAsStored) {
  const LogicalCase c = Tokens();
  Snapshot rollout = Side(c, true), trainer = Side(c);
  rollout.rope.q_state = trainer.rope.q_state = RopeState::kPreRope;
  trainer.rope.theta = 500000;  // the rollout's RoPE rotates both
  absl::StatusOr<PairReport> report =
      ComparePairs(rollout, trainer, nullptr, nullptr);
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_THAT(Verdicts(*report), ElementsAre("consistent", "consistent"));
  for (const RowPair& r : report->rows) EXPECT_EQ(r.input_effect, 0);
}

TEST(PairsTest, RowVerdictFollowsTheRules) {
  // Effect within the noise: within-noise however far the inputs are.
  EXPECT_EQ(
      RowVerdict(Verdict::kPass, Verdict::kPass, false, 1e-4, 1e-3, 50, 50, 50),
      PairVerdict::kWithinNoise);
  // Inputs within rounding: within-noise whatever the effect.
  EXPECT_EQ(RowVerdict(Verdict::kPass, Verdict::kPass, false, 1, 1e-3, 3, 3, 3),
            PairVerdict::kWithinNoise);
  EXPECT_EQ(RowVerdict(Verdict::kUnspecified, Verdict::kPass, false, 1, 1e-3, 0,
                       3.5, 0),
            PairVerdict::kStalePrefixKv);
  EXPECT_EQ(RowVerdict(Verdict::kInconclusive, Verdict::kPass, false, 1, 1e-3,
                       0, 3.5, 3.5),
            PairVerdict::kInputsDiffer);
  EXPECT_EQ(RowVerdict(Verdict::kPass, Verdict::kPass, true, 1, 1e-3, 9, 9, 9),
            PairVerdict::kConsistent);
}

}  // namespace
}  // namespace attnaudit
