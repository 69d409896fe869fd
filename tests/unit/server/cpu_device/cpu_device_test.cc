// CpuDevice: runs the core audit (PASS on a clean simulated snapshot, DRIFT
// on a faulty one, INVALID as a report, Cancelled when asked), and through
// the scheduler.
#include "server/cpu_device/cpu_device.h"

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"
#include "server/scheduler/scheduler.h"
#include "sim/simulator.h"

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

Snapshot SynthCp(int64_t world) {
  SynthOptions options;
  options.preset = "glm4-9b";
  options.context = 70;
  options.page_size = 8;
  options.threads = 1;
  options.cp_world_size = world;
  options.cp_sharding = CpSharding::kPageInterleaved;
  absl::StatusOr<Snapshot> s = Synthesize(options);
  EXPECT_TRUE(s.ok()) << s.status();
  return *std::move(s);
}

// A gang brings every worker's threads and lets that many ranks run at once.
TEST(CpuDeviceTest, AGangRunsTheCpReplayOnAllItsWorkers) {
  auto devices = MakeCpuDevices(3, 1);
  std::vector<Device*> gang = {devices[0].get(), devices[1].get(),
                               devices[2].get()};
  AuditOptions options;
  options.cp_strategy = CpStrategy::kRing;
  auto r = devices[0]->RunGang(gang, SynthCp(3), options);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->verdict, Verdict::kPass);
  EXPECT_EQ(r->provenance.threads, 3);
  EXPECT_EQ(r->cp.workers, 3);
  EXPECT_EQ(r->cp.execution, "thread_per_rank");
  EXPECT_EQ(r->provenance.timings.cp_rank_compute_seconds.size(), 3u);
  // Five ranks on the same three workers: in turns.
  auto turns = devices[0]->RunGang(gang, SynthCp(5), options);
  ASSERT_TRUE(turns.ok()) << turns.status();
  EXPECT_EQ(turns->verdict, Verdict::kPass);
  EXPECT_EQ(turns->cp.execution, "lockstep");
  EXPECT_EQ(turns->provenance.timings.cp_rank_compute_seconds.size(), 5u);
}

// Gang jobs of every size up to the pool, mixed with single jobs, all
// complete: the head waits for its gang, nothing deadlocks.
TEST(CpuDeviceTest, GangAndSingleJobsShareThePool) {
  SchedulerOptions so;
  so.devices = MakeCpuDevices(2, 1);
  auto scheduler = Scheduler::Create(std::move(so));
  ASSERT_TRUE(scheduler.ok()) << scheduler.status();
  const int kJobs = 6;
  std::atomic<int> done{0};
  std::atomic<int> passed{0};
  absl::Notification all;
  for (int i = 0; i < kJobs; ++i) {
    auto job = std::make_unique<Job>();
    job->id = "job" + std::to_string(i);
    job->priority = PriorityClass::kInteractive;
    job->snapshot = i % 3 == 0 ? Synth(Fault::kNone) : SynthCp(2 + i % 3 * 2);
    job->gang_size = i % 3 == 0 ? 1 : 2;
    job->device_kind = "cpu";
    job->on_done = [&](const JobOutcome& o) {
      if (o.status.ok() && o.report.verdict == Verdict::kPass) ++passed;
      if (++done == kJobs) all.Notify();
    };
    ASSERT_TRUE((*scheduler)->Submit(std::move(job)).ok());
  }
  ASSERT_TRUE(all.WaitForNotificationWithTimeout(absl::Seconds(120)));
  EXPECT_EQ(passed.load(), kJobs);
}

TEST(CpuDeviceTest, AGangOfOtherDevicesIsRefused) {
  class Other : public Device {
   public:
    std::string kind() const override { return "cpu"; }
    std::string name() const override { return "other:0"; }
    absl::StatusOr<AuditReport> Run(const Snapshot&,
                                    const AuditOptions&) override {
      return AuditReport();
    }
  };
  CpuDevice device(0, 1);
  Other other;
  std::vector<Device*> gang = {&device, &other};
  EXPECT_EQ(device.RunGang(gang, SynthCp(2), AuditOptions()).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace attnaudit::server
