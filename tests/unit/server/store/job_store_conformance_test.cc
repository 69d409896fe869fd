// The JobStore contract (server/store/job_store.h), one suite run against
// both stores: SQLite in a temporary directory, and PostgreSQL in a fresh
// database of the throwaway cluster ctest starts (pg_virtualenv). Two
// handles on one store stand for two replicas of a fleet.
#include <sqlite3.h>
#include <stdlib.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/store/job_store.h"
#include "server/store/postgres_job_store.h"
#include "server/store/sqlite_job_store.h"
#include "tests/unit/server/store/postgres_testing.h"
#include "tests/unit/server/store/store_records.h"

namespace attnaudit::server {
namespace {

using store_testing::Done;
using store_testing::Ids;
using store_testing::kT0;
using store_testing::Queued;
using ::testing::ElementsAre;
using ::testing::UnorderedElementsAre;

// Where one test's store lives; Open() may be called again for a second
// handle (another replica) on the same data.
class StoreLocation {
 public:
  explicit StoreLocation(std::string kind) : kind_(std::move(kind)) {}
  ~StoreLocation() {
    if (!dir_.empty()) {
      std::error_code ec;
      std::filesystem::remove_all(dir_, ec);
    }
  }

  // False (with *why) when this kind cannot run here.
  bool Prepare(std::string* why) {
    if (kind_ == "sqlite") {
      const char* base = getenv("TEST_TMPDIR");
      std::string tmpl =
          std::string(base ? base : "/tmp") + "/job_store_test_XXXXXX";
      dir_ = mkdtemp(&tmpl[0]);
      config_.url = "sqlite";
      config_.data_dir = dir_;
      return true;
    }
    if (!testing::PostgresAvailable()) {
      *why = testing::kNoPostgres;
      return false;
    }
    absl::StatusOr<std::string> url = testing::FreshPostgresDatabase();
    if (!url.ok()) {
      *why = url.status().ToString();
      return false;
    }
    config_.url = *url;
    return true;
  }

  std::unique_ptr<JobStore> Open(StoreOptions options = {}) {
    StoreConfig c = config_;
    options.sync = false;
    c.options = options;
    absl::StatusOr<std::unique_ptr<JobStore>> s = OpenJobStore(c);
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? *std::move(s) : nullptr;
  }

  const std::string& kind() const { return kind_; }
  const StoreConfig& config() const { return config_; }

  // Marks the stored schema as written by a newer server.
  absl::Status PretendNewerSchema() {
    if (kind_ == "sqlite") {
      sqlite3* db = nullptr;
      const int rc = sqlite3_open((dir_ + "/results.db").c_str(), &db);
      const int set = rc == SQLITE_OK
                          ? sqlite3_exec(db, "PRAGMA user_version = 99",
                                         nullptr, nullptr, nullptr)
                          : rc;
      sqlite3_close(db);
      return set == SQLITE_OK ? absl::OkStatus()
                              : absl::InternalError("results.db: tamper");
    }
    return testing::RunPostgresSql(config_.url,
                                   "UPDATE attnaudit_schema SET version = 99");
  }

  // Turns the store back into the schema before the train-rollout pairs
  // (SQLite version 4, PostgreSQL version 2), keeping its rows.
  absl::Status PretendNoPairs() {
    if (kind_ == "sqlite") {
      sqlite3* db = nullptr;
      const int rc = sqlite3_open((dir_ + "/results.db").c_str(), &db);
      const int set = rc == SQLITE_OK
                          ? sqlite3_exec(db,
                                         "DROP TABLE pair_sides;"
                                         "DROP TABLE pair_side_rows;"
                                         "DROP TABLE pairs;"
                                         "DROP TABLE pair_request_ids;"
                                         "PRAGMA user_version = 4;",
                                         nullptr, nullptr, nullptr)
                          : rc;
      sqlite3_close(db);
      return set == SQLITE_OK ? absl::OkStatus()
                              : absl::InternalError("results.db: tamper");
    }
    for (const char* sql :
         {"DROP TABLE attnaudit_pair_request_ids, attnaudit_pairs, "
          "attnaudit_pair_side_rows, attnaudit_pair_sides",
          "DELETE FROM attnaudit_counters WHERE name = 'pair_seq'",
          "UPDATE attnaudit_schema SET version = 2"}) {
      absl::Status s = testing::RunPostgresSql(config_.url, sql);
      if (!s.ok()) return s;
    }
    return absl::OkStatus();
  }

  // Turns the store back into the schema before tenants' own numbering
  // (SQLite version 3, PostgreSQL version 1), keeping its rows.
  absl::Status PretendNoTenantSeq() {
    if (absl::Status s = PretendNoPairs(); !s.ok()) return s;
    if (kind_ == "sqlite") {
      sqlite3* db = nullptr;
      const int rc = sqlite3_open((dir_ + "/results.db").c_str(), &db);
      const int set =
          rc == SQLITE_OK
              ? sqlite3_exec(db,
                             "DROP INDEX results_by_tenant_seq;"
                             "ALTER TABLE results DROP COLUMN tenant_seq;"
                             "DELETE FROM counters WHERE name LIKE 'tseq:%';"
                             "PRAGMA user_version = 3;",
                             nullptr, nullptr, nullptr)
              : rc;
      sqlite3_close(db);
      return set == SQLITE_OK ? absl::OkStatus()
                              : absl::InternalError("results.db: tamper");
    }
    for (const char* sql :
         {"DROP INDEX attnaudit_jobs_by_tenant_seq",
          "ALTER TABLE attnaudit_jobs DROP COLUMN tenant_seq",
          "DELETE FROM attnaudit_counters WHERE name LIKE 'tseq:%'",
          "UPDATE attnaudit_schema SET version = 1"}) {
      absl::Status s = testing::RunPostgresSql(config_.url, sql);
      if (!s.ok()) return s;
    }
    return absl::OkStatus();
  }

 private:
  const std::string kind_;
  std::string dir_;
  StoreConfig config_;
};

class JobStoreTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    std::string why;
    if (!location_.Prepare(&why)) GTEST_SKIP() << why;
    store_ = location_.Open();
    ASSERT_NE(store_, nullptr);
  }

  StoreLocation location_{GetParam()};
  std::unique_ptr<JobStore> store_;
};

TEST_P(JobStoreTest, StatesMoveForwardAndTheFirstResultWins) {
  ASSERT_TRUE(*store_->RecordQueued(Queued("j", kT0)));
  EXPECT_FALSE(*store_->RecordQueued(Queued("j", kT0)));  // already there
  EXPECT_EQ(store_->Get("j")->state, JobState::kQueued);
  EXPECT_TRUE(*store_->MarkRunning("j", kT0 + absl::Seconds(1)));
  EXPECT_FALSE(*store_->MarkRunning("j", kT0 + absl::Seconds(2)));
  EXPECT_EQ(store_->Get("j")->started, kT0 + absl::Seconds(1));

  ResultRecord done = Done("j", 2, kT0 + absl::Seconds(5), "report-bytes");
  done.diagnosis = "stale-page";
  EXPECT_TRUE(*store_->PutResult(done));
  EXPECT_FALSE(*store_->PutResult(Done("j", 1, kT0 + absl::Seconds(9), "x")));
  absl::StatusOr<ResultRecord> got = store_->Get("j");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->state, JobState::kDone);
  EXPECT_EQ(got->verdict, 2);
  EXPECT_EQ(got->report, "report-bytes");
  EXPECT_EQ(got->started, kT0 + absl::Seconds(1));  // kept from RUNNING
  EXPECT_EQ(got->finished, kT0 + absl::Seconds(5));
  EXPECT_EQ(got->backend, "flashinfer");
  EXPECT_EQ(got->step, 7);
  EXPECT_EQ(got->run, "run-a");
  EXPECT_EQ(got->diagnosis, "stale-page");
  EXPECT_EQ(got->replica, "replica-a");
  EXPECT_EQ(got->seq, 1);
  EXPECT_FALSE(*store_->MarkRunning("j", kT0));  // terminal stays terminal
}

