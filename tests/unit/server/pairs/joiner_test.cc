// PairJoiner over a real SQLite store: sides meet in the store whichever
// comes first, the pair is judged by core/pairs with each side's own
// audit, stored once and counted once.
#include "server/pairs/joiner.h"

#include <prometheus/registry.h>
#include <stdlib.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "attnaudit/v1/report.pb.h"
#include "core/audit/audit.h"
#include "gtest/gtest.h"
#include "proto/codec/codec.h"
#include "server/metrics/metrics.h"
#include "server/store/job_store.h"
#include "sim/simulator.h"

namespace attnaudit::server {
namespace {

std::string TempDir() {
  const char* base = getenv("TEST_TMPDIR");
  std::string tmpl = std::string(base ? base : "/tmp") + "/pairs_XXXXXX";
  return mkdtemp(&tmpl[0]);
}

// The wire's formats, as server/rpc gives them (codec only, no gRPC).
PairFormats Formats() {
  PairFormats f;
  f.encode_snapshot = [](const Snapshot& s) {
    v1::Snapshot wire;
    SnapshotToProto(s, &wire);
    return wire.SerializeAsString();
  };
  f.decode_snapshot = [](const std::string& b) -> absl::StatusOr<Snapshot> {
    v1::Snapshot wire;
    if (!wire.ParseFromString(b)) return absl::DataLossError("snapshot");
    return SnapshotFromProto(&wire);
  };
  f.encode_report = [](const AuditReport& r) {
    v1::AuditReport wire;
    ReportToProto(r, &wire);
    return wire.SerializeAsString();
  };
  f.decode_report = [](const std::string& b) -> absl::StatusOr<AuditReport> {
    v1::AuditReport wire;
    if (!wire.ParseFromString(b)) return absl::DataLossError("report");
    return ReportFromProto(wire);
  };
  f.encode_pair = [](const PairReport& r) {
    v1::PairReport wire;
    PairReportToProto(r, &wire);
    return wire.SerializeAsString();
  };
  return f;
}

// A decode step of two rows (requests req-0, req-1) at layer 5 of run
// "grpo-7"; `fault` is in the engine's output only.
Snapshot Side(SnapshotRole role, Fault fault = Fault::kNone,
              const std::string& run = "grpo-7") {
  SynthOptions o;
  o.preset = "llama3-8b";
  o.batch = 2;
  o.context = 48;
  o.q_heads = 4;
  o.kv_heads = 2;
  o.head_dim = 32;
  o.seed = 11;
  o.fault = fault;
  o.fault_row = 0;
  absl::StatusOr<Snapshot> s = Synthesize(o);
  EXPECT_TRUE(s.ok()) << s.status();
  if (!s.ok()) return Snapshot();
  s->labels.role = role;
  s->labels.run = run;
  s->labels.layer = 5;
  s->labels.request_ids = {"req-0", "req-1"};
  s->labels.weight_version = role == SnapshotRole::kRollout ? "w7" : "w8";
  return *std::move(s);
}

AuditReport Audit(const Snapshot& s) {
  absl::StatusOr<AuditReport> r = RunAudit(s, AuditOptions());
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? *std::move(r) : AuditReport();
}

class JoinerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    StoreConfig config;
    config.data_dir = TempDir();
    config.options.sync = false;
    absl::StatusOr<std::unique_ptr<JobStore>> store = OpenJobStore(config);
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = *std::move(store);
    absl::StatusOr<std::unique_ptr<Metrics>> metrics =
        Metrics::Create(MetricsOptions());
    ASSERT_TRUE(metrics.ok()) << metrics.status();
    metrics_ = *std::move(metrics);
    Start(PairJoinerOptions());
  }

  void Start(PairJoinerOptions options) {
    options.replica_id = "r1";
    joiner_.reset();
    absl::StatusOr<std::unique_ptr<PairJoiner>> joiner =
        PairJoiner::Create(options, Formats(), store_.get(), metrics_.get());
    ASSERT_TRUE(joiner.ok()) << joiner.status();
    joiner_ = *std::move(joiner);
  }

  void Offer(const std::string& job_id, const Snapshot& s,
             const std::string& tenant = "default") {
    joiner_->Offer(tenant, job_id, s, Audit(s));
  }

  std::vector<PairRecord> Pairs() {
    joiner_->Flush();
    PairQuery q;
    q.include_report = true;
    absl::StatusOr<std::vector<PairRecord>> rows = store_->QueryPairs(q);
    EXPECT_TRUE(rows.ok()) << rows.status();
    return rows.ok() ? *std::move(rows) : std::vector<PairRecord>();
  }

