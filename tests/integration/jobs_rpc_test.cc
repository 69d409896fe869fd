// Submit, GetResult, WatchResults and durability against an in-process
// server: a submitted job yields exactly one stored result, watchers get
// finished results filtered by verdict and labels, a slow watcher is
// dropped with RESOURCE_EXHAUSTED, idempotency keys deduplicate, bad input
// creates no job, and jobs left in the spool by a shutdown are resumed by
// the next server on the same data dir.
#include <sqlite3.h>

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"
#include "proto/codec/codec.h"
#include "tests/integration/test_server.h"

namespace attnaudit::testing {
namespace {

// Collects a watch stream on a thread until `count` results arrived.
class Watcher {
 public:
  Watcher(client::Client* client, v1::ResultFilter filter, int count)
      : thread_([this, client, filter, count] {
          status_ = client->Watch(
              filter,
              [this, count](const v1::JobResult& r) {
                absl::MutexLock lock(&mu_);
                results_.push_back(r);
                return static_cast<int>(results_.size()) < count;
              },
              kWait);
        }) {}
  ~Watcher() { Join(); }
  void Join() {
    if (thread_.joinable()) thread_.join();
  }
  std::vector<v1::JobResult> results() {
    absl::MutexLock lock(&mu_);
    return results_;
  }
  absl::Status status() const { return status_; }

 private:
  absl::Mutex mu_;
  std::vector<v1::JobResult> results_;
  absl::Status status_;
  std::thread thread_;
};

class JobsRpcTest : public ::testing::Test {
 protected:
  void SetUp() override {
    t_ = StartServer(TestOptions(MakeTempDir("jobs_rpc")));
    ASSERT_NE(t_, nullptr);
  }
  std::unique_ptr<TestServer> t_;
};

TEST_F(JobsRpcTest, SubmittedJobYieldsOneStoredResult) {
  const Snapshot snapshot = SmallSnapshot(21);
  absl::StatusOr<v1::SubmitResponse> submitted = t_->client->Submit(snapshot);
  ASSERT_TRUE(submitted.ok()) << submitted.status();
  EXPECT_FALSE(submitted->job_id().empty());
  EXPECT_FALSE(submitted->deduplicated());
  const v1::JobResult result =
      WaitFinished(t_->client.get(), submitted->job_id());
  ASSERT_EQ(result.state(), v1::JOB_STATE_DONE) << result.DebugString();
  EXPECT_EQ(result.job_id(), submitted->job_id());
  EXPECT_EQ(result.report().verdict(), v1::VERDICT_PASS);
  EXPECT_EQ(result.priority(), v1::PRIORITY_SAMPLED);
  EXPECT_EQ(result.labels().model(), "llama3-8b");
  EXPECT_TRUE(result.has_start_time());
  EXPECT_TRUE(result.has_finish_time());
  // The result is committed, so the spool entry is gone.
  EXPECT_TRUE(WaitFor(
      [&] { return CountFiles(t_->data_dir + "/spool", ".job") == 0; }));
}

TEST_F(JobsRpcTest, WatchStreamsFinishedResultsThatMatchTheFilter) {
  v1::ResultFilter drift_only;
  drift_only.add_verdicts(v1::VERDICT_DRIFT);
  Watcher drift(t_->client.get(), drift_only, 1);
  Watcher everything(t_->client.get(), v1::ResultFilter(), 2);
  ASSERT_TRUE(WaitFor(
      [&] { return t_->server->service()->watch_hub()->watchers() == 2; }));

  absl::StatusOr<v1::SubmitResponse> pass =
      t_->client->Submit(SmallSnapshot(22));
  ASSERT_TRUE(pass.ok()) << pass.status();
  ASSERT_EQ(WaitFinished(t_->client.get(), pass->job_id()).state(),
            v1::JOB_STATE_DONE);
  absl::StatusOr<AuditReport> drifting =  // an Audit call's job is watched too
      t_->client->Audit(SmallSnapshot(23, Fault::kStalePage, 256));
  ASSERT_TRUE(drifting.ok()) << drifting.status();
  ASSERT_EQ(drifting->verdict, Verdict::kDrift);

  drift.Join();
  everything.Join();
  EXPECT_TRUE(drift.status().ok()) << drift.status();
  std::vector<v1::JobResult> got = drift.results();
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].report().verdict(), v1::VERDICT_DRIFT);
  EXPECT_EQ(got[0].labels().step(), 23);
  std::vector<v1::JobResult> all = everything.results();
  ASSERT_EQ(all.size(), 2u);
  EXPECT_EQ(all[0].job_id(), pass->job_id());
  EXPECT_EQ(all[1].labels().step(), 23);
}

