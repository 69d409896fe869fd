// The server's log over spdlog: the line format (RFC 3339 UTC timestamp,
// level, quoted message and key=value pairs), level filtering that skips the
// arguments, whole lines under concurrency, and the --log-level names.
#include "server/log/log.h"

#include <spdlog/sinks/ostream_sink.h>

#include <algorithm>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"

namespace attnaudit::server {
namespace {

class LogTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ConfigureLogging(spdlog::level::info,
                     std::make_shared<spdlog::sinks::ostream_sink_mt>(out_));
  }
  void TearDown() override { ConfigureLogging(spdlog::level::info); }
  std::string out() const { return out_.str(); }

  std::ostringstream out_;
};

TEST_F(LogTest, FiltersByLevelWithoutEvaluatingArguments) {
  int evaluated = 0;
  auto expensive = [&evaluated] {
    ++evaluated;
    return std::string("v");
  };
  ATTNAUDIT_LOG(debug, "hidden").Kv("k", expensive());
  EXPECT_EQ(evaluated, 0);
  EXPECT_TRUE(out().empty());
  ATTNAUDIT_LOG(warn, "shown").Kv("k", expensive());
  EXPECT_EQ(evaluated, 1);
  EXPECT_TRUE(absl::StrContains(out(), " level=warn msg=shown k=v\n")) << out();
  spdlog::set_level(spdlog::level::debug);
  ATTNAUDIT_LOG(debug, "now").Kv("n", 3);
  EXPECT_TRUE(absl::StrContains(out(), "level=debug msg=now n=3\n")) << out();
  ATTNAUDIT_LOG(err, "bad").Kv("n", 4);
  EXPECT_TRUE(absl::StrContains(out(), "level=error msg=bad n=4\n")) << out();
}

TEST_F(LogTest, QuotesValuesThatNeedIt) {
  ATTNAUDIT_LOG(info, "two words")
      .Kv("plain", "abc")
      .Kv("space", "a b")
      .Kv("quote", "say \"hi\"")
      .Kv("eq", "a=b")
      .Kv("empty", "")
      .Kv("newline", "x\ny")
      .Kv("flag", true)
      .Kv("ms", 1.5)
      .Kv("status", absl::InvalidArgumentError("q: bad"));
  const std::string line = out();
  EXPECT_TRUE(absl::StrContains(
      line,
      "msg=\"two words\" plain=abc space=\"a b\" quote=\"say \\\"hi\\\"\" "
      "eq=\"a=b\" empty=\"\" newline=\"x\\ny\" flag=true ms=1.5 "
      "status=INVALID_ARGUMENT error=\"q: bad\"\n"))
      << line;
  // One line, starting with an RFC 3339 UTC timestamp with milliseconds:
  // 2024-05-01T12:00:00.123Z.
  EXPECT_EQ(std::count(line.begin(), line.end(), '\n'), 1);
  ASSERT_GT(line.size(), 24u);
  EXPECT_EQ(line[4], '-');
  EXPECT_EQ(line[10], 'T');
  EXPECT_EQ(line[19], '.');
  EXPECT_EQ(line.substr(23, 12), "Z level=info");
}

TEST_F(LogTest, ConcurrentLinesNeverInterleave) {
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([t] {
      for (int i = 0; i < 200; ++i) {
        ATTNAUDIT_LOG(info, "line")
            .Kv("thread", t)
            .Kv("i", i)
            .Kv("pad", std::string(100, 'a' + t));
      }
    });
  }
  for (std::thread& th : threads) th.join();
  std::vector<std::string> lines =
      absl::StrSplit(out(), '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 800u);
  for (const std::string& line : lines) {
    // Each line carries exactly one thread's padding.
    const size_t pad = line.find(" pad=");
    ASSERT_NE(pad, std::string::npos) << line;
    const std::string padding = line.substr(pad + 5);
    ASSERT_EQ(padding.size(), 100u) << line;
    EXPECT_EQ(padding, std::string(100, padding[0]));
  }
}

TEST(LogLevelTest, ParsesNamesAndRejectsOthers) {
  EXPECT_EQ(*ParseLogLevel("DEBUG"), spdlog::level::debug);
  EXPECT_EQ(*ParseLogLevel("info"), spdlog::level::info);
  EXPECT_EQ(*ParseLogLevel("warn"), spdlog::level::warn);
  EXPECT_EQ(*ParseLogLevel("warning"), spdlog::level::warn);
  EXPECT_EQ(*ParseLogLevel("error"), spdlog::level::err);
  for (const char* bad : {"loud", "off", "trace", ""}) {
    absl::StatusOr<spdlog::level::level_enum> level = ParseLogLevel(bad);
    ASSERT_FALSE(level.ok()) << bad;
    EXPECT_TRUE(absl::StartsWith(level.status().message(), "--log-level"));
  }
}

}  // namespace
}  // namespace attnaudit::server
