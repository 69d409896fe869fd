// The backend seams of the pipeline: the audit runs the backend it is
// given (a refusal is the audit's status), FallbackBackend hands what its
// primary refuses to the fallback and the report names the backend that
// ran, and a backend's capabilities, not its identity, decide whether the
// comparisons call it from several threads.
#include "core/backend/backend.h"

#include <algorithm>
#include <atomic>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "core/audit/audit.h"
#include "core/backend/fallback_backend.h"
#include "gtest/gtest.h"
#include "tests/unit/core/testing/snapshot_builder.h"

namespace attnaudit {
namespace testing {
namespace {

// A backend that refuses every attention pass with `status` and must not be
// asked for anything else.
class RefusingBackend : public Backend {
 public:
  explicit RefusingBackend(absl::Status status) : status_(std::move(status)) {}
  std::string name() const override { return "fake:0"; }
  BackendCapabilities capabilities() const override { return {}; }
  absl::StatusOr<AttentionResults> ComputeAttention(
      const PreparedAttention&, const AttentionRunOptions&) override {
    ++attention_calls;
    return status_;
  }
  absl::StatusOr<CpReplayRun> ReplayCp(const PreparedAttention&,
                                       const CpSchedule&,
                                       const CpReplayOptions&) override {
    ++other_calls;
    return absl::InternalError("ReplayCp on the refusing backend");
  }
  absl::StatusOr<DriftStats> ComputeDrift(const DenseView&, const DenseView&,
                                          const DriftOptions&) override {
    ++other_calls;
    return absl::InternalError("ComputeDrift on the refusing backend");
  }

  std::atomic<int> attention_calls{0};
  std::atomic<int> other_calls{0};

 private:
  absl::Status status_;
};

// The CPU backend under another name and stated capabilities, recording the
// threads that call ComputeDrift and how many calls overlapped.
class RecordingBackend : public Backend {
 public:
  explicit RecordingBackend(bool concurrent) : concurrent_(concurrent) {}
  std::string name() const override { return "recording"; }
  BackendCapabilities capabilities() const override {
    BackendCapabilities c;
    c.concurrent_calls = concurrent_;
    return c;
  }
  absl::StatusOr<AttentionResults> ComputeAttention(
      const PreparedAttention& p, const AttentionRunOptions& o) override {
    return CpuBackendInstance().ComputeAttention(p, o);
  }
  absl::StatusOr<CpReplayRun> ReplayCp(const PreparedAttention& p,
                                       const CpSchedule& s,
                                       const CpReplayOptions& o) override {
    return CpuBackendInstance().ReplayCp(p, s, o);
  }
  absl::StatusOr<DriftStats> ComputeDrift(const DenseView& c,
                                          const DenseView& b,
                                          const DriftOptions& o) override {
    const int now = ++in_flight_;
    {
      std::lock_guard<std::mutex> lock(mu_);
      threads.insert(std::this_thread::get_id());
      max_in_flight = std::max(max_in_flight, now);
      ++drift_calls;
    }
    absl::StatusOr<DriftStats> r = CpuBackendInstance().ComputeDrift(c, b, o);
    --in_flight_;
    return r;
  }

  std::set<std::thread::id> threads;
  int max_in_flight = 0;
  int drift_calls = 0;

