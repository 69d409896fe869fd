// The CLI's durations: docs/OPERATIONS.md shows `attnaudit list --since 7d`,
// which was refused (days were not a duration).
#include "client/cli/cli_flags.h"

#include "gtest/gtest.h"

namespace attnaudit::client {
namespace {

TEST(ParseCliDurationTest, TakesSecondsUnitsAndDays) {
  EXPECT_EQ(*ParseCliDuration("2.5"), absl::Milliseconds(2500));
  EXPECT_EQ(*ParseCliDuration("30s"), absl::Seconds(30));
  EXPECT_EQ(*ParseCliDuration("1h30m"), absl::Minutes(90));
  EXPECT_EQ(*ParseCliDuration("7d"), absl::Hours(24 * 7));
  EXPECT_EQ(*ParseCliDuration("1.5d"), absl::Hours(36));
  EXPECT_EQ(*ParseCliDuration("1d12h"), absl::Hours(36));
}

TEST(ParseCliDurationTest, RefusesWhatIsNotADuration) {
  for (const char* bad : {"", "d", "-1", "-1d", "7x", "7d-1h", "1d1d", "abc"}) {
    absl::StatusOr<absl::Duration> d = ParseCliDuration(bad);
    EXPECT_FALSE(d.ok()) << bad;
    if (!d.ok()) {
      EXPECT_NE(d.status().message().find("7d"), absl::string_view::npos);
    }
  }
}

}  // namespace
}  // namespace attnaudit::client
