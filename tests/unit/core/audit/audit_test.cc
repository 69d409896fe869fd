// The audit pipeline (RunAudit / AuditSnapshot) end to end: engine outputs
// built from the independent long-double oracle, then clean, perturbed,
// base-2 and invalid snapshots, cancellation and stage reporting.
#include "core/audit/audit.h"

#include <atomic>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "core/validate/validate.h"
#include "gtest/gtest.h"
#include "tests/unit/core/testing/attention_oracle.h"
#include "tests/unit/core/testing/snapshot_builder.h"

namespace attnaudit {
namespace testing {
namespace {

constexpr double kLn2 = 0.693147180559945309417232121458176568;

// A bf16 decode batch: GQA 4, D 64, two rows with partial last pages,
// permuted pages, gaps, an offset; two queries per row.
LogicalCase Bf16Case() {
  RandomCaseOptions o;
  o.batch = 2;
  o.queries = 2;
  o.q_heads = 8;
  o.kv_heads = 2;
  o.head_dim = 64;
  o.seq_lens = {200, 77};
  o.position_offset = 4096;
  o.max_gap = 1;
  o.spread_queries = true;
  o.q_dtype = o.kv_dtype = DType::kBF16;
  o.seed = 77;
  LogicalCase c = RandomCase(o);
  c.output_dtype = DType::kBF16;
  return c;
}

PagingOptions Paging() {
  PagingOptions p;
  p.page_size = 16;
  p.permute_pages = true;
  return p;
}

// The engine's view: out rounded once to bf16 and lse in fp32, from the
// oracle (what a perfectly accurate engine would have written).
Snapshot WithEngine(const LogicalCase& c, const OracleResult& o,
                    LseBase base = LseBase::kE) {
  Snapshot s = BuildSnapshot(c, Paging());
  std::vector<double> out(o.out.begin(), o.out.end());
  RoundTo(&out, DType::kBF16);
  std::vector<double> lse(o.lse_declared.size());
  for (size_t i = 0; i < lse.size(); ++i) {
    const double l = static_cast<double>(o.lse_declared[i]);
    lse[i] = static_cast<float>(base == LseBase::k2 ? l / kLn2 : l);
  }
  s.engine.out = MakeFloatTensor(
      DType::kBF16, {c.batch, c.queries, c.q_heads, c.head_dim}, out);
  s.engine.lse =
      MakeFloatTensor(DType::kF32, {c.batch, c.queries, c.q_heads}, lse);
  s.engine.lse_base = base;
  return s;
}

AuditReport MustAudit(const Snapshot& s, const AuditOptions& options = {}) {
  absl::StatusOr<AuditReport> r = RunAudit(s, options);
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? *std::move(r) : AuditReport{};
}

TEST(AuditTest, EngineEqualToTheReferenceRoundedToBf16Passes) {
  const LogicalCase c = Bf16Case();
  const OracleResult o = OracleAttention(c);
  const AuditReport report = MustAudit(WithEngine(c, o));
  EXPECT_EQ(report.verdict, Verdict::kPass) << report.invalid_reason;
  ASSERT_EQ(report.comparisons.size(), 3u);
  for (Comparison which :
       {Comparison::kEngineVsReference, Comparison::kReplayVsReference,
        Comparison::kEngineVsReplay}) {
    const ComparisonResult* r = report.Find(which);
    ASSERT_NE(r, nullptr) << ComparisonName(which);
    EXPECT_EQ(r->verdict, Verdict::kPass) << ComparisonName(which);
    for (const std::string& reason : r->reasons) ADD_FAILURE() << reason;
    EXPECT_TRUE(r->has_out);
    EXPECT_TRUE(r->has_lse);
    EXPECT_EQ(r->out.count, c.batch * c.queries * c.q_heads * c.head_dim);
    EXPECT_EQ(r->out.nonfinite_mismatch, 0);
  }
  // E is R rounded once to bf16: within half a bf16 ulp of R everywhere.
  const ComparisonResult* er = report.Find(Comparison::kEngineVsReference);
  EXPECT_LE(er->out.max_abs,
            HalfUlp(static_cast<double>(o.max_abs_out), DType::kBF16) * 1.0001);
  EXPECT_LE(er->out.max_ulp, 1.0);  // same bf16 value (or a midpoint)
  // Report metadata.
  EXPECT_EQ(report.dims.batch, 2);
  EXPECT_EQ(report.dims.head_dim, 64);
  EXPECT_EQ(report.provenance.output_dtype, DType::kBF16);
  EXPECT_DOUBLE_EQ(report.provenance.softmax_scale, 1.0 / 8.0);
  EXPECT_EQ(report.provenance.merge_orders, OracleMergeOrders(c, 16));
  EXPECT_EQ(report.provenance.max_merged_blocks, 13);  // ceil(200 / 16)
}

TEST(AuditTest, OnePerturbedHeadDriftsWithTheWorstLocationOnThatHead) {
  const LogicalCase c = Bf16Case();
  const OracleResult o = OracleAttention(c);
  Snapshot s = WithEngine(c, o);
  const int64_t bad_head = 5;
  std::vector<double> out = ToDoubles(s.engine.out);
  for (int64_t bs = 0; bs < c.batch * c.queries; ++bs) {
    for (int64_t i = 0; i < c.head_dim; ++i) {
      double& x = out[(bs * c.q_heads + bad_head) * c.head_dim + i];
      x = RoundToDType(static_cast<float>(x * 1.05 + 0.01), DType::kBF16);
    }
  }
  s.engine.out = MakeFloatTensor(DType::kBF16, s.engine.out.shape(), out);
  // Declared: undeclared, the widest envelope (16-bit scores) would let a
  // 5 % error on one head pass.
  s.precision.profile = EngineProfile::kFlashDecoding;
  const AuditReport report = MustAudit(s);
  EXPECT_EQ(report.verdict, Verdict::kDrift);
  for (Comparison which :
       {Comparison::kEngineVsReference, Comparison::kEngineVsReplay}) {
    const ComparisonResult* r = report.Find(which);
    ASSERT_NE(r, nullptr);
    EXPECT_EQ(r->verdict, Verdict::kDrift) << ComparisonName(which);
    EXPECT_FALSE(r->reasons.empty());
    EXPECT_EQ(r->out.worst.head, bad_head) << ComparisonName(which);
    ASSERT_FALSE(r->worst_heads.empty());
    EXPECT_EQ(r->worst_heads[0].head, bad_head);
    // Only that head's elements can be over tolerance.
    EXPECT_GT(r->out.over_tolerance, 0);
    EXPECT_LE(r->out.over_tolerance, c.batch * c.queries * c.head_dim);
    EXPECT_EQ(r->lse.over_tolerance, 0);  // lse untouched
  }
  EXPECT_EQ(report.Find(Comparison::kReplayVsReference)->verdict,
            Verdict::kPass);
}

// An engine LSE in base 2, declared as such, is converted at the edge and
// passes; the same numbers declared natural-log (the log2-vs-ln mix-up)
// drift on the LSE only.
TEST(AuditTest, LseBaseTwoIsConvertedAtTheEdge) {
  const LogicalCase c = Bf16Case();
  const OracleResult o = OracleAttention(c);
  const Snapshot declared = WithEngine(c, o, LseBase::k2);
  const AuditReport good = MustAudit(declared);
  EXPECT_EQ(good.verdict, Verdict::kPass);
  EXPECT_EQ(good.Find(Comparison::kEngineVsReference)->verdict, Verdict::kPass);

  Snapshot mislabelled = declared;
  mislabelled.engine.lse_base = LseBase::kE;
  const AuditReport bad = MustAudit(mislabelled);
  EXPECT_EQ(bad.verdict, Verdict::kDrift);
  const ComparisonResult* er = bad.Find(Comparison::kEngineVsReference);
  ASSERT_NE(er, nullptr);
  EXPECT_EQ(er->verdict, Verdict::kDrift);
  EXPECT_GT(er->lse.over_tolerance, 0);
  EXPECT_EQ(er->out.over_tolerance, 0);
  // The drift is exactly the ln 2 ratio: lse2 - lse = lse (1/ln2 - 1).
  const double want = std::fabs(er->lse.worst_baseline) * (1 / kLn2 - 1);
  EXPECT_NEAR(er->lse.max_abs, want, 1e-5 * want);
}

TEST(AuditTest, InvalidSnapshotGivesAnInvalidVerdictNamingTheField) {
  const LogicalCase c = Bf16Case();
  Snapshot s = BuildSnapshot(c, Paging());
  // Row 1 has ceil(77 / 16) = 5 blocks; point its third at a missing page.
  ASSERT_EQ(s.block_table.dtype(), DType::kI64);
  const int64_t m = s.block_table.dim(1);
  s.block_table.mutable_data<int64_t>()[1 * m + 2] = 999;
  const AuditReport report = MustAudit(s);
  EXPECT_EQ(report.verdict, Verdict::kInvalid);
  EXPECT_EQ(report.invalid_reason.rfind("block_table[1][2]", 0), 0u)
      << report.invalid_reason;
  EXPECT_TRUE(report.comparisons.empty());
  EXPECT_EQ(report.dims.batch, 2);  // shapes still reported

  const absl::StatusOr<AuditReport> status = AuditSnapshot(s, {});
  ASSERT_FALSE(status.ok());
  EXPECT_EQ(status.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(std::string(status.status().message()), report.invalid_reason);
}

// K/V values are checked finite by the fused pass, not by a separate scan;
// the message must still be validation's, naming the first bad element in
// memory order (K before V), whatever the threads did.
TEST(AuditTest, NonFiniteKvFoundByTheFusedPassIsNamedLikeValidation) {
  const LogicalCase c = Bf16Case();
  const Snapshot clean = BuildSnapshot(c, Paging());
  ASSERT_TRUE(ValidateSnapshot(clean).ok());
  struct Poison {
    bool k;
    int64_t element;
  };
  const int64_t row = clean.k_pages.num_elements() / clean.k_pages.dim(0) /
                      clean.k_pages.dim(1);  // Hkv * D: one slot
  // An active slot: the first slot of the page holding row 0's block 0.
  const ResolvedLayout layout = *ValidateSnapshot(clean);
  const int64_t page = layout.block_pages[0][0];
  const int64_t slot0 = page * clean.k_pages.dim(1) * row;
  for (const Poison& poison :
       {Poison{true, slot0 + 5}, Poison{false, slot0 + 7},
        Poison{true, slot0 + row + 3}}) {
    Snapshot s = clean;
    Tensor& t = poison.k ? s.k_pages : s.v_pages;
    t.mutable_data<uint16_t>()[poison.element] = 0x7fc0;  // bf16 NaN
    if (poison.k) {  // and a second, later bad value in V: K must win
      s.v_pages.mutable_data<uint16_t>()[slot0 + 1] = 0x7f80;  // +inf
    }
    const absl::Status want = ValidateSnapshot(s).status();
    ASSERT_FALSE(want.ok());
    for (int threads : {1, 2, 4}) {
      AuditOptions options;
      options.threads = threads;
      const absl::StatusOr<AuditReport> got = AuditSnapshot(s, options);
      ASSERT_FALSE(got.ok());
      EXPECT_EQ(got.status(), want) << threads << " threads";
    }
  }
}

TEST(AuditTest, NonFiniteValuesInInactiveSlotsAreNotRead) {
  Snapshot s = BuildSnapshot(Bf16Case(), Paging());
  const ResolvedLayout layout = *ValidateSnapshot(s);
  // Row 1 holds 77 tokens: its fifth block uses slots 0..12 of 16.
  const int64_t page = layout.block_pages[1][4];
  const int64_t row =
      s.k_pages.num_elements() / s.k_pages.dim(0) / s.k_pages.dim(1);
  const int64_t slot14 = (page * s.k_pages.dim(1) + 14) * row;
  s.k_pages.mutable_data<uint16_t>()[slot14 + 2] = 0x7fc0;
  s.v_pages.mutable_data<uint16_t>()[slot14 + 9] = 0xff80;
  ASSERT_TRUE(ValidateSnapshot(s).ok());
  const absl::StatusOr<AuditReport> report = AuditSnapshot(s, {});
  ASSERT_TRUE(report.ok()) << report.status();
}

TEST(AuditTest, CancellationIsReportedAsCancelled) {
  const Snapshot s = BuildSnapshot(Bf16Case(), Paging());
  std::atomic<bool> cancelled{true};
  AuditOptions options;
  options.cancelled = &cancelled;
  for (const auto& result : {RunAudit(s, options), AuditSnapshot(s, options)}) {
    ASSERT_FALSE(result.ok());
    EXPECT_EQ(result.status().code(), absl::StatusCode::kCancelled);
  }
  cancelled = false;
  EXPECT_TRUE(RunAudit(s, options).ok());
}

TEST(AuditTest, ComparisonsFollowTheOptionsAndTheEngineOutputs) {
  const LogicalCase c = Bf16Case();
  // No engine output: only the replay consistency check.
  const AuditReport replay_only = MustAudit(BuildSnapshot(c, Paging()));
  ASSERT_EQ(replay_only.comparisons.size(), 1u);
  EXPECT_EQ(replay_only.comparisons[0].comparison,
            Comparison::kReplayVsReference);
  EXPECT_EQ(replay_only.verdict, Verdict::kPass);

  AuditOptions options;
  options.engine_vs_replay = false;
  options.include_merge_orders = false;
  std::vector<std::string> stages;
  options.on_stage = [&](const char* stage, double seconds) {
    EXPECT_GE(seconds, 0.0);
    stages.push_back(stage);
  };
  const AuditReport r = MustAudit(WithEngine(c, OracleAttention(c)), options);
  ASSERT_EQ(r.comparisons.size(), 2u);
  EXPECT_EQ(r.Find(Comparison::kEngineVsReplay), nullptr);
  EXPECT_TRUE(r.provenance.merge_orders.empty());
  EXPECT_EQ(stages, (std::vector<std::string>{"validate", "reference", "replay",
                                              "compare"}));
}

// The comparisons run concurrently on the CPU backend; the report lists
// them in one order (E-R, P-R, E-P) with the same figures, whatever the
// thread count.
TEST(AuditTest, ComparisonsComeInOneOrderWithTheSameFiguresForAnyThreads) {
  const LogicalCase c = Bf16Case();
  const Snapshot s = WithEngine(c, OracleAttention(c));
  AuditOptions options;
  options.threads = 1;
  const AuditReport serial = MustAudit(s, options);
  ASSERT_EQ(serial.comparisons.size(), 3u);
  const Comparison order[] = {Comparison::kEngineVsReference,
                              Comparison::kReplayVsReference,
                              Comparison::kEngineVsReplay};
  for (int threads : {2, 3, 8}) {
    options.threads = threads;
    const AuditReport r = MustAudit(s, options);
    ASSERT_EQ(r.comparisons.size(), 3u) << threads;
    EXPECT_EQ(r.verdict, serial.verdict);
    for (size_t i = 0; i < 3; ++i) {
      const ComparisonResult& got = r.comparisons[i];
      const ComparisonResult& want = serial.comparisons[i];
      EXPECT_EQ(got.comparison, order[i]) << threads;
      EXPECT_EQ(got.verdict, want.verdict) << threads;
      EXPECT_EQ(got.out.max_abs, want.out.max_abs) << threads;
      EXPECT_EQ(got.out.p99_abs, want.out.p99_abs) << threads;
      EXPECT_EQ(got.out.max_ulp, want.out.max_ulp) << threads;
      EXPECT_EQ(got.lse.max_abs, want.lse.max_abs) << threads;
      EXPECT_EQ(got.statistical.computed, want.statistical.computed);
      EXPECT_EQ(got.worst_heads.size(), want.worst_heads.size());
    }
  }
  EXPECT_GT(serial.comparisons[1].out.count, 0);
}

}  // namespace
}  // namespace testing
}  // namespace attnaudit
