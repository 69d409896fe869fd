// The store records the job lifecycle writes: terminal states from a
// job's status, and records of a finished job.
#include "server/jobs/records.h"

#include <string>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"

namespace attnaudit::server::jobs_internal {
namespace {

TEST(RecordsTest, TerminalStatesFollowTheStatus) {
  EXPECT_EQ(TerminalStateOf(absl::OkStatus()), JobState::kDone);
  EXPECT_EQ(TerminalStateOf(absl::CancelledError("")), JobState::kCancelled);
  EXPECT_EQ(TerminalStateOf(absl::DeadlineExceededError("")),
            JobState::kCancelled);
  EXPECT_EQ(TerminalStateOf(absl::InternalError("")), JobState::kFailed);
}

TEST(RecordsTest, ATerminalRecordKeepsTheJobAndSaysWhyItEnded) {
  const absl::Time before = absl::Now();
  ResultRecord rec =
      TerminalRecord("s1", "fleet-a", PriorityClass::kSampled,
                     JobLabels{"m", 3, "e", "b", 7, "run-1"},
                     absl::FromUnixSeconds(100), absl::CancelledError("stop"));
  EXPECT_EQ(rec.job_id, "s1");
  EXPECT_EQ(rec.tenant, "fleet-a");
  EXPECT_EQ(rec.state, JobState::kCancelled);
  EXPECT_EQ(rec.error_code, static_cast<int>(absl::StatusCode::kCancelled));
  EXPECT_EQ(rec.error_message, "stop");
  EXPECT_EQ(rec.model, "m");
  EXPECT_EQ(rec.layer, 3);
  EXPECT_EQ(rec.step, 7);
  EXPECT_EQ(rec.run, "run-1");
  EXPECT_EQ(rec.created, absl::FromUnixSeconds(100));
  EXPECT_GE(rec.finished, before);
  // The same job known to the store ends the same way.
  ResultRecord again = TerminalRecord(rec, absl::InternalError("lost"));
  EXPECT_EQ(again.state, JobState::kFailed);
  EXPECT_EQ(again.model, "m");
  EXPECT_EQ(again.created, rec.created);
}

TEST(RecordsTest, AFinishedAuditKeepsItsReportAsTheFormatWritesIt) {
  JobOutcome outcome;
  outcome.job_id = "a1";
  outcome.tenant = "t";
  outcome.ran = true;
  outcome.report.verdict = Verdict::kDrift;
  outcome.report.diagnoses.emplace_back();
  outcome.report.diagnoses.back().hypothesis = "stale-page";
  const absl::Time started = absl::FromUnixSeconds(200);
  ResultRecord rec = OutcomeRecord(
      outcome, absl::FromUnixSeconds(100), started,
      [](const AuditReport& r) { return std::string("encoded"); });
  EXPECT_EQ(rec.state, JobState::kDone);
  EXPECT_EQ(rec.verdict, static_cast<int>(Verdict::kDrift));
  EXPECT_EQ(rec.report, "encoded");
  EXPECT_EQ(rec.diagnosis, "stale-page");
  EXPECT_EQ(rec.started, started);
  // A job that never ran has no start and no report.
  outcome.ran = false;
  outcome.status = absl::DeadlineExceededError("never ran");
  rec = OutcomeRecord(outcome, absl::FromUnixSeconds(100), started,
                      [](const AuditReport& r) { return std::string("x"); });
  EXPECT_EQ(rec.state, JobState::kCancelled);
  EXPECT_EQ(rec.started, absl::UnixEpoch());
  EXPECT_TRUE(rec.report.empty());
}

}  // namespace
}  // namespace attnaudit::server::jobs_internal
