// Scheduler: backfill behind a waiting gang, and devices that fail for
// good (Device::Health): taken out of the pool, the job retried once
// elsewhere, jobs the rest cannot hold completed Unavailable.
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/scheduler/scheduler.h"
#include "tests/unit/server/scheduler/test_devices.h"

namespace attnaudit::server {
namespace {

using testing::BreakableDevice;
using ::testing::ElementsAre;
using testing::GangDevice;
using testing::Gate;
using ::testing::HasSubstr;
using testing::MakeJob;
using testing::MakeScheduler;
using testing::Recorder;

using testing::kI;
using testing::kS;

// `n` BreakableDevices "<kind>:i" sharing `gate`; `out` (may be null)
// receives pointers to them.
void AddDevices(SchedulerOptions* options, int n, const std::string& kind,
                Gate* gate, std::vector<BreakableDevice*>* out = nullptr) {
  for (int i = 0; i < n; ++i) {
    auto d = std::make_unique<BreakableDevice>(kind + ":" + std::to_string(i),
                                               kind, gate);
    if (out != nullptr) out->push_back(d.get());
    options->devices.push_back(std::move(d));
  }
}

std::unique_ptr<Job> GangJob(const std::string& id, int size,
                             Recorder* recorder) {
  auto job = MakeJob(id, kI, recorder);
  job->gang_size = size;
  job->device_kind = "cuda";
  return job;
}

std::unique_ptr<Job> KindJob(const std::string& id, const std::string& kind,
                             Recorder* recorder) {
  auto job = MakeJob(id, kI, recorder);
  job->device_kind = kind;
  return job;
}

TEST(SchedulerBackfillTest, AWaitingGangLetsLaterJobsUseTheIdleDevices) {
  Gate gate;
  SchedulerOptions options;
  AddDevices(&options, 2, "cuda", &gate);
  options.gang_backfill_runs = 1e6;  // the window never closes here
  Recorder rec;  // outlives the scheduler, which may still deliver to it
  auto scheduler = MakeScheduler(std::move(options));
  ASSERT_TRUE(scheduler->Submit(KindJob("single", "cuda", &rec)).ok());
  gate.WaitStarted(1);
  ASSERT_TRUE(scheduler->Submit(GangJob("gang", 2, &rec)).ok());
  ASSERT_TRUE(scheduler->Submit(KindJob("after", "cuda", &rec)).ok());
  // "after" takes the device the gang cannot use yet.
  gate.WaitStarted(2);
  EXPECT_THAT(gate.started(), ElementsAre("single", "after"));
  EXPECT_EQ(scheduler->Stats().devices_busy, 2);
  gate.Open();
  const JobOutcome g = rec.Wait("gang");
  ASSERT_TRUE(g.status.ok()) << g.status;
  EXPECT_EQ(g.report.labels.layer, 2);  // RunGang had both devices
  EXPECT_THAT(gate.started(), ElementsAre("single", "after", "gang"));
}

TEST(SchedulerBackfillTest, AGangPastItsWindowHoldsTheDevicesAsTheyFree) {
  Gate gate;
  SchedulerOptions options;
  AddDevices(&options, 2, "cuda", &gate);
  options.gang_backfill_runs = 1;
  options.initial_run_estimate = absl::Milliseconds(1);  // a 1 ms window
  Recorder rec;  // outlives the scheduler, which may still deliver to it
  auto scheduler = MakeScheduler(std::move(options));
  ASSERT_TRUE(scheduler->Submit(KindJob("single", "cuda", &rec)).ok());
  gate.WaitStarted(1);
  ASSERT_TRUE(scheduler->Submit(GangJob("gang", 2, &rec)).ok());
  absl::SleepFor(absl::Milliseconds(50));  // well past the window
  ASSERT_TRUE(scheduler->Submit(KindJob("after", "cuda", &rec)).ok());
  // The idle device is held for the gang: "after" waits behind it.
  const SchedulerStats stats = scheduler->Stats();
  EXPECT_EQ(stats.devices_busy, 1);
  EXPECT_EQ(stats.queued[0], 2);
  gate.Open();
  ASSERT_TRUE(rec.Wait("gang").status.ok());
  ASSERT_TRUE(rec.Wait("after").status.ok());
  EXPECT_THAT(gate.started(), ElementsAre("single", "gang", "after"));
}

TEST(SchedulerBackfillTest, AGangNeverHoldsDevicesOfAnotherKind) {
  Gate gate;
  SchedulerOptions options;
  AddDevices(&options, 2, "cuda", &gate);
  AddDevices(&options, 1, "cpu", &gate);
  options.gang_backfill_runs = 0;  // held at once
  Recorder rec;  // outlives the scheduler, which may still deliver to it
  auto scheduler = MakeScheduler(std::move(options));
  ASSERT_TRUE(scheduler->Submit(KindJob("single", "cuda", &rec)).ok());
  gate.WaitStarted(1);
  ASSERT_TRUE(scheduler->Submit(GangJob("gang", 2, &rec)).ok());
  ASSERT_TRUE(scheduler->Submit(KindJob("on-gpu", "cuda", &rec)).ok());
  ASSERT_TRUE(scheduler->Submit(KindJob("on-cpu", "cpu", &rec)).ok());
  gate.WaitStarted(2);
  EXPECT_THAT(gate.started(), ElementsAre("single", "on-cpu"));
  gate.Open();
  ASSERT_TRUE(rec.Wait("on-gpu").status.ok());
  EXPECT_THAT(gate.started(),
              ElementsAre("single", "on-cpu", "gang", "on-gpu"));
}

// Records the devices the scheduler reports failed.
class FailureListener : public SchedulerListener {
 public:
  void OnDeviceFailed(absl::string_view name, absl::string_view kind,
                      const absl::Status& why) override {
    absl::MutexLock lock(&mu_);
    failed_.push_back(absl::StrCat(name, " ", why.message()));
  }
  void OnDevicesChanged(absl::string_view kind, int busy, int failed,
                        int total) override {
    absl::MutexLock lock(&mu_);
    last_failed_count_ = failed;
  }
  std::vector<std::string> failed() {
    absl::MutexLock lock(&mu_);
    return failed_;
  }
  int last_failed_count() {
    absl::MutexLock lock(&mu_);
    return last_failed_count_;
  }
  void OnStarted(const Job& job, absl::string_view device_kind,
                 absl::Duration queue_wait) override {
    absl::MutexLock lock(&mu_);
    started_.push_back(job.id);
  }
  std::vector<std::string> started() {
    absl::MutexLock lock(&mu_);
    return started_;
  }

