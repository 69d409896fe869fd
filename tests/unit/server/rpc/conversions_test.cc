// The RPC layer's conversions: times and durations through protobuf's
// TimeUtil (checked against hand-computed seconds/nanos), request decoding
// with field-path errors, the job-state mappings and an interactive
// job's answer.
#include "server/rpc/conversions.h"

#include <google/protobuf/util/time_util.h>

#include <limits>
#include <string>

#include "absl/strings/match.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"

namespace attnaudit::server::rpc_internal {
namespace {

google::protobuf::Duration Duration(int64_t seconds, int32_t nanos) {
  google::protobuf::Duration d;
  d.set_seconds(seconds);
  d.set_nanos(nanos);
  return d;
}

TEST(ConversionsTest, TimesBecomeNormalisedTimestamps) {
  google::protobuf::Timestamp ts;
  TimeToProto(absl::FromUnixNanos(1700000000123456789), &ts);
  EXPECT_EQ(ts.seconds(), 1700000000);
  EXPECT_EQ(ts.nanos(), 123456789);
  // Before the epoch the nanos stay in [0, 1e9): -1.25 s is -2 s + 0.75 s.
  TimeToProto(absl::UnixEpoch() - absl::Milliseconds(1250), &ts);
  EXPECT_EQ(ts.seconds(), -2);
  EXPECT_EQ(ts.nanos(), 750000000);
}

TEST(ConversionsTest, WellFormedDurationsConvert) {
  absl::StatusOr<absl::Duration> d =
      DurationFromProto(Duration(90, 500000000), "timeout");
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(*d, absl::Milliseconds(90500));
  d = DurationFromProto(Duration(-3, -250000000), "timeout");
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(*d, -absl::Milliseconds(3250));
  // The largest Duration the format allows (10000 years) fits.
  d = DurationFromProto(
      Duration(google::protobuf::util::TimeUtil::kDurationMaxSeconds, 0), "t");
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(*d, absl::Seconds(315576000000));
}

// Hostile values are refused naming the field, never converted with an
// overflow.
TEST(ConversionsTest, MalformedDurationsAreInvalidArgument) {
  for (const google::protobuf::Duration& bad :
       {Duration(1, -1), Duration(-1, 1), Duration(0, 1000000000),
        Duration(std::numeric_limits<int64_t>::max(), 0),
        Duration(std::numeric_limits<int64_t>::min(), 0)}) {
    absl::StatusOr<absl::Duration> d = DurationFromProto(bad, "timeout");
    ASSERT_FALSE(d.ok()) << bad.ShortDebugString();
    EXPECT_EQ(d.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(absl::StartsWith(d.status().message(), "timeout: "))
        << d.status();
  }
}

TEST(ConversionsTest, DecodingNamesTheField) {
  v1::AuditRequest audit;
  absl::StatusOr<AuditWork> decoded = DecodeAuditRequest(&audit);
  ASSERT_FALSE(decoded.ok());
  EXPECT_EQ(decoded.status().message(), "snapshot: missing");
  // A dtype the contract does not know: the error names it from the request.
  v1::SubmitRequest submit;
  submit.mutable_snapshot()->mutable_q()->set_dtype(
      static_cast<v1::DType>(999));
  decoded = DecodeAuditRequest(&submit);
  ASSERT_FALSE(decoded.ok());
  EXPECT_EQ(decoded.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(decoded.status().message(), "snapshot.q.dtype: unknown value 999");
  // A present, empty snapshot decodes (validation is a later step).
  v1::SubmitRequest empty;
  empty.mutable_snapshot();
  EXPECT_TRUE(DecodeAuditRequest(&empty).ok());
}

TEST(ConversionsTest, StoredRecordsBecomeJobResults) {
  EXPECT_EQ(JobStateToProto(JobState::kQueued), v1::JOB_STATE_QUEUED);
  EXPECT_EQ(JobStateToProto(JobState::kCancelled), v1::JOB_STATE_CANCELLED);
  // A stored record's error and times survive the trip to the wire.
  ResultRecord rec;
  rec.job_id = "s1";
  rec.tenant = "fleet-a";
  rec.state = JobState::kCancelled;
  rec.priority = static_cast<int32_t>(PriorityClass::kSampled);
  rec.model = "m";
  rec.layer = 3;
  rec.engine = "e";
  rec.created = absl::FromUnixSeconds(100);
  rec.finished = absl::FromUnixSeconds(101);
  rec.error_code = static_cast<int>(absl::StatusCode::kCancelled);
  rec.error_message = "stop";
  const v1::JobResult r = RecordToJobResult(rec);
  EXPECT_EQ(r.state(), v1::JOB_STATE_CANCELLED);
  EXPECT_EQ(r.error().code(), static_cast<int>(absl::StatusCode::kCancelled));
  EXPECT_EQ(r.error().message(), "stop");
  EXPECT_EQ(r.submit_time().seconds(), 100);
  EXPECT_EQ(r.finish_time().seconds(), 101);
  EXPECT_EQ(r.labels().model(), "m");
  EXPECT_EQ(r.labels().layer(), 3);
  EXPECT_EQ(r.priority(), v1::PRIORITY_SAMPLED);
}

// The answer of an interactive job: the report with its job id, or why
// it was not kept, or the job's error as the call's status.
TEST(ConversionsTest, AnInteractiveAnswerBecomesTheCallsResponse) {
  InteractiveAnswer kept;
  kept.report.verdict = Verdict::kPass;
  kept.job_id = "a1";
  v1::AuditResponse response;
  ASSERT_TRUE(AnswerToProto(kept, &response).ok());
  EXPECT_EQ(response.report().verdict(), v1::VERDICT_PASS);
  EXPECT_EQ(response.job_id(), "a1");
  EXPECT_TRUE(response.not_stored_reason().empty());

  InteractiveAnswer unkept;
  unkept.not_stored_reason = "not stored";
  response.Clear();
  ASSERT_TRUE(AnswerToProto(unkept, &response).ok());
  EXPECT_TRUE(response.job_id().empty());
  EXPECT_EQ(response.not_stored_reason(), "not stored");

  InteractiveAnswer failed;
  failed.status = absl::InvalidArgumentError("snapshot.q: bad");
  response.Clear();
  const grpc::Status s = AnswerToProto(failed, &response);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(s.error_message(), "snapshot.q: bad");
  EXPECT_FALSE(response.has_report());
}

// A spooled payload decodes as its request did; one that is not a
// SubmitRequest is DataLoss (the job's terminal status after a restart).
TEST(ConversionsTest, SpooledPayloadsDecodeAsTheirRequest) {
  v1::SubmitRequest submit;
  submit.mutable_snapshot();
  absl::StatusOr<AuditWork> work =
      DecodeSubmitPayload(submit.SerializeAsString());
  EXPECT_TRUE(work.ok()) << work.status();
  work = DecodeSubmitPayload(std::string("\xff\xff\xff", 3));
  EXPECT_EQ(work.status().code(), absl::StatusCode::kDataLoss);
}

}  // namespace
}  // namespace attnaudit::server::rpc_internal
