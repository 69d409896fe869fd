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

#include "absl/cleanup/cleanup.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
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

  // The options of replica `i` ("replica-a", ...): every tenant gets
  // `quota`, and tokens_ (when set) are the tenants.
  server::AuditServerOptions ReplicaOptions(int i,
                                            server::TenantQuota quota = {}) {
    server::AuditServerOptions o =
        TestOptions(MakeTempDir(absl::StrCat("fleet-", i)));
    o.tenant_quota = quota;
    o.store_url = url_;
    o.replica_id = absl::StrCat("replica-", std::string(1, 'a' + i));
    o.auth_tokens = tokens_;
    return o;
  }
  // Starts replica `i`; with `gate`, its one device waits at the gate.
  void StartReplica(int i, std::shared_ptr<GateState> gate = nullptr,
                    server::TenantQuota quota = {}) {
    server::AuditServerOptions o = ReplicaOptions(i, quota);
    if (gate != nullptr) {
      o.devices.push_back(std::make_unique<GateDevice>(gate, i));
    }
    StartWith(i, std::move(o));
  }
  void StartWith(int i, server::AuditServerOptions o) {
    client::ClientOptions co;
    co.auth_token = client_token_;
    replicas_[i] = StartServer(std::move(o), co);
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
  std::string tokens_;        // auth_tokens of every replica ("": none)
  std::string client_token_;  // the token of At(i)'s client
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
  const v1::JobResult r = WaitFinished(At(1), id);
  EXPECT_EQ(r.state(), v1::JOB_STATE_CANCELLED);
  // It used to say "cancelled before it was scheduled".
  EXPECT_EQ(r.error().message(), "cancelled while it ran on replica replica-a")
      << r.DebugString();
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

// The two sides of a train-rollout pair meet in the shared store: a
// rollout audited on one replica, its trainer on another, both see the
// pair, joined once.
TEST_F(FleetTest, APairJoinsAcrossReplicas) {
  StartAll();
  auto side = [](SnapshotRole role) {
    Snapshot s = SmallSnapshot(31);
    s.labels.role = role;
    s.labels.run = "fleet-run";
    s.labels.layer = 4;
    s.labels.request_ids = {"req-31"};
    return s;
  };
  v1::AuditRequest rollout;
  SnapshotToProto(side(SnapshotRole::kRollout), rollout.mutable_snapshot());
  ASSERT_TRUE(At(0)->AuditUnary(rollout).ok());
  v1::AuditRequest trainer;
  SnapshotToProto(side(SnapshotRole::kTrainer), trainer.mutable_snapshot());
  ASSERT_TRUE(At(1)->AuditUnary(trainer).ok());
  v1::ListPairsRequest by_run;
  by_run.set_run("fleet-run");
  EXPECT_TRUE(WaitFor([&] {
    absl::StatusOr<v1::ListPairsResponse> r = At(2)->ListPairs(by_run);
    return r.ok() && r->pairs_size() == 1;
  }));
  absl::StatusOr<v1::ListPairsResponse> r = At(0)->ListPairs(by_run);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->pairs_size(), 1);
  // Joined by whichever replica's side reached the store second.
  EXPECT_TRUE(r->pairs(0).replica() == "replica-a" ||
              r->pairs(0).replica() == "replica-b")
      << r->pairs(0).replica();
  EXPECT_EQ(r->pairs(0).report().verdict(), v1::PAIR_VERDICT_CONSISTENT);
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

// ---- What a hostile trial against a fleet found.

// A CPU device that fails its first run and then reports itself broken:
// the scheduler takes it out of the pool and refuses every later job
// (UNAVAILABLE, devices_failed) although the RPC layer's advisory check
// passes -- a replica whose admission refuses after the key's row exists.
class BrokenDevice : public server::Device {
 public:
  std::string kind() const override { return "cpu"; }
  std::string name() const override { return "broken:0"; }
  absl::StatusOr<AuditReport> Run(const Snapshot&,
                                  const AuditOptions&) override {
    broken_.store(true);
    return absl::InternalError("device broke");
  }
  absl::Status Health() const override {
    return broken_.load() ? absl::UnavailableError("broken") : absl::OkStatus();
  }

 private:
  std::atomic<bool> broken_{false};
};

// the same key through A (which inserted its row, then refused the
// job and deleted the row) and B (which answered "deduplicated" against
// that row): an acknowledged key whose job never existed. 100 rounds of
// the race, and every acknowledged key must name a job that finishes.
TEST_F(FleetTest, AnAcknowledgedKeyAlwaysNamesAJobThatFinishes) {
  server::AuditServerOptions a = ReplicaOptions(0);
  a.devices.push_back(std::make_unique<BrokenDevice>());
  StartWith(0, std::move(a));
  StartReplica(1);
  StartReplica(2);
  EXPECT_FALSE(At(0)->Audit(SmallSnapshot(1)).ok());  // A's device breaks
  constexpr int kRounds = 100;
  std::set<std::string> acknowledged;
  int refused_by_a = 0;
  for (int round = 0; round < kRounds; ++round) {
    client::SubmitOptions options;
    options.idempotency_key = absl::StrCat("race-", round);
    absl::StatusOr<v1::SubmitResponse> via_a, via_b;
    std::thread ta(
        [&] { via_a = At(0)->Submit(SmallSnapshot(round), options); });
    std::thread tb(
        [&] { via_b = At(1)->Submit(SmallSnapshot(round), options); });
    ta.join();
    tb.join();
    ASSERT_TRUE(via_b.ok()) << round << ": " << via_b.status();
    acknowledged.insert(via_b->job_id());
    if (via_a.ok()) {
      acknowledged.insert(via_a->job_id());
    } else {
      ++refused_by_a;
      EXPECT_EQ(via_a.status().code(), absl::StatusCode::kUnavailable)
          << via_a.status();
    }
  }
  EXPECT_EQ(acknowledged.size(), static_cast<size_t>(kRounds));
  EXPECT_GT(refused_by_a, 0);
  // Lost: NOT_FOUND (the answer named a job nobody had), or a job that
  // never finishes (a row nobody runs).
  std::set<std::string> unfinished = acknowledged;
  const absl::Time until = absl::Now() + kWait;
  while (!unfinished.empty() && absl::Now() < until) {
    for (auto it = unfinished.begin(); it != unfinished.end();) {
      absl::StatusOr<v1::JobResult> r = At(2)->GetResult(*it);
      const bool done = r.ok() && r->state() == v1::JOB_STATE_DONE;
      it = done ? unfinished.erase(it) : std::next(it);
    }
    absl::SleepFor(absl::Milliseconds(50));
  }
  EXPECT_TRUE(unfinished.empty())
      << unfinished.size() << " of " << acknowledged.size()
      << " acknowledged keys lost, e.g. " << *unfinished.begin();
}

// during an outage of the store an Audit answered OK with a job id,
// and GetResult said NOT_FOUND ever after; watchers never saw it. Now the
// result is journalled on the replica, readable there at once, and stored
// when the store is back, for every replica to read, list and watch.
TEST_F(FleetTest, AnAuditAnsweredDuringAnOutageIsReadBackAfterIt) {
  StartReplica(0);
  StartReplica(1);
  auto restart = absl::MakeCleanup([] { Cluster("start"); });
  ASSERT_TRUE(Cluster("stop -m fast"));
  v1::AuditRequest request;
  SnapshotToProto(SmallSnapshot(61), request.mutable_snapshot());
  absl::StatusOr<v1::AuditResponse> audited = At(0)->AuditUnary(request);
  ASSERT_TRUE(audited.ok()) << audited.status();
  ASSERT_FALSE(audited->job_id().empty());
  EXPECT_TRUE(audited->not_stored_reason().empty());
  absl::StatusOr<v1::JobResult> during = At(0)->GetResult(audited->job_id());
  ASSERT_TRUE(during.ok()) << during.status();
  EXPECT_EQ(during->state(), v1::JOB_STATE_DONE);
  ASSERT_TRUE(Cluster("start"));
  const v1::JobResult after = WaitFinished(At(1), audited->job_id());
  EXPECT_EQ(after.state(), v1::JOB_STATE_DONE) << after.DebugString();
  EXPECT_EQ(after.replica(), "replica-a");
  EXPECT_GT(after.cursor(), 0);
  absl::StatusOr<v1::ListResultsResponse> listed =
      At(1)->ListResults(v1::ListResultsRequest());
  ASSERT_TRUE(listed.ok()) << listed.status();
  ASSERT_EQ(listed->results_size(), 1);
  EXPECT_EQ(listed->results(0).job_id(), audited->job_id());
  const std::vector<v1::JobResult> watched = WatchFrom(At(1), 0, 1);
  ASSERT_EQ(watched.size(), 1u);
  EXPECT_EQ(watched[0].job_id(), audited->job_id());
}

// five jobs of live replicas ran twice during an outage. After the
// store returns every heartbeat is stale, and the first replica back
// claimed the others' jobs. A live replica's job must run once.
TEST_F(FleetTest, AnOutageDoesNotHandALiveReplicasJobToAnother) {
  auto gate_a = std::make_shared<GateState>();
  auto gate_b = std::make_shared<GateState>();
  for (int i : {0, 1}) {
    server::AuditServerOptions o = ReplicaOptions(i);
    o.fleet_lease = absl::Seconds(2);
    o.devices.push_back(
        std::make_unique<GateDevice>(i == 0 ? gate_a : gate_b, i));
    StartWith(i, std::move(o));
  }
  const std::string held = Submit(0, 70);
  ASSERT_TRUE(gate_a->WaitStarted(1));
  auto restart = absl::MakeCleanup([] { Cluster("start"); });
  ASSERT_TRUE(Cluster("stop -m fast"));
  absl::SleepFor(absl::Seconds(5));  // every heartbeat is past the lease
  ASSERT_TRUE(Cluster("start"));
  // Three leases: a claimer would have taken A's job by now.
  absl::SleepFor(absl::Seconds(6));
  EXPECT_TRUE(gate_b->started().empty()) << "A's job was run on B too";
  gate_a->Open();
  gate_b->Open();
  EXPECT_EQ(WaitFinished(At(1), held).state(), v1::JOB_STATE_DONE);
  EXPECT_EQ(gate_a->started(), std::vector<int64_t>{70});
  EXPECT_TRUE(gate_b->started().empty());
}

// max_jobs=4 on 3 replicas let 12 concurrent Submits in (11 held at
// once). The store decides a tenant's admissions one at a time.
TEST_F(FleetTest, AFleetWideQuotaHoldsUnderConcurrentSubmits) {
  server::TenantQuota four;
  four.max_jobs = 4;
  std::shared_ptr<GateState> gates[kReplicas];
  for (int i = 0; i < kReplicas; ++i) {
    gates[i] = std::make_shared<GateState>();
    StartReplica(i, gates[i], four);
  }
  std::atomic<int> accepted{0};
  std::vector<std::thread> threads;
  for (int c = 0; c < 12; ++c) {
    threads.emplace_back([&, c] {
      absl::StatusOr<v1::SubmitResponse> r =
          At(c % kReplicas)->Submit(SmallSnapshot(80 + c));
      if (r.ok()) {
        accepted.fetch_add(1);
      } else {
        EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted)
            << r.status();
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(accepted.load(), 4);
  for (auto& gate : gates) gate->Open();
}

// A tenant's cursors count its own results only (its results
// 1 and 2 no longer show five of another tenant's in between); a caller
// that reads all sees the feed's; a cursor beyond the newest is refused,
// not silently honoured by dropping live results.
TEST_F(FleetTest, CursorsAreATenantsOwnAndAFutureOneIsRefused) {
  tokens_ =
      "token:tok-a fleet-a audit,submit,read\n"
      "token:tok-b fleet-b audit,submit,read\n"
      "token:tok-ops ops read_all\n";
  client_token_ = "tok-a";
  StartReplica(0);
  StartReplica(1);
  auto b = ConnectAs(replicas_[1]->address, "tok-b");
  auto ops = ConnectAs(replicas_[1]->address, "tok-ops");
  const std::string first = Submit(0, 90);
  ASSERT_EQ(WaitFinished(At(0), first).state(), v1::JOB_STATE_DONE);
  for (int i = 0; i < 5; ++i) {
    absl::StatusOr<v1::SubmitResponse> r = b->Submit(SmallSnapshot(91 + i));
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_EQ(WaitFinished(b.get(), r->job_id()).state(), v1::JOB_STATE_DONE);
  }
  const std::string second = Submit(1, 96);
  ASSERT_EQ(WaitFinished(At(1), second).state(), v1::JOB_STATE_DONE);

  EXPECT_EQ(At(1)->GetResult(first)->cursor(), 1);
  EXPECT_EQ(At(0)->GetResult(second)->cursor(), 2);
  EXPECT_EQ(ops->GetResult(second)->cursor(), 7);  // the fleet's feed
  v1::ListResultsRequest page;
  page.set_page_size(1);
  absl::StatusOr<v1::ListResultsResponse> listed = At(0)->ListResults(page);
  ASSERT_TRUE(listed.ok()) << listed.status();
  ASSERT_EQ(listed->results_size(), 1);
  EXPECT_EQ(listed->results(0).cursor(), 2);
  EXPECT_EQ(listed->next_page_token(), "c2");
  page.set_page_token(listed->next_page_token());
  listed = At(1)->ListResults(page);
  ASSERT_TRUE(listed.ok()) << listed.status();
  ASSERT_EQ(listed->results_size(), 1);
  EXPECT_EQ(listed->results(0).job_id(), first);

  // Resumed after its first result, on the other replica: the second.
  std::vector<v1::JobResult> resumed = WatchFrom(At(1), 1, 1);
  ASSERT_EQ(resumed.size(), 1u);
  EXPECT_EQ(resumed[0].job_id(), second);
  EXPECT_EQ(resumed[0].cursor(), 2);

  for (int64_t future : {int64_t{3}, int64_t{1000000000000000}}) {
    v1::WatchResultsRequest request;
    request.set_resume_after(future);
    absl::Status s = At(0)->Watch(
        request, [](const v1::JobResult&) { return true; }, kWait);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_TRUE(absl::StartsWith(s.message(), "resume_after: ")) << s;
    EXPECT_TRUE(absl::StrContains(s.message(), "newest stored result (2)"))
        << s;
  }
}

// A second replica started with a live replica's --replica-id would share
// its jobs, heartbeat and spool identity; it is refused at start.
TEST_F(FleetTest, AReplicaWithALiveReplicasIdIsRefused) {
  StartReplica(0);
  absl::StatusOr<std::unique_ptr<server::AuditServer>> twin =
      server::AuditServer::Start(ReplicaOptions(0));
  ASSERT_FALSE(twin.ok());
  EXPECT_EQ(twin.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(
      absl::StartsWith(twin.status().message(), "--replica-id replica-a: "))
      << twin.status();
  // The same id once its replica is gone: a restart.
  replicas_[0].reset();
  StartReplica(0);
}

}  // namespace
}  // namespace attnaudit::testing