 private:
  absl::Mutex mu_;
  std::vector<std::string> failed_;
  std::vector<std::string> started_;
  int last_failed_count_ = -1;
};

// A pool of `n` BreakableDevices "cuda:i" whose runs return at once; arm
// the devices, then Start.
class SchedulerHealthTest : public ::testing::Test {
 protected:
  void Start(int n, const std::function<void()>& arm) {
    gate_.Open();
    SchedulerOptions options;
    AddDevices(&options, n, "cuda", &gate_, &devices_);
    options.listener = &listener_;
    arm();
    scheduler_ = MakeScheduler(std::move(options));
  }
  JobOutcome Run(std::unique_ptr<Job> job) {
    const std::string id = job->id;
    EXPECT_TRUE(scheduler_->Submit(std::move(job)).ok());
    return rec_.Wait(id);
  }

  // Declared before the scheduler: it may deliver to them until destroyed.
  Gate gate_;
  Recorder rec_;
  FailureListener listener_;
  std::vector<BreakableDevice*> devices_;
  std::unique_ptr<Scheduler> scheduler_;
};

absl::Status ContextLost() { return absl::InternalError("context lost"); }

TEST_F(SchedulerHealthTest, AJobThatFailedWithItsDeviceRunsOnceMoreElsewhere) {
  Start(2, [&] {
    devices_[0]->FailNextRun(absl::InternalError("illegal address"),
                             ContextLost());
  });
  std::unique_ptr<Job> job = KindJob("j", "cuda", &rec_);
  std::vector<std::string> took;  // on_start: every device that took it
  job->on_start = [&took](const Job&, absl::string_view device) {
    took.emplace_back(device);
  };
  const JobOutcome j = Run(std::move(job));
  ASSERT_TRUE(j.status.ok()) << j.status;
  EXPECT_EQ(j.device_name, "cuda:1");
  EXPECT_EQ(rec_.Calls("j"), 1);
  EXPECT_THAT(gate_.started(), ElementsAre("j", "j"));
  EXPECT_THAT(took, ElementsAre("cuda:0", "cuda:1"));
  EXPECT_THAT(listener_.started(), ElementsAre("j"));  // one queue wait

  const std::vector<DeviceInfo> pool = scheduler_->Devices();
  ASSERT_EQ(pool.size(), 2u);
  EXPECT_TRUE(pool[0].failed);
  EXPECT_EQ(pool[0].failure, "context lost");
  EXPECT_FALSE(pool[1].failed);
  EXPECT_EQ(scheduler_->Stats().devices_failed, 1);
  EXPECT_THAT(listener_.failed(), ElementsAre("cuda:0 context lost"));
  EXPECT_EQ(listener_.last_failed_count(), 1);

  // The failed device never gets another job.
  for (const char* id : {"k1", "k2", "k3"}) {
    EXPECT_EQ(Run(KindJob(id, "cuda", &rec_)).device_name, "cuda:1");
  }
}

TEST_F(SchedulerHealthTest, ASecondFailureIsTheOutcomeAndAnEmptyPoolRefuses) {
  Start(2, [&] {
    for (BreakableDevice* d : devices_) {
      d->FailNextRun(absl::InternalError(absl::StrCat(d->name(), " broke")),
                     ContextLost());
    }
  });
  const JobOutcome j = Run(KindJob("j", "cuda", &rec_));
  EXPECT_EQ(j.status.code(), absl::StatusCode::kInternal);
  EXPECT_THAT(j.status.message(), HasSubstr("cuda:1 broke"));
  EXPECT_EQ(scheduler_->Stats().devices_failed, 2);

  SubmitRejection why;
  const absl::Status s = scheduler_->Submit(KindJob("k", "cuda", &rec_), &why);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(why.reason, RejectReason::kDevicesFailed);
  EXPECT_THAT(s.message(), HasSubstr("cuda:0 failed: context lost"));
  EXPECT_FALSE(rec_.Has("k"));
}

TEST_F(SchedulerHealthTest, ALastHealthyDeviceFailingEndsTheJobUnavailable) {
  Start(1, [&] {
    devices_[0]->FailNextRun(absl::InternalError("illegal address"),
                             ContextLost());
  });
  const JobOutcome j = Run(KindJob("j", "cuda", &rec_));
  EXPECT_EQ(j.status.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(j.status.message(), HasSubstr("illegal address"));
  EXPECT_THAT(j.status.message(), HasSubstr("no healthy device is left"));
  EXPECT_THAT(gate_.started(), ElementsAre("j"));
}

TEST_F(SchedulerHealthTest, AJobThatSucceededKeepsItsResultAndRunsOnce) {
  Start(2, [&] {
    devices_[0]->FailNextRun(absl::OkStatus(),
                             absl::InternalError("ECC error"));
  });
  const JobOutcome j = Run(KindJob("j", "cuda", &rec_));
  ASSERT_TRUE(j.status.ok()) << j.status;
  EXPECT_EQ(j.device_name, "cuda:0");
  EXPECT_THAT(gate_.started(), ElementsAre("j"));
  EXPECT_TRUE(scheduler_->Devices()[0].failed);
}

TEST_F(SchedulerHealthTest, AGangWhoseMemberFailedRunsOnTheHealthyOnes) {
  Start(3, [&] {
    // The leader's ring fails because its peer, cuda:1, lost its context.
    devices_[0]->FailNextRun(absl::InternalError("peer lost"),
                             absl::OkStatus());
    devices_[1]->SetHealth(ContextLost());
  });
  const JobOutcome g = Run(GangJob("gang", 2, &rec_));
  ASSERT_TRUE(g.status.ok()) << g.status;
  EXPECT_EQ(g.report.labels.layer, 2);
  const std::vector<DeviceInfo> pool = scheduler_->Devices();
  EXPECT_FALSE(pool[0].failed);
  EXPECT_TRUE(pool[1].failed);
  EXPECT_FALSE(pool[2].failed);
}

TEST(SchedulerHealthQueueTest, QueuedJobsTheHealthyDevicesCannotHoldEnd) {
  Gate gate;
  SchedulerOptions options;
  std::vector<BreakableDevice*> devices;
  AddDevices(&options, 2, "cuda", &gate, &devices);
  devices[0]->FailNextRun(absl::InternalError("illegal address"),
                          ContextLost());
  Recorder rec;  // outlives the scheduler, which may still deliver to it
  auto scheduler = MakeScheduler(std::move(options));
  ASSERT_TRUE(scheduler->Submit(KindJob("single", "cuda", &rec)).ok());
  gate.WaitStarted(1);
  ASSERT_TRUE(scheduler->Submit(GangJob("gang", 2, &rec)).ok());
  gate.Open();
  // "single" fails with cuda:0 and runs again on cuda:1; the gang of two
  // can never run on the one device left.
  EXPECT_TRUE(rec.Wait("single").status.ok());
  const JobOutcome g = rec.Wait("gang");
  EXPECT_EQ(g.status.code(), absl::StatusCode::kUnavailable);
  EXPECT_FALSE(g.ran);
  EXPECT_THAT(g.status.message(), HasSubstr("cuda:0 failed: context lost"));
}

}  // namespace
}  // namespace attnaudit::server
