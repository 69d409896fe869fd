// The job lifecycle without a gRPC server: a JobService over a SQLite store
// and a spool in a temporary directory, a scheduler of gate devices (the
// test decides when a job's run returns), and formats of the test's own
// (a payload names the snapshot to synthesise; a report is its verdict).
#include <stdlib.h>

#include <atomic>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "server/jobs/jobs.h"
#include "server/metrics/metrics.h"
#include "server/spool/spool.h"
#include "server/store/job_ids.h"
#include "server/store/job_store.h"
#include "sim/simulator.h"
#include "tests/unit/server/scheduler/test_devices.h"

namespace attnaudit::server {
namespace {

using attnaudit::testing::Gate;
using attnaudit::testing::GatedOptions;
using attnaudit::testing::MakeScheduler;

std::string TempDir() {
  const char* base = getenv("TEST_TMPDIR");
  std::string tmpl = std::string(base ? base : "/tmp") + "/jobs_XXXXXX";
  return mkdtemp(&tmpl[0]);
}

// A small valid snapshot whose model label is `model` (the marker the
// gate devices record).
Snapshot SmallSnapshot(const std::string& model) {
  SynthOptions o;
  o.preset = "llama3-8b";
  o.batch = 1;
  o.context = 32;
  o.vocab = 16;
  absl::StatusOr<Snapshot> s = Synthesize(o);
  EXPECT_TRUE(s.ok()) << s.status();
  if (!s.ok()) return Snapshot();
  s->labels.model = model;
  return *std::move(s);
}

AuditWork WorkOf(const std::string& model) {
  AuditWork work;
  work.snapshot = SmallSnapshot(model);
  work.bytes = 1000;
  return work;
}

// The test's formats: a payload is "model:<name>", a report its verdict.
JobFormats TestFormats() {
  JobFormats f;
  f.decode_payload =
      [](const std::string& payload) -> absl::StatusOr<AuditWork> {
    if (!absl::StartsWith(payload, "model:")) {
      return absl::DataLossError("not a test payload");
    }
    return WorkOf(payload.substr(6));
  };
  f.encode_report = [](const AuditReport& report) {
    return absl::StrCat("verdict=", static_cast<int>(report.verdict));
  };
  return f;
}

Principal Tenant(const std::string& name) {
  Principal p;
  p.tenant = name;
  p.permissions = kPermSubmit | kPermRead | kPermCancel | kPermAudit;
  return p;
}

SubmitJob Submission(const Principal& caller, const std::string& model,
                     std::string key = "") {
  SubmitJob job;
  job.caller = caller;
  job.idempotency_key = std::move(key);
  job.work = WorkOf(model);
  job.payload = "model:" + model;
  return job;
}

// Records what the service publishes.
class Subscriber : public ResultSubscriber {
 public:
  void StartAfter(int64_t seq) override {}
  void Stored(const ResultRecord& record) override {
    absl::MutexLock lock(&mu_);
    stored_.push_back(record.job_id);
  }
  void Unstored(const ResultRecord& record) override {}
  bool Saw(const std::string& job_id) {
    absl::MutexLock lock(&mu_);
    for (const std::string& id : stored_) {
      if (id == job_id) return true;
    }
    return false;
  }

 private:
  absl::Mutex mu_;
  std::vector<std::string> stored_;
};

// One server's worth of parts over a data directory; a second instance
// over the same directory is the server after a restart.
class Replica {
 public:
  Replica(const std::string& dir, Gate* gate,
          JobServiceOptions options = JobServiceOptions()) {
    StoreConfig config;
    config.data_dir = dir;
    config.options.sync = false;
    store_ = *OpenJobStore(config);
    SpoolOptions spool;
    spool.sync = false;
    spool_ = *Spool::Open(dir, spool);
    metrics_ = *Metrics::Create(MetricsOptions());
    scheduler_ = MakeScheduler(GatedOptions(gate));
    options.replica_id = "r1";
    absl::StatusOr<std::unique_ptr<JobService>> jobs = JobService::Create(
        std::move(options), TestFormats(), scheduler_.get(), spool_.get(),
        store_.get(), metrics_.get(), JobIdKey::FromSecret("secret"));
    EXPECT_TRUE(jobs.ok()) << jobs.status();
    jobs_ = *std::move(jobs);
    EXPECT_TRUE(jobs_->Start(&subscriber_).ok());
  }
  // The shutdown order jobs.h asks for: drain, scheduler gone, shutdown.
  ~Replica() {
    jobs_->Drain(absl::Milliseconds(100)).IgnoreError();
    scheduler_.reset();
    jobs_->Shutdown();
  }

