// RopeTable (fp32 RoPE) against hand-computed vectors and the independent
// long-double oracle (tests/unit/core/testing/rope_oracle.h).
#include "core/rope/rope.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/unit/core/testing/rope_oracle.h"
#include "tests/unit/core/testing/snapshot_builder.h"

namespace attnaudit {
namespace {

using testing::OracleInvFreq;
using testing::OracleMagnitude;
using testing::OracleRope;
using testing::OracleYarnRange;
using testing::TestRng;

constexpr double kU = 0x1.0p-24;  // fp32 unit roundoff

RopeTable MustCreate(const RopeConfig& config, int64_t head_dim) {
  absl::StatusOr<RopeTable> t = RopeTable::Create(config, head_dim);
  EXPECT_TRUE(t.ok()) << t.status();
  return *std::move(t);
}

std::vector<float> Rotated(const RopeTable& t, std::vector<float> x,
                           int64_t pos) {
  t.Rotate(x.data(), pos);
  return x;
}

TEST(RopeTest, NeoxPairsHalvesOnAHandComputedVector) {
  // D = 4, theta = 10000: inv_freq = [1, 10000^-0.5 = 0.01]. NeoX pairs
  // (0, 2) and (1, 3).
  RopeConfig config;
  config.theta = 10000;
  const RopeTable t = MustCreate(config, 4);
  const std::vector<float> y = Rotated(t, {1, 2, 3, 4}, 1);
  const double c1 = std::cos(1.0), s1 = std::sin(1.0);
  const double c2 = std::cos(0.01), s2 = std::sin(0.01);
  // Tolerance: a few fp32 roundings of values of magnitude <= 5.
  EXPECT_NEAR(y[0], 1 * c1 - 3 * s1, 4e-6);
  EXPECT_NEAR(y[2], 3 * c1 + 1 * s1, 4e-6);
  EXPECT_NEAR(y[1], 2 * c2 - 4 * s2, 4e-6);
  EXPECT_NEAR(y[3], 4 * c2 + 2 * s2, 4e-6);
}

TEST(RopeTest, GptjPairsNeighboursOnAHandComputedVector) {
  RopeConfig config;
  config.theta = 10000;
  config.style = RopeStyle::kGptj;
  const RopeTable t = MustCreate(config, 4);
  const std::vector<float> y = Rotated(t, {1, 2, 3, 4}, 3);
  const double c1 = std::cos(3.0), s1 = std::sin(3.0);
  const double c2 = std::cos(0.03), s2 = std::sin(0.03);
  EXPECT_NEAR(y[0], 1 * c1 - 2 * s1, 4e-6);
  EXPECT_NEAR(y[1], 2 * c1 + 1 * s1, 4e-6);
  EXPECT_NEAR(y[2], 3 * c2 - 4 * s2, 4e-6);
  EXPECT_NEAR(y[3], 4 * c2 + 3 * s2, 4e-6);
}

TEST(RopeTest, PositionZeroIsTheIdentityBitwise) {
  // cos 0 = 1 and sin 0 = 0 exactly, so x*1 - y*0 = x in fp32.
  for (RopeStyle style : {RopeStyle::kNeox, RopeStyle::kGptj}) {
    RopeConfig config;
    config.style = style;
    const RopeTable t = MustCreate(config, 6);
    const std::vector<float> x = {1.5f, -2.25f, 3e-3f, 7.f, -1e4f, 0.1f};
    EXPECT_EQ(Rotated(t, x, 0), x);
  }
}

TEST(RopeTest, PartialRotaryLeavesTailDimsUntouched) {
  TestRng rng(5);
  for (RopeStyle style : {RopeStyle::kNeox, RopeStyle::kGptj}) {
    RopeConfig config;
    config.style = style;
    config.rotary_dim = 4;
    const RopeTable t = MustCreate(config, 8);
    EXPECT_EQ(t.rotary_dim(), 4);
    EXPECT_EQ(t.inv_freq().size(), 2u);
    std::vector<float> x(8);
    for (float& v : x) v = static_cast<float>(rng.Normal());
    const std::vector<float> y = Rotated(t, x, 77);
    for (int i = 4; i < 8; ++i) EXPECT_EQ(y[i], x[i]) << i;
    // The rotary part did rotate (and kept its norm).
    EXPECT_NE(y[0], x[0]);
    const double nx = x[0] * x[0] + x[1] * x[1] + x[2] * x[2] + x[3] * x[3];
    const double ny = y[0] * y[0] + y[1] * y[1] + y[2] * y[2] + y[3] * y[3];
    EXPECT_NEAR(nx, ny, 1e-5 * nx);
  }
}

TEST(RopeTest, AnglesAndRotateWithMatchRotateBitwise) {
  RopeConfig config;
  config.theta = 500000;
  config.scaling.type = RopeScalingType::kYarn;
  config.scaling.factor = 4;
  const RopeTable t = MustCreate(config, 16);
  std::vector<float> c(8), s(8);
  std::vector<float> x(16);
  TestRng rng(9);
  for (float& v : x) v = static_cast<float>(rng.Normal());
  t.Angles(4099, c.data(), s.data());
  std::vector<float> y = x;
  t.RotateWith(y.data(), c.data(), s.data());
  EXPECT_EQ(y, Rotated(t, x, 4099));
}

// LongRoPE divisors shaped like Phi-3.5's: short ones near 1, long ones
// growing to tens over the low frequencies.
RopeScaling LongRope(int64_t half, int64_t sequence_length) {
  RopeScaling s;
  s.type = RopeScalingType::kLongRope;
  s.factor = 32;  // max_position_embeddings 131072 / 4096
  s.original_max_position = 4096;
  s.sequence_length = sequence_length;
  for (int64_t i = 0; i < half; ++i) {
    const double t = static_cast<double>(i) / static_cast<double>(half - 1);
    s.short_factor.push_back(1.0 + 0.08 * t + 0.5 * t * t * t);
    s.long_factor.push_back(1.0 + 1.5 * t + 45.0 * t * t * t * t);
  }
  return s;
}

RopeScaling DynamicNtk(int64_t sequence_length) {
  RopeScaling s;
  s.type = RopeScalingType::kDynamic;
  s.factor = 4;
  s.original_max_position = 4096;
  s.sequence_length = sequence_length;
  return s;
}

// A config per scaling type, with realistic model parameters.
std::vector<std::pair<std::string, RopeConfig>> Configs() {
  std::vector<std::pair<std::string, RopeConfig>> out;
  RopeConfig plain;
  plain.theta = 1e6;
  out.push_back({"qwen3 neox", plain});
  RopeConfig gptj;
  gptj.style = RopeStyle::kGptj;
  gptj.rotary_dim = 64;
  out.push_back({"glm4 gptj partial", gptj});
  RopeConfig linear;
  linear.scaling.type = RopeScalingType::kLinear;
  linear.scaling.factor = 8;
  out.push_back({"gemma3 linear", linear});
  RopeConfig llama3;
  llama3.theta = 500000;
  llama3.scaling.type = RopeScalingType::kLlama3;
  llama3.scaling.factor = 8;
  out.push_back({"llama3.1", llama3});
  RopeConfig yarn;
  yarn.theta = 150000;
  yarn.scaling.type = RopeScalingType::kYarn;
  yarn.scaling.factor = 32;
  yarn.scaling.original_max_position = 4096;
  out.push_back({"gpt-oss yarn", yarn});
  RopeConfig phi = plain;
  phi.theta = 10000;
  phi.rotary_dim = 96;
  out.push_back({"phi4 partial", phi});
  RopeConfig dynamic;
  dynamic.theta = 10000;
  dynamic.scaling = DynamicNtk(13001);
  out.push_back({"dynamic ntk", dynamic});
  RopeConfig longrope;
  longrope.theta = 10000;
  longrope.rotary_dim = 64;  // 32 divisors, valid at D = 64 and 128
  longrope.scaling = LongRope(32, 131072);
  out.push_back({"phi3.5 longrope long", longrope});
  longrope.scaling = LongRope(32, 4096);
  out.push_back({"phi3.5 longrope short", longrope});
  return out;
}

// The scaled inverse frequencies are a handful of fp32 operations
// (powf, divisions, the llama3/YaRN blends): each within 16 ulps of the
// long-double definition.
TEST(RopeTest, InverseFrequenciesMatchTheOracle) {
  for (const auto& [name, config] : Configs()) {
    const int64_t D = 128;
    if (config.scaling.type == RopeScalingType::kYarn) {
      // Away from an integer, fp32 and long double floor/ceil agree.
      const testing::YarnRange r = OracleYarnRange(config, D);
      for (long double v : {r.low_dim, r.high_dim}) {
        const long double frac = v - std::floor(v);
        ASSERT_TRUE(frac > 0.01L && frac < 0.99L) << name << " " << (double)v;
      }
    }
    const RopeTable t = MustCreate(config, D);
    const std::vector<long double> want = OracleInvFreq(config, D);
    ASSERT_EQ(t.inv_freq().size(), want.size()) << name;
    for (size_t i = 0; i < want.size(); ++i) {
      const double w = static_cast<double>(want[i]);
      EXPECT_NEAR(t.inv_freq()[i], w, 16 * kU * w) << name << " i=" << i;
    }
    EXPECT_NEAR(t.magnitude(), static_cast<double>(OracleMagnitude(config)),
                4 * kU)
        << name;
  }
}

// fp32 RoPE vs the long-double oracle. The fp32 angle pos * inv_freq errs
// by |angle| * (16u inv_freq + 1u product); cos/sin add ~1u; the magnitude
// and the two products and sum add ~4u relative to |x_a| + |x_b|. So the
// bound per element is (|x_a| + |x_b|) * mag * u * (17 |angle| + 8): a few
// ulps times the angle magnitude, as fp32 RoPE really behaves.
TEST(RopeTest, Fp32RopeMatchesTheOracleWithinAngleScaledUlps) {
  TestRng rng(11);
  const std::vector<int64_t> positions = {
      0, 1, 2, 17, 511, 4095, 4096, 8191, 32768, 131071, 500000, 1048575};
  for (const auto& [name, config] : Configs()) {
    for (int64_t D : {64, 128}) {
      if (config.rotary_dim > D) continue;
      const RopeTable t = MustCreate(config, D);
      const std::vector<long double> inv = OracleInvFreq(config, D);
      const long double mag = OracleMagnitude(config);
      const int64_t rd = t.rotary_dim(), half = rd / 2;
      for (int64_t pos : positions) {
        std::vector<float> x(static_cast<size_t>(D));
        for (float& v : x) v = static_cast<float>(rng.Normal());
        const std::vector<float> y = Rotated(t, x, pos);
        const std::vector<long double> want = OracleRope(
            config, std::vector<long double>(x.begin(), x.end()), pos);
        for (int64_t i = 0; i < D; ++i) {
          if (i >= rd) {
            EXPECT_EQ(y[i], x[i]) << name << " pass-through dim " << i;
            continue;
          }
          const bool neox = config.style == RopeStyle::kNeox;
          const int64_t pair = neox ? i % half : i / 2;
          const int64_t a = neox ? pair : 2 * pair;
          const int64_t b = neox ? pair + half : 2 * pair + 1;
          const double angle = static_cast<double>(pos * inv[pair]);
          const double tol = (std::fabs(x[a]) + std::fabs(x[b])) *
                             static_cast<double>(mag) * kU * (17 * angle + 8);
          EXPECT_NEAR(y[i], static_cast<double>(want[i]), tol)
              << name << " D=" << D << " pos=" << pos << " dim=" << i;
        }
      }
    }
  }
}

TEST(RopeTest, LinearScalingDividesTheFrequencies) {
  RopeConfig none, linear;
  linear.scaling.type = RopeScalingType::kLinear;
  linear.scaling.factor = 4;
  const RopeTable a = MustCreate(none, 32), b = MustCreate(linear, 32);
  for (size_t i = 0; i < a.inv_freq().size(); ++i) {
    EXPECT_EQ(b.inv_freq()[i], a.inv_freq()[i] / 4.0f) << i;
  }
  // Hence position 4p with factor 4 is position p unscaled, up to the
  // fp32 rounding of the two angle products (|angle| <= 100 here).
  TestRng rng(3);
  std::vector<float> x(32);
  for (float& v : x) v = static_cast<float>(rng.Normal());
  const std::vector<float> ya = Rotated(a, x, 100);
  const std::vector<float> yb = Rotated(b, x, 400);
  for (int i = 0; i < 32; ++i) EXPECT_NEAR(ya[i], yb[i], 4e-4) << i;
}

// Llama 3.1 scaling, checked band by band against an independent
// computation: wavelengths under original/high_freq_factor keep their
// frequency bitwise, those over original/low_freq_factor are divided by
// the factor, those between are blended smoothly.
TEST(RopeTest, Llama3BandsBehaveAsDefined) {
  RopeConfig none, llama3;
  none.theta = llama3.theta = 500000;
  llama3.scaling.type = RopeScalingType::kLlama3;
  llama3.scaling.factor = 8;
  llama3.scaling.low_freq_factor = 1;
  llama3.scaling.high_freq_factor = 4;
  llama3.scaling.original_max_position = 8192;
  const RopeTable base = MustCreate(none, 128), t = MustCreate(llama3, 128);
  const long double pi = 3.141592653589793238462643383279502884L;
  int high = 0, low = 0, medium = 0;
  for (size_t i = 0; i < base.inv_freq().size(); ++i) {
    const float f = base.inv_freq()[i];
    const long double wavelen = 2 * pi / f;
    const float got = t.inv_freq()[i];
    // Skip the classification test right at a band edge (fp32 wavelen may
    // round across it); the blend is continuous there anyway.
    const bool near_edge = std::fabs(wavelen / 2048 - 1) < 1e-5L ||
                           std::fabs(wavelen / 8192 - 1) < 1e-5L;
    if (near_edge) continue;
    if (wavelen < 2048) {
      ++high;
      EXPECT_EQ(got, f) << i;
    } else if (wavelen > 8192) {
      ++low;
      EXPECT_EQ(got, f / 8.0f) << i;
    } else {
      ++medium;
      const long double smooth = (8192 / wavelen - 1) / (4 - 1);
      const long double want = (1 - smooth) * f / 8 + smooth * f;
      EXPECT_NEAR(got, static_cast<double>(want), 8 * kU * f) << i;
      EXPECT_GT(got, f / 8.0f);
      EXPECT_LT(got, f);
    }
  }
  // The configuration exercises all three bands.
  EXPECT_GT(high, 0);
  EXPECT_GT(low, 0);
  EXPECT_GT(medium, 0);
}

TEST(RopeTest, YarnMagnitudeDefaultsToTenthLogFactorPlusOne) {
  RopeConfig config;
  config.scaling.type = RopeScalingType::kYarn;
  config.scaling.factor = 32;
  const RopeTable t = MustCreate(config, 64);
  EXPECT_NEAR(t.magnitude(), 0.1 * std::log(32.0) + 1, 4 * kU);
  // At position 0 the rotation is a pure scaling by the magnitude.
  std::vector<float> x = {1, -2, 3, 4.5f};
  x.resize(64, 0.25f);
  const std::vector<float> y = Rotated(t, x, 0);
  for (int i = 0; i < 64; ++i) EXPECT_EQ(y[i], x[i] * t.magnitude()) << i;

  config.scaling.attention_factor = 0.7;
  EXPECT_EQ(MustCreate(config, 64).magnitude(), 0.7f);
  config.scaling.attention_factor = 0;
  config.scaling.factor = 1;
  EXPECT_EQ(MustCreate(config, 64).magnitude(), 1.0f);
}

// Dynamic NTK raises the base only past original_max_position, more the
// longer the sequence; pair 0 (theta^0) never moves.
TEST(RopeTest, DynamicNtkScalesWithTheSequenceLength) {
  RopeConfig none, dynamic;
  none.theta = dynamic.theta = 10000;
  const RopeTable base = MustCreate(none, 64);
  for (int64_t at_most : {1, 4095, 4096}) {
    dynamic.scaling = DynamicNtk(at_most);
    EXPECT_EQ(MustCreate(dynamic, 64).inv_freq(), base.inv_freq()) << at_most;
  }
  std::vector<float> previous = base.inv_freq();
  for (int64_t length : {4097, 8192, 16384, 65536}) {
    dynamic.scaling = DynamicNtk(length);
    const RopeTable t = MustCreate(dynamic, 64);
    EXPECT_EQ(t.inv_freq()[0], 1.0f);
    EXPECT_EQ(t.magnitude(), 1.0f);
    for (size_t i = 1; i < previous.size(); ++i) {
      EXPECT_LT(t.inv_freq()[i], previous[i]) << length << " i=" << i;
    }
    previous = t.inv_freq();
  }
  // At S = 2L with factor 4: theta' = theta * (4 * 2 - 3)^(64 / 62), the
  // frequency of the last pair theta'^(-62/64) = theta^(-62/64) / 5.
  dynamic.scaling = DynamicNtk(8192);
  const RopeTable t = MustCreate(dynamic, 64);
  EXPECT_NEAR(t.inv_freq()[31], base.inv_freq()[31] / 5.0,
              16 * kU * base.inv_freq()[31] / 5.0);
}

// LongRoPE divides pair i's frequency by short_factor[i] up to
// original_max_position and by long_factor[i] past it; the magnitude is
// sqrt(1 + ln(factor) / ln(original_max_position)) in both.
TEST(RopeTest, LongRopeSwitchesFactorsPastTheOriginalLength) {
  RopeConfig none, longrope;
  none.theta = longrope.theta = 10000;
  const RopeTable base = MustCreate(none, 32);
  longrope.scaling = LongRope(16, 4096);
  const RopeTable short_table = MustCreate(longrope, 32);
  longrope.scaling.sequence_length = 4097;
  const RopeTable long_table = MustCreate(longrope, 32);
  for (size_t i = 0; i < 16; ++i) {
    const double f = base.inv_freq()[i];
    EXPECT_NEAR(short_table.inv_freq()[i], f / longrope.scaling.short_factor[i],
                4 * kU * f)
        << i;
    EXPECT_NEAR(long_table.inv_freq()[i], f / longrope.scaling.long_factor[i],
                4 * kU * f)
        << i;
  }
  const double mag = std::sqrt(1 + std::log(32.0) / std::log(4096.0));
  EXPECT_EQ(short_table.magnitude(), static_cast<float>(mag));
  EXPECT_EQ(long_table.magnitude(), static_cast<float>(mag));
  longrope.scaling.attention_factor = 1.19;  // vLLM's short/long_mscale
  EXPECT_EQ(MustCreate(longrope, 32).magnitude(), 1.19f);
  longrope.scaling.attention_factor = 0;
  longrope.scaling.factor = 1;
  EXPECT_EQ(MustCreate(longrope, 32).magnitude(), 1.0f);
}

void ExpectInvalid(const RopeConfig& config, int64_t head_dim,
                   const std::string& field) {
  const absl::StatusOr<RopeTable> t = RopeTable::Create(config, head_dim);
  ASSERT_FALSE(t.ok()) << field;
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(std::string(t.status().message()).rfind(field, 0), 0u)
      << "message does not start with " << field << ": " << t.status();
}

TEST(RopeTest, InvalidThetaIsRejected) {
  for (double theta : {0.0, -1.0, std::numeric_limits<double>::quiet_NaN(),
                       std::numeric_limits<double>::infinity(),
                       -std::numeric_limits<double>::infinity()}) {
    RopeConfig config;
    config.theta = theta;
    ExpectInvalid(config, 8, "rope.theta");
  }
}

// A theta or linear factor at the edge of the double range gives fp32
// inverse frequencies that are zero or infinite: the error must name RoPE,
// not surface later as an attention overflow blamed on q.
TEST(RopeTest, ThetaOrFactorGivingNonNormalFrequenciesIsRejected) {
  for (double theta : {1e-300, 1e-46}) {
    RopeConfig config;
    config.theta = theta;
    ExpectInvalid(config, 8, "rope.theta");
  }
  RopeConfig linear;
  linear.scaling.type = RopeScalingType::kLinear;
  linear.scaling.factor = 1e-40;
  ExpectInvalid(linear, 8, "rope.");
}

TEST(RopeTest, YarnAttentionFactorAndBetasAreChecked) {
  RopeConfig yarn;
  yarn.scaling.type = RopeScalingType::kYarn;
  yarn.scaling.factor = 4;
  yarn.scaling.original_max_position = 4096;
  for (double af : {std::numeric_limits<double>::quiet_NaN(), -1.0, 1e39}) {
    yarn.scaling.attention_factor = af;
    ExpectInvalid(yarn, 8, "rope.scaling.attention_factor");
  }
  yarn.scaling.attention_factor = 0;
  yarn.scaling.beta_fast = 1;
  yarn.scaling.beta_slow = 32;  // beta_fast must exceed beta_slow
  ExpectInvalid(yarn, 8, "rope.scaling");
}

TEST(RopeTest, InvalidRotaryDimIsRejected) {
  for (int64_t rd : {3, 10, -2, 7}) {
    RopeConfig config;
    config.rotary_dim = rd;
    ExpectInvalid(config, 8, "rope.rotary_dim");
  }
  RopeConfig config;  // rotary_dim 0 defaults to an odd head_dim
  ExpectInvalid(config, 7, "rope.rotary_dim");
}

TEST(RopeTest, InvalidScalingIsRejected) {
  RopeConfig linear;
  linear.scaling.type = RopeScalingType::kLinear;
  for (double f : {0.0, -2.0, std::numeric_limits<double>::quiet_NaN(),
                   std::numeric_limits<double>::infinity()}) {
    linear.scaling.factor = f;
    ExpectInvalid(linear, 8, "rope.scaling");
  }
  RopeConfig llama3;
  llama3.scaling.type = RopeScalingType::kLlama3;
  llama3.scaling.factor = 8;
  llama3.scaling.high_freq_factor = 1;  // not above low_freq_factor
  ExpectInvalid(llama3, 8, "rope.scaling");
  llama3.scaling.high_freq_factor = 4;
  llama3.scaling.factor = 0.5;
  ExpectInvalid(llama3, 8, "rope.scaling");
  RopeConfig yarn;
  yarn.scaling.type = RopeScalingType::kYarn;
  yarn.scaling.factor = 4;
  yarn.scaling.beta_fast = 0;
  ExpectInvalid(yarn, 8, "rope.scaling");
  RopeConfig unknown;
  unknown.scaling.type = static_cast<RopeScalingType>(9);
  ExpectInvalid(unknown, 8, "rope.scaling.type");
}

TEST(RopeTest, InvalidDynamicNtkIsRejectedNamingTheField) {
  RopeConfig dynamic;
  dynamic.scaling = DynamicNtk(8192);
  dynamic.scaling.factor = 0.5;
  ExpectInvalid(dynamic, 8, "rope.scaling.factor");
  dynamic.scaling.factor = std::numeric_limits<double>::infinity();
  ExpectInvalid(dynamic, 8, "rope.scaling.factor");
  dynamic.scaling.factor = 2;
  dynamic.scaling.sequence_length = 0;  // required
  ExpectInvalid(dynamic, 8, "rope.scaling.sequence_length");
  dynamic.scaling.sequence_length = 8192;
  dynamic.scaling.original_max_position = -1;
  ExpectInvalid(dynamic, 8, "rope.scaling.original_max_position");
  dynamic.scaling.original_max_position = 4096;
  dynamic.rotary_dim = 2;  // the exponent r / (r - 2)
  ExpectInvalid(dynamic, 8, "rope.rotary_dim");
  // A base past the fp32 range at an absurd length: named, not inf.
  dynamic.rotary_dim = 0;
  dynamic.scaling.factor = 1e300;
  dynamic.scaling.sequence_length = int64_t{1} << 62;
  ExpectInvalid(dynamic, 8, "rope.");
}

TEST(RopeTest, InvalidLongRopeIsRejectedNamingTheField) {
  RopeConfig longrope;
  longrope.scaling = LongRope(4, 8192);
  ASSERT_TRUE(RopeTable::Create(longrope, 8).ok());
  RopeConfig bad = longrope;
  bad.scaling.short_factor.pop_back();
  ExpectInvalid(bad, 8, "rope.scaling.short_factor");
  bad = longrope;
  bad.scaling.long_factor.clear();
  ExpectInvalid(bad, 8, "rope.scaling.long_factor");
  bad = longrope;
  bad.scaling.long_factor[2] = -1;
  ExpectInvalid(bad, 8, "rope.scaling.long_factor[2]");
  bad = longrope;
  bad.scaling.short_factor[1] = std::numeric_limits<double>::quiet_NaN();
  ExpectInvalid(bad, 8, "rope.scaling.short_factor[1]");
  bad = longrope;
  bad.scaling.sequence_length = 0;
  ExpectInvalid(bad, 8, "rope.scaling.sequence_length");
  bad = longrope;
  bad.scaling.original_max_position = 1;  // ln(1) = 0 in the default
  ExpectInvalid(bad, 8, "rope.scaling.original_max_position");
  bad = longrope;
  bad.scaling.factor = -3;
  ExpectInvalid(bad, 8, "rope.scaling.factor");
  bad = longrope;
  bad.scaling.attention_factor = std::numeric_limits<double>::infinity();
  ExpectInvalid(bad, 8, "rope.scaling.attention_factor");
  // The divisors follow rotary_dim, not head_dim.
  bad = longrope;
  bad.rotary_dim = 4;
  ExpectInvalid(bad, 8, "rope.scaling.short_factor");
}

}  // namespace
}  // namespace attnaudit
