// Verdicts that cannot be fooled or cheated (docs/NUMERICS.md, "The convex
// hull", "Inconclusive", "Overrides", "Engine precision"): an output no
// attention produces is DRIFT whatever the tolerances; an audit whose honest
// tolerance verifies nothing is INCONCLUSIVE, never PASS; a request's
// overrides are listed; a truncating engine is judged by its declared
// rounding. Engine outputs come from the long-double oracle.
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "core/audit/audit.h"
#include "gtest/gtest.h"
#include "tests/unit/core/testing/attention_oracle.h"
#include "tests/unit/core/testing/snapshot_builder.h"

namespace attnaudit {
namespace testing {
namespace {

// A bf16 decode batch: B rows, GQA 4, D 64, a few hundred keys each.
LogicalCase Bf16Case(int64_t batch, int64_t q_heads, uint64_t seed) {
  RandomCaseOptions o;
  o.batch = batch;
  o.queries = 1;
  o.q_heads = q_heads;
  o.kv_heads = q_heads / 4;
  o.head_dim = 64;
  o.seq_lens.assign(static_cast<size_t>(batch), 0);
  for (int64_t b = 0; b < batch; ++b) o.seq_lens[b] = 150 + 37 * b;
  o.q_dtype = o.kv_dtype = DType::kBF16;
  o.seed = seed;
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

// q scaled by `gain` (rounded to bf16 again): attention as peaked as that.
LogicalCase ScaledQueries(LogicalCase c, double gain) {
  for (double& x : c.q) x = RoundValue(x * gain, DType::kBF16);
  return c;
}

// The engine output `out` (bf16) and the oracle's lse (fp32).
Snapshot WithEngine(const LogicalCase& c, const OracleResult& o,
                    std::vector<double> out) {
  Snapshot s = BuildSnapshot(c, Paging());
  std::vector<double> lse(o.lse_declared.begin(), o.lse_declared.end());
  RoundTo(&lse, DType::kF32);
  s.engine.out = MakeFloatTensor(
      DType::kBF16, {c.batch, c.queries, c.q_heads, c.head_dim}, out);
  s.engine.lse =
      MakeFloatTensor(DType::kF32, {c.batch, c.queries, c.q_heads}, lse);
  return s;
}

// R rounded once to bf16, each element through `narrow`.
template <typename Narrow>
std::vector<double> Narrowed(const OracleResult& o, Narrow narrow) {
  std::vector<double> out(o.out.size());
  for (size_t i = 0; i < out.size(); ++i) {
    out[i] = narrow(static_cast<float>(o.out[i]));
  }
  return out;
}

std::vector<double> RoundedToNearest(const OracleResult& o) {
  return Narrowed(o, [](float x) { return RoundToDType(x, DType::kBF16); });
}

std::vector<double> Truncated(const OracleResult& o) {
  return Narrowed(
      o, [](float x) { return RoundTowardZeroToDType(x, DType::kBF16); });
}

AuditReport MustAudit(const Snapshot& s, const AuditOptions& options = {}) {
  absl::StatusOr<AuditReport> r = RunAudit(s, options);
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? *std::move(r) : AuditReport{};
}

bool AnyContains(const std::vector<std::string>& lines,
                 const std::string& needle) {
  for (const std::string& line : lines) {
    if (line.find(needle) != std::string::npos) return true;
  }
  return false;
}

void DeclareFlashDecoding(Snapshot* s) {
  s->precision.profile = EngineProfile::kFlashDecoding;
}

// q x 1e12: scores near 1e12, far beyond what any tolerance can bound; an
// engine output of 1e4 everywhere is 2,000x the largest |V| and no
// attention produces it. DRIFT by the hull, even with a 1e300 override.
TEST(VerdictIntegrityTest, AnOutputOutsideTheValuesHullDriftsWhatever) {
  const LogicalCase c = ScaledQueries(Bf16Case(2, 8, 3), 1e12);
  const OracleResult o = OracleAttention(c);
  std::vector<double> out(o.out.size(), 1e4);
  Snapshot s = WithEngine(c, o, out);
  for (const double override_out : {0.0, 1e300}) {
    AuditOptions options;
    options.tolerances.out_abs = override_out;
    const AuditReport r = MustAudit(s, options);
    EXPECT_EQ(r.verdict, Verdict::kDrift) << override_out;
    ASSERT_TRUE(r.hull.present);
    EXPECT_EQ(r.hull.outside, static_cast<int64_t>(out.size()));
    EXPECT_EQ(r.hull.worst_value, RoundValue(1e4, DType::kBF16));
    EXPECT_LT(r.hull.worst_high, 10.0);  // |V| of N(0, 1) values, widened
    const ComparisonResult* er = r.Find(Comparison::kEngineVsReference);
    ASSERT_NE(er, nullptr);
    EXPECT_EQ(er->verdict, Verdict::kDrift);
    EXPECT_TRUE(AnyContains(er->reasons, "convex hull")) << override_out;
  }
}

// The engine's own output, rounded to bf16, is inside the hull wherever it
// is: the check reads no V (every output within the slack of R) and finds
// nothing.
TEST(VerdictIntegrityTest, ACorrectOutputIsInsideTheHull) {
  const LogicalCase c = Bf16Case(2, 8, 4);
  const OracleResult o = OracleAttention(c);
  const AuditReport r = MustAudit(WithEngine(c, o, RoundedToNearest(o)));
  ASSERT_TRUE(r.hull.present);
  EXPECT_EQ(r.hull.outside, 0);
  EXPECT_EQ(r.hull.checked, static_cast<int64_t>(o.out.size()));
}

// Outputs just inside and just outside one dimension's hull: the bound is
// the visible V values' least and largest (sinks add 0).
TEST(VerdictIntegrityTest, TheHullIsTheVisibleValuesRangePerDimension) {
  LogicalCase c = Bf16Case(1, 4, 5);
  // Every V value of dimension 0 in [0.5, 1]: a 0 there is impossible
  // without a sink and possible with one.
  for (int64_t j = 0; j < c.SeqLen(0); ++j) {
    for (int64_t g = 0; g < c.kv_heads; ++g) {
      double& v = c.v[0][(j * c.kv_heads + g) * c.head_dim];
      v = RoundValue(0.5 + 0.5 * std::fabs(std::sin(j + g)), DType::kBF16);
    }
  }
  const OracleResult o = OracleAttention(c);
  std::vector<double> out = RoundedToNearest(o);
  out[0] = 0.0;  // b 0, s 0, h 0, d 0
  const AuditReport without_sink = MustAudit(WithEngine(c, o, out));
  EXPECT_EQ(without_sink.verdict, Verdict::kDrift);
  EXPECT_EQ(without_sink.hull.outside, 1);
  EXPECT_EQ(without_sink.hull.worst.head, 0);
  EXPECT_EQ(without_sink.hull.worst.dim, 0);

  LogicalCase sunk = c;
  sunk.sinks.assign(static_cast<size_t>(c.q_heads), -30.0f);  // no weight
  const OracleResult os = OracleAttention(sunk);
  std::vector<double> out_sunk = RoundedToNearest(os);
  out_sunk[0] = 0.0;
  const AuditReport with_sink = MustAudit(WithEngine(sunk, os, out_sunk));
  EXPECT_EQ(with_sink.hull.outside, 0);  // 0 is in the hull with a sink
}

// q x 1e6: attention is one-hot and the scores are ~1e6, where a correct
// fp32 engine's scores may be off by more than a nat. An all-zero output
// is inside the hull and inside the tolerance: INCONCLUSIVE, never PASS.
TEST(VerdictIntegrityTest, AnUnverifiableAuditIsInconclusive) {
  const LogicalCase c = ScaledQueries(Bf16Case(2, 8, 6), 1e6);
  const OracleResult o = OracleAttention(c);
  Snapshot s = WithEngine(c, o, std::vector<double>(o.out.size(), 0.0));
  DeclareFlashDecoding(&s);
  const AuditReport r = MustAudit(s);
  EXPECT_EQ(r.verdict, Verdict::kInconclusive);
  EXPECT_EQ(r.Find(Comparison::kEngineVsReference)->verdict,
            Verdict::kInconclusive);
  EXPECT_TRUE(AnyContains(r.inconclusive_reasons, "E-R scores"));
  EXPECT_TRUE(AnyContains(r.inconclusive_reasons, "all-zero output"));
}

// A stale-page-sized error on one head: DRIFT under the policy. A 1e300
// out override (and the statistical test off) cannot make it PASS: the
// tolerance would pass an all-zero output, so INCONCLUSIVE, and the report
// lists what the request overrode.
TEST(VerdictIntegrityTest, OverridesCannotTurnADriftIntoAPass) {
  const LogicalCase c = Bf16Case(2, 8, 7);
  const OracleResult o = OracleAttention(c);
  std::vector<double> out = RoundedToNearest(o);
  for (int64_t i = 0; i < c.head_dim; ++i) {
    out[2 * c.head_dim + i] =
        RoundValue(out[2 * c.head_dim + i] * 1.2 + 0.02, DType::kBF16);
  }
  Snapshot s = WithEngine(c, o, out);
  DeclareFlashDecoding(&s);
  const AuditReport policy = MustAudit(s);
  EXPECT_EQ(policy.verdict, Verdict::kDrift);
  EXPECT_TRUE(policy.overrides.empty());
  AuditOptions cheat;
  cheat.tolerances.out_abs = 1e300;
  cheat.statistical_test = false;
  EXPECT_TRUE(OverridesPolicy(s, cheat));
  EXPECT_FALSE(OverridesPolicy(s, AuditOptions{}));
  const AuditReport r = MustAudit(s, cheat);
  EXPECT_EQ(r.verdict, Verdict::kInconclusive);
  EXPECT_TRUE(AnyContains(r.overrides, "tolerances.out_abs 1e+300"));
  EXPECT_TRUE(AnyContains(r.overrides, "statistical_test off"));
}

// Precision fields past every profile's range are overrides too.
TEST(VerdictIntegrityTest, PrecisionPastEveryProfileIsAnOverride) {
  const LogicalCase c = Bf16Case(1, 4, 8);
  const OracleResult o = OracleAttention(c);
  Snapshot s = WithEngine(c, o, RoundedToNearest(o));
  s.precision.profile = EngineProfile::kFlashDecoding;
  s.precision.exp_ulps = 1 << 20;
  s.precision.score_dtype = DType::kF8E4M3;
  EXPECT_TRUE(OverridesPolicy(s, AuditOptions{}));
  const AuditReport r = MustAudit(s);
  EXPECT_TRUE(AnyContains(r.overrides, "precision.exp_ulps 1048576"));
  EXPECT_TRUE(AnyContains(r.overrides, "precision.score_dtype fp8_e4m3"));
}

// vLLM's CPU kernels without AVX512_BF16 truncate their bf16 output: every
// element half an ulp smaller on average. Over 4 x 32 (row, head) cells
// the bias test sees it when the profile assumes rounding to nearest; the
// declared truncation, or no declaration at all (either rounding), PASS.
TEST(VerdictIntegrityTest, ATruncatingEngineIsJudgedByItsDeclaredRounding) {
  const LogicalCase c = Bf16Case(4, 32, 9);
  const OracleResult o = OracleAttention(c);
  Snapshot s = WithEngine(c, o, Truncated(o));
  s.precision.profile = EngineProfile::kVllmCpu;
  const AuditReport nearest = MustAudit(s);
  EXPECT_EQ(nearest.verdict, Verdict::kDrift);
  const ComparisonResult* er = nearest.Find(Comparison::kEngineVsReference);
  ASSERT_NE(er, nullptr);
  EXPECT_EQ(er->out.over_tolerance, 0);  // only the distribution shows it
  EXPECT_TRUE(AnyContains(er->reasons, "statistical"));

  s.precision.output_rounding = Rounding::kTowardZero;
  const AuditReport declared = MustAudit(s);
  EXPECT_EQ(declared.verdict, Verdict::kPass);
  for (const ComparisonResult& cr : declared.comparisons) {
    for (const std::string& reason : cr.reasons) ADD_FAILURE() << reason;
  }
  EXPECT_EQ(declared.provenance.precision_source, "declared");

  s.precision = EnginePrecision{};
  const AuditReport undeclared = MustAudit(s);
  EXPECT_EQ(undeclared.verdict, Verdict::kPass);
  EXPECT_EQ(undeclared.provenance.precision_source, "undeclared");
  EXPECT_TRUE(
      AnyContains(undeclared.provenance.sensitivity, "undeclared engine"));
}

// The declaration's source and evidence reach the report as sent.
TEST(VerdictIntegrityTest, TheReportSaysWhereThePrecisionCameFrom) {
  const LogicalCase c = Bf16Case(1, 4, 10);
  const OracleResult o = OracleAttention(c);
  Snapshot s = WithEngine(c, o, RoundedToNearest(o));
  s.precision.profile = EngineProfile::kVllmCpu;
  s.precision.source = PrecisionSource::kMeasured;
  s.precision.evidence = "probe: output truncated in 512 of 512 cases";
  const AuditReport r = MustAudit(s);
  EXPECT_EQ(r.provenance.precision_source, "measured");
  EXPECT_EQ(r.provenance.precision_evidence, s.precision.evidence);
  EXPECT_TRUE(r.provenance.sensitivity.empty());
}

}  // namespace
}  // namespace testing
}  // namespace attnaudit
