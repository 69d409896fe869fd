// UploadProgress: an upload makes progress by bytes over each window, not
// by messages; near its end it owes only what is left, and at least one
// byte (its end of stream).
#include "server/rpc/upload_progress.h"

#include "gtest/gtest.h"

namespace attnaudit::server {
namespace {

const absl::Time kT0 = absl::FromUnixSeconds(1700000000);

TEST(UploadProgressTest, MessagesWithoutBytesAreNoProgress) {
  UploadProgress p(absl::Seconds(5), /*min_rate=*/1000, kT0);
  EXPECT_EQ(p.per_window(), 5000);
  p.Expect(1 << 20);
  // The attack: an empty chunk every 4 s used to reset the idle timer.
  for (int s = 1; s < 5; ++s) {
    p.Add(0);
    EXPECT_FALSE(p.Stalled(kT0 + absl::Seconds(s)));
  }
  p.Add(0);
  EXPECT_TRUE(p.Stalled(kT0 + absl::Seconds(5)));
}

TEST(UploadProgressTest, EnoughBytesInAWindowStartTheNext) {
  UploadProgress p(absl::Seconds(5), 1000, kT0);
  p.Expect(1 << 20);
  p.Add(4999);
  EXPECT_TRUE(p.Stalled(kT0 + absl::Seconds(5)));  // one byte short
  UploadProgress q(absl::Seconds(5), 1000, kT0);
  q.Expect(1 << 20);
  q.Add(5000);
  EXPECT_FALSE(q.Stalled(kT0 + absl::Seconds(5)));
  // The next window counts from there: the earlier bytes are spent.
  EXPECT_FALSE(q.Stalled(kT0 + absl::Seconds(9)));
  EXPECT_TRUE(q.Stalled(kT0 + absl::Seconds(10)));
}

TEST(UploadProgressTest, NearItsEndAnUploadOwesWhatIsLeftThenItsEnd) {
  UploadProgress p(absl::Seconds(5), 1000, kT0);
  p.Expect(12000);
  p.Add(5000);
  EXPECT_FALSE(p.Stalled(kT0 + absl::Seconds(5)));
  p.Add(5000);
  EXPECT_FALSE(p.Stalled(kT0 + absl::Seconds(10)));
  p.Add(2000);  // the last 2000 bytes: less than a window's 5000
  EXPECT_FALSE(p.Stalled(kT0 + absl::Seconds(15)));
  // Everything sent and no end of stream for a window: stalled.
  EXPECT_TRUE(p.Stalled(kT0 + absl::Seconds(20)));
  // What is left is owed in full: 1999 of the last 2000 is not enough.
  UploadProgress q(absl::Seconds(5), 1000, kT0);
  q.Expect(2000);
  q.Add(1999);
  EXPECT_TRUE(q.Stalled(kT0 + absl::Seconds(5)));
}

TEST(UploadProgressTest, BeforeItsHeaderAnUploadOwesAWindowsBytes) {
  UploadProgress p(absl::Seconds(1), 1 << 20, kT0);
  p.Add(100);  // a header of 100 bytes and nothing announced yet
  EXPECT_TRUE(p.Stalled(kT0 + absl::Seconds(1)));
}

}  // namespace
}  // namespace attnaudit::server