TEST_F(JobsRpcTest, WatchFiltersOnLabels) {
  v1::ResultFilter other_model;
  other_model.set_model("not-llama");
  v1::ResultFilter layer0;
  layer0.set_layer(0);
  Watcher none(t_->client.get(), other_model, 1);
  Watcher some(t_->client.get(), layer0, 1);
  ASSERT_TRUE(WaitFor(
      [&] { return t_->server->service()->watch_hub()->watchers() == 2; }));
  ASSERT_TRUE(t_->client->Audit(SmallSnapshot(24)).ok());
  some.Join();
  ASSERT_EQ(some.results().size(), 1u);
  EXPECT_TRUE(none.results().empty());
  // Ends the unmatched watcher: the server closes streams on shutdown.
  t_->server->Shutdown();
  none.Join();
  EXPECT_TRUE(none.results().empty());
  EXPECT_EQ(none.status().code(), absl::StatusCode::kUnavailable)
      << none.status();
}

TEST_F(JobsRpcTest, SlowWatcherIsDroppedWithResourceExhausted) {
  t_.reset();
  server::AuditServerOptions options = TestOptions(MakeTempDir("slow"));
  options.watcher_buffer = 2;
  t_ = StartServer(std::move(options));
  ASSERT_NE(t_, nullptr);
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + kWait));
  auto reader = t_->stub->WatchResults(&context, v1::WatchResultsRequest());
  ASSERT_TRUE(WaitFor(
      [&] { return t_->server->service()->watch_hub()->watchers() == 1; }));
  // The client reads nothing while large results are published: once the
  // transport's flow-control window is full the server's buffer fills too.
  v1::JobResult big;
  big.set_job_id("big");
  big.set_state(v1::JOB_STATE_DONE);
  big.mutable_labels()->set_engine(std::string(256 << 10, 'x'));
  for (int i = 0; i < 400 && t_->server->service()->watch_hub()->watchers() > 0;
       ++i) {
    t_->server->service()->watch_hub()->Publish(big, "default");
  }
  v1::JobResult r;
  int read = 0;
  while (reader->Read(&r)) ++read;
  grpc::Status s = reader->Finish();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
      << s.error_message();
  EXPECT_TRUE(absl::StrContains(s.error_message(), "watcher too slow"));
  EXPECT_LT(read, 400);
}

TEST_F(JobsRpcTest, IdempotencyKeyReturnsTheSameJob) {
  const Snapshot snapshot = SmallSnapshot(25);
  client::SubmitOptions call;
  call.idempotency_key = "rollout-17/step-3";
  absl::StatusOr<v1::SubmitResponse> first = t_->client->Submit(snapshot, call);
  ASSERT_TRUE(first.ok()) << first.status();
  absl::StatusOr<v1::SubmitResponse> again = t_->client->Submit(snapshot, call);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->job_id(), first->job_id());
  EXPECT_TRUE(again->deduplicated());
  call.idempotency_key = "rollout-17/step-4";
  absl::StatusOr<v1::SubmitResponse> other = t_->client->Submit(snapshot, call);
  ASSERT_TRUE(other.ok());
  EXPECT_NE(other->job_id(), first->job_id());
  // Still deduplicated after the job finished (the store remembers it).
  ASSERT_EQ(WaitFinished(t_->client.get(), first->job_id()).state(),
            v1::JOB_STATE_DONE);
  call.idempotency_key = "rollout-17/step-3";
  absl::StatusOr<v1::SubmitResponse> late = t_->client->Submit(snapshot, call);
  ASSERT_TRUE(late.ok());
  EXPECT_EQ(late->job_id(), first->job_id());
  EXPECT_TRUE(late->deduplicated());

  call.idempotency_key = std::string(129, 'k');
  EXPECT_EQ(t_->client->Submit(snapshot, call).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(JobsRpcTest, InvalidSubmitCreatesNoJob) {
  Snapshot snapshot = SmallSnapshot(26);
  snapshot.kv_seq_lens.mutable_data<int32_t>()[0] = 1 << 20;  // past the pages
  absl::StatusOr<v1::SubmitResponse> r = t_->client->Submit(snapshot);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StartsWith(r.status().message(), "snapshot."))
      << r.status();
  EXPECT_EQ(CountFiles(t_->data_dir + "/spool", ".job"), 0);

  v1::SubmitRequest request;
  SnapshotToProto(SmallSnapshot(27), request.mutable_snapshot());
  request.mutable_timeout()->set_seconds(-1);
  grpc::ClientContext context;
  v1::SubmitResponse response;
  grpc::Status s = t_->stub->Submit(&context, request, &response);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_TRUE(absl::StartsWith(s.error_message(), "timeout"))
      << s.error_message();

  // A malformed Duration (mixed signs) is refused the same way.
  request.mutable_timeout()->set_seconds(5);
  request.mutable_timeout()->set_nanos(-1);
  grpc::ClientContext context2;
  s = t_->stub->Submit(&context2, request, &response);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_TRUE(absl::StartsWith(s.error_message(), "timeout: not a valid"))
      << s.error_message();

  v1::SubmitRequest no_snapshot;
  grpc::ClientContext context3;
  s = t_->stub->Submit(&context3, no_snapshot, &response);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(s.error_message(), "snapshot: missing");
  EXPECT_EQ(CountFiles(t_->data_dir + "/spool", ".job"), 0);
}

