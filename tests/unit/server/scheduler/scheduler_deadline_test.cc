// Scheduler deadlines (enforced by the timer thread, not by workers) and the
// listener's event stream.
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/scheduler/scheduler.h"
#include "tests/unit/server/scheduler/test_devices.h"

namespace attnaudit::server {
namespace {

using ::testing::ElementsAre;
using testing::Gate;
using testing::GatedOptions;
using ::testing::HasSubstr;
using testing::MakeJob;
using testing::MakeScheduler;
using testing::Recorder;

using testing::kI;
using testing::kS;

TEST(SchedulerDeadlineTest, ExpiredQueuedJobFailsWithoutAWorkerOrRunning) {
  Gate gate;  // the only device stays busy for the whole test
  SchedulerOptions options = GatedOptions(&gate);
  Recorder rec;
  auto scheduler = MakeScheduler(std::move(options));
  ASSERT_TRUE(scheduler->Submit(MakeJob("busy", kI, &rec)).ok());
  gate.WaitStarted(1);
  auto job = MakeJob("late", kS, &rec, 1000);
  job->deadline = absl::Now() + absl::Milliseconds(20);
  ASSERT_TRUE(scheduler->Submit(std::move(job)).ok());

  // The device never frees up, so only the timer can complete "late".
  const JobOutcome o = rec.Wait("late");
  EXPECT_EQ(o.status.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(o.status.message(), HasSubstr("never ran"));
  EXPECT_FALSE(o.ran);
  EXPECT_TRUE(o.device_name.empty());
  EXPECT_GE(o.timings.queue_wait, absl::ZeroDuration());
  EXPECT_FALSE(rec.Has("busy"));  // still running
  EXPECT_EQ(scheduler->Stats().queued[1], 0);
  EXPECT_EQ(scheduler->Stats().queued_bytes, 0);

  gate.Open();
  EXPECT_TRUE(rec.Wait("busy").status.ok());
  EXPECT_THAT(gate.started(), ElementsAre("busy"));
}

TEST(SchedulerDeadlineTest, EarlierDeadlineSubmittedLaterWakesTheTimer) {
  Gate gate;
  SchedulerOptions options = GatedOptions(&gate);
  Recorder rec;
  auto scheduler = MakeScheduler(std::move(options));
  ASSERT_TRUE(scheduler->Submit(MakeJob("busy", kI, &rec)).ok());
  gate.WaitStarted(1);
  auto far = MakeJob("far", kS, &rec);
  far->deadline = absl::Now() + absl::Hours(1);
  ASSERT_TRUE(scheduler->Submit(std::move(far)).ok());
  // INTERACTIVE, so "far" is not ahead of it and admission takes it.
  auto near = MakeJob("near", kI, &rec);
  near->deadline = absl::Now() + absl::Milliseconds(10);
  ASSERT_TRUE(scheduler->Submit(std::move(near)).ok());
  // If the timer still slept until the 1 h deadline this would hang.
  EXPECT_EQ(rec.Wait("near").status.code(),
            absl::StatusCode::kDeadlineExceeded);
  EXPECT_FALSE(rec.Has("far"));
  gate.Open();
  EXPECT_TRUE(rec.Wait("far").status.ok());
}

TEST(SchedulerDeadlineTest, RunningJobPastItsDeadlineIsStopped) {
  Gate gate;  // never released: only the deadline ends the run
  SchedulerOptions options = GatedOptions(&gate);
  Recorder rec;
  auto scheduler = MakeScheduler(std::move(options));
  auto job = MakeJob("slow", kI, &rec);
  job->deadline = absl::Now() + absl::Milliseconds(20);
  ASSERT_TRUE(scheduler->Submit(std::move(job)).ok());
  const JobOutcome o = rec.Wait("slow");
  EXPECT_EQ(o.status.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_TRUE(o.ran);
}

// Records every listener event as a line.
class LogListener : public SchedulerListener {
 public:
  void OnQueueChanged(PriorityClass c, int64_t depth,
                      int64_t queued_bytes) override {
    Add(absl::StrCat("queue ", PriorityClassLabel(c), " ", depth, " ",
                     queued_bytes));
  }
  void OnInFlightChanged(int64_t n) override {
    Add(absl::StrCat("inflight ", n));
  }
  void OnDevicesChanged(absl::string_view kind, int busy, int failed,
                        int total) override {
    Add(absl::StrCat("devices ", kind, " ", busy, "/", total,
                     failed > 0 ? absl::StrCat(" failed ", failed) : ""));
  }
  void OnRejected(RejectReason r) override {
    Add(absl::StrCat("rejected ", RejectReasonLabel(r)));
  }
  void OnStarted(const Job& job, absl::string_view kind,
                 absl::Duration) override {
    Add(absl::StrCat("started ", job.id, " ", kind));
  }
  void OnFinished(const JobOutcome& o) override {
    Add(absl::StrCat("finished ", o.job_id, " ",
                     absl::StatusCodeToString(o.status.code())));
  }
  std::vector<std::string> events() {
    absl::MutexLock lock(&mu_);
    return events_;
  }

 private:
  void Add(std::string line) {
    absl::MutexLock lock(&mu_);
    events_.push_back(std::move(line));
  }
  absl::Mutex mu_;
  std::vector<std::string> events_;
};

TEST(SchedulerListenerTest, ReportsQueueDevicesRejectionsAndCompletions) {
  Gate gate;
  LogListener log;
  SchedulerOptions options = GatedOptions(&gate);
  options.max_queued = {1, 1};
  options.listener = &log;
  {
    auto scheduler = MakeScheduler(std::move(options));
    Recorder rec;
    ASSERT_TRUE(scheduler->Submit(MakeJob("a", kI, &rec, 5)).ok());
    gate.WaitStarted(1);
    ASSERT_TRUE(scheduler->Submit(MakeJob("b", kI, &rec, 7)).ok());
    EXPECT_FALSE(scheduler->Submit(MakeJob("c", kI, &rec)).ok());
    gate.Open();
    rec.Wait("b");
  }
  EXPECT_THAT(log.events(),
              ElementsAre("queue interactive 0 0", "queue sampled 0 0",
                          "inflight 0", "devices cpu 0/1",
                          // a: queued, then dispatched at once
                          "queue interactive 1 5", "queue interactive 0 0",
                          "inflight 1", "devices cpu 1/1", "started a cpu",
                          // b queued; c refused
                          "queue interactive 1 7", "rejected queue_full",
                          // a finishes (lock held: gauges), b dispatched
                          "inflight 0", "devices cpu 0/1",
                          "queue interactive 0 0", "inflight 1",
                          "devices cpu 1/1", "finished a OK", "started b cpu",
                          "inflight 0", "devices cpu 0/1", "finished b OK"));
}

}  // namespace
}  // namespace attnaudit::server
