// The RoPE arithmetic profiles (RopeTable::RotateAs under each cast point)
// against the arithmetic written out by hand, the engine's own values
// (rows, inverse frequencies) taking precedence over the config, the
// angle-uncertainty bound, and the fp64 definition (ExactRopeOf) against
// an independent long-double computation.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "core/rope/rope.h"
#include "gtest/gtest.h"
#include "tests/unit/core/testing/rope_oracle.h"
#include "tests/unit/core/testing/snapshot_builder.h"

namespace attnaudit {
namespace {

float Bf16(float x) { return RoundToDType(x, DType::kBF16); }

RopeTable MustCreate(const RopeConfig& config, int64_t head_dim,
                     const EngineRopeTable& engine = {}) {
  absl::StatusOr<RopeTable> t = RopeTable::Create(config, head_dim, engine);
  EXPECT_TRUE(t.ok()) << t.status();
  return *std::move(t);
}

float Bf16Truncated(float x) { return RoundTowardZeroToDType(x, DType::kBF16); }

// Random bf16-valued vectors and positions, rotated under `cast` by the
// table and by the formula of the profile written out here; with
// `truncate`, the final cast rounds towards zero (the intermediate ones of
// cos_sin and each_op stay to nearest).
void ExpectProfile(RopeCastPoint cast, RopeStyle style, bool truncate = false) {
  RopeConfig config;
  config.theta = 500000;
  config.style = style;
  config.cast_point = cast;
  constexpr int64_t kD = 16;
  RopeTable t = MustCreate(config, kD);
  if (truncate) t.SetFinalRounding(Rounding::kTowardZero);
  auto last = truncate ? Bf16Truncated : Bf16;
  testing::TestRng rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<float> x(kD);
    for (float& e : x) e = Bf16(static_cast<float>(rng.Normal() * 3.0));
    const int64_t pos = static_cast<int64_t>(rng.Uniform(0.0, 100000.0));
    std::vector<float> c(kD / 2), s(kD / 2), got(kD);
    t.Angles(pos, c.data(), s.data());
    t.RotateAs(x.data(), c.data(), s.data(), DType::kBF16, got.data());
    for (int64_t i = 0; i < kD / 2; ++i) {
      const int64_t a = style == RopeStyle::kNeox ? i : 2 * i;
      const int64_t b = style == RopeStyle::kNeox ? i + kD / 2 : 2 * i + 1;
      float ya, yb;
      switch (cast) {
        case RopeCastPoint::kAfterRope:
          ya = last(x[a] * c[i] - x[b] * s[i]);
          yb = last(x[b] * c[i] + x[a] * s[i]);
          break;
        case RopeCastPoint::kCosSin: {
          const float cb = Bf16(c[i]), sb = Bf16(s[i]);
          ya = last(x[a] * cb - x[b] * sb);
          yb = last(x[b] * cb + x[a] * sb);
          break;
        }
        case RopeCastPoint::kEachOp: {
          const float cb = Bf16(c[i]), sb = Bf16(s[i]);
          // HF: q * cos + rotate_half(q) * sin, each a bf16 tensor.
          ya = last(Bf16(x[a] * cb) + Bf16(-x[b] * sb));
          yb = last(Bf16(x[b] * cb) + Bf16(x[a] * sb));
          break;
        }
      }
      ASSERT_EQ(got[a], ya) << "pair " << i << " pos " << pos;
      ASSERT_EQ(got[b], yb) << "pair " << i << " pos " << pos;
    }
  }
}

TEST(RopeArithmeticTest, AfterRopeRoundsOnceAtTheEnd) {
  ExpectProfile(RopeCastPoint::kAfterRope, RopeStyle::kNeox);
}

TEST(RopeArithmeticTest, CosSinRoundsTheTableFirst) {
  ExpectProfile(RopeCastPoint::kCosSin, RopeStyle::kNeox);
  ExpectProfile(RopeCastPoint::kCosSin, RopeStyle::kGptj);
}

TEST(RopeArithmeticTest, EachOpRoundsEveryProductAndSum) {
  ExpectProfile(RopeCastPoint::kEachOp, RopeStyle::kNeox);
  ExpectProfile(RopeCastPoint::kEachOp, RopeStyle::kGptj);
}

// vLLM's CPU rotary op without AVX512_BF16: the rotation in fp32, then
// truncated; under any cast point the final cast is the truncation.
TEST(RopeArithmeticTest, ATruncatingEngineTruncatesTheFinalCast) {
  for (RopeCastPoint cast : {RopeCastPoint::kAfterRope, RopeCastPoint::kCosSin,
                             RopeCastPoint::kEachOp}) {
    ExpectProfile(cast, RopeStyle::kNeox, /*truncate=*/true);
  }
}

TEST(RopeArithmeticTest, TheProfilesDifferOnBf16) {
  // The reason they exist: about a quarter of bf16 elements move by an ulp
  // between "fp32 cos/sin, one cast" and "cos/sin in bf16".
  RopeConfig after, cos_sin;
  cos_sin.cast_point = RopeCastPoint::kCosSin;
  const RopeTable a = MustCreate(after, 64), b = MustCreate(cos_sin, 64);
  testing::TestRng rng(3);
  int64_t differ = 0, total = 0;
  std::vector<float> x(64), ya(64), yb(64), c(32), s(32);
  for (int trial = 0; trial < 100; ++trial) {
    for (float& e : x) e = Bf16(static_cast<float>(rng.Normal()));
    const int64_t pos = 1 + trial * 37;
    a.Angles(pos, c.data(), s.data());
    a.RotateAs(x.data(), c.data(), s.data(), DType::kBF16, ya.data());
    b.RotateAs(x.data(), c.data(), s.data(), DType::kBF16, yb.data());
    for (int64_t i = 0; i < 64; ++i) differ += ya[i] != yb[i] ? 1 : 0;
    total += 64;
  }
  EXPECT_GT(differ, total / 20);
  EXPECT_LT(differ, total / 2);
}

TEST(RopeArithmeticTest, EngineRowsThenInvFreqThenConfig) {
  RopeConfig config;
  config.theta = 10000;
  EngineRopeTable engine;
  engine.inv_freq = Tensor(DType::kF32, {2});
  engine.inv_freq.mutable_data<float>()[0] = 0.5f;
  engine.inv_freq.mutable_data<float>()[1] = 0.25f;
  engine.positions = Tensor(DType::kI64, {1});
  engine.positions.mutable_data<int64_t>()[0] = 7;
  engine.cos = Tensor(DType::kF32, {1, 2});
  engine.sin = Tensor(DType::kF32, {1, 2});
  const float row_cos[] = {0.1f, 0.2f}, row_sin[] = {0.3f, 0.4f};
  std::copy_n(row_cos, 2, engine.cos.mutable_data<float>());
  std::copy_n(row_sin, 2, engine.sin.mutable_data<float>());
  const RopeTable t = MustCreate(config, 4, engine);
  float c[2], s[2];
  t.Angles(7, c, s);  // the row, as sent
  EXPECT_EQ(c[0], 0.1f);
  EXPECT_EQ(s[1], 0.4f);
  EXPECT_EQ(t.SourceAt(7), RopeTable::Source::kEngineRow);
  t.Angles(3, c, s);  // the engine's inverse frequencies
  EXPECT_EQ(c[0], std::cos(3.0f * 0.5f));
  EXPECT_EQ(s[1], std::sin(3.0f * 0.25f));
  EXPECT_EQ(t.SourceAt(3), RopeTable::Source::kEngineInvFreq);
  EXPECT_EQ(t.AngleUncertainty(7, 0), 0.0);
  // Without an engine table: the config, and an uncertainty that grows
  // with the position.
  const RopeTable plain = MustCreate(config, 4);
  EXPECT_EQ(plain.SourceAt(7), RopeTable::Source::kConfig);
  EXPECT_LT(plain.AngleUncertainty(100, 1), plain.AngleUncertainty(100000, 1));
  EXPECT_LT(t.AngleUncertainty(100000, 1), plain.AngleUncertainty(100000, 1));
  // Pair 0's frequency is theta^0 = 1 in every implementation: its angle
  // is the position itself, whatever the engine's pow.
  EXPECT_EQ(plain.AngleUncertainty(100000, 0), plain.AngleUncertainty(0, 0));
}

TEST(RopeArithmeticTest, AngleUncertaintyCoversAnUlpOfTheInverseFrequency) {
  // An engine whose inverse frequency is one ulp from ours: its angle at
  // position p differs by about p * ulp; the bound must cover it.
  RopeConfig config;
  config.theta = 500000;
  const RopeTable t = MustCreate(config, 128);
  for (int64_t pair : {1, 5, 30}) {
    const float f = t.inv_freq()[pair];
    const float g = std::nextafter(f, 1.0f);
    for (int64_t pos : {1000, 32768, 131072}) {
      const double ours = static_cast<double>(static_cast<float>(pos) * f);
      const double theirs = static_cast<double>(static_cast<float>(pos) * g);
      EXPECT_LE(std::fabs(ours - theirs), t.AngleUncertainty(pos, pair))
          << "pair " << pair << " pos " << pos;
    }
  }
}

TEST(RopeArithmeticTest, ExactRopeFollowsTheLongDoubleOracle) {
  RopeConfig config;
  config.theta = 500000;
  config.scaling.type = RopeScalingType::kLlama3;
  config.scaling.factor = 8;
  config.scaling.low_freq_factor = 1;
  config.scaling.high_freq_factor = 4;
  config.scaling.original_max_position = 8192;
  absl::StatusOr<ExactRope> exact = ExactRopeOf(config, 64);
  ASSERT_TRUE(exact.ok()) << exact.status();
  const std::vector<long double> oracle = testing::OracleInvFreq(config, 64);
  ASSERT_EQ(exact->inv_freq.size(), oracle.size());
  for (size_t i = 0; i < oracle.size(); ++i) {
    EXPECT_NEAR(exact->inv_freq[i], static_cast<double>(oracle[i]),
                1e-13 * static_cast<double>(oracle[i]))
        << i;
  }
}

TEST(RopeArithmeticTest, YarnWithoutTruncationFollowsTheOracle) {
  // GPT-OSS: YaRN with the correction range's fractional bounds kept.
  RopeConfig config;
  config.theta = 150000;
  config.scaling.type = RopeScalingType::kYarn;
  config.scaling.factor = 32;
  config.scaling.original_max_position = 4096;
  config.scaling.truncate = false;
  const RopeTable t = MustCreate(config, 64);
  const std::vector<long double> oracle = testing::OracleInvFreq(config, 64);
  config.scaling.truncate = true;
  const RopeTable truncated = MustCreate(config, 64);
  int differ = 0;
  for (size_t i = 0; i < oracle.size(); ++i) {
    EXPECT_NEAR(t.inv_freq()[i], static_cast<double>(oracle[i]),
                2e-6 * static_cast<double>(oracle[i]))
        << i;
    differ += t.inv_freq()[i] != truncated.inv_freq()[i] ? 1 : 0;
  }
  EXPECT_GT(differ, 0);
}

// ExactRopeOf for the scalings that read a sequence length, against the
// long-double oracle at lengths on both sides of original_max_position.
TEST(RopeArithmeticTest, ExactRopeOfSequenceLengthScalingsFollowsTheOracle) {
  std::vector<RopeConfig> configs;
  for (int64_t length : {100, 4096, 4097, 50000}) {
    RopeConfig dynamic;
    dynamic.theta = 10000;
    dynamic.scaling.type = RopeScalingType::kDynamic;
    dynamic.scaling.factor = 8;
    dynamic.scaling.original_max_position = 4096;
    dynamic.scaling.sequence_length = length;
    configs.push_back(dynamic);
    RopeConfig longrope;
    longrope.theta = 10000;
    longrope.rotary_dim = 48;  // Phi-4-mini: partial rotary with LongRoPE
    longrope.scaling.type = RopeScalingType::kLongRope;
    longrope.scaling.factor = 32;
    longrope.scaling.original_max_position = 4096;
    longrope.scaling.sequence_length = length;
    for (int i = 0; i < 24; ++i) {
      longrope.scaling.short_factor.push_back(1.0 + 0.03 * i);
      longrope.scaling.long_factor.push_back(1.0 + 0.9 * i * i / 23.0);
    }
    configs.push_back(longrope);
  }
  for (const RopeConfig& config : configs) {
    SCOPED_TRACE(static_cast<int>(config.scaling.type));
    SCOPED_TRACE(config.scaling.sequence_length);
    absl::StatusOr<ExactRope> exact = ExactRopeOf(config, 64);
    ASSERT_TRUE(exact.ok()) << exact.status();
    const std::vector<long double> oracle = testing::OracleInvFreq(config, 64);
    ASSERT_EQ(exact->inv_freq.size(), oracle.size());
    for (size_t i = 0; i < oracle.size(); ++i) {
      EXPECT_NEAR(exact->inv_freq[i], static_cast<double>(oracle[i]),
                  1e-13 * static_cast<double>(oracle[i]))
          << i;
    }
    EXPECT_NEAR(exact->magnitude,
                static_cast<double>(testing::OracleMagnitude(config)), 1e-15);
  }
}

// A table of another width than rotary_dim / 2 (an engine that rotated the
// whole head of a partial-rotary model) is not rotated with: the config's
// values are, and the angles carry the config's uncertainty.
TEST(RopeArithmeticTest, AFullHeadTableOnAPartialConfigIsNotRotatedWith) {
  RopeConfig config;
  config.theta = 10000;
  config.rotary_dim = 4;
  EngineRopeTable engine;
  engine.inv_freq = Tensor(DType::kF32, {4});  // head_dim / 2
  for (int i = 0; i < 4; ++i) {
    engine.inv_freq.mutable_data<float>()[i] = std::pow(10000.0f, -i / 4.0f);
  }
  EXPECT_EQ(EngineTableWidth(engine), 4);
  EXPECT_FALSE(EngineTableFitsRotaryDim(engine, config, 8));
  const RopeTable t = MustCreate(config, 8, engine);
  EXPECT_FALSE(t.has_engine_inv_freq());
  EXPECT_EQ(t.SourceAt(1000), RopeTable::Source::kConfig);
  const RopeTable plain = MustCreate(config, 8);
  EXPECT_EQ(t.AngleUncertainty(1000, 1), plain.AngleUncertainty(1000, 1));
  // At the declared width the same values are used.
  engine.inv_freq = Tensor(DType::kF32, {2});
  engine.inv_freq.mutable_data<float>()[0] = 1.0f;
  engine.inv_freq.mutable_data<float>()[1] = 0.01f;
  EXPECT_TRUE(MustCreate(config, 8, engine).has_engine_inv_freq());
}

// The sequence-length scalings are scaled: the config's angles carry the
// scaled allowance (the engine's order of the scaling arithmetic).
TEST(RopeArithmeticTest, SequenceLengthScalingsUseTheScaledAllowance) {
  RopeConfig plain, dynamic;
  plain.theta = dynamic.theta = 10000;
  dynamic.scaling.type = RopeScalingType::kDynamic;
  dynamic.scaling.factor = 2;
  dynamic.scaling.original_max_position = 4096;
  dynamic.scaling.sequence_length = 4096;  // not scaled: the same frequencies
  const RopeTable a = MustCreate(plain, 16), b = MustCreate(dynamic, 16);
  EXPECT_EQ(a.inv_freq(), b.inv_freq());
  EXPECT_GT(b.AngleUncertainty(100000, 3), a.AngleUncertainty(100000, 3));
}

}  // namespace
}  // namespace attnaudit
