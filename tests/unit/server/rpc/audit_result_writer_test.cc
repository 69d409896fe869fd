// AuditResultWriter: Add never waits for the store, results are written in
// order, a full queue hands the excess to the overflow sink, and the
// destructor writes what is queued.
#include "server/rpc/audit_result_writer.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"

namespace attnaudit::server {
namespace {

ResultRecord Record(int i) {
  ResultRecord r;
  r.job_id = absl::StrCat("a", i);
  return r;
}

TEST(AuditResultWriterTest, WritesInOrderWithoutHoldingTheCaller) {
  absl::Notification release;
  absl::Mutex mu;
  std::vector<std::string> written, overflowed;
  {
    AuditResultWriter writer(
        /*capacity=*/3,
        [&](ResultRecord r) {
          release.WaitForNotification();  // a slow store
          absl::MutexLock lock(&mu);
          written.push_back(r.job_id);
        },
        [&](ResultRecord r) {
          absl::MutexLock lock(&mu);
          overflowed.push_back(r.job_id);
        });
    // a0 is taken by the writer thread (blocked), or still queued; either
    // way at most 3 wait and the rest overflow, and no Add blocks.
    for (int i = 0; i < 8; ++i) writer.Add(Record(i));
    {
      absl::MutexLock lock(&mu);
      EXPECT_GE(overflowed.size(), 4u);
      EXPECT_LE(overflowed.size(), 5u);
      EXPECT_TRUE(written.empty());
    }
    EXPECT_EQ(writer.overflowed(), static_cast<int64_t>(overflowed.size()));
    release.Notify();
  }  // the destructor writes what was queued
  EXPECT_EQ(written.size() + overflowed.size(), 8u);
  for (size_t i = 1; i < written.size(); ++i) {
    EXPECT_LT(written[i - 1], written[i]);  // "a0" < "a1" < ... (one digit)
  }
  EXPECT_EQ(written.front(), "a0");
}

}  // namespace
}  // namespace attnaudit::server
