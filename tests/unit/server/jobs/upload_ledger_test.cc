// UploadLedger: each limit refuses with its reason and nothing reserved,
// releases give the room back, and one tenant's share leaves room for the
// others.
#include "server/jobs/upload_ledger.h"

#include "absl/strings/match.h"
#include "gtest/gtest.h"

namespace attnaudit::server {
namespace {

constexpr int64_t kMiB = int64_t{1} << 20;

TEST(UploadLedgerTest, OneTenantCannotTakeMoreThanItsShare) {
  UploadLedger ledger(100 * kMiB, 0.5);
  EXPECT_EQ(ledger.tenant_limit(), 50 * kMiB);
  RejectReason why = RejectReason::kQueueFull;
  for (int i = 0; i < 5; ++i) {
    ASSERT_TRUE(ledger.Reserve("a", 10 * kMiB, {}, &why).ok()) << i;
  }
  const absl::Status s = ledger.Reserve("a", 1, {}, &why);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(why, RejectReason::kTenantQuota);
  EXPECT_TRUE(absl::StrContains(s.message(), "one tenant may")) << s;
  EXPECT_EQ(ledger.TenantUse("a").bytes, 50 * kMiB);
  // The rest of the budget is another tenant's to use.
  for (int i = 0; i < 5; ++i) {
    ASSERT_TRUE(ledger.Reserve("b", 10 * kMiB, {}, &why).ok()) << i;
  }
  EXPECT_EQ(ledger.total_bytes(), 100 * kMiB);
  EXPECT_EQ(ledger.Reserve("c", 1, {}, &why).code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(why, RejectReason::kMemoryBudget);
  ledger.Release("a", 10 * kMiB);
  EXPECT_TRUE(ledger.Reserve("c", 10 * kMiB, {}, &why).ok());
  EXPECT_EQ(ledger.TenantUse("a").bytes, 40 * kMiB);
  EXPECT_EQ(ledger.TenantUse("a").calls, 4);
}

TEST(UploadLedgerTest, QuotasCountUploadCallsAndBytes) {
  UploadLedger ledger(1024 * kMiB, 1.0);
  RejectReason why = RejectReason::kQueueFull;
  const TenantQuota quota{2, 30 * kMiB};
  ASSERT_TRUE(ledger.Reserve("a", 10 * kMiB, quota, &why).ok());
  ASSERT_TRUE(ledger.Reserve("a", 10 * kMiB, quota, &why).ok());
  absl::Status s = ledger.Reserve("a", 1, quota, &why);
  EXPECT_EQ(why, RejectReason::kTenantQuota);
  EXPECT_TRUE(absl::StrContains(s.message(), "2 of 2 jobs")) << s;
  ledger.Release("a", 10 * kMiB);
  s = ledger.Reserve("a", 25 * kMiB, quota, &why);
  EXPECT_EQ(why, RejectReason::kTenantQuota);
  EXPECT_TRUE(absl::StrContains(s.message(), "10 MiB of 30 MiB")) << s;
  EXPECT_TRUE(ledger.Reserve("a", 20 * kMiB, quota, &why).ok());
  // Another tenant's quota is its own.
  EXPECT_TRUE(ledger.Reserve("b", 25 * kMiB, quota, &why).ok());
}

TEST(UploadLedgerTest, AnUploadLargerThanAShareCanNeverFit) {
  UploadLedger ledger(100 * kMiB, 0.25);
  RejectReason why = RejectReason::kQueueFull;
  EXPECT_EQ(ledger.Reserve("a", 26 * kMiB, {}, &why).code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(why, RejectReason::kTooLarge);
  EXPECT_EQ(ledger.total_bytes(), 0);
  EXPECT_EQ(ledger.TenantUse("a").calls, 0);
}

}  // namespace
}  // namespace attnaudit::server
