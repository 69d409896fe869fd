// Job ids are valid spool names, unique, ordered by creation; idempotent
// ids depend only on the key.
#include "server/rpc/job_ids.h"

#include <set>
#include <string>

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "server/spool/spool.h"

namespace attnaudit::server {
namespace {

TEST(JobIdsTest, NewIdsAreValidUniqueAndSortable) {
  std::set<std::string> seen;
  std::string previous;
  for (int i = 0; i < 1000; ++i) {
    const std::string id = NewJobId('s');
    EXPECT_TRUE(ValidateJobId(id).ok()) << id;
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
  EXPECT_TRUE(ValidateJobId(a).ok()) << a;
  EXPECT_EQ(a.size(), 33u);  // "k" + 32 hex digits
  // SHA-256("abc") starts with ba7816bf8f01cfea414140de5dae2223.
  EXPECT_EQ(IdempotentJobId("abc"), "kba7816bf8f01cfea414140de5dae2223");
  // Any bytes are fine as a key; the id stays a valid file name.
  EXPECT_TRUE(ValidateJobId(IdempotentJobId("../../etc\n")).ok());
}

}  // namespace
}  // namespace attnaudit::server
