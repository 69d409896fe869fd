// The RL-Kernel harness acceptance cases (docs/RL_KERNEL_HARNESS.md,
// "Acceptance cases") that need the whole pipeline: selected-token log-prob
// drift (case 1), the prefix-cache fingerprint (3, 10, 14, 15, 16) and the
// rejection of finite inputs that overflow attention (9). Adapted to our
// layout; case numbers are the table's.
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "core/audit/audit.h"
#include "core/fingerprint/fingerprint.h"
#include "core/validate/validate.h"
#include "gtest/gtest.h"
#include "tests/unit/core/testing/snapshot_builder.h"

namespace attnaudit {
namespace testing {
namespace {

// The harness fixture with its log-prob inputs: lm_head [11, Hq*D = 32],
// ids [[1,2],[3,4]], active mask [[T,T],[F,T]], theta 1e6.
Snapshot FixtureSnapshot(std::vector<int32_t> page_order = {0, 1, 2},
                         int64_t offset = 0) {
  LogicalCase c = SeedFixture(offset);
  c.rope.theta = 1e6;
  Snapshot s = BuildSnapshot(c, SeedFixturePaging(page_order));
  TestRng rng(18);
  std::vector<double> w(11 * 32);
  for (double& x : w) x = static_cast<float>(rng.Normal());
  s.lm_head = MakeFloatTensor(DType::kF32, {11, 32}, w);
  s.selected_token_ids = MakeIntTensor(DType::kI64, {2, 2}, {1, 2, 3, 4});
  s.active_mask = MakeBoolTensor({2, 2}, {true, true, false, true});
  return s;
}

// Enables the prefix cache (key "shared-prefix", 4 tokens) with the
// fingerprint recomputed after key, length and flag are set, as the
// harness fixture does.
void EnablePrefix(Snapshot* s) {
  s->prefix.enabled = true;
  s->prefix.key = "shared-prefix";
  s->prefix.length = 4;
  s->prefix.fingerprint = std::string(64, '0');  // placeholder, valid form
  const absl::StatusOr<ResolvedLayout> layout = ValidateSnapshot(*s);
  ASSERT_TRUE(layout.ok()) << layout.status();
  const absl::StatusOr<std::string> fp = PrefixFingerprint(*s, *layout, 4);
  ASSERT_TRUE(fp.ok()) << fp.status();
  s->prefix.fingerprint = *fp;
}

AuditReport MustAudit(const Snapshot& s) {
  absl::StatusOr<AuditReport> r = RunAudit(s, AuditOptions{});
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? *std::move(r) : AuditReport{};
}

void ExpectInvalidNaming(const Snapshot& s, const std::string& field) {
  const AuditReport r = MustAudit(s);
  EXPECT_EQ(r.verdict, Verdict::kInvalid);
  EXPECT_NE(r.invalid_reason.find(field), std::string::npos)
      << r.invalid_reason;
}

// Case 1: P vs R out and lse <= 1e-6, selected log-prob drift <= 3e-6 over
// the 3 active tokens; provenance as in the harness. Then Sq = 1.
TEST(SeedPipelineTest, Case01ReplayVsReferenceWithLogprobs) {
  const AuditReport r = MustAudit(FixtureSnapshot());
  EXPECT_EQ(r.verdict, Verdict::kPass) << r.invalid_reason;
  const ComparisonResult* pr = r.Find(Comparison::kReplayVsReference);
  ASSERT_NE(pr, nullptr);
  EXPECT_LE(pr->out.max_abs, 1e-6);
  EXPECT_LE(pr->lse.max_abs, 1e-6);
  ASSERT_TRUE(pr->has_logprob);
  EXPECT_EQ(pr->logprob.count, 3);
  EXPECT_LE(pr->logprob.max_abs, 3e-6);
  EXPECT_EQ(pr->logprob_agreement.count, 3);
  using Orders = std::vector<std::vector<std::vector<int32_t>>>;
  EXPECT_EQ(r.provenance.merge_orders,
            (Orders{{{0, 1, 2}, {0, 1, 2}}, {{0, 1, 2}, {0, 1, 2}}}));
  EXPECT_EQ(r.provenance.block_owners,
            (std::vector<std::vector<int32_t>>{{0, 1, 0}, {0, 1, 0}}));
  EXPECT_NEAR(r.provenance.softmax_scale, 1 / std::sqrt(8.0), 1e-15);
  EXPECT_EQ(r.provenance.output_dtype, DType::kF32);
  EXPECT_EQ(r.provenance.max_merged_blocks, 3);
  EXPECT_FALSE(r.provenance.rope_fingerprint.empty());

  // Sq = 1: the last query of each row only.
  LogicalCase c = SeedFixture();
  LogicalCase last = c;
  last.queries = 1;
  last.q.clear();
  const int64_t per_q = c.q_heads * c.head_dim;
  for (int64_t b = 0; b < 2; ++b) {
    const auto first = c.q.begin() + (b * 2 + 1) * per_q;
    last.q.insert(last.q.end(), first, first + per_q);
  }
  last.query_positions = {5, 5};
  const AuditReport single =
      MustAudit(BuildSnapshot(last, SeedFixturePaging()));
  const ComparisonResult* sp = single.Find(Comparison::kReplayVsReference);
  ASSERT_NE(sp, nullptr);
  EXPECT_EQ(single.verdict, Verdict::kPass);
  EXPECT_LE(sp->out.max_abs, 1e-6);
  EXPECT_LE(sp->lse.max_abs, 1e-6);
}

// Case 3: contiguous vs permuted pages with the prefix enabled: same
// results, same (recomputed and declared) prefix fingerprint.
TEST(SeedPipelineTest, Case03PrefixAndPageLayoutInvariance) {
  Snapshot a = FixtureSnapshot({0, 1, 2});
  Snapshot b = FixtureSnapshot({2, 0, 1});
  EnablePrefix(&a);
  EnablePrefix(&b);
  EXPECT_EQ(a.prefix.fingerprint, b.prefix.fingerprint);
  const AuditReport ra = MustAudit(a), rb = MustAudit(b);
  EXPECT_EQ(ra.verdict, Verdict::kPass) << ra.invalid_reason;
  EXPECT_EQ(rb.verdict, Verdict::kPass) << rb.invalid_reason;
  EXPECT_EQ(ra.provenance.prefix_fingerprint, a.prefix.fingerprint);
  EXPECT_EQ(rb.provenance.prefix_fingerprint, a.prefix.fingerprint);
  const ComparisonResult* pa = ra.Find(Comparison::kReplayVsReference);
  const ComparisonResult* pb = rb.Find(Comparison::kReplayVsReference);
  ASSERT_NE(pa, nullptr);
  ASSERT_NE(pb, nullptr);
  EXPECT_EQ(pa->out.max_abs, pb->out.max_abs);
  EXPECT_EQ(pa->lse.max_abs, pb->lse.max_abs);
}

// Case 9: q filled with FLT_MAX is finite input, but its attention
// overflows: INVALID, saying so.
TEST(SeedPipelineTest, Case09FiniteInputsThatOverflowAttentionAreInvalid) {
  Snapshot s = FixtureSnapshot();
  std::vector<double> q(static_cast<size_t>(s.q.num_elements()), FLT_MAX);
  s.q = MakeFloatTensor(DType::kF32, s.q.shape(), q);
  ExpectInvalidNaming(s, "non-finite");
}

// Case 10: a different prefix key no longer matches the fingerprint.
TEST(SeedPipelineTest, Case10PrefixKeyDriftIsInvalid) {
  Snapshot s = FixtureSnapshot();
  EnablePrefix(&s);
  ASSERT_EQ(MustAudit(s).verdict, Verdict::kPass);
  s.prefix.key = "different-prefix";
  ExpectInvalidNaming(s, "prefix.fingerprint");
}

// Case 14: stale prefix content (one K value of the first prefix token).
TEST(SeedPipelineTest, Case14StalePrefixContentIsInvalid) {
  Snapshot s = FixtureSnapshot();
  EnablePrefix(&s);
  // Logical token 0 of row 0 is slot 0 of page 0 (NHD, head 0, dim 0).
  float* k = s.k_pages.mutable_data<float>();
  k[0] += 1.0f;
  ExpectInvalidNaming(s, "prefix.fingerprint");
}

// Case 15: the RoPE theta is part of the prefix identity.
TEST(SeedPipelineTest, Case15PrefixThetaDriftIsInvalid) {
  Snapshot s = FixtureSnapshot();
  EnablePrefix(&s);
  s.rope.theta = 10000;
  ExpectInvalidNaming(s, "prefix.fingerprint");
}

// Case 16: so is the K/V storage dtype (here both cast to bf16, since our
// validation requires K and V to share a dtype).
TEST(SeedPipelineTest, Case16PrefixStorageDtypeDriftIsInvalid) {
  Snapshot s = FixtureSnapshot();
  EnablePrefix(&s);
  for (Tensor* t : {&s.k_pages, &s.v_pages}) {
    std::vector<double> values = ToDoubles(*t);
    RoundTo(&values, DType::kBF16);
    *t = MakeFloatTensor(DType::kBF16, t->shape(), values);
  }
  ExpectInvalidNaming(s, "prefix.fingerprint");
}

}  // namespace
}  // namespace testing
}  // namespace attnaudit