TEST_F(JobsRpcTest, UnknownAndMalformedJobIds) {
  absl::StatusOr<v1::JobResult> r = t_->client->GetResult("s0000nope");
  EXPECT_EQ(r.status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(absl::StartsWith(r.status().message(), "job_id")) << r.status();
  r = t_->client->GetResult("../../etc/passwd");
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StartsWith(r.status().message(), "job_id")) << r.status();
  absl::StatusOr<v1::JobState> c = t_->client->Cancel("s0000nope");
  EXPECT_EQ(c.status().code(), absl::StatusCode::kNotFound);
}

TEST(JobsDurabilityTest, SpooledJobsAreResumedByTheNextServer) {
  const std::string dir = MakeTempDir("resume");
  std::vector<std::string> ids;
  {
    // First server: its only device never lets a job finish, and the
    // drain gives up at once, so every accepted job stays spooled.
    auto gate = std::make_shared<GateState>();
    server::AuditServerOptions options = TestOptions(dir);
    options.devices.push_back(std::make_unique<GateDevice>(gate, 0));
    options.drain_timeout = absl::ZeroDuration();
    std::unique_ptr<TestServer> t = StartServer(std::move(options));
    ASSERT_NE(t, nullptr);
    for (int i = 0; i < 3; ++i) {
      absl::StatusOr<v1::SubmitResponse> r =
          t->client->Submit(SmallSnapshot(30 + i));
      ASSERT_TRUE(r.ok()) << r.status();
      ids.push_back(r->job_id());
    }
    ASSERT_TRUE(gate->WaitStarted(1));
    t->server->Shutdown();
    EXPECT_EQ(CountFiles(dir + "/spool", ".job"), 3);
  }
  // Second server on the same data dir, with a real CPU device.
  std::unique_ptr<TestServer> t = StartServer(TestOptions(dir));
  ASSERT_NE(t, nullptr);
  ASSERT_TRUE(t->server->WaitForResume(kWait));
  EXPECT_EQ(t->server->resumed_jobs(), 3);
  for (const std::string& id : ids) {
    const v1::JobResult r = WaitFinished(t->client.get(), id);
    EXPECT_EQ(r.state(), v1::JOB_STATE_DONE) << r.DebugString();
    EXPECT_EQ(r.report().verdict(), v1::VERDICT_PASS);
  }
  EXPECT_TRUE(WaitFor([&] { return CountFiles(dir + "/spool", ".job") == 0; }));
  // A third start finds nothing to resume: each job ran to one result.
  t.reset();
  std::unique_ptr<TestServer> again = StartServer(TestOptions(dir));
  ASSERT_NE(again, nullptr);
  ASSERT_TRUE(again->server->WaitForResume(kWait));
  EXPECT_EQ(again->server->resumed_jobs(), 0);
  for (const std::string& id : ids) {
    absl::StatusOr<v1::JobResult> r = again->client->GetResult(id);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->state(), v1::JOB_STATE_DONE);
  }
}

