// AuditResultWriter and ResultJournal: Add never waits for the store; each
// result is kept (stored, or journalled while the store refuses it) before
// its `done` runs; journalled results are stored, in order, once the store
// takes writes again (also after a restart); a full queue or journal says
// "not kept".
#include "server/rpc/audit_result_writer.h"

#include <stdlib.h>

#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "server/rpc/result_journal.h"

namespace attnaudit::server {
namespace {

constexpr absl::Duration kWait = absl::Seconds(30);

ResultRecord Record(int i) {
  ResultRecord r;
  r.job_id = absl::StrCat("a", i);
  r.tenant = "t";
  r.state = JobState::kDone;
  r.verdict = 1;
  r.model = "m";
  r.finished = absl::FromUnixSeconds(1700000000 + i);
  r.report = std::string("report\0bytes", 12);
  return r;
}

std::string TempDir() {
  const char* base = getenv("TEST_TMPDIR");
  std::string tmpl = std::string(base ? base : "/tmp") + "/journal_XXXXXX";
  return mkdtemp(&tmpl[0]);
}

// A store that refuses writes while `down`, and records what it took.
class FlakyStore {
 public:
  absl::Status Put(const std::vector<ResultRecord>& records) {
    absl::MutexLock lock(&mu_);
    if (down_) return absl::UnavailableError("store away");
    for (const ResultRecord& r : records) stored_.push_back(r.job_id);
    ++transactions_;
    return absl::OkStatus();
  }
  void SetDown(bool down) {
    absl::MutexLock lock(&mu_);
    down_ = down;
  }
  std::vector<std::string> stored() {
    absl::MutexLock lock(&mu_);
    return stored_;
  }
  int transactions() {
    absl::MutexLock lock(&mu_);
    return transactions_;
  }

 private:
  absl::Mutex mu_;
  bool down_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::string> stored_ ABSL_GUARDED_BY(mu_);
  int transactions_ ABSL_GUARDED_BY(mu_) = 0;
};

// What `done` said for each result, in order.
class Outcomes {
 public:
  AuditResultWriter::Done Sink() {
    return [this](const ResultRecord& r, bool kept) {
      absl::MutexLock lock(&mu_);
      seen_.push_back(absl::StrCat(r.job_id, kept ? ":kept" : ":lost"));
    };
  }
  bool WaitFor(size_t n) {
    absl::MutexLock lock(&mu_);
    auto enough = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
      return seen_.size() >= n;
    };
    return mu_.AwaitWithTimeout(absl::Condition(&enough), kWait);
  }
  std::vector<std::string> seen() {
    absl::MutexLock lock(&mu_);
    return seen_;
  }

 private:
  absl::Mutex mu_;
  std::vector<std::string> seen_ ABSL_GUARDED_BY(mu_);
};

ResultJournal::Options Small(int64_t bytes = int64_t{1} << 20) {
  ResultJournal::Options o;
  o.max_bytes = bytes;
  o.sync = false;
  return o;
}

TEST(ResultJournalTest, KeepsEveryFieldAndSurvivesAReopen) {
  const std::string dir = TempDir();
  ResultRecord r = Record(1);
  r.error_code = 3;
  r.error_message = "why";
  r.diagnosis = "stale-page";
  r.step = 9;
  r.replica = "replica-a";
  {
    auto journal = ResultJournal::Open(dir, Small());
    ASSERT_TRUE(journal.ok()) << journal.status();
    ASSERT_TRUE((*journal)->Append(r).ok());
    EXPECT_EQ((*journal)->Append(r).code(), absl::StatusCode::kAlreadyExists);
    ResultRecord queued = Record(2);
    queued.state = JobState::kQueued;
    EXPECT_EQ((*journal)->Append(queued).code(),
              absl::StatusCode::kInvalidArgument);
  }
  auto journal = ResultJournal::Open(dir, Small());
  ASSERT_TRUE(journal.ok()) << journal.status();
  EXPECT_EQ(*(*journal)->Ids(), std::vector<std::string>{"a1"});
  absl::StatusOr<ResultRecord> back = (*journal)->Read("a1");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->report, r.report);
  EXPECT_EQ(back->error_message, "why");
  EXPECT_EQ(back->diagnosis, "stale-page");
  EXPECT_EQ(back->step, 9);
  EXPECT_EQ(back->replica, "replica-a");
  EXPECT_EQ(back->finished, r.finished);
  EXPECT_EQ(back->state, JobState::kDone);
}

TEST(ResultJournalTest, IsBoundedInBytes) {
  auto journal = ResultJournal::Open(TempDir(), Small(1000));
  ASSERT_TRUE(journal.ok()) << journal.status();
  ResultRecord big = Record(1);
  big.report = std::string(2000, 'x');
  EXPECT_EQ((*journal)->Append(big).code(),
            absl::StatusCode::kResourceExhausted);
  int kept = 0;
  for (int i = 0; i < 20; ++i) kept += (*journal)->Append(Record(i)).ok();
  EXPECT_GT(kept, 0);
  EXPECT_LT(kept, 20);
  EXPECT_LE((*journal)->bytes(), 1000);
}