  JobService* jobs() { return jobs_.get(); }
  Spool* spool() { return spool_.get(); }
  Subscriber* subscriber() { return &subscriber_; }

  // Get until the job reaches `state` (bounded).
  bool WaitForState(const Principal& caller, const std::string& id,
                    JobState state) {
    for (int i = 0; i < 500; ++i) {
      absl::StatusOr<ResultRecord> r = jobs_->Get(caller, id);
      if (r.ok() && r->state == state) return true;
      absl::SleepFor(absl::Milliseconds(10));
    }
    return false;
  }

 private:
  std::unique_ptr<JobStore> store_;
  std::unique_ptr<Spool> spool_;
  std::unique_ptr<Metrics> metrics_;
  std::unique_ptr<Scheduler> scheduler_;
  Subscriber subscriber_;
  std::unique_ptr<JobService> jobs_;
};

class JobServiceTest : public ::testing::Test {
 protected:
  std::string dir_ = TempDir();
  Gate gate_;
  const Principal alice_ = Tenant("alice");
  const Principal bob_ = Tenant("bob");

  ~JobServiceTest() override {
    gate_.Open();
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
};

TEST_F(JobServiceTest, SubmitGetCancel) {
  Replica r(dir_, &gate_);
  SubmitAnswer first;
  ASSERT_TRUE(r.jobs()->Submit(Submission(alice_, "first"), &first).ok());
  EXPECT_TRUE(absl::StartsWith(first.job_id, "s")) << first.job_id;
  EXPECT_FALSE(first.deduplicated);
  gate_.WaitStarted(1);  // runs on the only device
  SubmitAnswer second;
  ASSERT_TRUE(r.jobs()->Submit(Submission(alice_, "second"), &second).ok());
  EXPECT_TRUE(r.spool()->Contains(second.job_id));

  absl::StatusOr<ResultRecord> queued = r.jobs()->Get(alice_, second.job_id);
  ASSERT_TRUE(queued.ok()) << queued.status();
  EXPECT_EQ(queued->state, JobState::kQueued);
  EXPECT_EQ(queued->tenant, "alice");
  EXPECT_EQ(queued->model, "second");

  absl::StatusOr<JobState> cancelled = r.jobs()->Cancel(alice_, second.job_id);
  ASSERT_TRUE(cancelled.ok()) << cancelled.status();
  EXPECT_EQ(*cancelled, JobState::kCancelled);
  ASSERT_TRUE(r.WaitForState(alice_, second.job_id, JobState::kCancelled));

  gate_.Open();
  ASSERT_TRUE(r.WaitForState(alice_, first.job_id, JobState::kDone));
  absl::StatusOr<ResultRecord> done = r.jobs()->Get(alice_, first.job_id);
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_EQ(done->report, "verdict=1");  // PASS, as the formats wrote it
  EXPECT_EQ(done->replica, "r1");
  EXPECT_GT(done->seq, 0);
  // Stored results leave the spool and reach the subscriber.
  EXPECT_FALSE(r.spool()->Contains(first.job_id));
  for (int i = 0; i < 500 && !r.subscriber()->Saw(first.job_id); ++i) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_TRUE(r.subscriber()->Saw(first.job_id));
}

TEST_F(JobServiceTest, AnotherTenantsJobIsNotFoundLikeAnUnknownOne) {
  gate_.Open();
  Replica r(dir_, &gate_);
  SubmitAnswer a;
  ASSERT_TRUE(r.jobs()->Submit(Submission(alice_, "mine"), &a).ok());
  ASSERT_TRUE(r.WaitForState(alice_, a.job_id, JobState::kDone));
  absl::Status hidden = r.jobs()->Get(bob_, a.job_id).status();
  EXPECT_EQ(hidden.code(), absl::StatusCode::kNotFound);
  const std::string unknown_id = "s0000000000000000000000000000000000000000000";
  absl::Status unknown = r.jobs()->Get(bob_, unknown_id).status();
  EXPECT_EQ(hidden.message(),
            absl::StrReplaceAll(unknown.message(), {{unknown_id, a.job_id}}));
  EXPECT_EQ(r.jobs()->Cancel(bob_, a.job_id).status().code(),
            absl::StatusCode::kNotFound);
  // List sees only the caller's tenant's results.
  ResultQuery query;
  query.results_only = true;
  absl::StatusOr<std::vector<ResultRecord>> bobs = r.jobs()->List(bob_, query);
  ASSERT_TRUE(bobs.ok()) << bobs.status();
  EXPECT_TRUE(bobs->empty());
  absl::StatusOr<std::vector<ResultRecord>> alices =
      r.jobs()->List(alice_, query);
  ASSERT_TRUE(alices.ok()) << alices.status();
  ASSERT_EQ(alices->size(), 1u);
  EXPECT_EQ(CursorFor(alice_, alices->front()), 1);
}

TEST_F(JobServiceTest, AnIdempotentSubmitNamesOneJob) {
  gate_.Open();
  Replica r(dir_, &gate_);
  SubmitAnswer first;
  ASSERT_TRUE(r.jobs()->Submit(Submission(alice_, "m", "key-1"), &first).ok());
  SubmitAnswer again;
  ASSERT_TRUE(r.jobs()->Submit(Submission(alice_, "m", "key-1"), &again).ok());
  EXPECT_EQ(again.job_id, first.job_id);
  EXPECT_TRUE(again.deduplicated);
  // The same key of another tenant is another job.
  SubmitAnswer other;
  ASSERT_TRUE(r.jobs()->Submit(Submission(bob_, "m", "key-1"), &other).ok());
  EXPECT_NE(other.job_id, first.job_id);
  EXPECT_FALSE(other.deduplicated);
}

TEST_F(JobServiceTest, BadInputNamesTheFieldAndCreatesNoJob) {
  Replica r(dir_, &gate_);
  SubmitJob long_key = Submission(alice_, "m", std::string(200, 'k'));
  SubmitAnswer answer;
  absl::Status s = r.jobs()->Submit(std::move(long_key), &answer);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StartsWith(s.message(), "idempotency_key: ")) << s;