// A run that died between a Submit's spool entry and its row's commit
// leaves a spooled job with no row. Its retry (same key) reaches the next
// server before that server's resume has read the entry: it is answered as
// the same job, and GetResult must find that job at once (it said NOT_FOUND
// until the resume came to it), and the resume runs it to one result.
TEST(JobsDurabilityTest, ARetriedSpooledJobIsFoundBeforeItsResume) {
  const std::string dir = MakeTempDir("retried_spooled");
  client::SubmitOptions call;
  call.idempotency_key = "rollout-3/step-9";
  std::string id;
  {
    auto gate = std::make_shared<GateState>();
    server::AuditServerOptions options = TestOptions(dir);
    options.devices.push_back(std::make_unique<GateDevice>(gate, 0));
    options.drain_timeout = absl::ZeroDuration();
    std::unique_ptr<TestServer> t = StartServer(std::move(options));
    ASSERT_NE(t, nullptr);
    absl::StatusOr<v1::SubmitResponse> r =
        t->client->Submit(SmallSnapshot(41), call);
    ASSERT_TRUE(r.ok()) << r.status();
    id = r->job_id();
    ASSERT_TRUE(gate->WaitStarted(1));
    t->server->Shutdown();
  }
  // The state of a crash before the commit: the entry, and no row.
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open((dir + "/results.db").c_str(), &db), SQLITE_OK);
  const std::string del =
      absl::StrCat("DELETE FROM results WHERE job_id = '", id, "'");
  ASSERT_EQ(sqlite3_exec(db, del.c_str(), nullptr, nullptr, nullptr),
            SQLITE_OK);
  EXPECT_EQ(sqlite3_changes(db), 1);
  sqlite3_close(db);
  ASSERT_EQ(CountFiles(dir + "/spool", ".job"), 1);
  {
    server::AuditServerOptions options = TestOptions(dir);
    options.resume_spool = false;  // the resume has not reached the entry
    std::unique_ptr<TestServer> t = StartServer(std::move(options));
    ASSERT_NE(t, nullptr);
    absl::StatusOr<v1::SubmitResponse> again =
        t->client->Submit(SmallSnapshot(41), call);
    ASSERT_TRUE(again.ok()) << again.status();
    EXPECT_EQ(again->job_id(), id);
    EXPECT_TRUE(again->deduplicated());
    absl::StatusOr<v1::JobResult> seen = t->client->GetResult(id);
    ASSERT_TRUE(seen.ok()) << seen.status();
    EXPECT_EQ(seen->state(), v1::JOB_STATE_QUEUED);
  }
  std::unique_ptr<TestServer> t = StartServer(TestOptions(dir));
  ASSERT_NE(t, nullptr);
  ASSERT_TRUE(t->server->WaitForResume(kWait));
  EXPECT_EQ(t->server->resumed_jobs(), 1);
  EXPECT_EQ(WaitFinished(t->client.get(), id).state(), v1::JOB_STATE_DONE);
  EXPECT_TRUE(WaitFor([&] { return CountFiles(dir + "/spool", ".job") == 0; }));
}

// On one replica a Submit was acknowledged even when its store
// write failed. It is acknowledged only once its row is committed: while
// results.db is locked by someone else the Submit fails (and nothing of
// it runs), and it succeeds again once the lock is gone.
TEST(JobsDurabilityTest, ASubmitIsAcknowledgedOnlyOnceItsRowIsStored) {
  const std::string dir = MakeTempDir("unstored");
  std::unique_ptr<TestServer> t = StartServer(TestOptions(dir));
  ASSERT_NE(t, nullptr);
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open((dir + "/results.db").c_str(), &db), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(db, "BEGIN EXCLUSIVE", nullptr, nullptr, nullptr),
            SQLITE_OK);
  absl::StatusOr<v1::SubmitResponse> refused =
      t->client->Submit(SmallSnapshot(7));
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnavailable)
      << refused.status();
  EXPECT_EQ(CountFiles(dir + "/spool", ".job"), 0);
  EXPECT_EQ(t->server->scheduler()->Stats().in_flight +
                t->server->scheduler()->Stats().queued[1],
            0);
  sqlite3_exec(db, "COMMIT", nullptr, nullptr, nullptr);
  sqlite3_close(db);
  absl::StatusOr<v1::SubmitResponse> ok = t->client->Submit(SmallSnapshot(8));
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(WaitFinished(t->client.get(), ok->job_id()).state(),
            v1::JOB_STATE_DONE);
}

// Two servers on one --data-dir both started, each resuming the
// other's spool. The second is refused, naming the flag; once the first
// is gone the directory is free again.
TEST(JobsDurabilityTest, ASecondServerOnTheSameDataDirIsRefused) {
  const std::string dir = MakeTempDir("locked");
  std::unique_ptr<TestServer> first = StartServer(TestOptions(dir));
  ASSERT_NE(first, nullptr);
  absl::StatusOr<std::unique_ptr<server::AuditServer>> second =
      server::AuditServer::Start(TestOptions(dir));
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StartsWith(second.status().message(),
                               absl::StrCat("--data-dir ", dir, ": in use")))
      << second.status();
  // The first one is untouched by the attempt.
  absl::StatusOr<v1::SubmitResponse> r =
      first->client->Submit(SmallSnapshot(9));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(WaitFinished(first->client.get(), r->job_id()).state(),
            v1::JOB_STATE_DONE);
  first.reset();
  EXPECT_NE(StartServer(TestOptions(dir)), nullptr);
}

}  // namespace
}  // namespace attnaudit::testing
