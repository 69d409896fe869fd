// Admission (server/jobs/admission.h) over a real scheduler on gate devices
// (tests/unit/server/scheduler/test_devices.h) and real metrics: the job's
// shape (server settings, gang by pool), refusals counted under their
// reason with the scheduler's retry hint, draining, and the RPC layer's own
// refusals.
#include "server/jobs/admission.h"

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"
#include "tests/unit/server/scheduler/test_devices.h"

namespace attnaudit::server {
namespace {

using testing::Gate;
using testing::GateDevices;
using testing::GatedOptions;
using testing::kI;
using testing::MakeJob;
using testing::MakeScheduler;
using testing::Query;

std::unique_ptr<Metrics> MakeMetrics() {
  absl::StatusOr<std::unique_ptr<Metrics>> m = Metrics::Create({});
  EXPECT_TRUE(m.ok()) << m.status();
  return m.ok() ? *std::move(m) : nullptr;
}

// attnaudit_rejections_total{reason="<reason>"} as rendered; -1 if absent.
double Rejections(Metrics& metrics, const std::string& reason) {
  const std::string prefix =
      absl::StrCat("attnaudit_rejections_total{reason=\"", reason, "\"} ");
  for (absl::string_view line : absl::StrSplit(metrics.RenderText(), '\n')) {
    if (absl::StartsWith(line, prefix)) {
      double v = -1;
      if (absl::SimpleAtod(line.substr(prefix.size()), &v)) return v;
    }
  }
  return -1;
}

Admission::Options ServerSettings() {
  Admission::Options o;
  o.threads_per_job = 3;
  o.limits.max_total_bytes = 12345;
  return o;
}

// The gang a job for a CP snapshot of `world` ranks and `bytes` gets on
// `pool`.
std::unique_ptr<Job> Shaped(
    Scheduler* scheduler, Metrics* metrics, int64_t world,
    CpStrategy strategy = CpStrategy::kAuto, int64_t bytes = 1000,
    Admission::RingGang ring_gang = Admission::RingGang::kWhenNeeded) {
  Admission::Options o = ServerSettings();
  o.ring_gang = ring_gang;
  Admission admission(scheduler, metrics, o);
  auto job = MakeJob("j", kI, nullptr);
  job->snapshot.cp.world_size = world;
  job->options.cp_strategy = strategy;
  job->bytes = bytes;
  admission.Shape(job.get());
  return job;
}

TEST(AdmissionTest, ShapeAppliesTheServerSettingsAndTheGangByPool) {
  std::unique_ptr<Metrics> metrics = MakeMetrics();
  Gate gate;
  std::unique_ptr<Scheduler> cpus = MakeScheduler(GatedOptions(&gate, 2));
  std::unique_ptr<Job> one = Shaped(cpus.get(), metrics.get(), 1);
  EXPECT_EQ(one->options.threads, 3);
  EXPECT_EQ(one->options.limits.max_total_bytes, 12345);
  EXPECT_EQ(one->gang_size, 1);
  std::unique_ptr<Job> cp = Shaped(cpus.get(), metrics.get(), 4);
  EXPECT_EQ(cp->device_kind, "cpu");
  EXPECT_EQ(cp->gang_size, 2);  // min(W, CPU workers), whatever the strategy
  EXPECT_EQ(Shaped(cpus.get(), metrics.get(), 4, CpStrategy::kRing)->gang_size,
            2);

  // GPUs in the pool (pools of 1 MB): a ring runs on one GPU while it
  // fits one, else on a gang of as many as it needs, at most min(W, GPU
  // workers); always that gang when the operator asks; partials and auto
  // on one GPU.
  SchedulerOptions mixed = GatedOptions(&gate, 1, "cpu");
  constexpr int64_t kPool = int64_t{1} << 20;
  for (int i = 0; i < 3; ++i) {
    auto gpu = std::make_unique<testing::GateDevice>(
        "cuda:" + std::to_string(i), "cuda", &gate);
    gpu->set_job_memory_bytes(kPool);
    mixed.devices.push_back(std::move(gpu));
  }
  std::unique_ptr<Scheduler> gpus = MakeScheduler(std::move(mixed));
  const int64_t fits = kPool / 4;  // RingDeviceBytes: 13/4 of it, < kPool
  ASSERT_LE(RingDeviceBytes(fits), kPool);
  std::unique_ptr<Job> small =
      Shaped(gpus.get(), metrics.get(), 8, CpStrategy::kRing, fits);
  EXPECT_EQ(small->device_kind, "cuda");
  EXPECT_EQ(small->gang_size, 1);
  // Needs two pools' worth, then more than the pool has.
  const int64_t two = kPool / 2;
  ASSERT_GT(RingDeviceBytes(two), kPool);
  ASSERT_LE(RingDeviceBytes(two), 2 * kPool);
  EXPECT_EQ(
      Shaped(gpus.get(), metrics.get(), 8, CpStrategy::kRing, two)->gang_size,
      2);
  EXPECT_EQ(Shaped(gpus.get(), metrics.get(), 8, CpStrategy::kRing, 10 * kPool)
                ->gang_size,
            3);
  EXPECT_EQ(Shaped(gpus.get(), metrics.get(), 2, CpStrategy::kRing, 10 * kPool)
                ->gang_size,
            2);  // never more GPUs than ranks
  std::unique_ptr<Job> asked =
      Shaped(gpus.get(), metrics.get(), 8, CpStrategy::kRing, fits,
             Admission::RingGang::kAlways);
  EXPECT_EQ(asked->gang_size, 3);
  for (CpStrategy s : {CpStrategy::kAuto, CpStrategy::kPartials}) {
    std::unique_ptr<Job> one_gpu =
        Shaped(gpus.get(), metrics.get(), 8, s, 10 * kPool);
    EXPECT_EQ(one_gpu->device_kind, "cuda");
    EXPECT_EQ(one_gpu->gang_size, 1);
  }
  // A pool that reports no bound: one GPU.
  SchedulerOptions unbounded = GatedOptions(&gate, 2, "cuda");
  std::unique_ptr<Scheduler> any = MakeScheduler(std::move(unbounded));
  EXPECT_EQ(Shaped(any.get(), metrics.get(), 8, CpStrategy::kRing, 10 * kPool)
                ->gang_size,
            1);
}

TEST(AdmissionTest, CheckCountsARefusalUnderItsReason) {
  std::unique_ptr<Metrics> metrics = MakeMetrics();
  Gate gate;
  SchedulerOptions options = GatedOptions(&gate);
  options.max_queued_bytes = 1000;
  std::unique_ptr<Scheduler> scheduler = MakeScheduler(std::move(options));
  Admission admission(scheduler.get(), metrics.get(), {});
  absl::Duration retry_after = absl::Seconds(-1);
  EXPECT_TRUE(admission.Check(Query(kI, 10), &retry_after).ok());
  EXPECT_EQ(retry_after, absl::Seconds(-1));  // untouched when admitted
  absl::Status s = admission.Check(Query(kI, 5000), &retry_after);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(retry_after, absl::ZeroDuration());  // it can never fit
  EXPECT_EQ(Rejections(*metrics, "too_large"), 1);
}

TEST(AdmissionTest, SubmitHandsTheJobToTheSchedulerWithItsHint) {
  std::unique_ptr<Metrics> metrics = MakeMetrics();
  Gate gate;
  gate.Open();
  std::unique_ptr<Scheduler> scheduler = MakeScheduler(GatedOptions(&gate));
  Admission admission(scheduler.get(), metrics.get(), {});
  testing::Recorder recorder;
  absl::Duration retry_after;
  ASSERT_TRUE(admission.Submit(MakeJob("a", kI, &recorder), &retry_after).ok());
  EXPECT_TRUE(recorder.Wait("a").status.ok());
  absl::Status dup = admission.Submit(MakeJob("", kI, &recorder), &retry_after);
  EXPECT_FALSE(dup.ok());
}

TEST(AdmissionTest, DrainingRefusesAndCounts) {
  std::unique_ptr<Metrics> metrics = MakeMetrics();
  Gate gate;
  std::unique_ptr<Scheduler> scheduler = MakeScheduler(GatedOptions(&gate));
  Admission admission(scheduler.get(), metrics.get(), {});
  EXPECT_TRUE(admission.RefuseIfDraining().ok());
  EXPECT_FALSE(admission.draining());
  admission.StartDraining();
  EXPECT_TRUE(admission.draining());
  EXPECT_EQ(admission.RefuseIfDraining().code(),
            absl::StatusCode::kUnavailable);
  EXPECT_EQ(Rejections(*metrics, "draining"), 1);
}

TEST(AdmissionTest, CountRefusalMapsTheRpcLayersOwnRefusals) {
  std::unique_ptr<Metrics> metrics = MakeMetrics();
  Gate gate;
  std::unique_ptr<Scheduler> scheduler = MakeScheduler(GatedOptions(&gate));
  Admission admission(scheduler.get(), metrics.get(), {});
  const Metrics::InvalidInput other = Metrics::InvalidInput::kOtherRequest;
  admission.CountRefusal(absl::InvalidArgumentError("x"), other);
  admission.CountRefusal(absl::UnavailableError("x"), other);
  admission.CountRefusal(absl::ResourceExhaustedError("x"), other);
  admission.CountRefusal(absl::NotFoundError("x"), other);
  admission.CountRefusal(absl::OkStatus(), other);
  EXPECT_EQ(Rejections(*metrics, "invalid_argument"), 1);
  EXPECT_EQ(Rejections(*metrics, "draining"), 1);
  EXPECT_EQ(Rejections(*metrics, "too_large"), 1);
  EXPECT_EQ(Rejections(*metrics, "queue_full"), 0);
}

}  // namespace
}  // namespace attnaudit::server
