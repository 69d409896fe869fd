// A fleet: three servers (replicas A, B, C) sharing one PostgreSQL store, in
// the throwaway cluster ctest starts (pg_virtualenv). Whichever replica
// accepted a job, every replica answers GetResult, Cancel, WatchResults and
// ListResults for it; an idempotency key names one job fleet-wide; Audit
// results are stored; a watcher resumes from its cursor on another replica.
#include <stdlib.h>

#include <atomic>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "proto/codec/codec.h"
#include "tests/integration/test_server.h"
#include "tests/unit/server/store/postgres_testing.h"

namespace attnaudit::testing {
namespace {

constexpr int kReplicas = 3;

class FleetTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!PostgresAvailable()) GTEST_SKIP() << kNoPostgres;
    absl::StatusOr<std::string> url = FreshPostgresDatabase();
    ASSERT_TRUE(url.ok()) << url.status();
    url_ = *url;
  }

  // Starts replica `i` ("replica-a", ...); with `gate`, its one device
  // waits at the gate; every tenant gets `quota`.
  void StartReplica(int i, std::shared_ptr<GateState> gate = nullptr,
                    server::TenantQuota quota = {}) {
    server::AuditServerOptions o =
        TestOptions(MakeTempDir(absl::StrCat("fleet-", i)));
    o.tenant_quota = quota;
    o.store_url = url_;
    o.replica_id = absl::StrCat("replica-", std::string(1, 'a' + i));
    if (gate != nullptr) {
      o.devices.push_back(std::make_unique<GateDevice>(gate, i));
    }
    replicas_[i] = StartServer(std::move(o));
    ASSERT_NE(replicas_[i], nullptr);
  }
  void StartAll() {
    for (int i = 0; i < kReplicas; ++i) StartReplica(i);
  }
  client::Client* At(int i) { return replicas_[i]->client.get(); }

  std::string Submit(int replica, int64_t tag, const std::string& key = "",
                     bool* deduplicated = nullptr) {
    client::SubmitOptions options;
    options.idempotency_key = key;
    absl::StatusOr<v1::SubmitResponse> r =
        At(replica)->Submit(SmallSnapshot(tag), options);
    // A replica answers ABORTED while it is itself submitting the same
    // key; a client retries.
    for (int i = 0; i < 100 && absl::IsAborted(r.status()); ++i) {
      absl::SleepFor(absl::Milliseconds(10));
      r = At(replica)->Submit(SmallSnapshot(tag), options);
    }
    EXPECT_TRUE(r.ok()) << r.status();
    if (!r.ok()) return "";
    if (deduplicated != nullptr) *deduplicated = r->deduplicated();
    return r->job_id();
  }

  std::string url_;
  std::unique_ptr<TestServer> replicas_[kReplicas];
};

TEST_F(FleetTest, AnyReplicaAnswersForAJobAnotherAccepted) {
  StartAll();
  const std::string id = Submit(0, 1);
  ASSERT_FALSE(id.empty());
  for (int reader : {1, 2}) {
    const v1::JobResult r = WaitFinished(At(reader), id);
    EXPECT_EQ(r.state(), v1::JOB_STATE_DONE) << "read through " << reader;
    EXPECT_EQ(r.report().verdict(), v1::VERDICT_PASS);
    EXPECT_EQ(r.replica(), "replica-a");
    EXPECT_GT(r.cursor(), 0);
  }
  // A finished job cannot be cancelled from anywhere; the answer says so.
  absl::StatusOr<v1::JobState> cancelled = At(2)->Cancel(id);
  ASSERT_TRUE(cancelled.ok()) << cancelled.status();
  EXPECT_EQ(*cancelled, v1::JOB_STATE_DONE);
}

