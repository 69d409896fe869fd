// Scheduler: admission, priorities, memory budget, cancellation, drain and
// gangs. Deadline and listener tests are in scheduler_deadline_test.cc.
#include "server/scheduler/scheduler.h"

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/server/scheduler/test_devices.h"

namespace attnaudit::server {
namespace {

using ::testing::ElementsAre;
using testing::Gate;
using testing::GateDevices;
using testing::GatedOptions;
using ::testing::HasSubstr;
using testing::MakeJob;
using testing::MakeScheduler;
using testing::Query;
using testing::Recorder;

using testing::kI;
using testing::kS;

TEST(SchedulerCreateTest, RejectsBadOptions) {
  Gate gate;
  SchedulerOptions none;
  EXPECT_EQ(Scheduler::Create(std::move(none)).status().code(),
            absl::StatusCode::kInvalidArgument);

  SchedulerOptions dup = GatedOptions(&gate);
  auto more = GateDevices(1, &gate);  // also "cpu:0"
  dup.devices.push_back(std::move(more[0]));
  auto s = Scheduler::Create(std::move(dup));
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.status().message(), HasSubstr("devices[1]"));

  SchedulerOptions zero = GatedOptions(&gate);
  zero.max_queued[1] = 0;
  s = Scheduler::Create(std::move(zero));
  EXPECT_THAT(s.status().message(), HasSubstr("max_queued[SAMPLED]"));

