// OpenCalls: every registered call is rechecked on reload and swept for
// idleness (by the sweeper thread too), removed calls are not, and
// Reauthorize tells a revoked credential, a moved tenant and a lost
// permission apart.
#include "server/jobs/open_calls.h"

#include <atomic>

#include "absl/strings/match.h"
#include "gtest/gtest.h"

namespace attnaudit::server {
namespace {

class FakeCall : public OpenCall {
 public:
  explicit FakeCall(bool idle) : idle_(idle) {}
  bool Recheck(const Authenticator&) override {
    ++rechecks;
    return true;
  }
  bool EndIfIdle(absl::Time) override {
    ++sweeps;
    return idle_;
  }
  std::atomic<int> rechecks{0};
  std::atomic<int> sweeps{0};

 private:
  const bool idle_;
};

std::unique_ptr<Authenticator> Auth(const char* text) {
  absl::StatusOr<TenantTable> table = TenantTable::Parse(text, {});
  EXPECT_TRUE(table.ok()) << table.status();
  return *Authenticator::CreateFromTable(*std::move(table), {});
}

Credentials Bearer(const std::string& token) {
  Credentials c;
  c.authorization = "Bearer " + token;
  return c;
}

TEST(OpenCallsTest, RegisteredCallsAreRecheckedAndSwept) {
  auto auth = Auth("token:x a read\n");
  OpenCalls calls;
  FakeCall idle(true), busy(false), gone(true);
  calls.Add(&idle);
  calls.Add(&busy);
  calls.Add(&gone);
  calls.Remove(&gone);
  EXPECT_EQ(calls.size(), 2u);
  EXPECT_EQ(calls.RecheckAll(*auth), 2);
  EXPECT_EQ(calls.EndIdle(absl::Now()), 1);
  EXPECT_EQ(idle.rechecks, 1);
  EXPECT_EQ(busy.sweeps, 1);
  EXPECT_EQ(gone.rechecks + gone.sweeps, 0);
}

TEST(OpenCallsTest, TheSweeperRunsUntilDestruction) {
  FakeCall idle(true);
  std::atomic<int64_t> ended{0};
  {
    OpenCalls calls;
    calls.Add(&idle);
    calls.StartSweeper(absl::Milliseconds(5),
                       [&](int64_t n) { ended.fetch_add(n); });
    const absl::Time limit = absl::Now() + absl::Seconds(30);
    while (ended.load() < 3 && absl::Now() < limit) {
      absl::SleepFor(absl::Milliseconds(1));
    }
    calls.Remove(&idle);
  }
  EXPECT_GE(ended.load(), 3);
  const int sweeps = idle.sweeps.load();
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_EQ(idle.sweeps.load(), sweeps);
}

TEST(ReauthorizeTest, RevokedMovedAndStrippedCredentialsAreTold) {
  Principal was;
  was.tenant = "fleet-a";
  was.permissions = kPermRead | kPermReadAll;
  auto before = Auth("token:t fleet-a read_all\n");
  absl::StatusOr<Principal> same =
      Reauthorize(*before, Bearer("t"), was, kPermRead, "WatchResults");
  ASSERT_TRUE(same.ok()) << same.status();
  EXPECT_TRUE(same->ReadsAll());

  auto revoked = Auth("token:other fleet-a read\n");
  EXPECT_EQ(
      Reauthorize(*revoked, Bearer("t"), was, kPermRead, "W").status().code(),
      absl::StatusCode::kUnauthenticated);
  auto moved = Auth("token:t fleet-b read\n");
  absl::Status s =
      Reauthorize(*moved, Bearer("t"), was, kPermRead, "W").status();
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_TRUE(absl::StrContains(s.message(), "no longer belongs")) << s;
  auto stripped = Auth("token:t fleet-a audit\n");
  s = Reauthorize(*stripped, Bearer("t"), was, kPermRead, "W").status();
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_TRUE(absl::StrContains(s.message(), "read permission")) << s;
  auto narrowed = Auth("token:t fleet-a read\n");
  absl::StatusOr<Principal> now =
      Reauthorize(*narrowed, Bearer("t"), was, kPermRead, "W");
  ASSERT_TRUE(now.ok());
  EXPECT_FALSE(now->ReadsAll());
}

}  // namespace
}  // namespace attnaudit::server
