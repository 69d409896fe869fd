// attnaudit v1 fingerprints: the documented byte stream (rebuilt here by
// hand from docs/NUMERICS.md and hashed with OpenSSL's one-shot SHA-256),
// invariances (page placement, NHD/HND, inactive slots, position integer
// width, scale form) and sensitivities (content, positions, RoPE identity,
// dtypes, key, page size, scales), the prefix check, and the SHA-256 stream
// against FIPS 180-2 test vectors.
#include "core/fingerprint/fingerprint.h"

#include <openssl/evp.h>

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <string>
#include <vector>

#include "core/fingerprint/sha256_stream.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/core/fingerprint/fixture.h"

namespace attnaudit {
namespace {

using testing::Fixture;
using testing::FixtureOptions;
using ::testing::HasSubstr;
using testing::KValue;
using testing::KvIndex;
using testing::MakeFixture;
using ::testing::StartsWith;
using testing::VValue;

std::string OneShotSha256(const std::string& bytes) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  EXPECT_EQ(
      EVP_Digest(bytes.data(), bytes.size(), digest, &n, EVP_sha256(), nullptr),
      1);
  std::string hex;
  static constexpr char kHex[] = "0123456789abcdef";
  for (unsigned int i = 0; i < n; ++i) {
    hex += kHex[digest[i] >> 4];
    hex += kHex[digest[i] & 0xf];
  }
  return hex;
}

std::string Prefix(const Fixture& f, int64_t tokens = 4) {
  absl::StatusOr<std::string> d =
      PrefixFingerprint(f.snapshot, f.layout, tokens);
  EXPECT_TRUE(d.ok()) << d.status();
  return d.ok() ? *d : std::string();
}

std::string Whole(const Fixture& f) {
  return KvCacheFingerprint(f.snapshot, f.layout);
}

void AppendLe(std::string* out, const void* p, size_t n) {
  out->append(static_cast<const char*>(p), n);  // the test host is LE (x86)
}

TEST(Sha256StreamTest, MatchesFips180Vectors) {
  {
    fingerprint_internal::Sha256Stream s;
    s.Append("abc");
    EXPECT_EQ(
        *s.Finish(),
        "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  }
  // One million 'a', fed in pieces of awkward sizes that straddle the
  // staging buffer, plus one piece larger than it.
  fingerprint_internal::Sha256Stream s;
  const std::string big(200000, 'a');
  size_t fed = 0;
  for (size_t piece = 1; fed + piece <= 800000; piece = piece * 3 + 7) {
    s.Append(big.data(), std::min(piece, big.size()));
    fed += std::min(piece, big.size());
  }
  while (fed < 1000000) {
    const size_t n = std::min<size_t>(1000000 - fed, big.size());
    s.Append(big.data(), n);
    fed += n;
  }
  EXPECT_EQ(*s.Finish(),
            "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

// The array form appends exactly the bytes of one AppendInt64Le per value
// (eight bytes, little endian, sign-extended from int32), across its
// 512-value blocks.
TEST(Sha256StreamTest, Int64ArrayAppendsEachValueAsEightLittleEndianBytes) {
  std::vector<int32_t> narrow(1300);
  std::vector<int64_t> wide(narrow.size());
  std::string expected;
  for (size_t i = 0; i < narrow.size(); ++i) {
    narrow[i] = static_cast<int32_t>(i * 2654435761u);  // mixed signs
    wide[i] = narrow[i];
    AppendLe(&expected, &wide[i], 8);
  }
  wide.push_back(INT64_MIN);
  wide.push_back(INT64_MAX);
  std::string expected_wide = expected;
  AppendLe(&expected_wide, &wide[1300], 8);
  AppendLe(&expected_wide, &wide[1301], 8);
  auto digest_of = [](const std::string& bytes) {
    fingerprint_internal::Sha256Stream s;
    s.Append(bytes);
    return *s.Finish();
  };
  for (int64_t n : {0, 1, 511, 512, 513, 1300}) {
    fingerprint_internal::Sha256Stream from_narrow;
    from_narrow.AppendInt64LeArray(narrow.data(), n);
    EXPECT_EQ(*from_narrow.Finish(),
              digest_of(expected.substr(0, static_cast<size_t>(8 * n))))
        << n;
  }
  fingerprint_internal::Sha256Stream from_wide;
  from_wide.AppendInt64LeArray(wide.data(), static_cast<int64_t>(wide.size()));
  fingerprint_internal::Sha256Stream one_by_one;
  for (int64_t v : wide) one_by_one.AppendInt64Le(v);
  const std::string digest = *from_wide.Finish();
  EXPECT_EQ(digest, digest_of(expected_wide));
  EXPECT_EQ(digest, *one_by_one.Finish());
}

// The stream of docs/FINGERPRINTS.md, written out for the base
// fixture: `tokens` per row, the key bound in the prefix domain only.
std::string DocumentedStream(const std::string& domain, int64_t tokens) {
  std::string bytes =
      "attnaudit.kv.v1;domain=" + domain +
      ";page_size=2;kv_heads=2;head_dim=8;"
      "k_dtype=f32;v_dtype=f32;k_scale=none;v_scale=none;"
      "k_rope_state=post_rope;rope_style=neox;rope_theta=1000000;"
      "rotary_dim=8;rope_scaling=none;rope_cast_at=after_rope;"
      "k_rope_output_dtype=f32";
  if (domain == "prefix") bytes += ";prefix_key=13:shared-prefix";
  bytes += "\n";
  for (int64_t b = 0; b < 2; ++b) {
    bytes +=
        "row=" + std::to_string(b) + ";tokens=" + std::to_string(tokens) + "\n";
    for (int64_t t = 0; t < tokens; ++t) {
      const int64_t position = t;
      AppendLe(&bytes, &position, 8);  // position
      AppendLe(&bytes, &position, 8);  // key RoPE position
      for (auto* value : {&KValue, &VValue}) {
        for (int64_t h = 0; h < 2; ++h) {
          for (int64_t d = 0; d < 8; ++d) {
            const float x =
                static_cast<float>(value(((b * 2 + h) * 6 + t) * 8 + d));
            AppendLe(&bytes, &x, 4);
          }
        }
      }
    }
  }
  return bytes;
}

TEST(PrefixFingerprintTest, MatchesTheDocumentedByteStream) {
  FixtureOptions o;
  o.page_order = {2, 0, 1};
  o.layout = KvLayout::kHND;
  const Fixture f = MakeFixture(o);
  EXPECT_EQ(Prefix(f), OneShotSha256(DocumentedStream("prefix", 4)));
  EXPECT_EQ(Whole(f), OneShotSha256(DocumentedStream("kv_cache", 6)));
}

TEST(PrefixFingerprintTest, InvariantToPagePlacementAndKvLayout) {
  FixtureOptions base;
  const Fixture reference = MakeFixture(base);
  for (const auto& order :
       std::vector<std::vector<int>>{{2, 0, 1}, {1, 2, 0}}) {
    for (KvLayout layout : {KvLayout::kNHD, KvLayout::kHND}) {
      FixtureOptions o = base;
      o.page_order = order;
      o.layout = layout;
      o.spare_pages = 2;
      const Fixture f = MakeFixture(o);
      EXPECT_EQ(Prefix(f), Prefix(reference));
      EXPECT_EQ(Whole(f), Whole(reference));
      EXPECT_EQ(
          *RlKernelPrefixFingerprint(f.snapshot, f.layout, 4),
          *RlKernelPrefixFingerprint(reference.snapshot, reference.layout, 4));
    }
  }
}

TEST(PrefixFingerprintTest, IgnoresInactiveSlotContent) {
  // Row 0 is 5 tokens long, so its last page has one inactive slot; two
  // spare pages are wholly inactive. Only the garbage differs.
  FixtureOptions o;
  o.seq_lens = {5, 6};
  o.spare_pages = 2;
  o.garbage = 123.0f;
  const Fixture a = MakeFixture(o);
  o.garbage = -456.0f;
  const Fixture b = MakeFixture(o);
  ASSERT_NE(a.snapshot.k_pages.bytes(), b.snapshot.k_pages.bytes());
  EXPECT_EQ(Prefix(a), Prefix(b));
  EXPECT_EQ(Prefix(a, 5), Prefix(b, 5));
  EXPECT_EQ(Whole(a), Whole(b));
}

TEST(PrefixFingerprintTest, Int32AndInt64PositionsHashTheSame) {
  FixtureOptions o;
  o.explicit_key_positions = true;
  const Fixture wide = MakeFixture(o);
  o.position_dtype = DType::kI32;
  const Fixture narrow = MakeFixture(o);
  EXPECT_EQ(Prefix(narrow), Prefix(wide));
  EXPECT_EQ(Whole(narrow), Whole(wide));
  EXPECT_EQ(RopeIdentityFingerprint(narrow.snapshot),
            RopeIdentityFingerprint(wide.snapshot));
}

TEST(PrefixFingerprintTest, AbsentKeyPositionsEqualExplicitSlotPositions) {
  FixtureOptions o;
  const Fixture absent = MakeFixture(o);
  o.explicit_key_positions = true;
  const Fixture given = MakeFixture(o);
  EXPECT_EQ(Prefix(absent), Prefix(given));
}

TEST(PrefixFingerprintTest, ContentOutsideThePrefixOnlyChangesTheCache) {
  const Fixture base = MakeFixture(FixtureOptions{});
  Fixture f = MakeFixture(FixtureOptions{});
  // Logical token 5 of row 1 (block 2, slot 1): beyond the 4-token prefix.
  const int64_t page = f.layout.block_pages[1][2];
  StoreFromFloat(f.snapshot.v_pages.mutable_raw(), DType::kF32,
                 KvIndex(f.snapshot, page, 1, 0, 0), 99.0f);
  EXPECT_EQ(Prefix(f), Prefix(base));
  EXPECT_NE(Whole(f), Whole(base));
}

// Every field the digest is bound to: changing it changes the digest.
TEST(PrefixFingerprintTest, BoundToContentPositionsRopeDtypesKeyAndPageSize) {
  const Fixture base_fixture = MakeFixture(FixtureOptions{});
  const std::string base = Prefix(base_fixture);
  auto expect_changed = [&](const Fixture& f, const char* what) {
    EXPECT_NE(Prefix(f), base) << what;
  };
  for (bool is_k : {true, false}) {  // first prefix slot, like harness case 14
    Fixture f = MakeFixture(FixtureOptions{});
    Tensor& pool = is_k ? f.snapshot.k_pages : f.snapshot.v_pages;
    const int64_t e = KvIndex(f.snapshot, f.layout.block_pages[0][0], 0, 0, 0);
    StoreFromFloat(pool.mutable_raw(), DType::kF32, e, pool.FloatAt(e) + 1.0f);
    expect_changed(f, is_k ? "k content" : "v content");
  }
  {
    FixtureOptions o;
    o.position_offset = 128;
    expect_changed(MakeFixture(o), "positions");
  }
  {
    Fixture f = MakeFixture(FixtureOptions{});
    f.snapshot.key_rope_positions = f.snapshot.slot_positions;
    f.snapshot.key_rope_positions
        .mutable_data<int64_t>()[f.layout.block_pages[1][1] * 2] += 1;
    expect_changed(f, "key rope positions");
  }
  {
    FixtureOptions o;
    o.kv_dtype = DType::kBF16;  // same values, exact in bf16
    expect_changed(MakeFixture(o), "storage dtype");
  }
  {
    FixtureOptions o;
    o.page_size = 3;
    o.owners = {0, 1};
    expect_changed(MakeFixture(o), "page size");
  }
  struct Edit {
    const char* what;
    void (*apply)(Snapshot*);
  };
  const Edit edits[] = {
      {"theta", [](Snapshot* s) { s->rope.theta = 10000.0; }},
      {"k state", [](Snapshot* s) { s->rope.k_state = RopeState::kPreRope; }},
      {"style", [](Snapshot* s) { s->rope.style = RopeStyle::kGptj; }},
      {"rotary dim", [](Snapshot* s) { s->rope.rotary_dim = 4; }},
      {"scaling",
       [](Snapshot* s) {
         s->rope.scaling.type = RopeScalingType::kLinear;
         s->rope.scaling.factor = 2.0;
       }},
      {"k output dtype",
       [](Snapshot* s) { s->rope.k_output_dtype = DType::kBF16; }},
      {"key", [](Snapshot* s) { s->prefix.key = "different-prefix"; }},
  };
  for (const Edit& edit : edits) {
    Fixture f = MakeFixture(FixtureOptions{});
    edit.apply(&f.snapshot);
    expect_changed(f, edit.what);
  }
  // Not bound: the q side, CP owners, the declared length (tokens is).
  Fixture f = MakeFixture(FixtureOptions{});
  f.snapshot.rope.q_state = RopeState::kPreRope;
  f.layout.block_owners = {{0, 0, 0}, {0, 0, 0}};
  f.snapshot.prefix.length = 3;
  EXPECT_EQ(Prefix(f), base);
  EXPECT_NE(Prefix(f, 3), base);
}

TEST(PrefixFingerprintTest, BoundToFp8ScalesInCanonicalPerHeadForm) {
  FixtureOptions o;
  o.kv_dtype = DType::kF8E4M3;
  Fixture absent = MakeFixture(o);
  Fixture one = MakeFixture(o);
  one.snapshot.k_scale = Tensor(DType::kF32, {});
  *one.snapshot.k_scale.mutable_data<float>() = 1.0f;
  EXPECT_EQ(Prefix(absent), Prefix(one));  // absent means 1.0

  Fixture per_tensor = MakeFixture(o);
  per_tensor.snapshot.k_scale = Tensor(DType::kF32, {});
  *per_tensor.snapshot.k_scale.mutable_data<float>() = 0.5f;
  Fixture per_head = MakeFixture(o);
  per_head.snapshot.k_scale = Tensor(DType::kF32, {2});
  per_head.snapshot.k_scale.mutable_data<float>()[0] = 0.5f;
  per_head.snapshot.k_scale.mutable_data<float>()[1] = 0.5f;
  EXPECT_EQ(Prefix(per_tensor), Prefix(per_head));
  EXPECT_NE(Prefix(per_tensor), Prefix(absent));

  per_head.snapshot.k_scale.mutable_data<float>()[1] = 0.25f;
  EXPECT_NE(Prefix(per_head), Prefix(per_tensor));
  Fixture v_scaled = MakeFixture(o);
  v_scaled.snapshot.v_scale = per_tensor.snapshot.k_scale;
  EXPECT_NE(Prefix(v_scaled), Prefix(per_tensor));
  EXPECT_NE(Prefix(v_scaled), Prefix(absent));

  Fixture bad = MakeFixture(o);
  bad.snapshot.k_scale = Tensor(DType::kF32, {3});
  absl::StatusOr<std::string> d =
      PrefixFingerprint(bad.snapshot, bad.layout, 4);
  ASSERT_FALSE(d.ok());
  EXPECT_THAT(std::string(d.status().message()), StartsWith("k_scale:"));
}

TEST(PrefixFingerprintTest, RejectsTokenCountsOutsideEveryRow) {
  FixtureOptions o;
  o.seq_lens = {6, 5};
  const Fixture f = MakeFixture(o);
  for (int64_t tokens : {int64_t{6}, int64_t{0}, int64_t{-1}}) {
    absl::StatusOr<std::string> d =
        PrefixFingerprint(f.snapshot, f.layout, tokens);
    ASSERT_FALSE(d.ok()) << tokens;
    EXPECT_EQ(d.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(d.status().message()),
                StartsWith("prefix.length:"));
  }
  absl::StatusOr<std::string> d = PrefixFingerprint(f.snapshot, f.layout, 6);
  EXPECT_THAT(std::string(d.status().message()),
              HasSubstr("kv_seq_lens[1] = 5"));
  EXPECT_TRUE(PrefixFingerprint(f.snapshot, f.layout, 5).ok());
}

TEST(PrefixFingerprintTest, InconsistentLayoutIsAnErrorNotACrash) {
  Fixture f = MakeFixture(FixtureOptions{});
  f.layout.block_pages[0][1] = 99;
  absl::StatusOr<std::string> d = PrefixFingerprint(f.snapshot, f.layout, 4);
  ASSERT_FALSE(d.ok());
  EXPECT_THAT(std::string(d.status().message()),
              StartsWith("block_table[0][1]:"));
  EXPECT_EQ(Whole(f), "");

  Fixture g = MakeFixture(FixtureOptions{});
  g.snapshot.k_pages.mutable_bytes()->resize(8);
  d = PrefixFingerprint(g.snapshot, g.layout, 4);
  ASSERT_FALSE(d.ok());
  EXPECT_THAT(std::string(d.status().message()), StartsWith("k_pages:"));
}

TEST(RopeIdentityFingerprintTest, BoundToRopeFactsAndPositions) {
  const Fixture base = MakeFixture(FixtureOptions{});
  const std::string digest = RopeIdentityFingerprint(base.snapshot);
  ASSERT_EQ(digest.size(), 64u);
  Fixture f = MakeFixture(FixtureOptions{});
  f.snapshot.rope.q_state = RopeState::kPreRope;
  EXPECT_NE(RopeIdentityFingerprint(f.snapshot), digest);
  f = MakeFixture(FixtureOptions{});
  f.snapshot.rope.q_output_dtype = DType::kBF16;
  EXPECT_NE(RopeIdentityFingerprint(f.snapshot), digest);
  f = MakeFixture(FixtureOptions{});
  f.snapshot.query_positions.mutable_data<int64_t>()[1] -= 1;
  EXPECT_NE(RopeIdentityFingerprint(f.snapshot), digest);
  f = MakeFixture(FixtureOptions{});
  f.snapshot.rope.scaling.type = RopeScalingType::kYarn;
  const std::string yarn = RopeIdentityFingerprint(f.snapshot);
  EXPECT_NE(yarn, digest);
  f.snapshot.rope.scaling.beta_fast = 16.0;
  EXPECT_NE(RopeIdentityFingerprint(f.snapshot), yarn);
  // A parameter the scaling type does not read is not bound.
  f = MakeFixture(FixtureOptions{});
  f.snapshot.rope.scaling.beta_fast = 16.0;
  EXPECT_EQ(RopeIdentityFingerprint(f.snapshot), digest);
}

// The RoPE identity digests of the base fixture (two rows at positions
// 0..5, queries at 5, a 6 x 2 pool) under none, linear, llama3 and yarn,
// pinned as literals computed from docs/FINGERPRINTS.md's stream outside
// this code base: a stored digest stays valid, so none of these may ever
// change (a new scaling type or parameter must leave them alone).
TEST(RopeIdentityFingerprintTest, DigestsOfEstablishedScalingTypesArePinned) {
  struct Pinned {
    const char* name;
    RopeScaling scaling;
    const char* digest;
  };
  RopeScaling linear;
  linear.type = RopeScalingType::kLinear;
  linear.factor = 2;
  RopeScaling llama3;
  llama3.type = RopeScalingType::kLlama3;
  llama3.factor = 8;
  RopeScaling yarn;
  yarn.type = RopeScalingType::kYarn;
  yarn.factor = 4;
  yarn.original_max_position = 4096;
  RopeScaling yarn_fractional = yarn;
  yarn_fractional.truncate = false;
  const Pinned pinned[] = {
      {"none", RopeScaling(),
       "83c02b38036ffb9283ef3facdb9619ee7f21c7df27b98c1742c9ad945e949064"},
      {"linear", linear,
       "c1e6fd5ebba9b9238c32ea7c76903d6ae179f14b6222f0fea8c3cb0d499fd89e"},
      {"llama3", llama3,
       "f7342f306f7b170e07a4446c9d6e00981d1d32eba0f70a950fe01d32b0031c5b"},
      {"yarn", yarn,
       "e7181a114963489386181754bca66fce071db1b231913f246431277ca6c48e81"},
      {"yarn truncate=false", yarn_fractional,
       "83b2a5b5f56764bd7d6453a027850b8671d9b310b2e406489001eac2ef259bff"},
  };
  for (const Pinned& p : pinned) {
    Fixture f = MakeFixture(FixtureOptions{});
    f.snapshot.rope.scaling = p.scaling;
    // Parameters these types do not read change nothing.
    f.snapshot.rope.scaling.sequence_length = 12345;
    f.snapshot.rope.scaling.short_factor = {1, 2, 3, 4};
    EXPECT_EQ(RopeIdentityFingerprint(f.snapshot), p.digest) << p.name;
  }
}

// Dynamic NTK and LongRoPE: their parameters in the scaling text, the
// step's sequence length after the q output dtype (docs/FINGERPRINTS.md).
TEST(RopeIdentityFingerprintTest,
     SequenceLengthScalingsHashTheirDocumentedText) {
  Fixture f = MakeFixture(FixtureOptions{});
  RopeScaling& s = f.snapshot.rope.scaling;
  s.type = RopeScalingType::kDynamic;
  s.factor = 2;
  s.original_max_position = 4096;
  s.sequence_length = 8192;
  s.short_factor = {9};  // not read by dynamic
  EXPECT_EQ(RopeIdentityFingerprint(f.snapshot),
            "55cce6436d417ac00ee5303a82a3bbf69ca0b67a25dd4a1ce9098f716191d438");
  const std::string dynamic = RopeIdentityFingerprint(f.snapshot);
  s.sequence_length = 8193;
  EXPECT_NE(RopeIdentityFingerprint(f.snapshot), dynamic);

  s.type = RopeScalingType::kLongRope;
  s.factor = 32;
  s.sequence_length = 8192;
  s.short_factor = {1, 1.25, 1.5, 2};
  s.long_factor = {1, 2.5, 4, 8};
  EXPECT_EQ(RopeIdentityFingerprint(f.snapshot),
            "760281504a03bc25a6fd958595b7f4ee38c856e97325451e7f1d6e46e1c929c1");
  const std::string longrope = RopeIdentityFingerprint(f.snapshot);
  s.long_factor[3] = 8.5;
  EXPECT_NE(RopeIdentityFingerprint(f.snapshot), longrope);
}

// The KV streams bind the scaling's model parameters but not the step's
// sequence length: a prefix hashes the same at every step of a sequence
// whose engine rescales as it grows.
TEST(PrefixFingerprintTest, SequenceLengthIsNotBound) {
  Fixture f = MakeFixture(FixtureOptions{});
  RopeScaling& s = f.snapshot.rope.scaling;
  s.type = RopeScalingType::kDynamic;
  s.factor = 2;
  s.sequence_length = 100;
  const std::string at_100 = Prefix(f);
  s.sequence_length = 200;
  EXPECT_EQ(Prefix(f), at_100);
  s.factor = 3;
  EXPECT_NE(Prefix(f), at_100);
}

TEST(VerifyPrefixFingerprintTest, AcceptsTheRecomputedDigest) {
  Fixture f = MakeFixture(FixtureOptions{});
  f.snapshot.prefix.fingerprint = Prefix(f);
  std::string recomputed = "stale";
  ASSERT_TRUE(VerifyPrefixFingerprint(f.snapshot, f.layout, &recomputed).ok());
  EXPECT_EQ(recomputed, f.snapshot.prefix.fingerprint);
  EXPECT_EQ(PrefixSchemeName(f.snapshot.prefix.scheme), kFingerprintVersion);
  EXPECT_EQ(PrefixSchemeName(PrefixCache::Scheme::kRlKernelCompat),
            "rl_kernel_compat");
}

TEST(VerifyPrefixFingerprintTest, DisabledPrefixIsNotChecked) {
  Fixture f = MakeFixture(FixtureOptions{});
  f.snapshot.prefix = PrefixCache{};
  std::string recomputed = "stale";
  EXPECT_TRUE(VerifyPrefixFingerprint(f.snapshot, f.layout, &recomputed).ok());
  EXPECT_EQ(recomputed, "");
}

// Harness cases 10, 14, 15, 16 (docs/RL_KERNEL_HARNESS.md): key, content, theta
// and storage dtype drift after the fingerprint was taken.
TEST(VerifyPrefixFingerprintTest, RejectsDriftWithTheFieldPath) {
  const std::string good = Prefix(MakeFixture(FixtureOptions{}));
  std::vector<Fixture> drifted;
  drifted.push_back(MakeFixture(FixtureOptions{}));
  drifted.back().snapshot.prefix.key = "different-prefix";
  drifted.push_back(MakeFixture(FixtureOptions{}));
  {
    Fixture& f = drifted.back();
    const int64_t e = KvIndex(f.snapshot, f.layout.block_pages[0][0], 0, 0, 0);
    f.snapshot.k_pages.mutable_data<float>()[e] += 1.0f;
  }
  drifted.push_back(MakeFixture(FixtureOptions{}));
  drifted.back().snapshot.rope.theta = 10000.0;
  FixtureOptions bf16;
  bf16.kv_dtype = DType::kBF16;
  drifted.push_back(MakeFixture(bf16));
  for (Fixture& f : drifted) {
    f.snapshot.prefix.fingerprint = good;
    std::string recomputed = "stale";
    const absl::Status s =
        VerifyPrefixFingerprint(f.snapshot, f.layout, &recomputed);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(s.message()), StartsWith("prefix.fingerprint:"));
    EXPECT_THAT(
        std::string(s.message()),
        HasSubstr("does not match the logical prefix positions/content"));
    EXPECT_EQ(recomputed, "");
  }
}

TEST(VerifyPrefixFingerprintTest, MissingFingerprintAndBadLengthAreNamed) {
  Fixture f = MakeFixture(FixtureOptions{});
  absl::Status s = VerifyPrefixFingerprint(f.snapshot, f.layout, nullptr);
  EXPECT_THAT(std::string(s.message()), StartsWith("prefix.fingerprint:"));
  f.snapshot.prefix.fingerprint = std::string(64, '0');
  f.snapshot.prefix.length = 7;
  s = VerifyPrefixFingerprint(f.snapshot, f.layout, nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), StartsWith("prefix.length:"));
}

}  // namespace
}  // namespace attnaudit
