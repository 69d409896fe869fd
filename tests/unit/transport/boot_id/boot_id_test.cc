// ReadBootId: the kernel's boot id as both ends of the memfd transport
// compare it (transport/boot_id/boot_id.h).
#include "transport/boot_id/boot_id.h"

#include <fstream>
#include <string>

#include "gtest/gtest.h"

namespace attnaudit {
namespace {

TEST(BootIdTest, IsTheFirstLineOfTheKernelsBootIdFile) {
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  std::string line;
  if (!std::getline(in, line)) GTEST_SKIP() << "no boot_id in this /proc";
  absl::StatusOr<std::string> id = ReadBootId();
  ASSERT_TRUE(id.ok()) << id.status();
  EXPECT_EQ(*id, line);
  // A UUID: 36 characters, dashes at 8, 13, 18 and 23, no line end.
  ASSERT_EQ(id->size(), 36u) << *id;
  for (size_t i : {8u, 13u, 18u, 23u}) EXPECT_EQ((*id)[i], '-') << *id;
}

TEST(BootIdTest, TwoReadsAgree) {
  absl::StatusOr<std::string> a = ReadBootId();
  absl::StatusOr<std::string> b = ReadBootId();
  if (!a.ok()) GTEST_SKIP() << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(*a, *b);
}

}  // namespace
}  // namespace attnaudit
