// The RL-Kernel compatible prefix digest against an independent oracle.
//
// The expected digests below were produced by
// tests/python/rlkernel_fingerprint_oracle.py, which rebuilds the harness's
// byte stream (docs/FINGERPRINTS.md, "RL-Kernel compatible prefix stream") with
// hashlib and struct only, from the logical fixture, without any attnaudit
// code. The ctest `rlkernel_fingerprint_oracle` re-runs that script and checks
// it still yields exactly the constants in this file (it reads them from here).
// Here the same logical fixture is laid out in attnaudit's shared pool with
// permuted pages, NHD and HND, so a match also checks the logical gather.
#include <string>

#include "core/fingerprint/fingerprint.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/core/fingerprint/fixture.h"

namespace attnaudit {
namespace {

using testing::Fixture;
using testing::FixtureOptions;
using testing::MakeFixture;
using ::testing::StartsWith;

// python3 tests/python/rlkernel_fingerprint_oracle.py
constexpr char kRlKernelOracleBase[] =
    "9a9c664bd81f7300913b9fde55ce877cb3bd1da3a123b6922478238b43b6ecba";
constexpr char kRlKernelOracleInt32Positions[] =
    "aae678fc24bb234c0cdbdfcfec67877131b9a1b217839e64cd6f83ba8963e299";
constexpr char kRlKernelOracleBf16PreRope[] =
    "c5fc33cba2a5748a155e904f4bdf89027ea68bd91a9ec26d79601767679e0bad";

std::string Compat(const Fixture& f, int64_t tokens) {
  absl::StatusOr<std::string> d =
      RlKernelPrefixFingerprint(f.snapshot, f.layout, tokens);
  EXPECT_TRUE(d.ok()) << d.status();
  return d.ok() ? *d : std::string();
}

class RlKernelOracleTest : public ::testing::TestWithParam<KvLayout> {};

TEST_P(RlKernelOracleTest, BaseFixture) {
  FixtureOptions o;
  o.layout = GetParam();
  o.page_order = {2, 0, 1};
  o.spare_pages = 1;
  EXPECT_EQ(Compat(MakeFixture(o), 4), kRlKernelOracleBase);
}

TEST_P(RlKernelOracleTest, Int32PositionsHashAsTheHarnessDoes) {
  FixtureOptions o;
  o.layout = GetParam();
  o.position_dtype = DType::kI32;
  o.explicit_key_positions = true;
  const Fixture f = MakeFixture(o);
  EXPECT_EQ(Compat(f, 4), kRlKernelOracleInt32Positions);
  // Unlike attnaudit v1, the harness binds the position integer width.
  EXPECT_NE(Compat(f, 4), kRlKernelOracleBase);
}

TEST_P(RlKernelOracleTest, Bf16PreRopeGappedPrefixInsideAPage) {
  FixtureOptions o;
  o.layout = GetParam();
  o.page_order = {1, 2, 0};
  o.kv_dtype = DType::kBF16;
  o.position_offset = 100;
  o.position_stride = 3;
  Fixture f = MakeFixture(o);
  f.snapshot.rope.k_state = RopeState::kPreRope;
  f.snapshot.rope.theta = 10000.0;
  f.snapshot.prefix.key = "p-42";
  f.snapshot.prefix.length = 3;
  EXPECT_EQ(Compat(f, 3), kRlKernelOracleBf16PreRope);
}

INSTANTIATE_TEST_SUITE_P(Layouts, RlKernelOracleTest,
                         ::testing::Values(KvLayout::kNHD, KvLayout::kHND));

TEST(RlKernelPrefixFingerprintTest, BindsOwnersAndTheHeaderPrefixFields) {
  const std::string base = Compat(MakeFixture(FixtureOptions{}), 4);
  ASSERT_EQ(base, kRlKernelOracleBase);
  Fixture f = MakeFixture(FixtureOptions{});
  f.layout.block_owners = {{0, 0, 0}, {0, 0, 0}};
  EXPECT_NE(Compat(f, 4), base);
  f = MakeFixture(FixtureOptions{});
  f.snapshot.prefix.length = 3;  // the header's prefix_length field
  EXPECT_NE(Compat(f, 4), base);
  f = MakeFixture(FixtureOptions{});
  f.snapshot.prefix.enabled = false;
  EXPECT_NE(Compat(f, 4), base);
}

TEST(RlKernelPrefixFingerprintTest, VerifyUsesTheDeclaredScheme) {
  Fixture f = MakeFixture(FixtureOptions{});
  f.snapshot.prefix.scheme = PrefixCache::Scheme::kRlKernelCompat;
  f.snapshot.prefix.fingerprint = kRlKernelOracleBase;
  std::string recomputed;
  ASSERT_TRUE(VerifyPrefixFingerprint(f.snapshot, f.layout, &recomputed).ok());
  EXPECT_EQ(recomputed, kRlKernelOracleBase);
  f.snapshot.prefix.scheme = PrefixCache::Scheme::kAttnauditV1;
  EXPECT_THAT(
      std::string(
          VerifyPrefixFingerprint(f.snapshot, f.layout, nullptr).message()),
      StartsWith("prefix.fingerprint:"));
}

TEST(RlKernelPrefixFingerprintTest, UnexpressibleSnapshotsAreUnimplemented) {
  struct Case {
    const char* field;
    void (*apply)(Fixture*);
  };
  const Case cases[] = {
      {"rope.style",
       [](Fixture* f) { f->snapshot.rope.style = RopeStyle::kGptj; }},
      {"rope.rotary_dim", [](Fixture* f) { f->snapshot.rope.rotary_dim = 4; }},
      {"rope.scaling",
       [](Fixture* f) {
         f->snapshot.rope.scaling.type = RopeScalingType::kLinear;
       }},
      {"prefix.key", [](Fixture* f) { f->snapshot.prefix.key = "it's"; }},
      {"prefix.key", [](Fixture* f) { f->snapshot.prefix.key = "a\\b"; }},
      {"prefix.key", [](Fixture* f) { f->snapshot.prefix.key = "tab\there"; }},
      {"prefix.key",
       [](Fixture* f) { f->snapshot.prefix.key = "caf\xc3\xa9"; }},
      {"k_scale",
       [](Fixture* f) { f->snapshot.k_scale = Tensor(DType::kF32, {}); }},
      {"cp.interleave_size",
       [](Fixture* f) {
         f->snapshot.cp.sharding = CpSharding::kTokenInterleaved;
         f->snapshot.cp.interleave_size = 1;
       }},
  };
  for (const Case& c : cases) {
    Fixture f = MakeFixture(FixtureOptions{});
    c.apply(&f);
    absl::StatusOr<std::string> d =
        RlKernelPrefixFingerprint(f.snapshot, f.layout, 4);
    ASSERT_FALSE(d.ok()) << c.field;
    EXPECT_EQ(d.status().code(), absl::StatusCode::kUnimplemented) << c.field;
    EXPECT_THAT(std::string(d.status().message()),
                StartsWith(std::string(c.field) + ":"));
  }
  FixtureOptions fp8;
  fp8.kv_dtype = DType::kF8E4M3;
  const Fixture f = MakeFixture(fp8);
  absl::StatusOr<std::string> d =
      RlKernelPrefixFingerprint(f.snapshot, f.layout, 4);
  EXPECT_EQ(d.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(std::string(d.status().message()), StartsWith("k_pages:"));
}

TEST(RlKernelPrefixFingerprintTest, TokenInterleavingAlignedToPagesIsFine) {
  Fixture f = MakeFixture(FixtureOptions{});
  f.snapshot.cp.sharding = CpSharding::kTokenInterleaved;
  f.snapshot.cp.interleave_size = 4;  // a multiple of the page size
  EXPECT_TRUE(RlKernelPrefixFingerprint(f.snapshot, f.layout, 4).ok());
}

TEST(RlKernelPrefixFingerprintTest, RejectsTokenCountsOutsideEveryRow) {
  const Fixture f = MakeFixture(FixtureOptions{});
  for (int64_t tokens : {int64_t{7}, int64_t{0}}) {
    absl::StatusOr<std::string> d =
        RlKernelPrefixFingerprint(f.snapshot, f.layout, tokens);
    EXPECT_EQ(d.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(d.status().message()),
                StartsWith("prefix.length:"));
  }
}

}  // namespace
}  // namespace attnaudit
