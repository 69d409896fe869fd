// Job ids are valid spool names, unique, ordered by creation; idempotent
// ids depend only on the key.
#include "server/rpc/job_ids.h"

#include <set>
#include <string>

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "server/spool/spool.h"

namespace attnaudit::rpc {
namespace {

TEST(JobIdsTest, NewIdsAreValidUniqueAndSortable) {
  std::set<std::string> seen;
  std::string previous;
  for (int i = 0; i < 1000; ++i) {
    const std::string id = NewJobId('s');
    EXPECT_TRUE(server::ValidateJobId(id).ok()) << id;
    EXPECT_EQ(id[0], 's');
    EXPECT_TRUE(seen.insert(id).second) << "duplicate " << id;
    EXPECT_LT(previous, id);  // same process: time then counter
    previous = id;
  }
  EXPECT_EQ(NewJobId('a')[0], 'a');
}

TEST(JobIdsTest, IdempotentIdsDependOnlyOnTheKey) {
  const std::string a = IdempotentJobId("rollout-1/step-2");
  EXPECT_EQ(a, IdempotentJobId("rollout-1/step-2"));
  EXPECT_NE(a, IdempotentJobId("rollout-1/step-3"));
  EXPECT_TRUE(server::ValidateJobId(a).ok()) << a;
  EXPECT_EQ(a.size(), 33u);  // "k" + 32 hex digits
  // SHA-256("abc") starts with ba7816bf8f01cfea414140de5dae2223.
  EXPECT_EQ(IdempotentJobId("abc"), "kba7816bf8f01cfea414140de5dae2223");
  // Any bytes are fine as a key; the id stays a valid file name.
  EXPECT_TRUE(server::ValidateJobId(IdempotentJobId("../../etc\n")).ok());
}

TEST(JobIdsTest, TokenFileIsTrimmedAndMustHoldAToken) {
  const std::string dir = ::testing::TempDir();
  const std::string good = dir + "/token_good";
  const std::string empty = dir + "/token_empty";
  FILE* f = fopen(good.c_str(), "w");
  fputs("  s3cret \n", f);
  fclose(f);
  f = fopen(empty.c_str(), "w");
  fputs("\n", f);
  fclose(f);
  absl::StatusOr<std::string> token = ReadTokenFile(good);
  ASSERT_TRUE(token.ok());
  EXPECT_EQ(*token, "s3cret");
  absl::StatusOr<std::string> none = ReadTokenFile(empty);
  ASSERT_FALSE(none.ok());
  EXPECT_TRUE(absl::StartsWith(none.status().message(), "--auth-token-file"));
  EXPECT_FALSE(absl::StrContains(none.status().message(), "s3cret"));
  EXPECT_FALSE(ReadTokenFile(dir + "/missing").ok());
}

}  // namespace
}  // namespace attnaudit::rpc
