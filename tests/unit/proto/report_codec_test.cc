// Audit options, limits and report codecs: round trips of every field, wire
// defaults, and rejection of unknown enum values by field path.
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "proto/codec/codec.h"
#include "tests/unit/proto/codec_test_util.h"

namespace attnaudit {
namespace {

using testing::ExpectReportEq;
using testing::FullReport;

TEST(AuditOptionsCodecTest, EmptyMessageMeansDefaults) {
  AuditOptions options;
  options.engine_vs_reference = false;
  options.threads = 3;  // server-side: must survive
  options.include_merge_orders = false;
  options.worst_heads = 9;
  ASSERT_TRUE(AuditOptionsFromProto(v1::AuditOptions(), &options).ok());
  EXPECT_TRUE(options.engine_vs_reference);
  EXPECT_TRUE(options.replay_vs_reference);
  EXPECT_TRUE(options.engine_vs_replay);
  EXPECT_TRUE(options.include_merge_orders);
  EXPECT_FALSE(options.compute_kv_fingerprint);
  EXPECT_EQ(options.worst_heads, 4);
  EXPECT_EQ(options.cp_strategy, CpStrategy::kAuto);
  EXPECT_EQ(options.tolerances.out_abs, 0);
  EXPECT_EQ(options.threads, 3);
  EXPECT_TRUE(options.statistical_test);
  EXPECT_TRUE(options.diagnose);
  EXPECT_EQ(options.diagnosis_max_seconds,
            AuditOptions().diagnosis_max_seconds);
}

TEST(AuditOptionsCodecTest, RoundTrip) {
  AuditOptions options;
  options.engine_vs_reference = true;
  options.replay_vs_reference = false;
  options.engine_vs_replay = true;
  options.engine_vs_emulation = false;
  options.tolerances = ToleranceOverrides{1e-3, 2e-4, 5e-2};
  options.cp_strategy = CpStrategy::kPartials;
  options.include_merge_orders = false;
  options.compute_kv_fingerprint = true;
  options.worst_heads = 0;
  options.statistical_test = false;
  options.diagnose = false;
  options.diagnosis_max_seconds = 2.5;

  v1::AuditOptions msg;
  AuditOptionsToProto(options, &msg);
  ASSERT_EQ(msg.comparisons_size(), 2);
  EXPECT_EQ(msg.comparisons(0), v1::COMPARISON_ENGINE_VS_REFERENCE);
  EXPECT_EQ(msg.comparisons(1), v1::COMPARISON_ENGINE_VS_REPLAY);

  absl::StatusOr<AuditOptions> decoded = AuditOptionsFromProto(msg);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_TRUE(decoded->engine_vs_reference);
  EXPECT_FALSE(decoded->replay_vs_reference);
  EXPECT_TRUE(decoded->engine_vs_replay);
  EXPECT_FALSE(decoded->engine_vs_emulation);
  EXPECT_EQ(decoded->tolerances.out_abs, 1e-3);
  EXPECT_EQ(decoded->tolerances.lse_abs, 2e-4);
  EXPECT_EQ(decoded->tolerances.logprob_abs, 5e-2);
  EXPECT_EQ(decoded->cp_strategy, CpStrategy::kPartials);
  EXPECT_FALSE(decoded->include_merge_orders);
  EXPECT_TRUE(decoded->compute_kv_fingerprint);
  EXPECT_EQ(decoded->worst_heads, 0);  // explicit 0 is "none", not default
  EXPECT_FALSE(decoded->statistical_test);
  EXPECT_FALSE(decoded->diagnose);
  EXPECT_EQ(decoded->diagnosis_max_seconds, 2.5);
}

TEST(AuditOptionsCodecTest, RejectsBadValuesAndLeavesOptionsUntouched) {
  struct Case {
    const char* prefix;
    std::function<void(v1::AuditOptions*)> corrupt;
  };
  const std::vector<Case> cases = {
      {"comparisons[1]: unknown value 8",
       [](v1::AuditOptions* m) {
         m->add_comparisons(v1::COMPARISON_ENGINE_VS_REFERENCE);
         m->add_comparisons(static_cast<v1::Comparison>(8));
       }},
      {"comparisons[0]: unspecified",
       [](v1::AuditOptions* m) {
         m->add_comparisons(v1::COMPARISON_UNSPECIFIED);
       }},
      {"cp_strategy: unknown value 3",
       [](v1::AuditOptions* m) {
         m->set_cp_strategy(static_cast<v1::CpStrategy>(3));
       }},
      {"worst_heads: must be >= 0",
       [](v1::AuditOptions* m) { m->set_worst_heads(-1); }},
      {"diagnosis_max_seconds: must be >= 0",
       [](v1::AuditOptions* m) { m->set_diagnosis_max_seconds(-1); }},
      {"tolerances.lse_abs: must be finite and >= 0",
       [](v1::AuditOptions* m) {
         m->mutable_tolerances()->set_lse_abs(-1e-3);
       }},
      {"tolerances.out_abs: must be finite and >= 0",
       [](v1::AuditOptions* m) {
         m->mutable_tolerances()->set_out_abs(
             std::numeric_limits<double>::infinity());
       }},
      {"tolerances.logprob_abs: must be finite and >= 0",
       [](v1::AuditOptions* m) {
         m->mutable_tolerances()->set_logprob_abs(
             std::numeric_limits<double>::quiet_NaN());
       }},
  };
  for (const Case& c : cases) {
    v1::AuditOptions msg;
    c.corrupt(&msg);
    AuditOptions options;
    options.engine_vs_replay = false;
    const absl::Status status = AuditOptionsFromProto(msg, &options);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << c.prefix;
    EXPECT_TRUE(absl::StartsWith(status.message(), c.prefix))
        << "got: " << status.message() << "\nwant prefix: " << c.prefix;
    EXPECT_FALSE(options.engine_vs_replay) << "options changed on error";
  }
}

TEST(LimitsCodecTest, CopiesEveryValidationLimit) {
  ValidationLimits limits;
  limits.max_tensor_bytes = 11;
  limits.max_batch = 12;
  limits.max_queries = 13;
  limits.max_heads = 14;
  limits.max_head_dim = 15;
  limits.max_page_size = 16;
  limits.max_blocks = 17;
  limits.max_context = 18;
  limits.max_cp_world_size = 19;
  limits.max_vocab = 20;
  v1::Limits msg;
  ValidationLimitsToProto(limits, &msg);
  EXPECT_EQ(msg.max_tensor_bytes(), 11);
  EXPECT_EQ(msg.max_batch(), 12);
  EXPECT_EQ(msg.max_queries(), 13);
  EXPECT_EQ(msg.max_heads(), 14);
  EXPECT_EQ(msg.max_head_dim(), 15);
  EXPECT_EQ(msg.max_page_size(), 16);
  EXPECT_EQ(msg.max_blocks(), 17);
  EXPECT_EQ(msg.max_context(), 18);
  EXPECT_EQ(msg.max_cp_world_size(), 19);
  EXPECT_EQ(msg.max_vocab(), 20);
  EXPECT_EQ(msg.max_receive_message_bytes(), 0);  // the server's to fill
}

TEST(ReportCodecTest, RoundTripsEveryField) {
  const AuditReport original = FullReport();
  v1::AuditReport msg;
  ReportToProto(original, &msg);
  EXPECT_EQ(msg.verdict(), v1::VERDICT_DRIFT);
  ASSERT_EQ(msg.comparisons_size(), 3);
  EXPECT_EQ(msg.comparisons(0).comparison(),
            v1::COMPARISON_ENGINE_VS_REFERENCE);
  EXPECT_TRUE(msg.comparisons(0).has_logprob_agreement());
  // Quantities that were not compared are absent on the wire.
  EXPECT_FALSE(msg.comparisons(2).has_out());
  EXPECT_FALSE(msg.comparisons(2).has_logprob());
  EXPECT_FALSE(msg.comparisons(2).has_logprob_agreement());
  // Ragged [B][Sq][k] merge orders, empty inner lists kept.
  ASSERT_EQ(msg.provenance().merge_orders_size(), 2);
  ASSERT_EQ(msg.provenance().merge_orders(0).queries_size(), 2);
  EXPECT_EQ(msg.provenance().merge_orders(0).queries(1).logical_blocks_size(),
            0);
  EXPECT_EQ(msg.provenance().merge_orders(1).queries(1).logical_blocks(1), 2);

  v1::AuditReport received;
  ASSERT_TRUE(received.ParseFromString(msg.SerializeAsString()));
  absl::StatusOr<AuditReport> decoded = ReportFromProto(received);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  ExpectReportEq(original, *decoded);
}

TEST(ReportCodecTest, UnknownEnumsNameTheField) {
  v1::AuditReport msg;
  ReportToProto(FullReport(), &msg);
  msg.mutable_comparisons(1)->set_verdict(static_cast<v1::Verdict>(9));
  absl::StatusOr<AuditReport> decoded = ReportFromProto(msg);
  ASSERT_FALSE(decoded.ok());
  EXPECT_TRUE(absl::StartsWith(decoded.status().message(),
                               "comparisons[1].verdict: unknown value 9"))
      << decoded.status();

  ReportToProto(FullReport(), &msg);
  msg.mutable_comparisons(2)->mutable_lse()->set_ulp_dtype(
      static_cast<v1::DType>(77));
  decoded = ReportFromProto(msg);
  ASSERT_FALSE(decoded.ok());
  EXPECT_TRUE(
      absl::StartsWith(decoded.status().message(),
                       "comparisons[2].lse.ulp_dtype: unknown value 77"))
      << decoded.status();

  ReportToProto(FullReport(), &msg);
  msg.mutable_comparisons(0)->set_comparison(v1::COMPARISON_UNSPECIFIED);
  decoded = ReportFromProto(msg);
  ASSERT_FALSE(decoded.ok());
  EXPECT_TRUE(absl::StartsWith(decoded.status().message(),
                               "comparisons[0].comparison: unspecified"))
      << decoded.status();
}

TEST(ReportCodecTest, UnsetWorstLocationDecodesToNowhere) {
  v1::AuditReport msg;
  v1::ComparisonResult* c = msg.add_comparisons();
  c->set_comparison(v1::COMPARISON_REPLAY_VS_REFERENCE);
  c->mutable_out()->set_count(3);
  absl::StatusOr<AuditReport> decoded = ReportFromProto(msg);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  ASSERT_EQ(decoded->comparisons.size(), 1u);
  EXPECT_TRUE(decoded->comparisons[0].has_out);
  EXPECT_FALSE(decoded->comparisons[0].has_lse);
  EXPECT_EQ(decoded->comparisons[0].out.worst.batch, -1);
  EXPECT_EQ(decoded->comparisons[0].out.worst.dim, -1);
}

}  // namespace
}  // namespace attnaudit