TEST_F(FleetTest, AnIdempotencyKeyNamesOneJobAcrossTheFleet) {
  StartAll();
  bool dedup = true;
  const std::string first = Submit(0, 1, "key-1", &dedup);
  EXPECT_FALSE(dedup);
  const std::string retry = Submit(1, 1, "key-1", &dedup);
  EXPECT_TRUE(dedup);
  EXPECT_EQ(retry, first);

  // The same new key through A and B at once: one job, one creator.
  constexpr int kCalls = 8;
  std::atomic<int> created{0};
  std::vector<std::string> ids(kCalls);
  std::vector<std::thread> threads;
  for (int c = 0; c < kCalls; ++c) {
    threads.emplace_back([&, c] {
      bool d = true;
      ids[c] = Submit(c % 2, 2, "key-2", &d);
      if (!d) created.fetch_add(1);
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(created.load(), 1);
  for (const std::string& id : ids) EXPECT_EQ(id, ids[0]);
  EXPECT_EQ(WaitFinished(At(2), ids[0]).state(), v1::JOB_STATE_DONE);
}

TEST_F(FleetTest, CancelThroughAnotherReplicaStopsTheOwnersRun) {
  auto gate = std::make_shared<GateState>();
  StartReplica(0, gate);
  StartReplica(1);
  const std::string id = Submit(0, 7);
  ASSERT_TRUE(gate->WaitStarted(1));  // running on A, held at the gate
  absl::StatusOr<v1::JobState> state = At(1)->Cancel(id);
  ASSERT_TRUE(state.ok()) << state.status();
  EXPECT_EQ(*state, v1::JOB_STATE_CANCELLED);
  // A learns it from the store's feed and stops its run.
  EXPECT_TRUE(WaitFor([&] { return gate->cancelled_runs() == 1; }));
  EXPECT_EQ(WaitFinished(At(0), id).state(), v1::JOB_STATE_CANCELLED);
  EXPECT_EQ(WaitFinished(At(1), id).state(), v1::JOB_STATE_CANCELLED);
}

// Watches `replica` from `resume_after` until `count` results arrived.
std::vector<v1::JobResult> WatchFrom(client::Client* replica,
                                     int64_t resume_after, size_t count) {
  v1::WatchResultsRequest request;
  request.set_resume_after(resume_after);
  std::vector<v1::JobResult> seen;
  absl::Status s = replica->Watch(
      request,
      [&seen, count](const v1::JobResult& r) {
        seen.push_back(r);
        return seen.size() < count;
      },
      kWait);
  EXPECT_TRUE(s.ok()) << s;
  return seen;
}

TEST_F(FleetTest, AWatcherSeesEveryReplicasResultsAndResumesElsewhere) {
  StartAll();
  std::set<std::string> submitted;
  for (int i = 0; i < 4; ++i) {
    const std::string id = Submit(i % 2, 10 + i);
    submitted.insert(id);
    ASSERT_EQ(WaitFinished(At(i % 2), id).state(), v1::JOB_STATE_DONE);
  }
  // From the start of the feed, on C, which accepted none of them.
  const std::vector<v1::JobResult> seen = WatchFrom(At(2), 0, 4);
  ASSERT_EQ(seen.size(), 4u);
  std::set<std::string> ids;
  for (size_t i = 0; i < seen.size(); ++i) {
    ids.insert(seen[i].job_id());
    if (i > 0) {
      EXPECT_GT(seen[i].cursor(), seen[i - 1].cursor());
    }
  }
  EXPECT_EQ(ids, submitted);

  // Resume on B after the second: the last two, then a live one from A.
  std::vector<v1::JobResult> resumed;
  std::thread watcher([&] { resumed = WatchFrom(At(1), seen[1].cursor(), 3); });
  const std::string live = Submit(0, 20);
  watcher.join();
  ASSERT_EQ(resumed.size(), 3u);
  EXPECT_EQ(resumed[0].job_id(), seen[2].job_id());
  EXPECT_EQ(resumed[1].job_id(), seen[3].job_id());
  EXPECT_EQ(resumed[2].job_id(), live);
  EXPECT_EQ(resumed[2].replica(), "replica-a");
}

TEST_F(FleetTest, AuditResultsAreStoredAndListedFromAnyReplica) {
  StartAll();
  v1::AuditRequest request;
  SnapshotToProto(SmallSnapshot(21, Fault::kStalePage),
                  request.mutable_snapshot());
  absl::StatusOr<v1::AuditResponse> audited = At(1)->AuditUnary(request);
  ASSERT_TRUE(audited.ok()) << audited.status();
  ASSERT_EQ(audited->report().verdict(), v1::VERDICT_DRIFT);
  ASSERT_FALSE(audited->job_id().empty());
  const std::string submitted = Submit(0, 22);
  ASSERT_EQ(WaitFinished(At(2), submitted).state(), v1::JOB_STATE_DONE);
  // The Audit's job reads back like a Submit's, from another replica.
  EXPECT_TRUE(WaitFor([&] {
    absl::StatusOr<v1::JobResult> r = At(2)->GetResult(audited->job_id());
    return r.ok() && r->state() == v1::JOB_STATE_DONE;
  }));

  v1::ListResultsRequest drift;
  drift.set_verdict(v1::VERDICT_DRIFT);
  absl::StatusOr<v1::ListResultsResponse> listed = At(0)->ListResults(drift);
  ASSERT_TRUE(listed.ok()) << listed.status();
  ASSERT_EQ(listed->results_size(), 1);
  const v1::ResultSummary& s = listed->results(0);
  EXPECT_EQ(s.job_id(), audited->job_id());
  EXPECT_EQ(s.replica(), "replica-b");
  EXPECT_FALSE(s.diagnosis().empty());
  EXPECT_GT(s.engine_out().max_abs(), s.engine_out().tolerance());

  // Every result once over pages of one, newest first.
  v1::ListResultsRequest all;
  all.set_page_size(1);
  std::vector<int64_t> cursors;
  for (int page = 0; page < 5; ++page) {
    absl::StatusOr<v1::ListResultsResponse> r = At(page % 3)->ListResults(all);
    ASSERT_TRUE(r.ok()) << r.status();
    for (const auto& row : r->results()) cursors.push_back(row.cursor());
    if (r->next_page_token().empty()) break;
    all.set_page_token(r->next_page_token());
  }
  ASSERT_EQ(cursors.size(), 2u);
  EXPECT_GT(cursors[0], cursors[1]);
}

TEST_F(FleetTest, ATenantsQuotaCountsItsJobsOnEveryReplica) {
  server::TenantQuota two_jobs;
  two_jobs.max_jobs = 2;
  auto gate_a = std::make_shared<GateState>();
  auto gate_b = std::make_shared<GateState>();
  StartReplica(0, gate_a, two_jobs);
  StartReplica(1, gate_b, two_jobs);
  const std::string first = Submit(0, 50);
  ASSERT_TRUE(gate_a->WaitStarted(1));
  const std::string second = Submit(1, 51);
  ASSERT_TRUE(gate_b->WaitStarted(1));
  // One job on each replica: the tenant's third is refused on either.
  for (int replica : {0, 1}) {
    absl::StatusOr<v1::SubmitResponse> third =
        At(replica)->Submit(SmallSnapshot(52 + replica));
    EXPECT_EQ(third.status().code(), absl::StatusCode::kResourceExhausted)
        << third.status();
    EXPECT_NE(third.status().message().find("tenant quota: 2 of 2 jobs"),
              absl::string_view::npos)
        << third.status();
  }
  gate_a->Open();
  gate_b->Open();
  EXPECT_EQ(WaitFinished(At(0), first).state(), v1::JOB_STATE_DONE);
  EXPECT_EQ(WaitFinished(At(0), second).state(), v1::JOB_STATE_DONE);
  EXPECT_FALSE(Submit(1, 54).empty());  // room again
}

// Stops or starts the throwaway cluster (pg_virtualenv names it
// "regress"); true on success.
bool Cluster(const char* action) {
  return std::system(absl::StrCat("pg_ctlcluster \"$PGVERSION\" regress ",
                                  action, " >/dev/null 2>&1")
                         .c_str()) == 0;
}

TEST_F(FleetTest, AStoreOutageIsUnavailableWithAHintAndLosesNothing) {
  auto gate = std::make_shared<GateState>();
  StartReplica(0, gate);
  const std::string held = Submit(0, 40);  // acknowledged, held at the gate
  ASSERT_TRUE(gate->WaitStarted(1));
  ASSERT_TRUE(Cluster("stop -m fast"));
  gate->Open();  // it finishes while the store is away: its result waits

  client::SubmitOptions options;
  absl::StatusOr<v1::SubmitResponse> refused =
      At(0)->Submit(SmallSnapshot(41), options);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnavailable)
      << refused.status();
  EXPECT_GT(client::RetryAfter(refused.status()), absl::ZeroDuration());
  absl::StatusOr<v1::ListResultsResponse> listed =
      At(0)->ListResults(v1::ListResultsRequest());
  EXPECT_EQ(listed.status().code(), absl::StatusCode::kUnavailable);
  // The held job stays visible from the replica that runs it.
  absl::StatusOr<v1::JobResult> during = At(0)->GetResult(held);
  ASSERT_TRUE(during.ok()) << during.status();
  EXPECT_EQ(during->state(), v1::JOB_STATE_RUNNING);

  ASSERT_TRUE(Cluster("start"));
  EXPECT_EQ(WaitFinished(At(0), held).state(), v1::JOB_STATE_DONE);
  const std::string after = Submit(0, 42);
  EXPECT_EQ(WaitFinished(At(0), after).state(), v1::JOB_STATE_DONE);
}

TEST_F(FleetTest, AnUnreachableStoreIsAClearStartError) {
  server::AuditServerOptions o = TestOptions(MakeTempDir("fleet-bad"));
  o.store_url = "postgresql://audit:hunter2@127.0.0.1:1/attnaudit";
  absl::StatusOr<std::unique_ptr<server::AuditServer>> s =
      server::AuditServer::Start(std::move(o));
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(s.status().message().find("postgresql://audit:***@127.0.0.1:1"),
            absl::string_view::npos)
      << s.status();
  EXPECT_EQ(s.status().message().find("hunter2"), absl::string_view::npos);
}

}  // namespace
}  // namespace attnaudit::testing
