// The real binary's wiring of tenants and /metrics security: SIGHUP
// re-reads the token file (a broken one keeps the tenants in force), and
// --metrics-token-file guards /metrics. Loopback only.
#include <signal.h>

#include <fstream>
#include <memory>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/lib/client.h"
#include "gtest/gtest.h"
#include "tests/load/server_process.h"

namespace attnaudit::testing {
namespace {

absl::Status Caps(const ServerProcess& server, const std::string& token) {
  client::ClientOptions o;
  o.address = server.address();
  o.auth_token = token;
  o.timeout = absl::Seconds(10);
  auto c = client::Client::Connect(o);
  if (!c.ok()) return c.status();
  return (*c)->Capabilities(/*refresh=*/true).status();
}

bool LogShows(const ServerProcess& server, const std::string& text, int times) {
  const absl::Time until = absl::Now() + absl::Seconds(30);
  while (absl::Now() < until) {
    const std::string log = server.Log();
    int n = 0;
    for (size_t at = log.find(text); at != std::string::npos;
         at = log.find(text, at + 1)) {
      ++n;
    }
    if (n >= times) return true;
    absl::SleepFor(absl::Milliseconds(20));
  }
  return false;
}

TEST(SignalsTest, SighupReloadsTokensAndTheMetricsTokenGuardsScrapes) {
  const std::string dir = ::testing::TempDir() + "/attnaudit_signals";
  std::system(
      absl::StrCat("rm -rf '", dir, "' && mkdir -p '", dir, "'").c_str());
  std::ofstream(dir + "/tokens") << "token:old fleet-a audit,read\n";
  std::ofstream(dir + "/metrics.token") << "scrape-token\n";
  auto server = ServerProcess::Start(
      {"--data-dir", dir + "/data", "--auth-token-file", dir + "/tokens",
       "--metrics-token-file", dir + "/metrics.token"},
      dir + "/server.log");
  ASSERT_TRUE(server.ok()) << server.status();
  ServerProcess& s = **server;
  EXPECT_TRUE(Caps(s, "old").ok());
  EXPECT_EQ(Caps(s, "new").code(), absl::StatusCode::kUnauthenticated);

  std::ofstream(dir + "/tokens") << "token:new fleet-a audit,read\n";
  s.Signal(SIGHUP);
  ASSERT_TRUE(LogShows(s, "token file reloaded", 1)) << s.Log();
  EXPECT_EQ(Caps(s, "old").code(), absl::StatusCode::kUnauthenticated);
  EXPECT_TRUE(Caps(s, "new").ok());

  std::ofstream(dir + "/tokens") << "token:newer fleet-a teleport\n";
  s.Signal(SIGHUP);
  ASSERT_TRUE(LogShows(s, "token file reload failed", 1)) << s.Log();
  EXPECT_TRUE(Caps(s, "new").ok());
  EXPECT_FALSE(absl::StrContains(s.Log(), "newer"));  // no secret logged

  absl::StatusOr<std::string> none = s.Scrape("", /*with_head=*/true);
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(absl::StartsWith(*none, "HTTP/1.1 401")) << *none;
  absl::StatusOr<std::string> ok = s.Scrape("scrape-token");
  ASSERT_TRUE(ok.ok());
  EXPECT_TRUE(absl::StrContains(*ok, "attnaudit_build_info")) << *ok;

  s.Signal(SIGTERM);
  EXPECT_EQ(s.Wait(), 0);
}

}  // namespace
}  // namespace attnaudit::testing
