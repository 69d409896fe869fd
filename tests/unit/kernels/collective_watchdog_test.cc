// AwaitCollective against fake collectives: one that finishes, one that
// hangs, one whose communicator reports an asynchronous error, one whose
// job is cancelled while it waits.
#include "kernels/collective_watchdog.h"

#include <atomic>
#include <thread>

#include "absl/status/status.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace attnaudit {
namespace {

using ::testing::HasSubstr;

// A collective the test controls: done after `polls_until_done` polls
// (never when negative), counting polls and aborts.
struct FakeCollective {
  int polls_until_done = -1;
  absl::Status async_error;
  absl::Status query_error;
  int polls = 0;
  int aborts = 0;

  absl::Status Await(CollectiveWait wait) {
    return AwaitCollective(
        [this]() -> absl::StatusOr<bool> {
          if (!query_error.ok()) return query_error;
          ++polls;
          return polls_until_done >= 0 && polls > polls_until_done;
        },
        [this] { return async_error; }, [this] { ++aborts; }, wait);
  }
};

CollectiveWait Wait(absl::Duration timeout) {
  CollectiveWait w;
  w.what = "cp ring on cuda:0,cuda:1";
  w.timeout = timeout;
  return w;
}

TEST(CollectiveWatchdogTest, AFinishedCollectiveIsOkAndNotAborted) {
  FakeCollective c;
  c.polls_until_done = 5;
  EXPECT_TRUE(c.Await(Wait(absl::Seconds(600))).ok());
  EXPECT_EQ(c.polls, 6);
  EXPECT_EQ(c.aborts, 0);
}

TEST(CollectiveWatchdogTest, AHungCollectiveIsAbortedAtTheTimeout) {
  FakeCollective c;  // never done
  const absl::Status s = c.Await(Wait(absl::Milliseconds(30)));
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(s.message(), HasSubstr("cp ring on cuda:0,cuda:1"));
  EXPECT_THAT(s.message(), HasSubstr("aborted"));
  EXPECT_EQ(c.aborts, 1);
  EXPECT_GT(c.polls, 1);  // it kept polling until then
}

TEST(CollectiveWatchdogTest, AnAsyncErrorAbortsAtOnceWithThatError) {
  FakeCollective c;
  c.async_error = absl::UnavailableError("nccl: remote process exited");
  const absl::Status s = c.Await(Wait(absl::Seconds(600)));
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(s.message(), HasSubstr("remote process exited"));
  EXPECT_THAT(s.message(), HasSubstr("cp ring on cuda:0,cuda:1"));
  EXPECT_EQ(c.aborts, 1);
  EXPECT_EQ(c.polls, 1);
}

TEST(CollectiveWatchdogTest, AFailedQueryAbortsWithItsError) {
  FakeCollective c;
  c.query_error = absl::InternalError("cuda: illegal address");
  const absl::Status s = c.Await(Wait(absl::Seconds(600)));
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal);
  EXPECT_EQ(c.aborts, 1);
}

TEST(CollectiveWatchdogTest, ACancelledJobAbortsTheWait) {
  FakeCollective c;  // never done
  std::atomic<bool> cancelled{false};
  CollectiveWait w = Wait(absl::Seconds(600));
  w.cancelled = &cancelled;
  std::thread canceller([&] {
    absl::SleepFor(absl::Milliseconds(20));
    cancelled.store(true);
  });
  const absl::Status s = c.Await(w);
  canceller.join();
  EXPECT_EQ(s.code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(c.aborts, 1);
}

TEST(CollectiveWatchdogTest, ACollectiveDoneWithAnErrorPendingIsStillDone) {
  // Done is asked first: a ring that finished is not aborted for an error
  // its communicator reports afterwards (the next job's problem).
  FakeCollective c;
  c.polls_until_done = 0;
  c.async_error = absl::InternalError("late");
  EXPECT_TRUE(c.Await(Wait(absl::Seconds(600))).ok());
  EXPECT_EQ(c.aborts, 0);
}

}  // namespace
}  // namespace attnaudit
