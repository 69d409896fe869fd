// ResultStore: state transitions, one result per job (also under races and
// after a crash), queries, and retention.
#include "server/store/result_store.h"

#include <sqlite3.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace attnaudit::server {
namespace {

using ::testing::ElementsAre;
using ::testing::UnorderedElementsAre;

class TempDir {
 public:
  TempDir() {
    const char* base = getenv("TEST_TMPDIR");
    std::string tmpl = std::string(base ? base : "/tmp") + "/store_test_XXXXXX";
    path_ = mkdtemp(&tmpl[0]);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

const absl::Time kT0 = absl::FromUnixSeconds(1700000000);

std::unique_ptr<ResultStore> OpenStore(const std::string& dir,
                                       StoreOptions options = {}) {
  auto s = ResultStore::Open(dir, options);
  EXPECT_TRUE(s.ok()) << s.status();
  return *std::move(s);
}

ResultRecord Queued(const std::string& id, absl::Time created) {
  ResultRecord r;
  r.job_id = id;
  r.created = created;
  r.model = "m";
  r.layer = 3;
  r.engine = "vllm";
  r.priority = 1;
  return r;
}

ResultRecord Done(const std::string& id, int verdict, absl::Time finished,
                  std::string report = "") {
  ResultRecord r = Queued(id, finished - absl::Seconds(1));
  r.state = JobState::kDone;
  r.verdict = verdict;
  r.finished = finished;
  r.report = std::move(report);
  return r;
}

std::vector<std::string> Ids(const std::vector<ResultRecord>& rows) {
  std::vector<std::string> out;
  for (const auto& r : rows) out.push_back(r.job_id);
  return out;
}

TEST(ResultStoreTest, OpensInWalMode) {
  TempDir tmp;
  auto store = OpenStore(tmp.path() + "/nested/data");
  EXPECT_EQ(store->path(), tmp.path() + "/nested/data/results.db");
  // WAL is persistent: a second connection sees it.
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(store->path().c_str(), &db), SQLITE_OK);
  sqlite3_stmt* st = nullptr;
  ASSERT_EQ(sqlite3_prepare_v2(db, "PRAGMA journal_mode", -1, &st, nullptr),
            SQLITE_OK);
  ASSERT_EQ(sqlite3_step(st), SQLITE_ROW);
  EXPECT_STREQ(reinterpret_cast<const char*>(sqlite3_column_text(st, 0)),
               "wal");
  sqlite3_finalize(st);
  ASSERT_EQ(sqlite3_prepare_v2(db, "PRAGMA auto_vacuum", -1, &st, nullptr),
            SQLITE_OK);
  ASSERT_EQ(sqlite3_step(st), SQLITE_ROW);
  EXPECT_EQ(sqlite3_column_int(st, 0), 2);  // incremental
  sqlite3_finalize(st);
  sqlite3_close(db);
}

TEST(ResultStoreTest, StatesMoveForwardAndTheFirstResultWins) {
  TempDir tmp;
  auto store = OpenStore(tmp.path());
  EXPECT_EQ(store->Get("j").status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(*store->RecordQueued(Queued("j", kT0)));
  EXPECT_FALSE(*store->RecordQueued(Queued("j", kT0)));  // resume: harmless
  EXPECT_EQ(store->Get("j")->state, JobState::kQueued);

  EXPECT_TRUE(*store->MarkRunning("j", kT0 + absl::Seconds(2)));
  EXPECT_FALSE(*store->MarkRunning("j", kT0 + absl::Seconds(3)));
  auto running = store->Get("j");
  EXPECT_EQ(running->state, JobState::kRunning);
  EXPECT_EQ(running->started, kT0 + absl::Seconds(2));

  const std::string report("\0binary\xffreport", 14);
  ResultRecord done = Done("j", 2, kT0 + absl::Seconds(5), report);
  EXPECT_TRUE(*store->PutResult(done));
  ResultRecord second = Done("j", 1, kT0 + absl::Seconds(9), "other");
  EXPECT_FALSE(*store->PutResult(second));  // never two results
  second.state = JobState::kFailed;
  EXPECT_FALSE(*store->PutResult(second));
  EXPECT_FALSE(*store->RecordQueued(Queued("j", kT0)));
  EXPECT_FALSE(*store->MarkRunning("j", kT0));

  auto got = store->Get("j");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->state, JobState::kDone);
  EXPECT_EQ(got->verdict, 2);
  EXPECT_EQ(got->report, report);
  EXPECT_EQ(got->created, kT0);                     // from RecordQueued
  EXPECT_EQ(got->started, kT0 + absl::Seconds(2));  // from MarkRunning
  EXPECT_EQ(got->finished, kT0 + absl::Seconds(5));
  EXPECT_EQ(got->model, "m");
  EXPECT_EQ(got->layer, 3);
  EXPECT_EQ(got->engine, "vllm");
}

TEST(ResultStoreTest, ResultWithoutQueuedRowAndErrors) {
  TempDir tmp;
  auto store = OpenStore(tmp.path());
  ResultRecord failed = Queued("f", kT0);
  failed.state = JobState::kFailed;
  failed.error_code = static_cast<int>(absl::StatusCode::kInternal);
  failed.error_message = "boom";
  failed.finished = kT0 + absl::Seconds(1);
  EXPECT_TRUE(*store->PutResult(failed));
  auto got = store->Get("f");
  EXPECT_EQ(got->state, JobState::kFailed);
  EXPECT_EQ(got->error_code, static_cast<int>(absl::StatusCode::kInternal));
  EXPECT_EQ(got->error_message, "boom");
  EXPECT_EQ(got->started, absl::UnixEpoch());  // never ran

  ResultRecord bad = Queued("x", kT0);  // state QUEUED
  EXPECT_EQ(store->PutResult(bad).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store->RecordQueued(Queued("", kT0)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(*store->MarkRunning("absent", kT0));
}

TEST(ResultStoreTest, ConcurrentResultsForOneJobYieldExactlyOne) {
  TempDir tmp;
  auto store = OpenStore(tmp.path());
  std::atomic<int> winners{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      auto r = store->PutResult(Done("race", t, kT0 + absl::Seconds(t)));
      ASSERT_TRUE(r.ok()) << r.status();
      winners += *r;
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(winners.load(), 1);
  EXPECT_EQ(store->Get("race")->state, JobState::kDone);
}

TEST(ResultStoreTest, QueriesFilterOrderAndLimit) {
  TempDir tmp;
  auto store = OpenStore(tmp.path());
  ResultRecord a = Done("a", 1, kT0 + absl::Seconds(10), "ra");
  ResultRecord b = Done("b", 2, kT0 + absl::Seconds(20), "rb");
  b.model = "other";
  ResultRecord c = Done("c", 2, kT0 + absl::Seconds(30), "rc");
  c.layer = 9;
  for (const auto& r : {a, b, c}) ASSERT_TRUE(*store->PutResult(r));
  ASSERT_TRUE(*store->RecordQueued(Queued("q", kT0 + absl::Seconds(40))));

  ResultQuery drift;
  drift.verdict = 2;
  EXPECT_THAT(Ids(*store->Query(drift)),
              ElementsAre("c", "b"));  // newest first
  ResultQuery model;
  model.model = "m";
  EXPECT_THAT(Ids(*store->Query(model)), ElementsAre("q", "c", "a"));
  ResultQuery layer;
  layer.layer = 9;
  EXPECT_THAT(Ids(*store->Query(layer)), ElementsAre("c"));
  ResultQuery queued;
  queued.state = JobState::kQueued;
  EXPECT_THAT(Ids(*store->Query(queued)), ElementsAre("q"));

  ResultQuery since;
  since.finished_since = kT0 + absl::Seconds(20);
  since.include_report = true;
  auto rows = store->Query(since);
  ASSERT_TRUE(rows.ok()) << rows.status();
  EXPECT_THAT(Ids(*rows), ElementsAre("b", "c"));  // oldest first, no "q"
  EXPECT_EQ((*rows)[0].report, "rb");
  since.include_report = false;
  since.limit = 1;
  rows = store->Query(since);
  EXPECT_THAT(Ids(*rows), ElementsAre("b"));
  EXPECT_TRUE((*rows)[0].report.empty());

  ResultQuery bad;
  bad.limit = 0;
  EXPECT_EQ(store->Query(bad).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(*store->Unfinished(), ElementsAre("q"));
}

TEST(ResultStoreTest, PrunesByAgeThenByCountButNeverUnfinished) {
  TempDir tmp;
  StoreOptions options;
  options.max_age = absl::Hours(24);
  options.max_results = 2;
  auto store = OpenStore(tmp.path(), options);
  const absl::Time now = kT0 + absl::Hours(1000);
  ASSERT_TRUE(*store->PutResult(Done("ancient", 1, now - absl::Hours(48))));
  ASSERT_TRUE(*store->PutResult(Done("old", 1, now - absl::Hours(25))));
  ASSERT_TRUE(*store->PutResult(Done("r1", 1, now - absl::Hours(3))));
  ASSERT_TRUE(*store->PutResult(Done("r2", 1, now - absl::Hours(2))));
  ASSERT_TRUE(*store->PutResult(Done("r3", 1, now - absl::Hours(1))));
  ASSERT_TRUE(*store->RecordQueued(Queued("waiting", kT0)));  // very old
  ASSERT_TRUE(*store->RecordQueued(Queued("running", kT0)));
  ASSERT_TRUE(*store->MarkRunning("running", kT0));

  auto deleted = store->Prune(now);
  ASSERT_TRUE(deleted.ok()) << deleted.status();
  EXPECT_EQ(*deleted, 3);  // ancient, old by age; r1 by count
  ResultQuery all;
  EXPECT_THAT(Ids(*store->Query(all)),
              UnorderedElementsAre("r2", "r3", "waiting", "running"));
  EXPECT_EQ(*store->Prune(now), 0);  // idempotent
}

TEST(ResultStoreTest, PruneWithoutLimitsKeepsEverything) {
  TempDir tmp;
  StoreOptions options;
  options.max_age = absl::InfiniteDuration();
  options.max_results = 0;
  auto store = OpenStore(tmp.path(), options);
  ASSERT_TRUE(*store->PutResult(Done("a", 1, kT0)));
  EXPECT_EQ(*store->Prune(kT0 + absl::Hours(100000)), 0);
  EXPECT_TRUE(store->Get("a").ok());
}

TEST(ResultStoreCrashTest, CommittedResultSurvivesAProcessThatDiesUnclean) {
  TempDir tmp;
  {
    auto store = OpenStore(tmp.path());
    ASSERT_TRUE(*store->RecordQueued(Queued("survivor", kT0)));
  }
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    // Child: commit a result, then die without closing the database
    // (no destructor, no checkpoint), as a SIGKILL would.
    auto store = ResultStore::Open(tmp.path());
    if (!store.ok()) _exit(2);
    auto put = (*store)->PutResult(Done("survivor", 2, kT0, "report"));
    _exit(put.ok() && *put ? 0 : 3);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  ASSERT_EQ(WEXITSTATUS(status), 0);

  auto store = OpenStore(tmp.path());
  auto got = store->Get("survivor");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->state, JobState::kDone);
  EXPECT_EQ(got->report, "report");
  // A restart that re-runs it is refused: the first result stands.
  EXPECT_FALSE(*store->PutResult(Done("survivor", 1, kT0, "again")));
  EXPECT_TRUE(store->Unfinished()->empty());
}

TEST(ResultStoreTest, NamesOfStates) {
  EXPECT_EQ(JobStateName(JobState::kQueued), "QUEUED");
  EXPECT_EQ(JobStateName(JobState::kCancelled), "CANCELLED");
  EXPECT_FALSE(IsTerminal(JobState::kRunning));
  EXPECT_TRUE(IsTerminal(JobState::kFailed));
}

TEST(ResultStoreTest, RowsKeepTheirTenant) {
  TempDir dir;
  auto store = OpenStore(dir.path());
  ResultRecord q = Queued("j1", kT0);
  q.tenant = "fleet-a";
  ASSERT_TRUE(*store->RecordQueued(q));
  EXPECT_EQ(store->Get("j1")->tenant, "fleet-a");
  ResultRecord done = q;
  done.state = JobState::kDone;
  done.tenant = "someone-else";  // a terminal write never moves the owner
  ASSERT_TRUE(*store->PutResult(done));
  EXPECT_EQ(store->Get("j1")->tenant, "fleet-a");
  ResultRecord fresh = Queued("j2", kT0);
  fresh.state = JobState::kFailed;
  fresh.tenant = "fleet-b";
  ASSERT_TRUE(*store->PutResult(fresh));
  EXPECT_EQ(store->Get("j2")->tenant, "fleet-b");
}

TEST(ResultStoreTest, SchemaVersion1RowsBelongToTheDefaultTenant) {
  TempDir dir;
  {
    // A results.db as the server before tenants wrote it.
    sqlite3* db = nullptr;
    ASSERT_EQ(sqlite3_open((dir.path() + "/results.db").c_str(), &db),
              SQLITE_OK);
    ASSERT_EQ(sqlite3_exec(db,
                           "CREATE TABLE results (job_id TEXT PRIMARY KEY NOT "
                           "NULL, state TEXT NOT NULL, verdict INTEGER NOT "
                           "NULL DEFAULT 0, priority INTEGER NOT NULL DEFAULT "
                           "1, model TEXT NOT NULL DEFAULT '', layer INTEGER "
                           "NOT NULL DEFAULT -1, engine TEXT NOT NULL DEFAULT "
                           "'', created_us INTEGER NOT NULL DEFAULT 0, "
                           "started_us INTEGER NOT NULL DEFAULT 0, finished_us "
                           "INTEGER NOT NULL DEFAULT 0, error_code INTEGER NOT "
                           "NULL DEFAULT 0, error_message TEXT NOT NULL "
                           "DEFAULT '', report BLOB);"
                           "INSERT INTO results(job_id, state) "
                           "VALUES('old', 'DONE');"
                           "PRAGMA user_version = 1;",
                           nullptr, nullptr, nullptr),
              SQLITE_OK);
    sqlite3_close(db);
  }
  auto store = OpenStore(dir.path());
  absl::StatusOr<ResultRecord> old = store->Get("old");
  ASSERT_TRUE(old.ok()) << old.status();
  EXPECT_EQ(old->tenant, "default");
  EXPECT_EQ(old->state, JobState::kDone);
  ResultRecord q = Queued("new", kT0);
  q.tenant = "fleet-a";
  ASSERT_TRUE(*store->RecordQueued(q));
  store.reset();
  store = OpenStore(dir.path());  // already version 2: opens as is
  EXPECT_EQ(store->Get("new")->tenant, "fleet-a");
}

}  // namespace
}  // namespace attnaudit::server