  // attnaudit_pair_verdicts_total or _sides_total with exactly `labels`;
  // 0 when the series does not exist yet.
  double Count(const std::string& name,
               const std::map<std::string, std::string>& labels) {
    for (const auto& f : metrics_->registry()->Collect()) {
      if (f.name != name) continue;
      for (const auto& m : f.metric) {
        std::map<std::string, std::string> got;
        for (const auto& l : m.label) got[l.name] = l.value;
        if (got == labels) return m.counter.value;
      }
    }
    return 0;
  }
  double Sides(const std::string& outcome) {
    return Count("attnaudit_pair_sides_total", {{"outcome", outcome}});
  }
  double Verdicts(const std::string& verdict) {
    return Count("attnaudit_pair_verdicts_total",
                 {{"layer", "5"}, {"verdict", verdict}});
  }

  std::unique_ptr<JobStore> store_;
  std::unique_ptr<Metrics> metrics_;
  std::unique_ptr<PairJoiner> joiner_;
};

v1::PairReport Parsed(const PairRecord& p) {
  v1::PairReport r;
  EXPECT_TRUE(r.ParseFromString(p.report));
  return r;
}

TEST_F(JoinerTest, TheSecondSideJoinsTheFirstWhicheverComesFirst) {
  Offer("a-rollout", Side(SnapshotRole::kRollout));
  EXPECT_TRUE(Pairs().empty());
  EXPECT_EQ(Sides("waiting"), 1);
  Offer("a-trainer", Side(SnapshotRole::kTrainer));
  std::vector<PairRecord> pairs = Pairs();
  ASSERT_EQ(pairs.size(), 1u);
  EXPECT_EQ(pairs[0].rollout_job, "a-rollout");
  EXPECT_EQ(pairs[0].trainer_job, "a-trainer");
  EXPECT_EQ(pairs[0].run, "grpo-7");
  EXPECT_EQ(pairs[0].layer, 5);
  EXPECT_EQ(pairs[0].rollout_weight_version, "w7");
  EXPECT_EQ(pairs[0].trainer_weight_version, "w8");
  EXPECT_EQ(pairs[0].replica, "r1");
  EXPECT_EQ(pairs[0].verdict, v1::PAIR_VERDICT_CONSISTENT);
  const v1::PairReport report = Parsed(pairs[0]);
  ASSERT_EQ(report.rows_size(), 2);
  EXPECT_EQ(report.rows(0).request_id(), "req-0");
  EXPECT_TRUE(report.rows(0).out_bitwise());
  EXPECT_EQ(report.rollout_verdict(), v1::VERDICT_PASS);
  EXPECT_EQ(Sides("joined"), 1);
  EXPECT_EQ(Verdicts("consistent"), 2);
  EXPECT_EQ(Verdicts("trainer-drift"), 0);

  // The other order: the trainer waits, the rollout joins it.
  Offer("b-trainer", Side(SnapshotRole::kTrainer, Fault::kNone, "run-b"));
  Offer("b-rollout", Side(SnapshotRole::kRollout, Fault::kNone, "run-b"));
  pairs = Pairs();
  ASSERT_EQ(pairs.size(), 2u);
  EXPECT_EQ(pairs[0].rollout_job, "b-rollout");  // newest first
  EXPECT_EQ(pairs[0].trainer_job, "b-trainer");
  EXPECT_EQ(Verdicts("consistent"), 4);
}

TEST_F(JoinerTest, EachSideIsJudgedByItsOwnAudit) {
  const Snapshot trainer = Side(SnapshotRole::kTrainer, Fault::kStalePage);
  ASSERT_EQ(Audit(trainer).verdict, Verdict::kDrift);
  Offer("rollout", Side(SnapshotRole::kRollout));
  Offer("trainer", trainer);
  const std::vector<PairRecord> pairs = Pairs();
  ASSERT_EQ(pairs.size(), 1u);
  EXPECT_EQ(pairs[0].verdict, v1::PAIR_VERDICT_TRAINER_DRIFT);
  const v1::PairReport report = Parsed(pairs[0]);
  EXPECT_EQ(report.trainer_verdict(), v1::VERDICT_DRIFT);
  EXPECT_FALSE(report.trainer_diagnosis().empty());
  EXPECT_GE(Verdicts("trainer-drift"), 1);
}

