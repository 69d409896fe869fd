// BlockingExecutor: FIFO, bounded, and Shutdown runs what was accepted.
#include "server/jobs/blocking_executor.h"

#include <atomic>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"

namespace attnaudit::server {
namespace {

TEST(BlockingExecutorTest, RunsInOrderAndRefusesWhenFull) {
  BlockingExecutor executor(/*threads=*/1, /*max_queued=*/3);
  absl::Notification release;
  absl::Notification started;
  ASSERT_TRUE(executor.Post([&] {
    started.Notify();
    release.WaitForNotification();
  }));
  started.WaitForNotification();  // the only thread is busy now
  absl::Mutex mu;
  std::vector<int> order;
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(executor.Post([&, i] {
      absl::MutexLock lock(&mu);
      order.push_back(i);
    }));
  }
  EXPECT_EQ(executor.queued(), 3u);
  EXPECT_FALSE(executor.Post([] {})) << "a 4th queued task is refused";
  release.Notify();
  executor.Shutdown();  // runs the queued tasks first
  EXPECT_EQ(order, (std::vector<int>{0, 1, 2}));
  EXPECT_FALSE(executor.Post([] {})) << "refused after shutdown";
}

TEST(BlockingExecutorTest, ManyThreadsRunEveryTask) {
  std::atomic<int> ran{0};
  {
    BlockingExecutor executor(4, 10000);
    for (int i = 0; i < 1000; ++i) {
      ASSERT_TRUE(executor.Post([&] { ran.fetch_add(1); }));
    }
  }  // the destructor shuts down
  EXPECT_EQ(ran.load(), 1000);
}

}  // namespace
}  // namespace attnaudit::server
