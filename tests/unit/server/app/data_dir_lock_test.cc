// DataDirLock: one holder per data directory; the refusal names the flag
// and the holder; the lock goes with its holder.
#include "server/app/data_dir_lock.h"

#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace attnaudit::server {
namespace {

std::string TempDir() {
  const char* base = getenv("TEST_TMPDIR");
  std::string tmpl = std::string(base ? base : "/tmp") + "/data_dir_XXXXXX";
  return mkdtemp(&tmpl[0]);
}

TEST(DataDirLockTest, ASecondHolderIsRefusedNamingTheFlagAndTheHolder) {
  const std::string dir = TempDir();
  absl::StatusOr<std::unique_ptr<DataDirLock>> first =
      DataDirLock::Acquire(dir);
  ASSERT_TRUE(first.ok()) << first.status();
  absl::StatusOr<std::unique_ptr<DataDirLock>> second =
      DataDirLock::Acquire(dir);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition);
  const std::string message(second.status().message());
  EXPECT_TRUE(absl::StartsWith(message, "--data-dir " + dir + ": in use"))
      << message;
  EXPECT_TRUE(absl::StrContains(message, absl::StrCat("pid ", getpid())))
      << message;
  // Released with its holder.
  first->reset();
  EXPECT_TRUE(DataDirLock::Acquire(dir).ok());
}

TEST(DataDirLockTest, AHolderThatDiesReleasesIt) {
  const std::string dir = TempDir();
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // Locks and dies without unlocking (what kill -9 leaves).
    auto lock = DataDirLock::Acquire(dir);
    _exit(lock.ok() ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  EXPECT_TRUE(DataDirLock::Acquire(dir).ok());
}

}  // namespace
}  // namespace attnaudit::server