  SchedulerOptions null_device;
  null_device.devices.push_back(nullptr);
  EXPECT_EQ(Scheduler::Create(std::move(null_device)).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(SchedulerTest, RunsAJobAndReportsTheOutcome) {
  Gate gate;
  gate.Open();
  Recorder rec;
  auto scheduler = MakeScheduler(GatedOptions(&gate));
  auto job = MakeJob("a", kI, &rec);
  job->labels.layer = 7;
  ASSERT_TRUE(scheduler->Submit(std::move(job)).ok());
  const JobOutcome o = rec.Wait("a");
  EXPECT_TRUE(o.status.ok()) << o.status;
  EXPECT_TRUE(o.ran);
  EXPECT_EQ(o.device_kind, "cpu");
  EXPECT_EQ(o.device_name, "cpu:0");
  EXPECT_EQ(o.report.verdict, Verdict::kPass);
  EXPECT_EQ(o.report.labels.model, "a");  // the device saw our snapshot
  EXPECT_EQ(o.labels.layer, 7);
  EXPECT_EQ(o.priority, kI);
  EXPECT_EQ(rec.Calls("a"), 1);
}

TEST(SchedulerTest, FullQueueRejectsWithRetryHintThenAcceptsAfterItDrains) {
  Gate gate;
  SchedulerOptions options = GatedOptions(&gate);
  options.max_queued = {2, 2};
  Recorder rec;
  auto scheduler = MakeScheduler(std::move(options));
  ASSERT_TRUE(scheduler->Submit(MakeJob("run", kI, &rec)).ok());
  gate.WaitStarted(1);  // "run" holds the only device
  ASSERT_TRUE(scheduler->Submit(MakeJob("q1", kI, &rec)).ok());
  ASSERT_TRUE(scheduler->Submit(MakeJob("q2", kI, &rec)).ok());

  SubmitRejection why;
  absl::Status s = scheduler->Submit(MakeJob("over", kI, &rec), &why);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(s.message(), HasSubstr("queue INTERACTIVE full (2 jobs); "
                                     "retry after ~"));
  EXPECT_EQ(why.reason, RejectReason::kQueueFull);
  EXPECT_GT(why.retry_after, absl::ZeroDuration());
  EXPECT_EQ(scheduler->CheckAdmission(Query(kI, 0)).code(),
            absl::StatusCode::kResourceExhausted);
  // The other class has its own bound.
  EXPECT_TRUE(scheduler->Submit(MakeJob("s1", kS, &rec)).ok());

  gate.Release(4);
  for (const char* id : {"run", "q1", "q2", "s1"}) {
    EXPECT_TRUE(rec.Wait(id).status.ok()) << id;
  }
  EXPECT_FALSE(rec.Has("over"));  // a refused job never completes
  EXPECT_EQ(scheduler->Stats().queued[0], 0);
  EXPECT_TRUE(scheduler->CheckAdmission(Query(kI, 0)).ok());
  ASSERT_TRUE(scheduler->Submit(MakeJob("over", kI, &rec)).ok());
  gate.Open();
  EXPECT_TRUE(rec.Wait("over").status.ok());
}

TEST(SchedulerTest, InteractiveJobsSubmittedLaterRunFirst) {
  Gate gate;
  Recorder rec;
  auto scheduler = MakeScheduler(GatedOptions(&gate));
  ASSERT_TRUE(scheduler->Submit(MakeJob("busy", kS, &rec)).ok());
  gate.WaitStarted(1);
  for (const char* id : {"s1", "s2"}) {
    ASSERT_TRUE(scheduler->Submit(MakeJob(id, kS, &rec)).ok());
  }
  for (const char* id : {"i1", "i2"}) {
    ASSERT_TRUE(scheduler->Submit(MakeJob(id, kI, &rec)).ok());
  }
  gate.Open();
  rec.Wait("s2");
  EXPECT_THAT(gate.started(), ElementsAre("busy", "i1", "i2", "s1", "s2"));
}

TEST(SchedulerTest, AgedSampledJobsGoFirstWhenPromotionIsEnabled) {
  Gate gate;
  SchedulerOptions options = GatedOptions(&gate);
  options.sampled_promote_after = absl::ZeroDuration();  // always aged
  Recorder rec;
  auto scheduler = MakeScheduler(std::move(options));
  ASSERT_TRUE(scheduler->Submit(MakeJob("busy", kI, &rec)).ok());
  gate.WaitStarted(1);
  ASSERT_TRUE(scheduler->Submit(MakeJob("s1", kS, &rec)).ok());
  ASSERT_TRUE(scheduler->Submit(MakeJob("i1", kI, &rec)).ok());
  gate.Open();
  rec.Wait("i1");
  rec.Wait("s1");
  EXPECT_THAT(gate.started(), ElementsAre("busy", "s1", "i1"));
}

TEST(SchedulerTest, MemoryBudgetCountsQueuedBytesOnly) {
  Gate gate;
  SchedulerOptions options = GatedOptions(&gate);
  options.max_queued_bytes = 100;
  Recorder rec;
  auto scheduler = MakeScheduler(std::move(options));
  ASSERT_TRUE(scheduler->Submit(MakeJob("run", kI, &rec, 90)).ok());
  gate.WaitStarted(1);
  EXPECT_EQ(scheduler->Stats().queued_bytes, 0);  // released on dispatch

  ASSERT_TRUE(scheduler->Submit(MakeJob("b", kS, &rec, 60)).ok());
  SubmitRejection why;
  absl::Status s = scheduler->Submit(MakeJob("c", kI, &rec, 50), &why);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(why.reason, RejectReason::kMemoryBudget);
  EXPECT_THAT(s.message(), HasSubstr("retry after ~"));
  ASSERT_TRUE(scheduler->Submit(MakeJob("d", kI, &rec, 40)).ok());  // = 100
  EXPECT_EQ(scheduler->Stats().queued_bytes, 100);

  s = scheduler->Submit(MakeJob("huge", kI, &rec, 101), &why);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(why.reason, RejectReason::kTooLarge);
  EXPECT_EQ(why.retry_after, absl::ZeroDuration());

  ASSERT_TRUE(scheduler->Cancel("b").ok());  // frees 60
  EXPECT_EQ(scheduler->Stats().queued_bytes, 40);
  ASSERT_TRUE(scheduler->Submit(MakeJob("c", kI, &rec, 50)).ok());
  gate.Open();
  rec.Wait("c");
  rec.Wait("d");
  EXPECT_EQ(scheduler->Stats().queued_bytes, 0);
}

TEST(SchedulerTest, CancelQueuedCompletesAtOnceAndFreesTheJob) {
  Gate gate;
  Recorder rec;
  auto scheduler = MakeScheduler(GatedOptions(&gate));
  ASSERT_TRUE(scheduler->Submit(MakeJob("run", kI, &rec)).ok());
  gate.WaitStarted(1);
  auto job = MakeJob("queued", kS, &rec, 10);
  // The job owns this token through its callback: it expires when the
  // scheduler destroys the job.
  auto token = std::make_shared<int>(1);
  std::weak_ptr<int> alive = token;
  auto inner = job->on_done;
  job->on_done = [inner, token](const JobOutcome& o) { inner(o); };
  token.reset();
  ASSERT_TRUE(scheduler->Submit(std::move(job)).ok());
  EXPECT_FALSE(alive.expired());

  ASSERT_TRUE(scheduler->Cancel("queued").ok());
  ASSERT_TRUE(rec.Has("queued"));  // delivered before Cancel returned
  const JobOutcome o = rec.Wait("queued");
  EXPECT_EQ(o.status.code(), absl::StatusCode::kCancelled);
  EXPECT_FALSE(o.ran);
  EXPECT_TRUE(alive.expired());
  EXPECT_EQ(scheduler->Stats().queued[1], 0);
  EXPECT_EQ(scheduler->Stats().queued_bytes, 0);
  EXPECT_EQ(scheduler->Cancel("queued").code(), absl::StatusCode::kNotFound);

  gate.Open();
  rec.Wait("run");
  EXPECT_THAT(gate.started(), ElementsAre("run"));  // never ran
}

TEST(SchedulerTest, CancelRunningSetsTheFlagAndCompletesCancelled) {
  Gate gate;  // never released: only the cancel flag ends the run
  Recorder rec;
  auto scheduler = MakeScheduler(GatedOptions(&gate));
  ASSERT_TRUE(scheduler->Submit(MakeJob("run", kI, &rec)).ok());
  gate.WaitStarted(1);
  ASSERT_TRUE(scheduler->Cancel("run").ok());
  const JobOutcome o = rec.Wait("run");
  EXPECT_EQ(o.status.code(), absl::StatusCode::kCancelled);
  EXPECT_TRUE(o.ran);
  EXPECT_EQ(scheduler->Cancel("run").code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(scheduler->Cancel("never-seen").code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(rec.Calls("run"), 1);
}

TEST(SchedulerTest, RejectsDuplicatesAndBadJobs) {
  Gate gate;
  Recorder rec;
  auto scheduler = MakeScheduler(GatedOptions(&gate));
  ASSERT_TRUE(scheduler->Submit(MakeJob("a", kI, &rec)).ok());
  SubmitRejection why;
  EXPECT_EQ(scheduler->Submit(MakeJob("a", kS, &rec), &why).code(),
            absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(why.reason, RejectReason::kInvalidArgument);
  EXPECT_EQ(scheduler->Submit(MakeJob("", kS, &rec)).code(),
            absl::StatusCode::kInvalidArgument);
  auto neg = MakeJob("neg", kS, &rec, -1);
  EXPECT_EQ(scheduler->Submit(std::move(neg)).code(),
            absl::StatusCode::kInvalidArgument);
  auto cuda = MakeJob("cuda", kS, &rec);
  cuda->device_kind = "cuda";
  EXPECT_EQ(scheduler->Submit(std::move(cuda)).code(),
            absl::StatusCode::kFailedPrecondition);
  auto past = MakeJob("past", kS, &rec);
  past->deadline = absl::Now() - absl::Seconds(1);
  EXPECT_EQ(scheduler->Submit(std::move(past), &why).code(),
            absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(why.reason, RejectReason::kDeadline);
  gate.Open();
  rec.Wait("a");
  EXPECT_EQ(rec.order().size(), 1u);  // only "a" ever completed
}

TEST(SchedulerTest, DrainFinishesQueuedJobsThenRefusesNewOnes) {
  Gate gate;
  SchedulerOptions options;
  options.devices = GateDevices(2, &gate);
  Recorder rec;
  auto scheduler = MakeScheduler(std::move(options));
  for (const char* id : {"a", "b", "c", "d"}) {
    ASSERT_TRUE(scheduler->Submit(MakeJob(id, kS, &rec)).ok());
  }
  gate.Release(4);
  EXPECT_TRUE(scheduler->Drain(absl::Hours(1)).ok());
  for (const char* id : {"a", "b", "c", "d"}) {
    EXPECT_TRUE(rec.Has(id)) << id;  // delivered before Drain returned
    EXPECT_TRUE(rec.Wait(id).status.ok()) << id;
  }
  SubmitRejection why;
  EXPECT_EQ(scheduler->Submit(MakeJob("late", kI, &rec), &why).code(),
            absl::StatusCode::kUnavailable);
  EXPECT_EQ(why.reason, RejectReason::kDraining);
  EXPECT_TRUE(scheduler->Stats().draining);
}

TEST(SchedulerTest, DrainTimeoutEndsLeftoversUnavailable) {
  Gate gate;  // never released
  Recorder rec;
  auto scheduler = MakeScheduler(GatedOptions(&gate));
  ASSERT_TRUE(scheduler->Submit(MakeJob("run", kI, &rec)).ok());
  gate.WaitStarted(1);
  ASSERT_TRUE(scheduler->Submit(MakeJob("queued", kS, &rec)).ok());
  absl::Status s = scheduler->Drain(absl::ZeroDuration());
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded);
  const JobOutcome run = rec.Wait("run");
  const JobOutcome queued = rec.Wait("queued");
  EXPECT_EQ(run.status.code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(run.ran);
  EXPECT_EQ(queued.status.code(), absl::StatusCode::kUnavailable);
  EXPECT_FALSE(queued.ran);
  EXPECT_THAT(gate.started(), ElementsAre("run"));
}

TEST(SchedulerTest, DestructionDeliversEveryAcceptedJob) {
  Gate gate;
  Recorder rec;
  {
    auto scheduler = MakeScheduler(GatedOptions(&gate));
    ASSERT_TRUE(scheduler->Submit(MakeJob("run", kI, &rec)).ok());
    gate.WaitStarted(1);
    ASSERT_TRUE(scheduler->Submit(MakeJob("queued", kS, &rec)).ok());
  }
  EXPECT_EQ(rec.Calls("run"), 1);
  EXPECT_EQ(rec.Calls("queued"), 1);
  EXPECT_EQ(rec.Wait("queued").status.code(), absl::StatusCode::kUnavailable);
}

TEST(SchedulerTest, OnDoneMaySubmitAgain) {
  Gate gate;
  gate.Open();
  Recorder rec;
  auto scheduler = MakeScheduler(GatedOptions(&gate));
  auto first = MakeJob("first", kI, &rec);
  Scheduler* raw = scheduler.get();
  first->on_done = [raw, &rec](const JobOutcome&) {
    EXPECT_TRUE(raw->Submit(MakeJob("second", kI, &rec)).ok());
  };
  ASSERT_TRUE(scheduler->Submit(std::move(first)).ok());
  EXPECT_TRUE(rec.Wait("second").status.ok());
}

TEST(SchedulerTest, SubmitWhenAdmittedWaitsForRoom) {
  Gate gate;
  SchedulerOptions options = GatedOptions(&gate);
  options.max_queued = {1, 1};
  Recorder rec;
  auto scheduler = MakeScheduler(std::move(options));
  ASSERT_TRUE(scheduler->Submit(MakeJob("run", kS, &rec)).ok());
  gate.WaitStarted(1);
  ASSERT_TRUE(scheduler->Submit(MakeJob("q", kS, &rec)).ok());
  // Full, and it stays full: times out.
  EXPECT_EQ(scheduler
                ->SubmitWhenAdmitted(MakeJob("t", kS, &rec),
                                     absl::Now() + absl::Milliseconds(5))
                .code(),
            absl::StatusCode::kResourceExhausted);
  absl::Status resumed;
  std::thread waiter([&] {
    resumed = scheduler->SubmitWhenAdmitted(MakeJob("resumed", kS, &rec),
                                            absl::InfiniteFuture());
  });
  gate.Open();  // "run" and "q" finish; room appears
  waiter.join();
  EXPECT_TRUE(resumed.ok()) << resumed;
  EXPECT_TRUE(rec.Wait("resumed").status.ok());
  EXPECT_FALSE(rec.Has("t"));
}

TEST(SchedulerTest, GangJobsHoldSeveralDevicesAndAreNotOvertaken) {
  Gate gate;
  SchedulerOptions options;
  options.gang_backfill_runs = 0;  // no backfill (scheduler_gang_test.cc)
  options.devices.push_back(
      std::make_unique<testing::GangDevice>("gpu:0", "cuda", &gate));
  options.devices.push_back(
      std::make_unique<testing::GangDevice>("gpu:1", "cuda", &gate));
  Recorder rec;
  auto scheduler = MakeScheduler(std::move(options));
  ASSERT_TRUE(scheduler->Submit(MakeJob("single", kI, &rec)).ok());
  gate.WaitStarted(1);
  auto gang = MakeJob("gang", kI, &rec);
  gang->gang_size = 2;
  gang->device_kind = "cuda";
  ASSERT_TRUE(scheduler->Submit(std::move(gang)).ok());
  ASSERT_TRUE(scheduler->Submit(MakeJob("after", kI, &rec)).ok());
  // One device is idle, yet "after" must wait behind the gang head.
  SchedulerStats stats = scheduler->Stats();
  EXPECT_EQ(stats.devices_busy, 1);
  EXPECT_EQ(stats.queued[0], 2);

  auto too_big = MakeJob("too_big", kI, &rec);
  too_big->gang_size = 3;
  EXPECT_EQ(scheduler->Submit(std::move(too_big)).code(),
            absl::StatusCode::kFailedPrecondition);

  gate.Open();
  const JobOutcome g = rec.Wait("gang");
  ASSERT_TRUE(g.status.ok()) << g.status;
  EXPECT_EQ(g.report.labels.layer, 2);  // RunGang saw both devices
  rec.Wait("after");
  EXPECT_THAT(gate.started(), ElementsAre("single", "gang", "after"));
}

TEST(SchedulerTest, DefaultRunGangRefusesGangs) {
  Gate gate;
  gate.Open();
  SchedulerOptions options;
  options.devices = GateDevices(2, &gate);
  Recorder rec;
  auto scheduler = MakeScheduler(std::move(options));
  auto gang = MakeJob("gang", kI, &rec);
  gang->gang_size = 2;
  ASSERT_TRUE(scheduler->Submit(std::move(gang)).ok());
  EXPECT_EQ(rec.Wait("gang").status.code(), absl::StatusCode::kUnimplemented);
}

}  // namespace
}  // namespace attnaudit::server
