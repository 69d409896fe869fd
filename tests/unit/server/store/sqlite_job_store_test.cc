// SqliteJobStore alone: WAL mode, results that survive a process dying
// unclean, and migration of older results.db files (the behaviour both
// stores share is in job_store_conformance_test.cc).
#include "server/store/sqlite_job_store.h"

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
#include "tests/unit/server/store/store_records.h"

namespace attnaudit::server {
namespace {

using store_testing::Done;
using store_testing::Ids;
using store_testing::kT0;
using store_testing::Queued;
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

std::unique_ptr<SqliteJobStore> OpenStore(const std::string& dir,
                                          StoreOptions options = {}) {
  auto s = SqliteJobStore::Open(dir, options);
  EXPECT_TRUE(s.ok()) << s.status();
  return *std::move(s);
}

TEST(SqliteJobStoreTest, OpensInWalMode) {
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

TEST(SqliteJobStoreCrashTest, CommittedResultSurvivesAProcessThatDiesUnclean) {
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
    auto store = SqliteJobStore::Open(tmp.path());
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
  EXPECT_TRUE(store->Unfinished("")->empty());
}

TEST(SqliteJobStoreTest, SchemaVersion1RowsBelongToTheDefaultTenant) {
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
  // Version 3 numbered the old result in the feed, version 4 among its
  // tenant's; new ones follow it.
  EXPECT_EQ(old->seq, 1);
  EXPECT_EQ(old->tenant_seq, 1);
  EXPECT_EQ(old->step, -1);
  EXPECT_EQ(*store->LastSeq(), 1);
  // Version 5 added the pair tables.
  EXPECT_TRUE(store->QueryPairs(PairQuery{})->empty());
  ResultRecord q = Queued("new", kT0);
  q.tenant = "fleet-a";
  ASSERT_TRUE(*store->RecordQueued(q));
  store.reset();
  store = OpenStore(dir.path());  // already the current version: as is
  EXPECT_EQ(store->Get("new")->tenant, "fleet-a");
  ResultRecord done = q;
  done.state = JobState::kDone;
  ASSERT_TRUE(*store->PutResult(done));
  EXPECT_EQ(store->Get("new")->seq, 2);
}

}  // namespace
}  // namespace attnaudit::server