TEST_P(JobStoreTest, ReportsKeepEveryByte) {
  std::string bytes;
  for (int i = 0; i < 70000; ++i) bytes.push_back(static_cast<char>(i * 7));
  ASSERT_TRUE(*store_->PutResult(Done("bin", 1, kT0, bytes)));
  EXPECT_EQ(store_->Get("bin")->report, bytes);
  ASSERT_TRUE(*store_->PutResult(Done("empty", 1, kT0, "")));
  EXPECT_EQ(store_->Get("empty")->report, "");
}

TEST_P(JobStoreTest, ErrorsNameTheArgument) {
  EXPECT_EQ(store_->Get("nope").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store_->PutResult(Queued("q", kT0)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store_->RecordQueued(Queued("", kT0)).status().code(),
            absl::StatusCode::kInvalidArgument);
  ResultQuery bad;
  bad.limit = 0;
  EXPECT_EQ(store_->Query(bad).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store_->ResultsAfter(0, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// Admission and the row as one decision: a refused job leaves no row,
// a known job is not admitted again.
TEST_P(JobStoreTest, AnAdmittedJobIsRecordedAndARefusedOneLeavesNothing) {
  AdmittedJob job;
  job.record = Queued("a", kT0);
  job.payload = "request";
  int admits = 0;
  auto accept = [&](const TenantUsage&) {
    ++admits;
    return absl::OkStatus();
  };
  auto refuse = [&](const TenantUsage&) {
    ++admits;
    return absl::ResourceExhaustedError("queue full");
  };
  EXPECT_EQ(store_->RecordAdmitted(job, refuse).status().code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(store_->Get("a").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store_->ReadPayload("a").status().code(),
            absl::StatusCode::kNotFound);
  ASSERT_TRUE(*store_->RecordAdmitted(job, accept));
  EXPECT_EQ(store_->Get("a")->state, JobState::kQueued);
  EXPECT_FALSE(*store_->RecordAdmitted(job, accept));  // known: not admitted
  EXPECT_EQ(admits, 2);
  if (store_->shared()) {
    EXPECT_EQ(store_->ReadPayload("a")->payload, "request");
  }
}

// The key race: replica A inserts the row of a key, then
// its scheduler refuses the job; replica B, given the same key meanwhile,
// must not answer "deduplicated" against a row that is about to go. B
// waits for A's decision and, A having refused, runs the job itself.
TEST_P(JobStoreTest, ASecondAdmissionOfOneJobWaitsForTheFirstsDecision) {
  std::unique_ptr<JobStore> other = location_.Open();
  ASSERT_NE(other, nullptr);
  AdmittedJob job;
  job.record = Queued("k", kT0);
  job.payload = "request";
  absl::Notification a_deciding, a_may_refuse;
  std::thread a([&] {
    auto refused = store_->RecordAdmitted(job, [&](const TenantUsage&) {
      a_deciding.Notify();
      a_may_refuse.WaitForNotification();
      return absl::UnavailableError("devices failed");
    });
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnavailable);
  });
  a_deciding.WaitForNotification();
  std::atomic<bool> b_done{false};
  absl::StatusOr<bool> b_created = false;
  std::thread b([&] {
    b_created = other->RecordAdmitted(
        job, [](const TenantUsage&) { return absl::OkStatus(); });
    b_done.store(true);
  });
  // B cannot have decided while A's row is undecided: it would have seen
  // A's row (deduplicated) or none.
  absl::SleepFor(absl::Milliseconds(100));
  EXPECT_FALSE(b_done.load());
  a_may_refuse.Notify();
  a.join();
  b.join();
  ASSERT_TRUE(b_created.ok()) << b_created.status();
  EXPECT_TRUE(*b_created);  // B admitted it: the key names a job B runs
  EXPECT_EQ(store_->Get("k")->state, JobState::kQueued);
}

// a tenant's admissions on several replicas are decided one at a time
// in the store, so their sum never passes the quota.
TEST_P(JobStoreTest, ATenantsQuotaHoldsAcrossReplicasAdmittingAtOnce) {
  if (!store_->shared()) GTEST_SKIP() << "one process: the scheduler decides";
  constexpr int kReplicas = 3;
  constexpr int kPerReplica = 8;
  constexpr int64_t kMaxJobs = 4;
  std::vector<std::unique_ptr<JobStore>> handles;
  for (int r = 0; r < kReplicas; ++r) handles.push_back(location_.Open());
  std::atomic<int> admitted{0};
  std::atomic<int64_t> local[kReplicas] = {};  // each scheduler's own count
  std::vector<std::thread> threads;
  for (int r = 0; r < kReplicas; ++r) {
    for (int i = 0; i < kPerReplica; ++i) {
      threads.emplace_back([&, r, i] {
        AdmittedJob job;
        job.record = Queued(absl::StrCat("r", r, "-", i), kT0);
        job.record.replica = absl::StrCat("replica-", r);
        job.record.tenant = "t";
        job.count_tenant = true;
        auto s = handles[r]->RecordAdmitted(job, [&](const TenantUsage& e) {
          // The quota as the scheduler applies it: its own jobs and the
          // other replicas' rows (held jobs stay held).
          absl::SleepFor(absl::Milliseconds(20));  // a slow scheduler
          if (e.jobs + local[r].load() >= kMaxJobs) {
            return absl::ResourceExhaustedError("quota");
          }
          local[r].fetch_add(1);
          return absl::OkStatus();
        });
        if (s.ok() && *s) admitted.fetch_add(1);
      });
    }
  }
  for (auto& t : threads) t.join();
  ResultQuery held;
  held.tenant = "t";
  held.state = JobState::kQueued;
  EXPECT_EQ(store_->Query(held)->size(), static_cast<size_t>(kMaxJobs));
  EXPECT_EQ(admitted.load(), kMaxJobs);
}

TEST_P(JobStoreTest, QueriesFilterOrderAndPage) {
  ResultRecord a = Done("a", 1, kT0 + absl::Seconds(10), "ra");
  ResultRecord b = Done("b", 2, kT0 + absl::Seconds(20), "rb");
  b.model = "other";
  b.tenant = "fleet-b";
  ResultRecord c = Done("c", 2, kT0 + absl::Seconds(30), "rc");
  c.layer = 9;
  c.step = 8;
  c.run = "run-b";
  c.diagnosis = "rope-offset";
  c.backend = "flash_attn";
  for (const auto& r : {a, b, c}) ASSERT_TRUE(*store_->PutResult(r));
  ASSERT_TRUE(*store_->RecordQueued(Queued("q", kT0 + absl::Seconds(40))));

  ResultQuery drift;
  drift.verdict = 2;
  EXPECT_THAT(Ids(*store_->Query(drift)), ElementsAre("c", "b"));
  ResultQuery model;
  model.model = "m";
  EXPECT_THAT(Ids(*store_->Query(model)), ElementsAre("q", "c", "a"));
  ResultQuery tenant;
  tenant.tenant = "fleet-b";
  EXPECT_THAT(Ids(*store_->Query(tenant)), ElementsAre("b"));
  ResultQuery labels;
  labels.layer = 9;
  labels.step = 8;
  labels.run = "run-b";
  labels.diagnosis = "rope-offset";
  labels.backend = "flash_attn";
  EXPECT_THAT(Ids(*store_->Query(labels)), ElementsAre("c"));
  labels.run = "run-a";
  EXPECT_TRUE(store_->Query(labels)->empty());
  ResultQuery queued;
  queued.state = JobState::kQueued;
  EXPECT_THAT(Ids(*store_->Query(queued)), ElementsAre("q"));

  // Results only, newest result first, paged by seq.
  ResultQuery page;
  page.results_only = true;
  page.limit = 2;
  page.include_report = true;
  auto rows = store_->Query(page);
  ASSERT_TRUE(rows.ok()) << rows.status();
  EXPECT_THAT(Ids(*rows), ElementsAre("c", "b"));
  EXPECT_EQ((*rows)[0].report, "rc");
  page.before_seq = rows->back().seq;
  page.include_report = false;
  rows = store_->Query(page);
  EXPECT_THAT(Ids(*rows), ElementsAre("a"));
  EXPECT_TRUE((*rows)[0].report.empty());

  ResultQuery window;
  window.results_only = true;
  window.finished_since = kT0 + absl::Seconds(20);
  window.finished_until = kT0 + absl::Seconds(30);
  EXPECT_THAT(Ids(*store_->Query(window)), ElementsAre("b"));
}

TEST_P(JobStoreTest, TheFeedNumbersResultsInCommitOrderWithoutReuse) {
  EXPECT_EQ(*store_->LastSeq(), 0);
  ASSERT_TRUE(*store_->RecordQueued(Queued("x", kT0)));
  ASSERT_TRUE(*store_->PutResult(Done("b", 1, kT0 + absl::Seconds(9))));
  ASSERT_TRUE(*store_->PutResult(Done("a", 1, kT0 + absl::Seconds(1))));
  EXPECT_FALSE(*store_->PutResult(Done("a", 2, kT0)));  // takes no number
  ResultRecord x = Done("x", 3, kT0 + absl::Seconds(5));
  x.state = JobState::kCancelled;
  ASSERT_TRUE(*store_->PutResult(x));
  auto feed = store_->ResultsAfter(0, 100);
  ASSERT_TRUE(feed.ok()) << feed.status();
  ASSERT_THAT(Ids(*feed), ElementsAre("b", "a", "x"));
  EXPECT_EQ((*feed)[0].seq, 1);
  EXPECT_EQ((*feed)[2].seq, 3);
  EXPECT_EQ(*store_->LastSeq(), 3);
  EXPECT_THAT(Ids(*store_->ResultsAfter(1, 1)), ElementsAre("a"));
  EXPECT_TRUE(store_->ResultsAfter(3, 100)->empty());

  // Pruning every result never hands a number out twice.
  StoreOptions prune_all;
  prune_all.max_age = absl::Seconds(1);
  std::unique_ptr<JobStore> pruner = location_.Open(prune_all);
  ASSERT_NE(pruner, nullptr);
  EXPECT_EQ(*pruner->Prune(kT0 + absl::Hours(1)), 3);
  ASSERT_TRUE(*store_->PutResult(Done("later", 1, kT0 + absl::Hours(2))));
  EXPECT_EQ(store_->Get("later")->seq, 4);
  EXPECT_THAT(Ids(*store_->ResultsAfter(3, 10)), ElementsAre("later"));
}

TEST_P(JobStoreTest, PrunesByAgeThenByCountButNeverUnfinished) {
  StoreOptions options;
  options.max_age = absl::Hours(24);
  options.max_results = 2;
  store_ = location_.Open(options);
  const absl::Time now = kT0 + absl::Hours(1000);
  ASSERT_TRUE(*store_->PutResult(Done("ancient", 1, now - absl::Hours(48))));
  ASSERT_TRUE(*store_->PutResult(Done("old", 1, now - absl::Hours(25))));
  ASSERT_TRUE(*store_->PutResult(Done("r1", 1, now - absl::Hours(3))));
  ASSERT_TRUE(*store_->PutResult(Done("r2", 1, now - absl::Hours(2))));
  ASSERT_TRUE(*store_->PutResult(Done("r3", 1, now - absl::Hours(1))));
  ASSERT_TRUE(*store_->RecordQueued(Queued("waiting", kT0)));
  ASSERT_TRUE(*store_->RecordQueued(Queued("running", kT0)));
  ASSERT_TRUE(*store_->MarkRunning("running", kT0));
  auto deleted = store_->Prune(now);
  ASSERT_TRUE(deleted.ok()) << deleted.status();
  EXPECT_EQ(*deleted, 3);  // ancient, old by age; r1 by count
  EXPECT_THAT(Ids(*store_->Query(ResultQuery{})),
              UnorderedElementsAre("r2", "r3", "waiting", "running"));
  EXPECT_EQ(*store_->Prune(now), 0);
}

TEST_P(JobStoreTest, UnfinishedJobsByReplica) {
  ResultRecord a = Queued("a", kT0);
  ResultRecord b = Queued("b", kT0 + absl::Seconds(1));
  b.replica = "replica-b";
  ASSERT_TRUE(*store_->RecordQueued(a));
  ASSERT_TRUE(*store_->RecordQueued(b));
  ASSERT_TRUE(*store_->PutResult(Done("c", 1, kT0)));
  EXPECT_THAT(*store_->Unfinished(""), ElementsAre("a", "b"));
  EXPECT_THAT(*store_->Unfinished("replica-b"), ElementsAre("b"));
  // Another replica's result keeps the row's owner.
  ResultRecord done = Done("b", 1, kT0 + absl::Seconds(3));
  done.replica = "replica-c";
  ASSERT_TRUE(*store_->PutResult(done));
  EXPECT_EQ(store_->Get("b")->replica, "replica-b");
  EXPECT_TRUE(store_->Unfinished("replica-b")->empty());
}

TEST_P(JobStoreTest, RowsKeepTheirTenant) {
  ResultRecord q = Queued("j1", kT0);
  q.tenant = "fleet-a";
  ASSERT_TRUE(*store_->RecordQueued(q));
  ResultRecord done = q;
  done.state = JobState::kDone;
  done.tenant = "someone-else";  // a terminal write never moves the owner
  ASSERT_TRUE(*store_->PutResult(done));
  EXPECT_EQ(store_->Get("j1")->tenant, "fleet-a");
}

TEST_P(JobStoreTest, TheFirstSecretWinsAcrossHandles) {
  std::unique_ptr<JobStore> other = location_.Open();
  ASSERT_NE(other, nullptr);
  auto first = store_->SharedSecret("k", std::string("one\0\xff", 5));
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(*first, std::string("one\0\xff", 5));
  EXPECT_EQ(*other->SharedSecret("k", "two"), *first);
  EXPECT_EQ(*other->SharedSecret("other", "two"), "two");
}

TEST_P(JobStoreTest, TwoHandlesRacingForOneJobStoreOneResult) {
  std::unique_ptr<JobStore> other = location_.Open();
  ASSERT_NE(other, nullptr);
  constexpr int kJobs = 40;
  std::atomic<int> won{0};
  auto race = [&](JobStore* s, int verdict) {
    for (int i = 0; i < kJobs; ++i) {
      auto put = s->PutResult(Done(absl::StrCat("j", i), verdict, kT0));
      ASSERT_TRUE(put.ok()) << put.status();
      if (*put) won.fetch_add(1);
    }
  };
  std::thread t1(race, store_.get(), 1);
  std::thread t2(race, other.get(), 2);
  t1.join();
  t2.join();
  EXPECT_EQ(won.load(), kJobs);
  // The feed holds each job once, numbered 1..kJobs without a gap.
  auto feed = store_->ResultsAfter(0, 1000);
  ASSERT_TRUE(feed.ok()) << feed.status();
  ASSERT_EQ(feed->size(), static_cast<size_t>(kJobs));
  std::set<std::string> ids;
  for (size_t i = 0; i < feed->size(); ++i) {
    EXPECT_EQ((*feed)[i].seq, static_cast<int64_t>(i + 1));
    ids.insert((*feed)[i].job_id);
  }
  EXPECT_EQ(ids.size(), static_cast<size_t>(kJobs));
}

TEST_P(JobStoreTest, OneHandleServesCallsFromManyThreads) {
  std::vector<std::thread> threads;
  for (int t = 0; t < 6; ++t) {
    threads.emplace_back([this, t] {
      for (int i = 0; i < 10; ++i) {
        const std::string id = absl::StrCat("t", t, "-", i);
        ASSERT_TRUE(*store_->RecordQueuedWithPayload(
            Queued(id, kT0), absl::InfiniteFuture(), "payload"));
        ASSERT_TRUE(*store_->PutResult(Done(id, 1, kT0 + absl::Seconds(i))));
        ASSERT_TRUE(store_->Get(id).ok());
        ASSERT_TRUE(store_->ResultsAfter(0, 10).ok());
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(*store_->LastSeq(), 60);
  EXPECT_EQ(store_->ResultsAfter(0, 100)->size(), 60u);
}

TEST_P(JobStoreTest, AQueuedClaimIsWonOnce) {
  std::unique_ptr<JobStore> other = location_.Open();
  ASSERT_NE(other, nullptr);
  std::atomic<int> won{0};
  auto claim = [&](JobStore* s) {
    for (int i = 0; i < 40; ++i) {
      auto put = s->RecordQueued(Queued(absl::StrCat("k", i), kT0));
      ASSERT_TRUE(put.ok()) << put.status();
      if (*put) won.fetch_add(1);
    }
  };
  std::thread t1(claim, store_.get());
  std::thread t2(claim, other.get());
  t1.join();
  t2.join();
  EXPECT_EQ(won.load(), 40);
}

TEST_P(JobStoreTest, ANewerSchemaIsRefused) {
  store_.reset();
  ASSERT_TRUE(location_.PretendNewerSchema().ok());
  StoreConfig c = location_.config();
  absl::StatusOr<std::unique_ptr<JobStore>> s = OpenJobStore(c);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(s.status().message()),
              ::testing::HasSubstr("newer than this server"));
}

// The hand-off between replicas: stores of one process have nothing to
// hand off (they keep no payload and claim nothing).
TEST_P(JobStoreTest, AStrandedJobIsClaimedOnceWithItsPayload) {
  std::unique_ptr<JobStore> other = location_.Open();
  ASSERT_NE(other, nullptr);
  ASSERT_TRUE(store_->Heartbeat("replica-a").ok());
  ASSERT_TRUE(other->Heartbeat("replica-b").ok());
  const std::string payload("request\0bytes", 13);
  ASSERT_TRUE(*store_->RecordQueuedWithPayload(Queued("j1", kT0),
                                               kT0 + absl::Hours(1), payload));
  // A duplicate claim stores no second payload and changes nothing.
  EXPECT_FALSE(*other->RecordQueuedWithPayload(Queued("j1", kT0),
                                               absl::InfiniteFuture(), "x"));
  ASSERT_TRUE(*store_->MarkRunning("j1", kT0));
  ASSERT_TRUE(*store_->RecordQueuedWithPayload(
      Queued("j2", kT0 + absl::Seconds(1)), absl::InfiniteFuture(), "p2"));
  if (!store_->shared()) {
    EXPECT_TRUE(
        other->ClaimStranded("replica-b", absl::Seconds(0), 10, 1 << 20, false)
            ->empty());
    EXPECT_EQ(other->ReadHeartbeat("replica-a").status().code(),
              absl::StatusCode::kNotFound);
    EXPECT_EQ(other->ReadPayload("j1").status().code(),
              absl::StatusCode::kNotFound);
    return;
  }
  // replica-a is alive: nothing to claim.
  absl::StatusOr<ReplicaBeat> beat = other->ReadHeartbeat("replica-a");
  ASSERT_TRUE(beat.ok()) << beat.status();
  EXPECT_LE(beat->written, beat->now);
  EXPECT_TRUE(
      other->ClaimStranded("replica-b", absl::Hours(1), 10, 1 << 20, false)
          ->empty());
  // Silent past a lease but not retired: a claimer that may take only
  // retired replicas' jobs (one not yet healthy for a lease) leaves them.
  absl::SleepFor(absl::Milliseconds(20));
  EXPECT_TRUE(other
                  ->ClaimStranded("replica-b", absl::Milliseconds(1), 10,
                                  1 << 20, /*retired_only=*/true)
                  ->empty());
  // replica-a retires: both of its jobs go to the first claimer, once,
  // without their payloads (read after the claim).
  ASSERT_TRUE(store_->Retire("replica-a").ok());
  EXPECT_EQ(other->ReadHeartbeat("replica-a").status().code(),
            absl::StatusCode::kNotFound);
  auto claimed = other->ClaimStranded("replica-b", absl::Hours(1), 10, 1 << 20,
                                      /*retired_only=*/true);
  ASSERT_TRUE(claimed.ok()) << claimed.status();
  ASSERT_EQ(claimed->size(), 2u);
  EXPECT_EQ((*claimed)[0].record.job_id, "j1");
  EXPECT_TRUE((*claimed)[0].payload.empty());
  EXPECT_EQ((*claimed)[0].payload_bytes, static_cast<int64_t>(payload.size()));
  EXPECT_EQ(other->ReadPayload("j1")->payload, payload);
  EXPECT_EQ((*claimed)[0].deadline, kT0 + absl::Hours(1));
  EXPECT_EQ((*claimed)[0].record.state, JobState::kQueued);  // was RUNNING
  EXPECT_EQ((*claimed)[0].record.replica, "replica-b");
  EXPECT_EQ((*claimed)[1].deadline, absl::InfiniteFuture());
  EXPECT_TRUE(
      store_->ClaimStranded("replica-c", absl::Hours(1), 10, 1 << 20, false)
          ->empty());
  EXPECT_EQ(*other->Unfinished("replica-b"),
            (std::vector<std::string>{"j1", "j2"}));
  // A stored result drops the payload.
  EXPECT_EQ(store_->ReadPayload("j2")->payload, "p2");
  ASSERT_TRUE(*other->PutResult(Done("j2", 1, kT0 + absl::Seconds(5))));
  EXPECT_EQ(store_->ReadPayload("j2").status().code(),
            absl::StatusCode::kNotFound);
  // A heartbeat older than the lease counts as gone.
  absl::SleepFor(absl::Milliseconds(20));
  auto late = store_->ClaimStranded("replica-a", absl::Milliseconds(1), 10,
                                    1 << 20, false);
  ASSERT_TRUE(late.ok()) << late.status();
  ASSERT_EQ(late->size(), 1u);
  EXPECT_EQ((*late)[0].record.job_id, "j1");
}

TEST_P(JobStoreTest, ATenantsUsageOnOtherReplicas) {
  ResultRecord a = Queued("a", kT0);  // replica-a
  a.tenant = "t";
  a.bytes = 100;
  ResultRecord b = Queued("b", kT0);
  b.tenant = "t";
  b.bytes = 30;
  b.replica = "replica-b";
  ResultRecord c = b;
  c.job_id = "c";
  ResultRecord other_tenant = b;
  other_tenant.job_id = "d";
  other_tenant.tenant = "u";
  for (const auto& r : {a, b, c, other_tenant}) {
    ASSERT_TRUE(*store_->RecordQueued(r));
  }
  ASSERT_TRUE(*store_->PutResult(Done("c", 1, kT0)));  // finished: not held
  auto use = store_->OthersUsage("t", "replica-a");
  ASSERT_TRUE(use.ok()) << use.status();
  if (!store_->shared()) {
    EXPECT_EQ(use->jobs, 0);  // one process: the scheduler counts it all
    return;
  }
  EXPECT_EQ(use->jobs, 1);
  EXPECT_EQ(use->bytes, 30);
  EXPECT_EQ(store_->OthersUsage("t", "replica-b")->bytes, 100);
}

TEST_P(JobStoreTest, ConcurrentClaimersNeverShareAJob) {
  if (GetParam() == "sqlite") GTEST_SKIP() << "one process: no hand-off";
  for (int i = 0; i < 30; ++i) {
    ResultRecord r = Queued(absl::StrCat("s", i), kT0 + absl::Seconds(i));
    r.replica = "gone";
    ASSERT_TRUE(*store_->RecordQueuedWithPayload(r, absl::InfiniteFuture(),
                                                 absl::StrCat("p", i)));
  }
  std::unique_ptr<JobStore> b = location_.Open();
  std::unique_ptr<JobStore> c = location_.Open();
  // Both alive: neither takes the other's claims.
  ASSERT_TRUE(b->Heartbeat("b").ok());
  ASSERT_TRUE(c->Heartbeat("c").ok());
  std::vector<std::string> got_b, got_c;
  auto claim = [](JobStore* s, const char* me, std::vector<std::string>* got) {
    for (int round = 0; round < 10; ++round) {
      auto jobs = s->ClaimStranded(me, absl::Seconds(5), 4, 1 << 20, false);
      ASSERT_TRUE(jobs.ok()) << jobs.status();
      for (const StoredJob& j : *jobs) got->push_back(j.record.job_id);
    }
  };
  std::thread tb(claim, b.get(), "b", &got_b);
  std::thread tc(claim, c.get(), "c", &got_c);
  tb.join();
  tc.join();
  std::set<std::string> all(got_b.begin(), got_b.end());
  for (const std::string& id : got_c) EXPECT_TRUE(all.insert(id).second) << id;
  EXPECT_EQ(all.size(), 30u);
}

// Results stored together: one transaction, each answered as PutResult
// would, a terminal row left alone without taking a number.
TEST_P(JobStoreTest, ResultsStoredTogetherAreNumberedWithoutGaps) {
  ASSERT_TRUE(*store_->PutResult(Done("old", 1, kT0)));
  auto stored = store_->PutResults({Done("a", 1, kT0 + absl::Seconds(1)),
                                    Done("old", 2, kT0 + absl::Seconds(2)),
                                    Done("b", 1, kT0 + absl::Seconds(3))});
  ASSERT_TRUE(stored.ok()) << stored.status();
  EXPECT_EQ(*stored, (std::vector<bool>{true, false, true}));
  EXPECT_EQ(store_->Get("old")->verdict, 1);
  EXPECT_EQ(store_->Get("a")->seq, 2);
  EXPECT_EQ(store_->Get("b")->seq, 3);
  EXPECT_EQ(store_->Get("b")->tenant_seq, 3);
  EXPECT_EQ(*store_->LastSeq(), 3);
  // One bad record stores none.
  EXPECT_EQ(
      store_->PutResults({Done("c", 1, kT0), Queued("d", kT0)}).status().code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store_->Get("c").status().code(), absl::StatusCode::kNotFound);
}

// a claim takes what fits its byte budget (always one job, so a job
// larger than the budget is still taken over, alone).
TEST_P(JobStoreTest, AClaimIsBoundedInBytes) {
  if (!store_->shared()) GTEST_SKIP() << "one process: no hand-off";
  for (int i = 0; i < 6; ++i) {
    ResultRecord r = Queued(absl::StrCat("s", i), kT0 + absl::Seconds(i));
    r.replica = "gone";
    const std::string payload(i == 3 ? 5000 : 1000, 'p');
    ASSERT_TRUE(
        *store_->RecordQueuedWithPayload(r, absl::InfiniteFuture(), payload));
  }
  std::vector<std::vector<std::string>> rounds;
  for (int round = 0; round < 5; ++round) {
    auto jobs = store_->ClaimStranded("me", absl::Seconds(5), 10, 2500, false);
    ASSERT_TRUE(jobs.ok()) << jobs.status();
    rounds.push_back(Ids([&] {
      std::vector<ResultRecord> rows;
      for (const StoredJob& j : *jobs) rows.push_back(j.record);
      return rows;
    }()));
  }
  EXPECT_THAT(rounds[0], ElementsAre("s0", "s1"));
  EXPECT_THAT(rounds[1], ElementsAre("s2"));  // s3 would pass 2500 bytes
  EXPECT_THAT(rounds[2], ElementsAre("s3"));  // alone, larger than the budget
  EXPECT_THAT(rounds[3], ElementsAre("s4", "s5"));
  EXPECT_TRUE(rounds[4].empty());
}

// a tenant's results are numbered among its own, so its cursors say
// nothing of other tenants' volume; pages and the tenant's feed use them.
TEST_P(JobStoreTest, EachTenantNumbersItsOwnResults) {
  const char* tenants[] = {"a", "b", "b", "a", "b", "a"};
  for (int i = 0; i < 6; ++i) {
    ResultRecord r = Done(absl::StrCat("j", i), 1, kT0 + absl::Seconds(i));
    r.tenant = tenants[i];
    ASSERT_TRUE(*store_->PutResult(r));
  }
  // A refused duplicate takes no number of either kind.
  ResultRecord again = Done("j0", 2, kT0);
  again.tenant = "a";
  EXPECT_FALSE(*store_->PutResult(again));
  EXPECT_EQ(store_->Get("j3")->seq, 4);
  EXPECT_EQ(store_->Get("j3")->tenant_seq, 2);
  EXPECT_EQ(*store_->LastTenantSeq("a"), 3);
  EXPECT_EQ(*store_->LastTenantSeq("b"), 3);
  EXPECT_EQ(*store_->LastTenantSeq("nobody"), 0);
  auto feed = store_->TenantResultsAfter("a", 1, 10);
  ASSERT_TRUE(feed.ok()) << feed.status();
  EXPECT_THAT(Ids(*feed), ElementsAre("j3", "j5"));
  EXPECT_EQ((*feed)[1].tenant_seq, 3);
  EXPECT_EQ(store_->TenantResultsAfter("a", 0, 0).status().code(),
            absl::StatusCode::kInvalidArgument);

  ResultQuery page;
  page.results_only = true;
  page.tenant = "b";
  page.tenant_cursor = true;
  page.limit = 2;
  auto rows = store_->Query(page);
  ASSERT_TRUE(rows.ok()) << rows.status();
  EXPECT_THAT(Ids(*rows), ElementsAre("j4", "j2"));
  page.before_seq = rows->back().tenant_seq;
  EXPECT_THAT(Ids(*store_->Query(page)), ElementsAre("j1"));
  ResultQuery no_tenant;
  no_tenant.results_only = true;
  no_tenant.tenant_cursor = true;
  EXPECT_EQ(store_->Query(no_tenant).status().code(),
            absl::StatusCode::kInvalidArgument);

  // A job that was queued under one tenant is numbered in that tenant's.
  ResultRecord queued = Queued("q", kT0);
  queued.tenant = "b";
  ASSERT_TRUE(*store_->RecordQueued(queued));
  ResultRecord done = Done("q", 1, kT0 + absl::Seconds(9));
  done.tenant = "b";
  ASSERT_TRUE(*store_->PutResult(done));
  EXPECT_EQ(store_->Get("q")->tenant_seq, 4);
}

// A store written before tenants had their own numbering is migrated:
// every result numbered among its tenant's in feed order, and the next
// one continues from there.
TEST_P(JobStoreTest, AnOlderSchemaGetsTenantNumbers) {
  const char* tenants[] = {"a", "b", "a"};
  for (int i = 0; i < 3; ++i) {
    ResultRecord r = Done(absl::StrCat("j", i), 1, kT0 + absl::Seconds(i));
    r.tenant = tenants[i];
    ASSERT_TRUE(*store_->PutResult(r));
  }
  store_.reset();
  ASSERT_TRUE(location_.PretendNoTenantSeq().ok());
  store_ = location_.Open();
  ASSERT_NE(store_, nullptr);
  EXPECT_EQ(store_->Get("j2")->tenant_seq, 2);
  EXPECT_EQ(store_->Get("j1")->tenant_seq, 1);
  EXPECT_EQ(*store_->LastTenantSeq("a"), 2);
  ResultRecord next = Done("j3", 1, kT0 + absl::Seconds(3));
  next.tenant = "a";
  ASSERT_TRUE(*store_->PutResult(next));
  EXPECT_EQ(store_->Get("j3")->tenant_seq, 3);
  EXPECT_EQ(store_->Get("j3")->seq, 4);
}

// --- Train-rollout pairs.

constexpr int kRollout = 1;
constexpr int kTrainer = 2;

// A side of tenant "default", run "run-a", layer 3 with `rows`; its
// snapshot and report are binary (NUL and 0xff bytes) and name it.
PairSide Side(const std::string& id, int role,
              std::vector<std::pair<std::string, int64_t>> rows,
              absl::Time expires = kT0 + absl::Hours(1)) {
  PairSide s;
  s.job_id = id;
  s.run = "run-a";
  s.layer = 3;
  s.role = role;
  s.step = role == kRollout ? 10 : 11;
  s.weight_version = role == kRollout ? "w10" : "w11";
  s.rows = std::move(rows);
  s.snapshot = std::string("snap\0\xff", 6) + id;
  s.report = std::string("report\0\x01", 8) + id;
  s.expires = expires;
  return s;
}

std::vector<std::string> SideIds(const std::vector<PairSide>& sides) {
  std::vector<std::string> out;
  for (const PairSide& s : sides) out.push_back(s.job_id);
  return out;
}

// The ids of the sides PutPairSide returns for `side` at kT0 (limit 100);
// "error: ..." when it fails.
std::vector<std::string> Put(JobStore* store, const PairSide& side,
                             absl::Time now = kT0, int limit = 100) {
  absl::StatusOr<std::vector<PairSide>> found =
      store->PutPairSide(side, now, limit);
  if (!found.ok()) return {absl::StrCat("error: ", found.status().ToString())};
  return SideIds(*found);
}

// A pair of run "run-a", layer 3, PASS, joined at `joined`.
PairRecord Pair(const std::string& rollout, const std::string& trainer,
                absl::Time joined) {
  PairRecord p;
  p.run = "run-a";
  p.layer = 3;
  p.rollout_job = rollout;
  p.trainer_job = trainer;
  p.rollout_step = 10;
  p.trainer_step = 11;
  p.rollout_weight_version = "w10";
  p.trainer_weight_version = "w11";
  p.verdict = 1;
  p.request_ids = {"req-b", "req-a"};
  p.report = std::string("pair\0report\xff", 12);
  p.replica = "replica-a";
  p.joined = joined;
  return p;
}

// The rollout jobs of `pairs` (unique in these tests), in order.
std::vector<std::string> Rollouts(
    const absl::StatusOr<std::vector<PairRecord>>& pairs) {
  if (!pairs.ok()) return {absl::StrCat("error: ", pairs.status().ToString())};
  std::vector<std::string> out;
  for (const PairRecord& p : *pairs) out.push_back(p.rollout_job);
  return out;
}

TEST_P(JobStoreTest, ASideFindsTheOtherRolesSidesThatShareARow) {
  EXPECT_TRUE(
      Put(store_.get(), Side("r1", kRollout, {{"a", 0}, {"a", 1}})).empty());
  std::string big;  // a snapshot of real size, every byte value
  for (int i = 0; i < 100000; ++i) big.push_back(static_cast<char>(i * 13));
  PairSide t1 = Side("t1", kTrainer, {{"a", 1}, {"b", 0}});
  t1.snapshot = big;
  auto found = store_->PutPairSide(t1, kT0, 100);
  ASSERT_TRUE(found.ok()) << found.status();
  ASSERT_EQ(found->size(), 1u);
  const PairSide& r1 = found->front();
  const PairSide want = Side("r1", kRollout, {});
  EXPECT_EQ(r1.job_id, "r1");
  EXPECT_EQ(r1.tenant, "default");
  EXPECT_EQ(r1.run, "run-a");
  EXPECT_EQ(r1.layer, 3);
  EXPECT_EQ(r1.role, kRollout);
  EXPECT_EQ(r1.step, 10);
  EXPECT_EQ(r1.weight_version, "w10");
  EXPECT_EQ(r1.snapshot, want.snapshot);
  EXPECT_EQ(r1.report, want.report);
  EXPECT_EQ(r1.expires, want.expires);
  EXPECT_TRUE(r1.rows.empty());  // the snapshot holds them
  // A rollout sharing t1's other row finds t1 (and its bytes), not r1.
  found = store_->PutPairSide(Side("r2", kRollout, {{"b", 0}}), kT0, 100);
  ASSERT_TRUE(found.ok()) << found.status();
  ASSERT_THAT(SideIds(*found), ElementsAre("t1"));
  EXPECT_EQ(found->front().snapshot, big);
  // Same role never pairs: a second trainer on t1's row finds r1 only.
  EXPECT_THAT(Put(store_.get(), Side("t2", kTrainer, {{"a", 1}})),
              ElementsAre("r1"));
  // The same request id at another position is another row.
  EXPECT_TRUE(Put(store_.get(), Side("r3", kRollout, {{"b", 1}})).empty());
}

TEST_P(JobStoreTest, SidesPairOnlyWithinTheirTenantRunAndLayer) {
  ASSERT_TRUE(Put(store_.get(), Side("r", kRollout, {{"a", 0}})).empty());
  PairSide other_run = Side("t-run", kTrainer, {{"a", 0}});
  other_run.run = "run-b";
  EXPECT_TRUE(Put(store_.get(), other_run).empty());
  PairSide other_layer = Side("t-layer", kTrainer, {{"a", 0}});
  other_layer.layer = 4;
  EXPECT_TRUE(Put(store_.get(), other_layer).empty());
  PairSide other_tenant = Side("t-tenant", kTrainer, {{"a", 0}});
  other_tenant.tenant = "fleet-b";
  EXPECT_TRUE(Put(store_.get(), other_tenant).empty());
  EXPECT_THAT(Put(store_.get(), Side("t", kTrainer, {{"a", 0}})),
              ElementsAre("r"));
  // And within another group, its own counterparts.
  PairSide r_tenant = Side("r-tenant", kRollout, {{"a", 0}});
  r_tenant.tenant = "fleet-b";
  EXPECT_THAT(Put(store_.get(), r_tenant), ElementsAre("t-tenant"));
}

TEST_P(JobStoreTest, ExpiredSidesAreNeverReturnedAndPruneDeletesThem) {
  const absl::Time soon = kT0 + absl::Seconds(10);
  ASSERT_TRUE(
      Put(store_.get(), Side("old", kRollout, {{"a", 0}}, soon)).empty());
  ASSERT_TRUE(Put(store_.get(), Side("new", kRollout, {{"a", 0}})).empty());
  // Expired at the moment it expires.
  EXPECT_THAT(Put(store_.get(), Side("t1", kTrainer, {{"a", 0}}), soon),
              ElementsAre("new"));
  EXPECT_THAT(Put(store_.get(), Side("t2", kTrainer, {{"a", 0}}), kT0),
              ElementsAre("old", "new"));
  auto deleted = store_->Prune(soon);
  ASSERT_TRUE(deleted.ok()) << deleted.status();
  EXPECT_EQ(*deleted, 1);  // old
  // Gone, even for a caller whose clock says it is not expired yet.
  EXPECT_THAT(Put(store_.get(), Side("t3", kTrainer, {{"a", 0}}), kT0),
              ElementsAre("new"));
  EXPECT_EQ(*store_->Prune(kT0 + absl::Hours(2)), 4);  // new, t1, t2, t3
  EXPECT_TRUE(Put(store_.get(), Side("t4", kTrainer, {{"a", 0}}), kT0).empty());
  EXPECT_EQ(*store_->Prune(kT0 + absl::Hours(2)), 1);  // t4
}

TEST_P(JobStoreTest, ARetriedSideReplacesItself) {
  ASSERT_TRUE(Put(store_.get(), Side("r1", kRollout, {{"a", 0}})).empty());
  ASSERT_TRUE(Put(store_.get(), Side("r2", kRollout, {{"a", 0}})).empty());
  // A row named twice is one row.
  EXPECT_THAT(Put(store_.get(), Side("t", kTrainer, {{"a", 0}, {"a", 0}})),
              ElementsAre("r1", "r2"));
  // The retry finds each counterpart once, never itself.
  EXPECT_THAT(Put(store_.get(), Side("t", kTrainer, {{"a", 0}})),
              ElementsAre("r1", "r2"));
  // A retried side counts as put again (last), with its new rows only.
  EXPECT_THAT(Put(store_.get(), Side("r1", kRollout, {{"a", 0}, {"b", 0}})),
              ElementsAre("t"));
  EXPECT_THAT(Put(store_.get(), Side("t2", kTrainer, {{"a", 0}})),
              ElementsAre("r2", "r1"));
  EXPECT_TRUE(Put(store_.get(), Side("r1", kRollout, {{"b", 0}})).empty());
  EXPECT_THAT(Put(store_.get(), Side("t3", kTrainer, {{"a", 0}})),
              ElementsAre("r2"));
  // A side retried in the other role does not meet its former self.
  ASSERT_TRUE(Put(store_.get(), Side("x", kRollout, {{"c", 0}})).empty());
  EXPECT_TRUE(Put(store_.get(), Side("x", kTrainer, {{"c", 0}})).empty());
  // Prune counts each side once (no duplicates were kept).
  EXPECT_EQ(*store_->Prune(kT0 + absl::Hours(2)), 6);  // r1 r2 t t2 t3 x
}

TEST_P(JobStoreTest, CounterpartsAreBoundedByTheLimitOldestFirst) {
  for (int i = 0; i < 5; ++i) {
    ASSERT_TRUE(
        Put(store_.get(), Side(absl::StrCat("r", i), kRollout, {{"a", 0}}))
            .empty());
  }
  EXPECT_THAT(Put(store_.get(), Side("t", kTrainer, {{"a", 0}}), kT0, 3),
              ElementsAre("r0", "r1", "r2"));
  EXPECT_THAT(Put(store_.get(), Side("t", kTrainer, {{"a", 0}}), kT0, 1000),
              ElementsAre("r0", "r1", "r2", "r3", "r4"));
}

TEST_P(JobStoreTest, BadSidesAndPairsNameTheField) {
  auto field = [&](PairSide side, int limit = 10) {
    absl::StatusOr<std::vector<PairSide>> s =
        store_->PutPairSide(side, kT0, limit);
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument)
        << s.status();
    const std::string message(s.status().message());
    return message.substr(0, message.find(':'));
  };
  const PairSide good = Side("s", kRollout, {{"a", 0}});
  PairSide bad = good;
  bad.job_id = "";
  EXPECT_EQ(field(bad), "side.job_id");
  bad = good;
  bad.run = "";
  EXPECT_EQ(field(bad), "side.run");
  bad = good;
  bad.layer = -1;
  EXPECT_EQ(field(bad), "side.layer");
  bad = good;
  bad.role = 0;
  EXPECT_EQ(field(bad), "side.role");
  bad.role = 3;
  EXPECT_EQ(field(bad), "side.role");
  bad = good;
  bad.rows.clear();
  EXPECT_EQ(field(bad), "side.rows");
  for (size_t i = 0; i < kMaxPairSideRows; ++i) {
    bad.rows.emplace_back("r", static_cast<int64_t>(i));
  }
  EXPECT_TRUE(store_->PutPairSide(bad, kT0, 10).ok());  // the most allowed
  bad.job_id = "s2";
  bad.rows.emplace_back("r", -1);
  EXPECT_EQ(field(bad), "side.rows");
  EXPECT_EQ(field(good, 0), "limit");
  EXPECT_EQ(field(good, 1001), "limit");
  PairRecord pair = Pair("r", "t", kT0);
  pair.rollout_job = "";
  EXPECT_EQ(store_->PutPair(pair).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(store_->PutPair(pair).status().message()),
              ::testing::StartsWith("pair.rollout_job"));
  pair = Pair("r", "", kT0);
  EXPECT_THAT(std::string(store_->PutPair(pair).status().message()),
              ::testing::StartsWith("pair.trainer_job"));
  PairQuery query;
  query.limit = 0;
  EXPECT_EQ(store_->QueryPairs(query).status().code(),
            absl::StatusCode::kInvalidArgument);
  query.limit = 10001;
  EXPECT_EQ(store_->QueryPairs(query).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_P(JobStoreTest, APairOfTwoJobsIsStoredOnce) {
  ASSERT_TRUE(*store_->PutPair(Pair("r", "t", kT0)));
  PairRecord again = Pair("r", "t", kT0 + absl::Seconds(5));
  again.verdict = 2;
  auto stored = store_->PutPair(again);
  ASSERT_TRUE(stored.ok()) << stored.status();
  EXPECT_FALSE(*stored);
  // The other way round is another pair of jobs.
  ASSERT_TRUE(*store_->PutPair(Pair("t", "r", kT0 + absl::Seconds(6))));
  PairQuery all;
  all.include_report = true;
  auto pairs = store_->QueryPairs(all);
  ASSERT_TRUE(pairs.ok()) << pairs.status();
  ASSERT_EQ(pairs->size(), 2u);
  const PairRecord& p = (*pairs)[1];
  EXPECT_EQ(p.seq, 1);
  EXPECT_EQ((*pairs)[0].seq, 2);  // the refused one took no number
  EXPECT_EQ(p.verdict, 1);
  EXPECT_EQ(p.tenant, "default");
  EXPECT_EQ(p.run, "run-a");
  EXPECT_EQ(p.layer, 3);
  EXPECT_EQ(p.rollout_job, "r");
  EXPECT_EQ(p.trainer_job, "t");
  EXPECT_EQ(p.rollout_step, 10);
  EXPECT_EQ(p.trainer_step, 11);
  EXPECT_EQ(p.rollout_weight_version, "w10");
  EXPECT_EQ(p.trainer_weight_version, "w11");
  EXPECT_THAT(p.request_ids, ElementsAre("req-a", "req-b"));  // sorted
  EXPECT_EQ(p.report, std::string("pair\0report\xff", 12));
  EXPECT_EQ(p.replica, "replica-a");
  EXPECT_EQ(p.joined, kT0);
}

TEST_P(JobStoreTest, PairQueriesFilterOrderAndPage) {
  PairRecord a = Pair("a", "ta", kT0 + absl::Seconds(10));
  a.request_ids = {"q1"};
  PairRecord b = Pair("b", "tb", kT0 + absl::Seconds(20));
  b.run = "run-b";
  b.verdict = 2;
  b.rollout_step = 20;
  b.trainer_step = 21;
  b.request_ids = {"q1", "q2"};
  PairRecord c = Pair("c", "tc", kT0 + absl::Seconds(30));
  c.layer = 9;
  c.verdict = 2;
  c.rollout_step = 21;
  c.trainer_step = 30;
  c.request_ids = {"q3"};
  PairRecord d = Pair("d", "td", kT0 + absl::Seconds(40));
  d.tenant = "fleet-b";
  d.request_ids = {"q1"};
  for (const PairRecord& p : {a, b, c, d}) ASSERT_TRUE(*store_->PutPair(p));

  PairQuery q;
  EXPECT_THAT(Rollouts(store_->QueryPairs(q)), ElementsAre("d", "c", "b", "a"));
  q.tenant = "default";
  EXPECT_THAT(Rollouts(store_->QueryPairs(q)), ElementsAre("c", "b", "a"));
  PairQuery run;
  run.run = "run-b";
  EXPECT_THAT(Rollouts(store_->QueryPairs(run)), ElementsAre("b"));
  PairQuery layer;
  layer.layer = 9;
  EXPECT_THAT(Rollouts(store_->QueryPairs(layer)), ElementsAre("c"));
  PairQuery verdict;
  verdict.verdict = 2;
  EXPECT_THAT(Rollouts(store_->QueryPairs(verdict)), ElementsAre("c", "b"));
  PairQuery step;  // either side's
  step.step = 21;
  EXPECT_THAT(Rollouts(store_->QueryPairs(step)), ElementsAre("c", "b"));
  step.step = 30;
  EXPECT_THAT(Rollouts(store_->QueryPairs(step)), ElementsAre("c"));
  step.step = 10;
  EXPECT_THAT(Rollouts(store_->QueryPairs(step)), ElementsAre("d", "a"));
  PairQuery request;
  request.request_id = "q1";
  EXPECT_THAT(Rollouts(store_->QueryPairs(request)),
              ElementsAre("d", "b", "a"));
  request.tenant = "default";
  request.verdict = 2;
  auto rows = store_->QueryPairs(request);
  ASSERT_THAT(Rollouts(rows), ElementsAre("b"));
  EXPECT_THAT(rows->front().request_ids, ElementsAre("q1", "q2"));
  request.request_id = "nobody";
  EXPECT_TRUE(store_->QueryPairs(request)->empty());
  PairQuery window;
  window.joined_since = kT0 + absl::Seconds(20);
  window.joined_until = kT0 + absl::Seconds(40);
  EXPECT_THAT(Rollouts(store_->QueryPairs(window)), ElementsAre("c", "b"));

  // Newest first, paged by seq; reports only when asked for.
  PairQuery page;
  page.limit = 3;
  page.include_report = true;
  rows = store_->QueryPairs(page);
  ASSERT_THAT(Rollouts(rows), ElementsAre("d", "c", "b"));
  EXPECT_EQ(rows->front().report, d.report);
  page.before_seq = rows->back().seq;
  page.include_report = false;
  rows = store_->QueryPairs(page);
  ASSERT_THAT(Rollouts(rows), ElementsAre("a"));
  EXPECT_TRUE(rows->front().report.empty());
  EXPECT_THAT(rows->front().request_ids, ElementsAre("q1"));
  page.before_seq = rows->back().seq;
  EXPECT_TRUE(store_->QueryPairs(page)->empty());
}

TEST_P(JobStoreTest, PairsArePrunedByAgeThenByCount) {
  StoreOptions options;
  options.max_age = absl::Hours(24);
  options.max_results = 2;
  store_ = location_.Open(options);
  ASSERT_NE(store_, nullptr);
  const absl::Time now = kT0 + absl::Hours(1000);
  ASSERT_TRUE(*store_->PutPair(Pair("ancient", "t0", now - absl::Hours(48))));
  ASSERT_TRUE(*store_->PutPair(Pair("p1", "t1", now - absl::Hours(3))));
  ASSERT_TRUE(*store_->PutPair(Pair("p2", "t2", now - absl::Hours(2))));
  ASSERT_TRUE(*store_->PutPair(Pair("p3", "t3", now - absl::Hours(1))));
  ASSERT_TRUE(*store_->PutResult(Done("j", 1, now - absl::Hours(1))));
  auto deleted = store_->Prune(now);
  ASSERT_TRUE(deleted.ok()) << deleted.status();
  EXPECT_EQ(*deleted, 2);  // ancient by age, p1 by count; the result stays
  EXPECT_THAT(Rollouts(store_->QueryPairs(PairQuery{})),
              ElementsAre("p3", "p2"));
  PairQuery request;
  request.request_id = "req-a";
  EXPECT_THAT(Rollouts(store_->QueryPairs(request)), ElementsAre("p3", "p2"));
  EXPECT_EQ(*store_->Prune(now), 0);
  // Numbers are never reused.
  ASSERT_TRUE(*store_->PutPair(Pair("p4", "t4", now)));
  EXPECT_EQ(store_->QueryPairs(PairQuery{})->front().seq, 5);
}

// A store written before the pairs is migrated: its rows kept, the pair
// tables added.
TEST_P(JobStoreTest, AnOlderSchemaGetsThePairTables) {
  ASSERT_TRUE(*store_->PutResult(Done("j", 2, kT0, "report")));
  ASSERT_TRUE(*store_->RecordQueued(Queued("q", kT0)));
  store_.reset();
  ASSERT_TRUE(location_.PretendNoPairs().ok());
  store_ = location_.Open();
  ASSERT_NE(store_, nullptr);
  EXPECT_EQ(store_->Get("j")->report, "report");
  EXPECT_EQ(store_->Get("j")->seq, 1);
  EXPECT_EQ(store_->Get("q")->state, JobState::kQueued);
  ASSERT_TRUE(Put(store_.get(), Side("r", kRollout, {{"a", 0}})).empty());
  EXPECT_THAT(Put(store_.get(), Side("t", kTrainer, {{"a", 0}})),
              ElementsAre("r"));
  ASSERT_TRUE(*store_->PutPair(Pair("r", "t", kT0)));
  EXPECT_EQ(store_->QueryPairs(PairQuery{})->front().seq, 1);
  ASSERT_TRUE(*store_->PutResult(Done("k", 1, kT0)));
  EXPECT_EQ(store_->Get("k")->seq, 2);
  // Opening again finds the current version: nothing to migrate.
  store_ = location_.Open();
  ASSERT_NE(store_, nullptr);
  EXPECT_EQ(store_->QueryPairs(PairQuery{})->size(), 1u);
}

// A connection lost (the server restarted) makes the call Unavailable, and
// the next call reconnects; nothing is half-written.
TEST_P(JobStoreTest, PairCallsAreUnavailableWhenTheConnectionIsLost) {
  if (GetParam() == "sqlite") GTEST_SKIP() << "a file: nothing to lose";
  ASSERT_TRUE(Put(store_.get(), Side("r", kRollout, {{"a", 0}})).empty());
  auto drop = [&] {
    // Waits until the store's connections are gone.
    ASSERT_TRUE(testing::RunPostgresSql(
                    location_.config().url,
                    "SELECT pg_terminate_backend(pid, 10000) FROM "
                    "pg_stat_activity WHERE datname = current_database() "
                    "AND pid <> pg_backend_pid()")
                    .ok());
  };
  drop();
  EXPECT_EQ(store_->PutPairSide(Side("t", kTrainer, {{"a", 0}}), kT0, 10)
                .status()
                .code(),
            absl::StatusCode::kUnavailable);
  EXPECT_THAT(Put(store_.get(), Side("t", kTrainer, {{"a", 0}})),
              ElementsAre("r"));
  drop();
  EXPECT_EQ(store_->PutPair(Pair("r", "t", kT0)).status().code(),
            absl::StatusCode::kUnavailable);
  EXPECT_TRUE(*store_->PutPair(Pair("r", "t", kT0)));
  drop();
  EXPECT_EQ(store_->QueryPairs(PairQuery{}).status().code(),
            absl::StatusCode::kUnavailable);
  EXPECT_THAT(Rollouts(store_->QueryPairs(PairQuery{})), ElementsAre("r"));
}

// Two replicas put the two sides of a pair at the same moment, many
// times: sides of one group are put one at a time, so in every race at
// least one of the two finds the other.
TEST_P(JobStoreTest, CounterpartsPutAtOnceOnTwoReplicasMeet) {
  std::unique_ptr<JobStore> other = location_.Open();
  ASSERT_NE(other, nullptr);
  constexpr int kRaces = 60;
  std::vector<int> rollout_found(kRaces, 0), trainer_found(kRaces, 0);
  std::atomic<int> arrived{0};
  // Both threads start race i together (no sleeps: a spin barrier).
  auto barrier = [&](int i) {
    arrived.fetch_add(1);
    while (arrived.load() < 2 * (i + 1)) std::this_thread::yield();
  };
  auto side = [&](JobStore* s, int role, std::vector<int>* found) {
    for (int i = 0; i < kRaces; ++i) {
      barrier(i);
      const std::string mine = absl::StrCat(role == kRollout ? "r" : "t", i);
      const std::string theirs = absl::StrCat(role == kRollout ? "t" : "r", i);
      auto got = s->PutPairSide(
          Side(mine, role, {{absl::StrCat("q", i), i % 3}}), kT0, 10);
      if (!got.ok()) {  // no ASSERT: the other thread waits at the barrier
        ADD_FAILURE() << got.status();
        continue;
      }
      for (const PairSide& p : *got) {
        EXPECT_EQ(p.job_id, theirs);
        if (p.job_id == theirs) (*found)[i] = 1;
      }
    }
  };
  std::thread a(side, store_.get(), kRollout, &rollout_found);
  std::thread b(side, other.get(), kTrainer, &trainer_found);
  a.join();
  b.join();
  for (int i = 0; i < kRaces; ++i) {
    EXPECT_TRUE(rollout_found[i] || trainer_found[i]) << "race " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(BothStores, JobStoreTest,
                         ::testing::Values("sqlite", "postgresql"),
                         [](const auto& info) { return info.param; });

TEST(OpenJobStoreTest, ABadUrlNamesTheFlag) {
  StoreConfig c;
  c.url = "mysql://u:secret@h/db";
  absl::StatusOr<std::unique_ptr<JobStore>> s = OpenJobStore(c);
  ASSERT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.status().message()),
              ::testing::HasSubstr("--store"));
  EXPECT_THAT(std::string(s.status().message()),
              ::testing::Not(::testing::HasSubstr("secret")));
}

TEST(OpenJobStoreTest, AnUnreachableServerIsUnavailableWithoutThePassword) {
  StoreConfig c;
  // Port 1 on loopback: nothing listens there.
  c.url = "postgresql://audit:hunter2@127.0.0.1:1/attnaudit";
  c.options.busy_timeout = absl::Seconds(2);
  absl::StatusOr<std::unique_ptr<JobStore>> s = OpenJobStore(c);
  ASSERT_EQ(s.status().code(), absl::StatusCode::kUnavailable) << s.status();
  EXPECT_THAT(std::string(s.status().message()),
              ::testing::HasSubstr("postgresql://audit:***@127.0.0.1:1"));
  EXPECT_THAT(std::string(s.status().message()),
              ::testing::Not(::testing::HasSubstr("hunter2")));
}

TEST(RedactStoreUrlTest, HidesOnlyThePassword) {
  EXPECT_EQ(RedactStoreUrl("postgresql://u:p@h:5432/db?sslmode=require"),
            "postgresql://u:***@h:5432/db?sslmode=require");
  EXPECT_EQ(RedactStoreUrl("postgresql://u@h/db"), "postgresql://u@h/db");
  EXPECT_EQ(RedactStoreUrl("postgres:///db"), "postgres:///db");
  EXPECT_EQ(RedactStoreUrl("sqlite"), "sqlite");
}

}  // namespace
}  // namespace attnaudit::server
