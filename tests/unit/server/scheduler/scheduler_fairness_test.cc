// Scheduler fairness under overload: the INTERACTIVE byte reserve, tenant
// quotas, tenant-scoped cancellation, jobs that could only expire in the
// queue (refused at admission, counting the higher class still to come;
// dropped before they run) and the measured
// drain rate behind retry hints.
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/scheduler/scheduler.h"
#include "tests/unit/server/scheduler/test_devices.h"

namespace attnaudit::server {
namespace {

using testing::Gate;
using testing::GatedOptions;
using ::testing::HasSubstr;
using testing::MakeJob;
using testing::MakeScheduler;
using testing::Recorder;
using testing::TenantJob;

using testing::kI;
using testing::kS;

TEST(SchedulerFairnessTest, SampledCannotTakeTheInteractiveReserve) {
  Gate gate;
  SchedulerOptions options = GatedOptions(&gate);
  options.max_queued_bytes = 100;
  options.interactive_reserved_bytes = 30;  // SAMPLED may queue 70
  Recorder rec;
  auto scheduler = MakeScheduler(std::move(options));
  ASSERT_TRUE(scheduler->Submit(MakeJob("run", kI, &rec)).ok());
  gate.WaitStarted(1);

  ASSERT_TRUE(scheduler->Submit(MakeJob("s1", kS, &rec, 40)).ok());
  ASSERT_TRUE(scheduler->Submit(MakeJob("s2", kS, &rec, 30)).ok());  // = 70
  SubmitRejection why;
  absl::Status s = scheduler->Submit(MakeJob("s3", kS, &rec, 1), &why);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(why.reason, RejectReason::kMemoryBudget);
  EXPECT_THAT(s.message(), HasSubstr("SAMPLED"));
  // The reserve is there for INTERACTIVE calls, which may use all of it.
  ASSERT_TRUE(scheduler->Submit(MakeJob("i1", kI, &rec, 30)).ok());
  EXPECT_EQ(scheduler->Stats().queued_bytes, 100);
  EXPECT_EQ(scheduler->Stats().class_queued_bytes[1], 70);
  // A SAMPLED job bigger than its class budget can never fit.
  s = scheduler->Submit(MakeJob("s4", kS, &rec, 71), &why);
  EXPECT_EQ(why.reason, RejectReason::kTooLarge);
  EXPECT_EQ(why.retry_after, absl::ZeroDuration());

  gate.Open();
  for (const char* id : {"run", "s1", "s2", "i1"}) {
    EXPECT_TRUE(rec.Wait(id).status.ok()) << id;
  }
  EXPECT_FALSE(rec.Has("s3"));
}

TEST(SchedulerFairnessTest, ReserveMustLeaveRoomForSampled) {
  Gate gate;
  SchedulerOptions options = GatedOptions(&gate);
  options.max_queued_bytes = 100;
  options.interactive_reserved_bytes = 100;
  EXPECT_THAT(Scheduler::Create(std::move(options)).status().message(),
              HasSubstr("interactive_reserved_bytes"));
}

TEST(SchedulerFairnessTest, TenantQuotaCapsJobsAndBytesInFlight) {
  Gate gate;
  SchedulerOptions options = GatedOptions(&gate);
  Recorder rec;
  auto scheduler = MakeScheduler(std::move(options));
  const TenantQuota quota{/*max_jobs=*/2, /*max_bytes=*/100};
  // Running jobs count too: "a1" holds the device.
  ASSERT_TRUE(
      scheduler->Submit(TenantJob("a1", kS, &rec, "a", 10, quota)).ok());
  gate.WaitStarted(1);
  ASSERT_TRUE(
      scheduler->Submit(TenantJob("a2", kS, &rec, "a", 10, quota)).ok());
  SubmitRejection why;
  absl::Status s =
      scheduler->Submit(TenantJob("a3", kS, &rec, "a", 10, quota), &why);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(why.reason, RejectReason::kTenantQuota);
  EXPECT_GT(why.retry_after, absl::ZeroDuration());
  EXPECT_THAT(s.message(), HasSubstr("2 of 2 jobs"));
  // Another tenant is not affected by a's quota.
  ASSERT_TRUE(
      scheduler->Submit(TenantJob("b1", kS, &rec, "b", 10, quota)).ok());
  // Bytes: b holds 10; 91 more would pass 100.
  s = scheduler->Submit(TenantJob("b2", kS, &rec, "b", 91, quota), &why);
  EXPECT_EQ(why.reason, RejectReason::kTenantQuota);
  // Larger than the whole quota: never fits.
  s = scheduler->Submit(TenantJob("b3", kS, &rec, "b", 101, quota), &why);
  EXPECT_EQ(why.reason, RejectReason::kTooLarge);

  gate.Release(1);  // a1 finishes: a has room again
  EXPECT_TRUE(rec.Wait("a1").status.ok());
  EXPECT_TRUE(
      scheduler->Submit(TenantJob("a3", kS, &rec, "a", 10, quota)).ok());
  gate.Open();
  for (const char* id : {"a2", "a3", "b1"}) {
    EXPECT_TRUE(rec.Wait(id).status.ok()) << id;
  }
}

// A fleet's quota: what the tenant holds on other replicas (counted by the
// store when it admitted the job) adds to its jobs here, at admission.
TEST(SchedulerFairnessTest, TheTenantsJobsElsewhereCountAgainstItsQuota) {
  Gate gate;
  Recorder rec;
  auto scheduler = MakeScheduler(GatedOptions(&gate));
  const TenantQuota quota{/*max_jobs=*/4, /*max_bytes=*/0};
  ASSERT_TRUE(
      scheduler->Submit(TenantJob("a1", kS, &rec, "a", 10, quota)).ok());
  std::unique_ptr<Job> job = TenantJob("a2", kS, &rec, "a", 10, quota);
  job->held_jobs_elsewhere = 3;  // 1 here + 3 elsewhere = 4 of 4
  SubmitRejection why;
  absl::Status s = scheduler->Submit(std::move(job), &why);
  EXPECT_EQ(why.reason, RejectReason::kTenantQuota) << s;
  EXPECT_THAT(s.message(), HasSubstr("4 of 4 jobs"));
  job = TenantJob("a2", kS, &rec, "a", 10, quota);
  job->held_jobs_elsewhere = 2;
  EXPECT_TRUE(scheduler->Submit(std::move(job)).ok());
  gate.Open();
  for (const char* id : {"a1", "a2"}) {
    EXPECT_TRUE(rec.Wait(id).status.ok()) << id;
  }
}

TEST(SchedulerFairnessTest, CancelOwnedSeesOnlyTheTenantsJobs) {
  Gate gate;
  SchedulerOptions options = GatedOptions(&gate);
  Recorder rec;
  auto scheduler = MakeScheduler(std::move(options));
  ASSERT_TRUE(scheduler->Submit(TenantJob("run", kS, &rec, "a")).ok());
  gate.WaitStarted(1);
  ASSERT_TRUE(scheduler->Submit(TenantJob("queued", kS, &rec, "a")).ok());

  EXPECT_EQ(*scheduler->OwnerOf("queued"), "a");
  const absl::Status other = scheduler->CancelOwned("queued", "b");
  const absl::Status unknown = scheduler->CancelOwned("nosuch", "b");
  EXPECT_EQ(other.code(), absl::StatusCode::kNotFound);
  // Word for word what an unknown id gets, but for the id itself.
  EXPECT_EQ(absl::StrCat(other.message()),
            absl::StrCat("job queued is not queued or running"));
  EXPECT_EQ(absl::StrCat(unknown.message()),
            absl::StrCat("job nosuch is not queued or running"));
  EXPECT_FALSE(rec.Has("queued"));

  ASSERT_TRUE(scheduler->CancelOwned("queued", "a").ok());
  EXPECT_EQ(rec.Wait("queued").status.code(), absl::StatusCode::kCancelled);
  ASSERT_TRUE(scheduler->CancelOwned("run", "a").ok());
  EXPECT_EQ(rec.Wait("run").status.code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(scheduler->OwnerOf("run").status().code(),
            absl::StatusCode::kNotFound);
}

TEST(SchedulerFairnessTest, JobThatWouldOnlyExpireInTheQueueIsRefused) {
  Gate gate;
  SchedulerOptions options = GatedOptions(&gate);
  options.initial_run_estimate = absl::Seconds(1);
  Recorder rec;
  auto scheduler = MakeScheduler(std::move(options));
  ASSERT_TRUE(scheduler->Submit(MakeJob("run", kS, &rec)).ok());
  gate.WaitStarted(1);
  ASSERT_TRUE(scheduler->Submit(MakeJob("ahead", kS, &rec)).ok());

  // One job ahead (~1 s x 2, the wait safety) and a ~1 s run: 2 s left is
  // not enough.
  auto late = MakeJob("late", kS, &rec);
  late->deadline = absl::Now() + absl::Seconds(2);
  SubmitRejection why;
  absl::Status s = scheduler->Submit(std::move(late), &why);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(why.reason, RejectReason::kWouldExpire);
  EXPECT_GT(why.retry_after, absl::ZeroDuration());
  EXPECT_THAT(s.message(), HasSubstr("1 job(s) ahead"));
  // With time enough it is admitted; INTERACTIVE has nothing ahead.
  auto fine = MakeJob("fine", kS, &rec);
  fine->deadline = absl::Now() + absl::Seconds(60);
  EXPECT_TRUE(scheduler->Submit(std::move(fine)).ok());
  auto urgent = MakeJob("urgent", kI, &rec);
  urgent->deadline = absl::Now() + absl::Seconds(2);
  EXPECT_TRUE(scheduler->Submit(std::move(urgent)).ok());
  // A resumed job is never refused for its deadline (the timer decides).
  auto resumed = MakeJob("resumed", kS, &rec);
  resumed->deadline = absl::Now() + absl::Seconds(30);
  EXPECT_TRUE(scheduler
                  ->SubmitWhenAdmitted(std::move(resumed),
                                       absl::Now() + absl::Seconds(5))
                  .ok());
  EXPECT_EQ(scheduler->Stats().expired_in_queue, 0);
  gate.Open();
  for (const char* id : {"run", "ahead", "fine", "urgent", "resumed"}) {
    EXPECT_TRUE(rec.Wait(id).status.ok()) << id;
  }
}

// Admission counts the INTERACTIVE jobs still to come against a SAMPLED
// job: they overtake it while it waits. Here three of every four recent
// dispatches went to INTERACTIVE jobs, so the SAMPLED queue drains at a
// quarter of the pool's rate. Four jobs ahead at ~25 dispatches/s: ~0.24 s
// by the queue length alone (the estimate before, which admitted and then
// let such jobs expire: the overload test), ~0.96 s at the class's rate;
// either is 2x slower on a slow machine, and the deadline (0.8 s) lies
// between them.
TEST(SchedulerFairnessTest, SampledWaitCountsTheInteractiveShareOfDispatches) {
  Gate gate;
  SchedulerOptions options = GatedOptions(&gate);
  options.max_queued = {16, 16};
  options.initial_run_estimate = absl::Milliseconds(40);
  Recorder rec;
  auto scheduler = MakeScheduler(std::move(options));
  ASSERT_TRUE(scheduler->Submit(MakeJob("w", kS, &rec)).ok());
  gate.WaitStarted(1);
  std::vector<std::string> window = {"w"};
  for (int i = 0; i < 6; ++i) {
    window.push_back(absl::StrCat("i", i));
    ASSERT_TRUE(scheduler->Submit(MakeJob(window.back(), kI, &rec)).ok());
  }
  for (int i = 0; i < 2; ++i) {
    window.push_back(absl::StrCat("s", i));
    ASSERT_TRUE(scheduler->Submit(MakeJob(window.back(), kS, &rec)).ok());
  }
  // Eight saturated dispatches ~40 ms apart: six INTERACTIVE, two SAMPLED.
  for (const std::string& id : window) {
    absl::SleepFor(absl::Milliseconds(40));
    gate.Release(1);
    rec.Wait(id);
  }
  ASSERT_TRUE(scheduler->Submit(MakeJob("hold", kS, &rec)).ok());
  gate.WaitStarted(static_cast<int>(window.size()) + 1);
  for (const char* id : {"qi0", "qi1"}) {
    ASSERT_TRUE(scheduler->Submit(MakeJob(id, kI, &rec)).ok());
  }
  for (const char* id : {"qs0", "qs1"}) {
    ASSERT_TRUE(scheduler->Submit(MakeJob(id, kS, &rec)).ok());
  }

  auto late = MakeJob("late", kS, &rec);
  late->deadline = absl::Now() + absl::Milliseconds(800);
  SubmitRejection why;
  absl::Status s = scheduler->Submit(std::move(late), &why);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_EQ(why.reason, RejectReason::kWouldExpire);
  EXPECT_THAT(s.message(), HasSubstr("4 job(s) ahead"));
  // The same deadline for INTERACTIVE: two ahead, nothing above it.
  auto urgent = MakeJob("urgent", kI, &rec);
  urgent->deadline = absl::Now() + absl::Milliseconds(800);
  EXPECT_TRUE(scheduler->Submit(std::move(urgent)).ok());
  auto patient = MakeJob("patient", kS, &rec);
  patient->deadline = absl::Now() + absl::Seconds(30);
  EXPECT_TRUE(scheduler->Submit(std::move(patient)).ok());
  gate.Open();
  for (const char* id :
       {"hold", "qi0", "qi1", "urgent", "qs0", "qs1", "patient"}) {
    EXPECT_TRUE(rec.Wait(id).status.ok()) << id;
  }
  EXPECT_EQ(scheduler->Stats().expired_in_queue, 0);
}

TEST(SchedulerFairnessTest, QueuedJobIsDroppedOnceItsDeadlineCannotBeMet) {
  Gate gate;
  SchedulerOptions options = GatedOptions(&gate);
  options.initial_run_estimate = absl::Seconds(10);  // drop 5 s early
  Recorder rec;
  auto scheduler = MakeScheduler(std::move(options));
  ASSERT_TRUE(scheduler->Submit(MakeJob("run", kI, &rec)).ok());
  gate.WaitStarted(1);
  auto doomed = MakeJob("doomed", kI, &rec);
  doomed->deadline = absl::Now() + absl::Seconds(4);
  ASSERT_TRUE(scheduler->Submit(std::move(doomed)).ok());
  // Well before its deadline: 4 s left < 0.5 x 10 s.
  const JobOutcome o = rec.Wait("doomed");
  EXPECT_EQ(o.status.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(o.status.message(), HasSubstr("could no longer be met"));
  EXPECT_THAT(o.status.message(), HasSubstr("never ran"));
  EXPECT_FALSE(o.ran);
  EXPECT_EQ(scheduler->Stats().expired_in_queue, 1);
  gate.Open();
  EXPECT_TRUE(rec.Wait("run").status.ok());
}

TEST(SchedulerFairnessTest, DrainRateIsMeasuredFromSaturatedDispatches) {
  Gate gate;
  SchedulerOptions options = GatedOptions(&gate);
  options.max_queued = {8, 8};
  Recorder rec;
  auto scheduler = MakeScheduler(std::move(options));
  EXPECT_EQ(scheduler->Stats().drain_rate, 0);  // nothing measured yet
  ASSERT_TRUE(scheduler->Submit(MakeJob("j0", kS, &rec)).ok());
  gate.WaitStarted(1);
  for (int i = 1; i < 8; ++i) {
    ASSERT_TRUE(
        scheduler->Submit(MakeJob(absl::StrCat("j", i), kS, &rec)).ok());
  }
  // Each release frees the device for a job that was waiting for it.
  for (int i = 0; i < 8; ++i) {
    gate.Release(1);
    rec.Wait(absl::StrCat("j", i));
  }
  EXPECT_GT(scheduler->Stats().drain_rate, 0);
  // A full queue's hint follows the measured rate (bounded, positive).
  // k0 takes the idle device, k1..k8 fill the queue.
  for (int i = 0; i < 9; ++i) {
    ASSERT_TRUE(
        scheduler->Submit(MakeJob(absl::StrCat("k", i), kS, &rec)).ok());
  }
  SubmitRejection why;
  ASSERT_FALSE(scheduler->Submit(MakeJob("over", kS, &rec), &why).ok());
  EXPECT_GT(why.retry_after, absl::ZeroDuration());
  EXPECT_LE(why.retry_after, absl::Seconds(60));
  gate.Open();
  for (int i = 0; i < 9; ++i) rec.Wait(absl::StrCat("k", i));
}

}  // namespace
}  // namespace attnaudit::server