TEST_F(JoinerTest, OnlyTheOtherRoleOfTheSameTenantRunAndLayerJoins) {
  Offer("r1", Side(SnapshotRole::kRollout));
  Offer("r2", Side(SnapshotRole::kRollout));  // same role: no pair
  Offer("t-other-run", Side(SnapshotRole::kTrainer, Fault::kNone, "other"));
  Offer("t-other-tenant", Side(SnapshotRole::kTrainer), "tenant-b");
  Snapshot other_layer = Side(SnapshotRole::kTrainer);
  other_layer.labels.layer = 6;
  Offer("t-other-layer", other_layer);
  Snapshot other_rows = Side(SnapshotRole::kTrainer);
  other_rows.labels.request_ids = {"req-8", "req-9"};
  Offer("t-other-rows", other_rows);
  EXPECT_TRUE(Pairs().empty());
  EXPECT_EQ(Sides("waiting"), 6);
  // A trainer side that matches joins both waiting rollouts.
  Offer("t", Side(SnapshotRole::kTrainer));
  EXPECT_EQ(Pairs().size(), 2u);
}

TEST_F(JoinerTest, SnapshotsThatAreNotSidesAreLeftAlone) {
  Snapshot alone = Side(SnapshotRole::kRollout);
  alone.labels.role = SnapshotRole::kNone;
  Offer("alone", alone);
  Snapshot no_run = Side(SnapshotRole::kRollout);
  no_run.labels.run.clear();
  Offer("no-run", no_run);
  Offer("t", Side(SnapshotRole::kTrainer));
  EXPECT_TRUE(Pairs().empty());
  EXPECT_EQ(Sides("waiting"), 1);  // the trainer side only
  EXPECT_FALSE(PairJoiner::IsSide(alone));
  EXPECT_FALSE(PairJoiner::IsSide(no_run));
}

TEST_F(JoinerTest, AJoinMadeTwiceIsStoredAndCountedOnce) {
  Offer("rollout", Side(SnapshotRole::kRollout));
  Offer("trainer", Side(SnapshotRole::kTrainer));
  ASSERT_EQ(Pairs().size(), 1u);
  // The trainer's job offered again (a job run twice after a take-over):
  // it replaces its side and finds the rollout again.
  Offer("trainer", Side(SnapshotRole::kTrainer));
  EXPECT_EQ(Pairs().size(), 1u);
  EXPECT_EQ(Verdicts("consistent"), 2);
}

TEST_F(JoinerTest, AnExpiredSideIsNotJoined) {
  PairJoinerOptions o;
  o.wait = absl::Nanoseconds(1);
  Start(o);
  Offer("rollout", Side(SnapshotRole::kRollout));
  joiner_->Flush();
  absl::SleepFor(absl::Milliseconds(2));  // past its expiry, whatever else
  Offer("trainer", Side(SnapshotRole::kTrainer));
  EXPECT_TRUE(Pairs().empty());
  EXPECT_EQ(Sides("waiting"), 2);
}

TEST_F(JoinerTest, ASideOverItsBoundIsDroppedAndCounted) {
  PairJoinerOptions o;
  o.max_side_bytes = 1000;  // far below the snapshot's encoded size
  o.max_queued_bytes = 1000;
  Start(o);
  Offer("rollout", Side(SnapshotRole::kRollout));
  EXPECT_TRUE(Pairs().empty());
  EXPECT_EQ(Sides("dropped"), 1);
  EXPECT_EQ(Sides("waiting"), 0);
}

TEST_F(JoinerTest, ASideThatCannotBePairedFailsAlone) {
  Snapshot few_ids = Side(SnapshotRole::kRollout);
  few_ids.labels.request_ids = {"only-one"};  // two rows
  // Not audited as valid either way: offered with a PASS report by hand.
  AuditReport pass;
  pass.verdict = Verdict::kPass;
  joiner_->Offer("default", "few-ids", few_ids, pass);
  EXPECT_TRUE(Pairs().empty());
  EXPECT_EQ(Sides("failed"), 1);
}

TEST_F(JoinerTest, CreateRefusesOptionsOutOfRange) {
  PairJoinerOptions o;
  o.wait = absl::ZeroDuration();
  EXPECT_EQ(PairJoiner::Create(o, Formats(), store_.get(), metrics_.get())
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  o = PairJoinerOptions();
  o.max_queued_bytes = o.max_side_bytes - 1;
  EXPECT_FALSE(
      PairJoiner::Create(o, Formats(), store_.get(), metrics_.get()).ok());
  o = PairJoinerOptions();
  EXPECT_FALSE(PairJoiner::Create(o, Formats(), nullptr, metrics_.get()).ok());
}

}  // namespace
}  // namespace attnaudit::server
