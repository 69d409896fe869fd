// CpuDevice: runs the core audit (PASS on a clean simulated snapshot, DRIFT
// on a faulty one, INVALID as a report, Cancelled when asked), and through
// the scheduler.
#include "server/cpu_device/cpu_device.h"

#include <atomic>
#include <memory>
#include <string>

#include "absl/synchronization/notification.h"
#include "core/sim/simulator.h"
#include "gtest/gtest.h"
#include "server/scheduler/scheduler.h"

namespace attnaudit::server {
namespace {

Snapshot Synth(Fault fault) {
  SynthOptions options;
  options.preset = "llama3-8b";
  options.context = 48;
  options.page_size = 16;
  options.threads = 1;
  options.fault = fault;
  absl::StatusOr<Snapshot> s = Synthesize(options);
  EXPECT_TRUE(s.ok()) << s.status();
  return *std::move(s);
}

TEST(CpuDeviceTest, NamesAndKinds) {
  auto devices = MakeCpuDevices(3, 0);
  ASSERT_EQ(devices.size(), 3u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(devices[i]->kind(), "cpu");
    EXPECT_EQ(devices[i]->name(), "cpu:" + std::to_string(i));
  }
}

TEST(CpuDeviceTest, AuditsWithTheWorkersThreadShare) {
  CpuDevice device(0, 2);
  AuditOptions options;
  auto clean = device.Run(Synth(Fault::kNone), options);
  ASSERT_TRUE(clean.ok()) << clean.status();
  EXPECT_EQ(clean->verdict, Verdict::kPass);
  EXPECT_EQ(clean->provenance.threads, 2);
  options.threads = 1;  // an explicit request wins
  auto faulty = device.Run(Synth(Fault::kStalePage), options);
  ASSERT_TRUE(faulty.ok()) << faulty.status();
  EXPECT_EQ(faulty->verdict, Verdict::kDrift);
  EXPECT_EQ(faulty->provenance.threads, 1);
}

TEST(CpuDeviceTest, InvalidSnapshotIsAReportNotAnError) {
  CpuDevice device(0, 1);
  auto r = device.Run(Snapshot(), AuditOptions());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->verdict, Verdict::kInvalid);
  EXPECT_FALSE(r->invalid_reason.empty());
}

TEST(CpuDeviceTest, HonoursTheCancelFlag) {
  CpuDevice device(0, 1);
  std::atomic<bool> cancelled{true};
  AuditOptions options;
  options.cancelled = &cancelled;
  EXPECT_EQ(device.Run(Synth(Fault::kNone), options).status().code(),
            absl::StatusCode::kCancelled);
}

TEST(CpuDeviceTest, RunsJobsThroughTheScheduler) {
  SchedulerOptions so;
  so.devices = MakeCpuDevices(2, 1);
  auto scheduler = Scheduler::Create(std::move(so));
  ASSERT_TRUE(scheduler.ok()) << scheduler.status();
  auto job = std::make_unique<Job>();
  job->id = "sim";
  job->priority = PriorityClass::kInteractive;
  job->snapshot = Synth(Fault::kNone);
  absl::Notification done;
  JobOutcome outcome;
  job->on_done = [&](const JobOutcome& o) {
    outcome = o;
    done.Notify();
  };
  ASSERT_TRUE((*scheduler)->Submit(std::move(job)).ok());
  done.WaitForNotification();
  ASSERT_TRUE(outcome.status.ok()) << outcome.status;
  EXPECT_EQ(outcome.report.verdict, Verdict::kPass);
  EXPECT_EQ(outcome.device_kind, "cpu");
  EXPECT_GT(outcome.report.provenance.timings.total_seconds, 0);
}

}  // namespace
}  // namespace attnaudit::server