  SubmitJob no_time = Submission(alice_, "m");
  no_time.timeout = absl::ZeroDuration();
  s = r.jobs()->Submit(std::move(no_time), &answer);
  EXPECT_EQ(s.message(), "timeout: must be positive");

  SubmitJob empty = Submission(alice_, "m");
  empty.work.snapshot = Snapshot();
  s = r.jobs()->Submit(std::move(empty), &answer);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StartsWith(s.message(), "snapshot.")) << s;
  absl::StatusOr<std::vector<SpoolListing>> spooled = r.spool()->List();
  ASSERT_TRUE(spooled.ok());
  EXPECT_TRUE(spooled->empty());
}

TEST_F(JobServiceTest, DrainingRefusesWork) {
  Replica r(dir_, &gate_);
  r.jobs()->StartDraining();
  EXPECT_TRUE(r.jobs()->draining());
  SubmitAnswer answer;
  absl::Status s = r.jobs()->Submit(Submission(alice_, "late"), &answer);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  InteractiveJob job;
  job.job_id = "a-late";
  job.caller = alice_;
  job.work = WorkOf("late");
  absl::Duration retry_after;
  s = r.jobs()->RunInteractive(
      std::move(job), [](InteractiveAnswer) { ADD_FAILURE(); }, &retry_after);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
}

// A retried Submit whose job is only spooled (an earlier run died before
// the row's commit) finds its job before the start-up resume reaches the
// entry: the row is created from the spool entry before the answer, so
// Get never says NOT_FOUND for an acknowledged job.
TEST_F(JobServiceTest, ARetriedSpooledJobIsFoundBeforeItsResume) {
  const std::string key = "rollout-3/step-9";
  const std::string id =
      JobIdKey::FromSecret("secret").IdempotentJobId(alice_.tenant, key);
  {
    // The state of a crash before the commit: the entry, and no row.
    SpoolOptions options;
    options.sync = false;
    absl::StatusOr<std::unique_ptr<Spool>> spool = Spool::Open(dir_, options);
    ASSERT_TRUE(spool.ok()) << spool.status();
    SpoolMetadata meta;
    meta.priority = static_cast<int32_t>(PriorityClass::kSampled);
    meta.created = absl::Now() - absl::Minutes(1);
    meta.deadline = absl::InfiniteFuture();
    meta.model = "spooled";
    meta.tenant = alice_.tenant;
    ASSERT_TRUE((*spool)->Put(id, meta, "model:spooled").ok());
  }
  gate_.Open();
  Replica r(dir_, &gate_);
  EXPECT_EQ(r.jobs()->Get(alice_, id).status().code(),
            absl::StatusCode::kNotFound);
  SubmitAnswer again;
  absl::Status s = r.jobs()->Submit(Submission(alice_, "spooled", key), &again);
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(again.job_id, id);
  EXPECT_TRUE(again.deduplicated);
  absl::StatusOr<ResultRecord> seen = r.jobs()->Get(alice_, id);
  ASSERT_TRUE(seen.ok()) << seen.status();
  EXPECT_EQ(seen->state, JobState::kQueued);
  EXPECT_EQ(seen->model, "spooled");
  EXPECT_EQ(seen->replica, "r1");
  // The resume then runs it to its one result.
  std::atomic<bool> stop{false};
  EXPECT_EQ(r.jobs()->ResumeSpool(stop, absl::Now()), 1);
  ASSERT_TRUE(r.WaitForState(alice_, id, JobState::kDone));
  EXPECT_FALSE(r.spool()->Contains(id));
}

// A drain that times out leaves the unfinished job spooled; the next start
// over the same directory runs it to its one result.
TEST_F(JobServiceTest, ADrainedJobIsResumedFromTheSpoolAfterARestart) {
  std::string id;
  {
    Replica r(dir_, &gate_);
    SubmitAnswer answer;
    ASSERT_TRUE(r.jobs()->Submit(Submission(alice_, "survivor"), &answer).ok());
    id = answer.job_id;
    gate_.WaitStarted(1);
    // ~Replica drains for 100 ms: the job is still running, so it is
    // cancelled as the scheduler drains and stays spooled.
  }
  Gate open;
  open.Open();
  Replica again(dir_, &open);
  EXPECT_TRUE(again.spool()->Contains(id));
  std::atomic<bool> stop{false};
  EXPECT_EQ(again.jobs()->ResumeSpool(stop, absl::Now()), 1);
  ASSERT_TRUE(again.WaitForState(alice_, id, JobState::kDone));
  EXPECT_FALSE(again.spool()->Contains(id));
  // Resuming again finds nothing left to run.
  EXPECT_EQ(again.jobs()->ResumeSpool(stop, absl::Now()), 0);
}

// A drain with time enough lets the running job finish: its result is
// stored and its spool entry gone, while new work is refused.
TEST_F(JobServiceTest, ADrainLetsTheRunningJobFinish) {
  Replica r(dir_, &gate_);
  SubmitAnswer answer;
  ASSERT_TRUE(r.jobs()->Submit(Submission(alice_, "last"), &answer).ok());
  gate_.WaitStarted(1);
  absl::Status drained = absl::UnknownError("not drained");
  std::thread drain([&] { drained = r.jobs()->Drain(absl::Seconds(30)); });
  for (int i = 0; i < 500 && !r.jobs()->draining(); ++i) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  SubmitAnswer late;
  EXPECT_EQ(r.jobs()->Submit(Submission(alice_, "late"), &late).code(),
            absl::StatusCode::kUnavailable);
  gate_.Open();
  drain.join();
  EXPECT_TRUE(drained.ok()) << drained;
  absl::StatusOr<ResultRecord> done = r.jobs()->Get(alice_, answer.job_id);
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_EQ(done->state, JobState::kDone);
  EXPECT_FALSE(r.spool()->Contains(answer.job_id));
}

// A job still spooled after a restart and cancelled before the resume
// reaches it is recorded CANCELLED and never runs; the resume runs the
// other one.
TEST_F(JobServiceTest, ASpooledJobCancelledBeforeTheResumeNeverRuns) {
  std::string running;
  std::string queued;
  {
    Replica r(dir_, &gate_);
    SubmitAnswer a;
    ASSERT_TRUE(r.jobs()->Submit(Submission(alice_, "running"), &a).ok());
    gate_.WaitStarted(1);
    SubmitAnswer b;
    ASSERT_TRUE(r.jobs()->Submit(Submission(alice_, "queued"), &b).ok());
    running = a.job_id;
    queued = b.job_id;
  }
  Gate open;
  open.Open();
  Replica again(dir_, &open);
  ASSERT_TRUE(again.spool()->Contains(queued));
  absl::StatusOr<JobState> cancelled = again.jobs()->Cancel(alice_, queued);
  ASSERT_TRUE(cancelled.ok()) << cancelled.status();
  EXPECT_EQ(*cancelled, JobState::kCancelled);
  ASSERT_TRUE(again.WaitForState(alice_, queued, JobState::kCancelled));
  EXPECT_FALSE(again.spool()->Contains(queued));
  std::atomic<bool> stop{false};
  EXPECT_EQ(again.jobs()->ResumeSpool(stop, absl::Now()), 1);
  ASSERT_TRUE(again.WaitForState(alice_, running, JobState::kDone));
  for (const std::string& model : open.started()) {
    EXPECT_NE(model, "queued");
  }
}

TEST_F(JobServiceTest, AnInteractiveJobIsAnsweredOnceItsResultIsKept) {
  gate_.Open();
  Replica r(dir_, &gate_);
  InteractiveJob job;
  ASSERT_TRUE(NewJobId('a').ok());
  job.job_id = *NewJobId('a');
  job.caller = alice_;
  job.work = WorkOf("interactive");
  absl::Notification answered;
  InteractiveAnswer got;
  absl::Duration retry_after;
  ASSERT_TRUE(r.jobs()
                  ->RunInteractive(
                      job,
                      [&](InteractiveAnswer a) {
                        got = std::move(a);
                        answered.Notify();
                      },
                      &retry_after)
                  .ok());
  ASSERT_TRUE(answered.WaitForNotificationWithTimeout(absl::Seconds(10)));
  ASSERT_TRUE(got.status.ok()) << got.status;
  EXPECT_EQ(got.report.verdict, Verdict::kPass);
  EXPECT_EQ(got.job_id, job.job_id);
  EXPECT_TRUE(got.not_stored_reason.empty());
  // Kept: GetResult reads it back.
  absl::StatusOr<ResultRecord> stored = r.jobs()->Get(alice_, job.job_id);
  ASSERT_TRUE(stored.ok()) << stored.status();
  EXPECT_EQ(stored->state, JobState::kDone);
  EXPECT_EQ(stored->report, "verdict=1");
}

TEST_F(JobServiceTest, AResumedWatchGetsWhatItMissed) {
  gate_.Open();
  Replica r(dir_, &gate_);
  std::vector<std::string> ids;
  for (const char* model : {"w1", "w2", "w3"}) {
    SubmitAnswer answer;
    ASSERT_TRUE(r.jobs()->Submit(Submission(alice_, model), &answer).ok());
    ASSERT_TRUE(r.WaitForState(alice_, answer.job_id, JobState::kDone));
    ids.push_back(answer.job_id);
  }
  absl::StatusOr<std::vector<ResultRecord>> backlog =
      r.jobs()->WatchBacklog(alice_, /*after=*/1, /*until=*/1000);
  ASSERT_TRUE(backlog.ok()) << backlog.status();
  ASSERT_EQ(backlog->size(), 2u);
  EXPECT_EQ((*backlog)[0].job_id, ids[1]);
  EXPECT_EQ((*backlog)[1].job_id, ids[2]);
  // Bob's numbering has no results: any cursor is beyond his newest.
  absl::Status beyond = r.jobs()->WatchBacklog(bob_, 1, 1000).status();
  EXPECT_EQ(beyond.code(), absl::StatusCode::kInvalidArgument) << beyond;
  EXPECT_TRUE(absl::StartsWith(beyond.message(), "resume_after: ")) << beyond;
}

}  // namespace
}  // namespace attnaudit::server
