// The server's structured log: level filtering that skips the arguments,
// key=value quoting, and whole lines under concurrency.
#include "server/common/log.h"

#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"

namespace attnaudit::log {
namespace {

void Capture(absl::string_view line, void* arg) {
  static_cast<std::string*>(arg)->append(line.data(), line.size());
}

class LogTest : public ::testing::Test {
 protected:
  void SetUp() override {
    SetSink(&Capture, &out_);
    SetLevel(Level::kInfo);
  }
  void TearDown() override {
    SetSink(nullptr, nullptr);
    SetLevel(Level::kInfo);
  }
  std::string out_;
};

TEST_F(LogTest, FiltersByLevelWithoutEvaluatingArguments) {
  int evaluated = 0;
  auto expensive = [&evaluated] {
    ++evaluated;
    return std::string("v");
  };
  ATTNAUDIT_LOG(kDebug, "hidden").Kv("k", expensive());
  EXPECT_EQ(evaluated, 0);
  EXPECT_TRUE(out_.empty());
  ATTNAUDIT_LOG(kWarn, "shown").Kv("k", expensive());
  EXPECT_EQ(evaluated, 1);
  EXPECT_TRUE(absl::StrContains(out_, " level=warn msg=shown k=v\n")) << out_;
  SetLevel(Level::kDebug);
  ATTNAUDIT_LOG(kDebug, "now").Kv("n", 3);
  EXPECT_TRUE(absl::StrContains(out_, "level=debug msg=now n=3\n")) << out_;
}

TEST_F(LogTest, QuotesValuesThatNeedIt) {
  ATTNAUDIT_LOG(kInfo, "two words")
      .Kv("plain", "abc")
      .Kv("space", "a b")
      .Kv("quote", "say \"hi\"")
      .Kv("eq", "a=b")
      .Kv("empty", "")
      .Kv("newline", "x\ny")
      .Kv("flag", true)
      .Kv("ms", 1.5)
      .Kv("status", absl::InvalidArgumentError("q: bad"));
  EXPECT_TRUE(absl::StrContains(
      out_,
      "msg=\"two words\" plain=abc space=\"a b\" quote=\"say \\\"hi\\\"\" "
      "eq=\"a=b\" empty=\"\" newline=\"x\\ny\" flag=true ms=1.5 "
      "status=INVALID_ARGUMENT error=\"q: bad\"\n"))
      << out_;
  // One line, starting with an RFC 3339 UTC timestamp.
  EXPECT_EQ(std::count(out_.begin(), out_.end(), '\n'), 1);
  EXPECT_EQ(out_[4], '-');
  EXPECT_EQ(out_[10], 'T');
  EXPECT_TRUE(absl::StrContains(out_.substr(0, 40), "Z level=info"));
}

TEST_F(LogTest, ConcurrentLinesNeverInterleave) {
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([t] {
      for (int i = 0; i < 200; ++i) {
        ATTNAUDIT_LOG(kInfo, "line")
            .Kv("thread", t)
            .Kv("i", i)
            .Kv("pad", std::string(100, 'a' + t));
      }
    });
  }
  for (std::thread& th : threads) th.join();
  std::vector<std::string> lines =
      absl::StrSplit(out_, '\n', absl::SkipEmpty());
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
  EXPECT_EQ(*ParseLevel("DEBUG"), Level::kDebug);
  EXPECT_EQ(*ParseLevel("warning"), Level::kWarn);
  absl::StatusOr<Level> bad = ParseLevel("loud");
  ASSERT_FALSE(bad.ok());
  EXPECT_TRUE(absl::StartsWith(bad.status().message(), "--log-level"));
}

}  // namespace
}  // namespace attnaudit::log
