// Job ids are valid spool names, unique and not guessable; idempotent ids
// are a keyed hash of (tenant, key) under the data directory's secret.
#include "server/store/job_ids.h"

#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <sys/stat.h>

#include <bitset>
#include <cstdio>
#include <fstream>
#include <set>
#include <string>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "server/spool/spool.h"

namespace attnaudit::server {
namespace {

TEST(JobIdsTest, NewIdsAreValidUniqueAndCarry128RandomBits) {
  std::set<std::string> seen;
  // Bits that differ between ids in the random part: with 128 random bits
  // every one of them flips in a thousand ids.
  std::bitset<128> flipped;
  std::string first_random;
  for (int i = 0; i < 1000; ++i) {
    absl::StatusOr<std::string> id = NewJobId('s');
    ASSERT_TRUE(id.ok());
    EXPECT_TRUE(ValidateJobId(*id).ok()) << *id;
    EXPECT_EQ((*id)[0], 's');
    ASSERT_EQ(id->size(), 44u);
    EXPECT_TRUE(seen.insert(*id).second) << "duplicate " << *id;
    const std::string random = absl::HexStringToBytes(id->substr(12));
    ASSERT_EQ(random.size(), 16u);
    if (first_random.empty()) first_random = random;
    for (int b = 0; b < 128; ++b) {
      const bool x = (random[b / 8] >> (b % 8)) & 1;
      const bool y = (first_random[b / 8] >> (b % 8)) & 1;
      if (x != y) flipped.set(b);
    }
  }
  EXPECT_EQ(flipped.count(), 128u);
  EXPECT_EQ((*NewJobId('a'))[0], 'a');
}

TEST(JobIdsTest, IdempotentIdsAreAKeyedHashOfTenantAndKey) {
  const JobIdKey key = JobIdKey::FromSecret(std::string(32, 'x'));
  const std::string a = key.IdempotentJobId("fleet-a", "rollout-1/step-2");
  EXPECT_EQ(a, key.IdempotentJobId("fleet-a", "rollout-1/step-2"));
  EXPECT_NE(a, key.IdempotentJobId("fleet-a", "rollout-1/step-3"));
  EXPECT_NE(a, key.IdempotentJobId("fleet-b", "rollout-1/step-2"));
  // Bytes cannot move between tenant and key.
  EXPECT_NE(key.IdempotentJobId("ab", "c"), key.IdempotentJobId("a", "bc"));
  EXPECT_TRUE(ValidateJobId(a).ok()) << a;
  EXPECT_EQ(a.size(), 33u);  // "k" + 32 hex digits
  // Another secret, other ids.
  EXPECT_NE(a, JobIdKey::FromSecret(std::string(32, 'y'))
                   .IdempotentJobId("fleet-a", "rollout-1/step-2"));
  // Independent oracle: HMAC-SHA256 over "<len>:<tenant><key>".
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  const std::string msg = "7:fleet-arollout-1/step-2";
  HMAC(EVP_sha256(), std::string(32, 'x').data(), 32,
       reinterpret_cast<const unsigned char*>(msg.data()), msg.size(), mac,
       &len);
  EXPECT_EQ(a, "k" + absl::BytesToHexString(absl::string_view(
                         reinterpret_cast<const char*>(mac), 16)));
  // Any bytes are fine as a key; the id stays a valid file name.
  EXPECT_TRUE(ValidateJobId(key.IdempotentJobId("t", "../../etc\n")).ok());
}

TEST(JobIdsTest, TheSecretIsCreatedOnceAndKept) {
  const std::string dir = ::testing::TempDir() + "/job_ids_test_key";
  std::remove((dir + "/job-id.key").c_str());
  mkdir(dir.c_str(), 0700);
  absl::StatusOr<JobIdKey> first = JobIdKey::LoadOrCreate(dir);
  ASSERT_TRUE(first.ok()) << first.status();
  absl::StatusOr<JobIdKey> again = JobIdKey::LoadOrCreate(dir);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(first->IdempotentJobId("t", "k"), again->IdempotentJobId("t", "k"));
  std::ofstream(dir + "/job-id.key") << "short";
  absl::StatusOr<JobIdKey> bad = JobIdKey::LoadOrCreate(dir);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_FALSE(absl::StrContains(bad.status().message(), dir));
  std::remove((dir + "/job-id.key").c_str());
}

}  // namespace
}  // namespace attnaudit::server