// During an outage an Audit was answered with a job id its
// result never got under (GetResult: NOT_FOUND, 74 of 74). Now the answer
// waits until the result is kept, and what was journalled is stored when
// the store is back.
TEST(AuditResultWriterTest, AnOutageIsJournalledAndStoredWhenTheStoreReturns) {
  auto journal = ResultJournal::Open(TempDir(), Small());
  ASSERT_TRUE(journal.ok()) << journal.status();
  FlakyStore store;
  Outcomes outcomes;
  AuditResultWriter::Options o;
  o.retry_period = absl::Milliseconds(20);
  AuditResultWriter writer(
      o, [&](const std::vector<ResultRecord>& r) { return store.Put(r); },
      journal->get());
  writer.Add(Record(0), outcomes.Sink());
  ASSERT_TRUE(outcomes.WaitFor(1));
  store.SetDown(true);
  for (int i = 1; i <= 3; ++i) writer.Add(Record(i), outcomes.Sink());
  ASSERT_TRUE(outcomes.WaitFor(4));
  EXPECT_EQ(outcomes.seen(), (std::vector<std::string>{"a0:kept", "a1:kept",
                                                       "a2:kept", "a3:kept"}));
  EXPECT_EQ(store.stored(), std::vector<std::string>{"a0"});
  EXPECT_EQ(writer.journalled(), 3);
  EXPECT_TRUE((*journal)->Contains("a2"));
  store.SetDown(false);
  writer.StoreAnswered();
  const absl::Time until = absl::Now() + kWait;
  while (writer.journalled() > 0 && absl::Now() < until) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  EXPECT_EQ(store.stored(),
            (std::vector<std::string>{"a0", "a1", "a2", "a3"}));  // in order
  EXPECT_FALSE((*journal)->Contains("a2"));
}

TEST(AuditResultWriterTest, AJournalLeftByAnEarlierRunIsStored) {
  const std::string dir = TempDir();
  {
    auto journal = ResultJournal::Open(dir, Small());
    ASSERT_TRUE(journal.ok());
    ASSERT_TRUE((*journal)->Append(Record(7)).ok());
  }
  auto journal = ResultJournal::Open(dir, Small());
  ASSERT_TRUE(journal.ok());
  FlakyStore store;
  {
    AuditResultWriter writer(
        AuditResultWriter::Options{},
        [&](const std::vector<ResultRecord>& r) { return store.Put(r); },
        journal->get());
    const absl::Time until = absl::Now() + kWait;
    while (writer.journalled() > 0 && absl::Now() < until) {
      absl::SleepFor(absl::Milliseconds(5));
    }
  }
  EXPECT_EQ(store.stored(), std::vector<std::string>{"a7"});
}

// Results waiting together are stored in one transaction (one commit):
// a store that flushes its disk per commit keeps up with the audits.
TEST(AuditResultWriterTest, ResultsWaitingTogetherShareATransaction) {
  FlakyStore store;
  absl::Notification release;
  Outcomes outcomes;
  AuditResultWriter writer(
      AuditResultWriter::Options{},
      [&](const std::vector<ResultRecord>& r) {
        release.WaitForNotification();  // the first commit is slow
        return store.Put(r);
      },
      nullptr);
  for (int i = 0; i < 20; ++i) writer.Add(Record(i), outcomes.Sink());
  release.Notify();
  ASSERT_TRUE(outcomes.WaitFor(20));
  EXPECT_EQ(store.stored().size(), 20u);
  EXPECT_LE(store.transactions(), 2);  // the first alone, the rest together
}

TEST(AuditResultWriterTest, WhatCannotBeKeptIsSaidSo) {
  FlakyStore store;
  store.SetDown(true);
  Outcomes outcomes;
  {
    // No journal: a refused result is lost, and `done` says so.
    AuditResultWriter writer(
        AuditResultWriter::Options{},
        [&](const std::vector<ResultRecord>& r) { return store.Put(r); },
        nullptr);
    writer.Add(Record(1), outcomes.Sink());
    ASSERT_TRUE(outcomes.WaitFor(1));
  }
  EXPECT_EQ(outcomes.seen(), std::vector<std::string>{"a1:lost"});

  // A full queue answers at once, without waiting for the store: with the
  // store busy on the first result (the writer may take a batch, so it
  // is given one alone) and two queued, the other three overflow.
  absl::Notification entered, release;
  Outcomes queued;
  AuditResultWriter::Options o;
  o.capacity = 2;
  AuditResultWriter writer(
      o,
      [&](const std::vector<ResultRecord>&) {
        if (!entered.HasBeenNotified()) entered.Notify();
        release.WaitForNotification();
        return absl::OkStatus();
      },
      nullptr);
  writer.Add(Record(0), queued.Sink());
  const bool busy = entered.WaitForNotificationWithTimeout(kWait);
  for (int i = 1; i < 6; ++i) writer.Add(Record(i), queued.Sink());
  const bool answered = queued.WaitFor(3);
  const std::vector<std::string> early = queued.seen();
  // Before any assertion can return: the writer's thread (joined by its
  // destructor) waits on it.
  release.Notify();
  ASSERT_TRUE(busy);
  ASSERT_TRUE(answered);
  for (const std::string& s : early) {
    EXPECT_TRUE(absl::EndsWith(s, ":lost")) << s;
  }
  EXPECT_GE(writer.overflowed(), 3);
}

}  // namespace
}  // namespace attnaudit::server