 private:
  const bool concurrent_;
  std::atomic<int> in_flight_{0};
  std::mutex mu_;
};

Snapshot TestSnapshot() {
  Snapshot s = BuildSnapshot(SnapshotSpec{});
  AddEngineOutputs(&s);
  AddLogprobInputs(&s);
  return s;
}

AuditOptions Options(Backend* backend) {
  AuditOptions o;
  o.backend = backend;
  o.threads = 4;
  o.diagnose = false;
  return o;
}

TEST(BackendTest, TheAuditRunsTheBackendItIsGivenAndReturnsItsRefusal) {
  const Snapshot s = TestSnapshot();
  RefusingBackend refusing(absl::ResourceExhaustedError("pool too small"));
  absl::StatusOr<AuditReport> report = RunAudit(s, Options(&refusing));
  EXPECT_EQ(report.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(refusing.attention_calls.load(), 1);
}

TEST(FallbackBackendTest,
     ARefusedSnapshotRunsOnTheFallbackAndTheReportNamesIt) {
  const Snapshot s = TestSnapshot();
  absl::StatusOr<AuditReport> cpu = RunAudit(s, Options(nullptr));
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  for (absl::StatusCode code : {absl::StatusCode::kResourceExhausted,
                                absl::StatusCode::kUnimplemented}) {
    RefusingBackend refusing(absl::Status(code, "cannot take it"));
    std::vector<absl::Status> told;
    FallbackBackend backend(
        refusing, CpuBackendInstance(),
        [&told](const absl::Status& why) { told.push_back(why); });
    EXPECT_EQ(backend.name(), "fake:0");
    EXPECT_FALSE(backend.capabilities().concurrent_calls);
    absl::StatusOr<AuditReport> report = RunAudit(s, Options(&backend));
    ASSERT_TRUE(report.ok()) << report.status();
    EXPECT_TRUE(backend.fell_back());
    EXPECT_EQ(report->provenance.backend, "cpu");
    EXPECT_TRUE(backend.capabilities().concurrent_calls);
    ASSERT_EQ(told.size(), 1u);
    EXPECT_EQ(told[0].code(), code);
    EXPECT_EQ(refusing.attention_calls.load(), 1);
    EXPECT_EQ(refusing.other_calls.load(), 0);
    EXPECT_EQ(report->verdict, cpu->verdict);
    ASSERT_EQ(report->comparisons.size(), cpu->comparisons.size());
    for (size_t i = 0; i < cpu->comparisons.size(); ++i) {
      EXPECT_EQ(report->comparisons[i].verdict, cpu->comparisons[i].verdict);
    }
  }
}

TEST(FallbackBackendTest, OtherErrorsAreNotFallenBackFrom) {
  const Snapshot s = TestSnapshot();
  RefusingBackend failing(absl::InternalError("device lost"));
  int told = 0;
  FallbackBackend backend(failing, CpuBackendInstance(),
                          [&told](const absl::Status&) { ++told; });
  absl::StatusOr<AuditReport> report = RunAudit(s, Options(&backend));
  EXPECT_EQ(report.status().code(), absl::StatusCode::kInternal);
  EXPECT_FALSE(backend.fell_back());
  EXPECT_EQ(told, 0);
}

TEST(FallbackBackendTest, APrimaryThatTakesTheSnapshotRunsTheWholeAudit) {
  const Snapshot s = TestSnapshot();
  RecordingBackend primary(/*concurrent=*/false);
  RefusingBackend never(absl::InternalError("the fallback must not run"));
  FallbackBackend backend(primary, never);
  absl::StatusOr<AuditReport> report = RunAudit(s, Options(&backend));
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_FALSE(backend.fell_back());
  EXPECT_EQ(report->provenance.backend, "recording");
  EXPECT_GT(primary.drift_calls, 0);
  EXPECT_EQ(never.attention_calls.load() + never.other_calls.load(), 0);
}

// A backend that serves one call at a time is called from the auditing
// thread only, whatever the audit's thread count.
TEST(BackendCapabilitiesTest, OneCallAtATimeKeepsTheComparisonsOnOneThread) {
  const Snapshot s = TestSnapshot();
  RecordingBackend backend(/*concurrent=*/false);
  absl::StatusOr<AuditReport> report = RunAudit(s, Options(&backend));
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_EQ(report->provenance.backend, "recording");
  EXPECT_GT(backend.drift_calls, 1);
  EXPECT_EQ(backend.max_in_flight, 1);
  EXPECT_EQ(backend.threads,
            std::set<std::thread::id>{std::this_thread::get_id()});
}

// A backend that serves concurrent calls gets the same results as the CPU
// backend's own audit (the parallel comparisons change no number).
TEST(BackendCapabilitiesTest, ConcurrentCallsGiveTheSameReport) {
  const Snapshot s = TestSnapshot();
  RecordingBackend one(/*concurrent=*/false);
  RecordingBackend many(/*concurrent=*/true);
  absl::StatusOr<AuditReport> a = RunAudit(s, Options(&one));
  absl::StatusOr<AuditReport> b = RunAudit(s, Options(&many));
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(a->verdict, b->verdict);
  ASSERT_EQ(a->comparisons.size(), b->comparisons.size());
  EXPECT_EQ(many.drift_calls, one.drift_calls);
  for (size_t i = 0; i < a->comparisons.size(); ++i) {
    EXPECT_EQ(a->comparisons[i].out.max_abs, b->comparisons[i].out.max_abs);
    EXPECT_EQ(a->comparisons[i].lse.max_abs, b->comparisons[i].lse.max_abs);
  }
}

}  // namespace
}  // namespace testing
}  // namespace attnaudit
