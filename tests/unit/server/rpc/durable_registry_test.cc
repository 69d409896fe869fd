// DurableJobs: acknowledged jobs stay visible until their result is
// stored; a commit the store refuses is retried with backoff until it
// succeeds, then the entry goes and on_stored runs once.
#include "server/rpc/durable_registry.h"

#include <atomic>
#include <string>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace attnaudit::server {
namespace {

ResultRecord Record(const std::string& id, JobState state) {
  ResultRecord r;
  r.job_id = id;
  r.tenant = "t";
  r.state = state;
  return r;
}

// A store whose writes fail until healed.
struct FakeStore {
  absl::Mutex mu;
  bool healthy = true;
  int attempts = 0;
  int stored = 0;
  absl::StatusOr<bool> Commit(const ResultRecord&) {
    absl::MutexLock lock(&mu);
    ++attempts;
    if (!healthy) return absl::ResourceExhaustedError("disk full");
    ++stored;
    return true;
  }
};

bool WaitFor(const std::function<bool()>& p) {
  const absl::Time until = absl::Now() + absl::Seconds(30);
  while (!p()) {
    if (absl::Now() > until) return false;
    absl::SleepFor(absl::Milliseconds(1));
  }
  return true;
}

DurableJobs::Options Fast() {
  DurableJobs::Options o;
  o.first_retry = absl::Milliseconds(5);
  o.max_retry = absl::Milliseconds(40);
  return o;
}

TEST(DurableJobsTest, LiveStatesUntilTheResultIsStored) {
  FakeStore store;
  DurableJobs jobs([&](const ResultRecord& r) { return store.Commit(r); },
                   Fast());
  jobs.Add(Record("j", JobState::kQueued));
  EXPECT_EQ(jobs.Get("j")->state, JobState::kQueued);
  EXPECT_EQ(jobs.Get("j")->tenant, "t");
  jobs.MarkRunning("j", absl::FromUnixSeconds(5));
  EXPECT_EQ(jobs.Get("j")->state, JobState::kRunning);
  int stored_calls = 0;
  jobs.Finish(Record("j", JobState::kDone), [&] { ++stored_calls; });
  EXPECT_FALSE(jobs.Get("j").has_value());  // in the store now
  EXPECT_EQ(stored_calls, 1);
  EXPECT_EQ(jobs.pending(), 0);
}

TEST(DurableJobsTest, RefusedCommitsAreRetriedUntilTheyStick) {
  FakeStore store;
  store.healthy = false;
  DurableJobs jobs([&](const ResultRecord& r) { return store.Commit(r); },
                   Fast());
  std::atomic<int> stored_calls{0};
  for (const char* id : {"a", "b"}) {
    jobs.Add(Record(id, JobState::kQueued));
    jobs.Finish(Record(id, JobState::kDone), [&] { ++stored_calls; });
    // Still visible, as RUNNING, while the result waits.
    ASSERT_TRUE(jobs.Get(id).has_value());
    EXPECT_EQ(jobs.Get(id)->state, JobState::kRunning);
  }
  EXPECT_EQ(jobs.pending(), 2);
  ASSERT_TRUE(WaitFor([&] {
    absl::MutexLock lock(&store.mu);
    return store.attempts >= 8;  // retried, with backoff
  }));
  EXPECT_EQ(stored_calls.load(), 0);
  {
    absl::MutexLock lock(&store.mu);
    store.healthy = true;
  }
  ASSERT_TRUE(WaitFor([&] { return jobs.pending() == 0; }));
  // on_stored runs just after the entry leaves (outside the lock).
  EXPECT_TRUE(WaitFor([&] { return stored_calls.load() == 2; }))
      << stored_calls.load();
  EXPECT_FALSE(jobs.Get("a").has_value());
  absl::MutexLock lock(&store.mu);
  EXPECT_EQ(store.stored, 2);
}

TEST(DurableJobsTest, ForgetDropsAJobWithoutAResult) {
  FakeStore store;
  DurableJobs jobs([&](const ResultRecord& r) { return store.Commit(r); },
                   Fast());
  jobs.Add(Record("j", JobState::kQueued));
  jobs.Forget("j");
  EXPECT_FALSE(jobs.Get("j").has_value());
  // A second result for one job is ignored while the first is pending.
  {
    absl::MutexLock lock(&store.mu);
    store.healthy = false;
  }
  jobs.Finish(Record("k", JobState::kDone), [] {});
  jobs.Finish(Record("k", JobState::kFailed), [] {});
  EXPECT_EQ(jobs.pending(), 1);
  jobs.Shutdown();  // stops retrying; idempotent
  jobs.Shutdown();
}

}  // namespace
}  // namespace attnaudit::server
