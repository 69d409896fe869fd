#include "core/tensor/dtype.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iterator>
#include <limits>
#include <random>
#include <vector>

#include "core/tensor/dtype_traits.h"
#include "core/tensor/tensor.h"
#include "gtest/gtest.h"

namespace attnaudit {
namespace {

TEST(DTypeTest, SizesAndNames) {
  EXPECT_EQ(DTypeSize(DType::kBF16), 2);
  EXPECT_EQ(DTypeSize(DType::kF8E4M3), 1);
  EXPECT_EQ(DTypeSize(DType::kF64), 8);
  EXPECT_EQ(DTypeSize(DType::kInvalid), 0);
  for (DType t :
       {DType::kF32, DType::kF16, DType::kBF16, DType::kF8E4M3, DType::kF8E5M2,
        DType::kF64, DType::kI32, DType::kI64, DType::kBool}) {
    EXPECT_EQ(DTypeFromName(DTypeName(t)), t) << DTypeName(t);
  }
  EXPECT_EQ(DTypeFromName("bfloat16"), DType::kBF16);
  EXPECT_EQ(DTypeFromName("nope"), DType::kInvalid);
}

// The traits table agrees with the conversions: each narrow format's
// largest finite value, smallest normal and smallest subnormal round-trip,
// the next value past the largest is not finite (or saturates), one ulp
// above 1 is 1 + epsilon, and half of it rounds back to 1 (ties to even).
TEST(DTypeTest, UlpAtIsTheSpacingOfTheValuesThere) {
  EXPECT_EQ(UlpAt(1.0, DType::kBF16), std::ldexp(1.0, -7));
  EXPECT_EQ(UlpAt(-1.5, DType::kF16), std::ldexp(1.0, -10));
  EXPECT_EQ(UlpAt(3.0, DType::kF32), std::ldexp(1.0, -22));
  // The next value above x is x + UlpAt(x): 1.0 + 2^-7 is bf16's.
  EXPECT_EQ(RoundToDType(1.0f + std::ldexp(1.0f, -7), DType::kBF16),
            1.0f + std::ldexp(1.0f, -7));
  // Below the smallest normal: f16's own, f32's for the others.
  EXPECT_EQ(UlpAt(0.0, DType::kF16), std::ldexp(1.0, -24));
  EXPECT_EQ(UlpAt(1e-40, DType::kBF16), std::ldexp(1.0, -133));
  EXPECT_EQ(UlpAt(1e-30, DType::kBF16), std::ldexp(1.0, -107));
}

TEST(DTypeTraitsTest, AgreeWithTheConversions) {
  for (DType t : {DType::kF16, DType::kBF16, DType::kF8E4M3, DType::kF8E5M2}) {
    const DTypeTraits& traits = DTypeTraitsOf(t);
    SCOPED_TRACE(traits.name);
    const float max = static_cast<float>(traits.max_finite);
    EXPECT_EQ(RoundToDType(max, t), max);
    EXPECT_EQ(RoundToDType(-max, t), -max);
    const float beyond =
        max * (1.0f + 2.0f * static_cast<float>(traits.epsilon()));
    if (traits.saturates) {
      EXPECT_EQ(RoundToDType(beyond, t), max);
    } else {
      EXPECT_TRUE(std::isinf(RoundToDType(beyond, t)));
    }
    EXPECT_EQ(std::ilogb(traits.max_finite), traits.max_exponent);
    const float normal = static_cast<float>(traits.smallest_normal());
    const float subnormal = static_cast<float>(traits.denorm_min());
    EXPECT_EQ(RoundToDType(normal, t), normal);
    EXPECT_EQ(RoundToDType(subnormal, t), subnormal);
    EXPECT_EQ(RoundToDType(subnormal * 0.5f, t), 0.0f);  // tie to even
    EXPECT_EQ(RoundToDType(normal - subnormal, t), normal - subnormal);
    const float eps = static_cast<float>(traits.epsilon());
    EXPECT_EQ(RoundToDType(1.0f + eps, t), 1.0f + eps);
    EXPECT_EQ(RoundToDType(1.0f + 0.5f * eps, t), 1.0f);
    EXPECT_EQ(DTypeSize(t), traits.bytes);
    EXPECT_EQ(1 + traits.exponent_bits + traits.mantissa_bits,
              8 * traits.bytes);
    EXPECT_EQ(traits.has_infinity, t != DType::kF8E4M3);
  }
  EXPECT_EQ(DTypeTraitsOf(DType::kF32).max_finite,
            std::numeric_limits<float>::max());
  EXPECT_EQ(DTypeTraitsOf(DType::kF32).denorm_min(),
            std::numeric_limits<float>::denorm_min());
  EXPECT_EQ(DTypeTraitsOf(DType::kF32).smallest_normal(),
            std::numeric_limits<float>::min());
  EXPECT_EQ(kEpsF32, std::numeric_limits<float>::epsilon());
  EXPECT_EQ(DTypeTraitsOf(DType::kF64).max_finite,
            std::numeric_limits<double>::max());
  EXPECT_EQ(DTypeTraitsOf(DType::kF64).denorm_min(),
            std::numeric_limits<double>::denorm_min());
  EXPECT_EQ(DTypeEpsilon(DType::kF64), std::numeric_limits<double>::epsilon());
}

TEST(DTypeTraitsTest, EveryRowAndItsAliases) {
  for (const DTypeTraits& t : kDTypeTraits) {
    EXPECT_EQ(DTypeTraitsOf(t.dtype).name, t.name);
    EXPECT_EQ(DTypeName(t.dtype), t.name);
    EXPECT_EQ(IsFloating(t.dtype), t.kind == DTypeKind::kFloating);
    for (absl::string_view alias : t.aliases) {
      if (!alias.empty()) {
        EXPECT_EQ(DTypeFromName(alias), t.dtype) << alias;
      }
    }
  }
  // A value outside the enum (cast from an unchecked integer) is invalid.
  const DType stray = static_cast<DType>(42);
  EXPECT_EQ(DTypeName(stray), "invalid");
  EXPECT_EQ(DTypeSize(stray), 0);
  EXPECT_FALSE(IsFloating(stray));
  EXPECT_TRUE(IsFp8(DType::kF8E4M3));
  EXPECT_TRUE(IsFp8(DType::kF8E5M2));
  EXPECT_FALSE(IsFp8(DType::kBool));
  EXPECT_FALSE(IsFp8(DType::kF16));
  // Not floating: f32's smallest normal and subnormal, no epsilon.
  EXPECT_EQ(DTypeSmallestNormal(DType::kI32), std::ldexp(1.0, -126));
  EXPECT_EQ(DTypeDenormMin(DType::kBool), std::ldexp(1.0, -149));
  EXPECT_EQ(DTypeEpsilon(DType::kI64), 0.0);
}

// Each row of the table against the formats' published facts, written out
// here rather than derived (IEEE 754 binary16/32/64, bfloat16, the OCP 8-bit
// floating point formats; the numbers torch.finfo prints), and the codes of
// known values: the largest finite, the smallest normal and subnormal, 1
// and the next value above it, decoded and encoded by the conversions.
struct PublishedFormat {
  DType dtype;
  const char* name;
  int bits;
  int mantissa_bits;
  int exponent_bits;
  double max;              // torch.finfo(...).max
  double smallest_normal;  // .tiny
  double denorm_min;       // .smallest_subnormal
  double epsilon;          // .eps
  bool has_infinity;
  bool saturates;  // narrowing clamps to max (fp8: vLLM's scaled quant)
};

constexpr PublishedFormat kPublished[] = {
    {DType::kF32, "f32", 32, 23, 8, 3.4028234663852886e38,
     1.1754943508222875e-38, 1.401298464324817e-45, 1.1920928955078125e-07,
     true, false},
    {DType::kF16, "f16", 16, 10, 5, 65504.0, 6.103515625e-05,
     5.960464477539063e-08, 0.0009765625, true, false},
    {DType::kBF16, "bf16", 16, 7, 8, 3.3895313892515355e38,
     1.1754943508222875e-38, 9.183549615799121e-41, 0.0078125, true, false},
    {DType::kF8E4M3, "fp8_e4m3", 8, 3, 4, 448.0, 0.015625, 0.001953125, 0.125,
     false, true},
    {DType::kF8E5M2, "fp8_e5m2", 8, 2, 5, 57344.0, 6.103515625e-05,
     1.52587890625e-05, 0.25, true, true},
    {DType::kF64, "f64", 64, 52, 11, 1.7976931348623157e308,
     2.2250738585072014e-308, 4.9406564584124654e-324, 2.220446049250313e-16,
     true, false},
};

TEST(DTypeTraitsTest, EachFloatingRowIsThePublishedFormat) {
  int floating_rows = 0;
  for (const DTypeTraits& t : kDTypeTraits) floating_rows += t.floating();
  EXPECT_EQ(floating_rows, static_cast<int>(std::size(kPublished)));
  for (const PublishedFormat& f : kPublished) {
    const DTypeTraits& t = DTypeTraitsOf(f.dtype);
    SCOPED_TRACE(f.name);
    EXPECT_EQ(t.name, f.name);
    EXPECT_TRUE(t.floating());
    EXPECT_TRUE(IsFloating(f.dtype));
    EXPECT_FALSE(IsInteger(f.dtype));
    EXPECT_EQ(8 * t.bytes, f.bits);
    EXPECT_EQ(8 * DTypeSize(f.dtype), f.bits);
    EXPECT_EQ(t.mantissa_bits, f.mantissa_bits);
    EXPECT_EQ(t.exponent_bits, f.exponent_bits);
    EXPECT_EQ(t.exponent_bias(), (1 << (f.exponent_bits - 1)) - 1);
    EXPECT_EQ(t.max_finite, f.max);
    EXPECT_EQ(DTypeMaxFinite(f.dtype), f.max);
    EXPECT_EQ(t.smallest_normal(), f.smallest_normal);
    EXPECT_EQ(DTypeSmallestNormal(f.dtype), f.smallest_normal);
    EXPECT_EQ(t.denorm_min(), f.denorm_min);
    EXPECT_EQ(DTypeDenormMin(f.dtype), f.denorm_min);
    EXPECT_EQ(t.epsilon(), f.epsilon);
    EXPECT_EQ(DTypeEpsilon(f.dtype), f.epsilon);
    EXPECT_EQ(t.has_infinity, f.has_infinity);
    EXPECT_EQ(t.saturates, f.saturates);
    EXPECT_EQ(IsFp8(f.dtype), f.bits == 8);
  }
  EXPECT_EQ(kEpsF32, 1.1920928955078125e-07);
  EXPECT_EQ(kEpsBf16, 0.0078125);
}

TEST(DTypeTraitsTest, TheOtherRowsAreTheirWidths) {
  struct Row {
    DType dtype;
    const char* name;
    int bytes;
    bool integer;
  };
  for (const Row& r :
       {Row{DType::kI32, "i32", 4, true}, Row{DType::kI64, "i64", 8, true},
        Row{DType::kBool, "bool", 1, false},
        Row{DType::kInvalid, "invalid", 0, false}}) {
    SCOPED_TRACE(r.name);
    EXPECT_EQ(DTypeName(r.dtype), r.name);
    EXPECT_EQ(DTypeSize(r.dtype), r.bytes);
    EXPECT_EQ(IsInteger(r.dtype), r.integer);
    EXPECT_FALSE(IsFloating(r.dtype));
    EXPECT_FALSE(IsFp8(r.dtype));
    EXPECT_EQ(DTypeMaxFinite(r.dtype), 0.0);
  }
}

// The codes of known values in each narrow format, decoded and encoded.
struct KnownCode {
  DType dtype;
  uint16_t code;
  double value;
};

constexpr KnownCode kKnownCodes[] = {
    // f16: S.EEEEE.MMMMMMMMMM
    {DType::kF16, 0x7bff, 65504.0},
    {DType::kF16, 0x0400, 6.103515625e-05},
    {DType::kF16, 0x0001, 5.960464477539063e-08},
    {DType::kF16, 0x3c00, 1.0},
    {DType::kF16, 0x3c01, 1.0009765625},
    {DType::kF16, 0xc000, -2.0},
    // bf16: the top half of an f32
    {DType::kBF16, 0x7f7f, 3.3895313892515355e38},
    {DType::kBF16, 0x0080, 1.1754943508222875e-38},
    {DType::kBF16, 0x0001, 9.183549615799121e-41},
    {DType::kBF16, 0x3f80, 1.0},
    {DType::kBF16, 0x3f81, 1.0078125},
    {DType::kBF16, 0xc000, -2.0},
    // e4m3fn: S.EEEE.MMM, bias 7; 0x7f is NaN
    {DType::kF8E4M3, 0x7e, 448.0},
    {DType::kF8E4M3, 0x08, 0.015625},
    {DType::kF8E4M3, 0x01, 0.001953125},
    {DType::kF8E4M3, 0x38, 1.0},
    {DType::kF8E4M3, 0x39, 1.125},
    {DType::kF8E4M3, 0xc0, -2.0},
    // e5m2: S.EEEEE.MM, the top byte of an f16
    {DType::kF8E5M2, 0x7b, 57344.0},
    {DType::kF8E5M2, 0x04, 6.103515625e-05},
    {DType::kF8E5M2, 0x01, 1.52587890625e-05},
    {DType::kF8E5M2, 0x3c, 1.0},
    {DType::kF8E5M2, 0x3d, 1.25},
    {DType::kF8E5M2, 0xc0, -2.0},
};

float Decode(DType dtype, uint16_t code) {
  switch (DTypeSize(dtype)) {
    case 1:
      return dtype == DType::kF8E4M3
                 ? F8E4M3ToFloat(static_cast<uint8_t>(code))
                 : F8E5M2ToFloat(static_cast<uint8_t>(code));
    default:
      return dtype == DType::kF16 ? F16ToFloat(code) : Bf16ToFloat(code);
  }
}

uint16_t Encode(DType dtype, float value) {
  switch (dtype) {
    case DType::kF16:
      return FloatToF16(value);
    case DType::kBF16:
      return FloatToBf16(value);
    case DType::kF8E4M3:
      return FloatToF8E4M3(value);
    default:
      return FloatToF8E5M2(value);
  }
}

TEST(DTypeTraitsTest, KnownCodesDecodeAndEncode) {
  for (const KnownCode& k : kKnownCodes) {
    SCOPED_TRACE(::testing::Message()
                 << DTypeName(k.dtype) << " 0x" << std::hex << k.code);
    EXPECT_EQ(static_cast<double>(Decode(k.dtype, k.code)), k.value);
    EXPECT_EQ(Encode(k.dtype, static_cast<float>(k.value)), k.code);
    EXPECT_EQ(
        static_cast<double>(RoundToDType(static_cast<float>(k.value), k.dtype)),
        k.value);
  }
  // Past the largest finite value: IEEE formats' infinity code, e4m3fn's
  // NaN, and fp8 narrowing saturates.
  EXPECT_TRUE(std::isinf(F16ToFloat(0x7c00)));
  EXPECT_TRUE(std::isinf(Bf16ToFloat(0x7f80)));
  EXPECT_TRUE(std::isnan(F8E4M3ToFloat(0x7f)));
  EXPECT_TRUE(std::isinf(F8E5M2ToFloat(0x7c)));
  EXPECT_EQ(FloatToF8E4M3(1e6f), 0x7e);
  EXPECT_EQ(FloatToF8E5M2(1e6f), 0x7b);
  EXPECT_EQ(FloatToF16(1e6f), 0x7c00);
}

TEST(DTypeTest, Bf16RoundsToNearestEven) {
  // 1 + 2^-8 is exactly halfway between bf16 1.0 and 1 + 2^-7: ties to even.
  EXPECT_EQ(Bf16ToFloat(FloatToBf16(1.0f + std::ldexp(1.0f, -8))), 1.0f);
  // 1 + 3*2^-8 is halfway between 1+2^-7 (odd) and 1+2^-6 (even).
  EXPECT_EQ(Bf16ToFloat(FloatToBf16(1.0f + 3 * std::ldexp(1.0f, -8))),
            1.0f + std::ldexp(1.0f, -6));
  EXPECT_EQ(Bf16ToFloat(FloatToBf16(-2.5f)), -2.5f);
  EXPECT_TRUE(std::isnan(Bf16ToFloat(FloatToBf16(NAN))));
  EXPECT_TRUE(std::isinf(Bf16ToFloat(FloatToBf16(INFINITY))));
}

TEST(DTypeTest, F16KnownValues) {
  EXPECT_EQ(F16ToFloat(0x3c00), 1.0f);
  EXPECT_EQ(F16ToFloat(0xc000), -2.0f);
  EXPECT_EQ(F16ToFloat(0x7bff), 65504.0f);
  EXPECT_EQ(F16ToFloat(0x0001), std::ldexp(1.0f, -24));  // smallest subnormal
  EXPECT_TRUE(std::isinf(F16ToFloat(0x7c00)));
  EXPECT_TRUE(std::isnan(F16ToFloat(0x7e00)));
  EXPECT_EQ(FloatToF16(1.0f), 0x3c00);
  EXPECT_EQ(FloatToF16(65504.0f), 0x7bff);
  EXPECT_EQ(FloatToF16(65520.0f), 0x7c00);  // rounds up to infinity
  EXPECT_EQ(FloatToF16(std::ldexp(1.0f, -25)), 0x0000);      // tie to even (0)
  EXPECT_EQ(FloatToF16(3 * std::ldexp(1.0f, -25)), 0x0002);  // tie to even
}

TEST(DTypeTest, F16RoundTripsEveryFiniteCode) {
  for (uint32_t code = 0; code < 0x10000; ++code) {
    const float f = F16ToFloat(static_cast<uint16_t>(code));
    if (std::isnan(f)) continue;
    ASSERT_EQ(FloatToF16(f), code) << code;
  }
}

TEST(DTypeTest, Fp8E4M3) {
  EXPECT_EQ(F8E4M3ToFloat(0x7e), 448.0f);  // max finite
  EXPECT_TRUE(std::isnan(F8E4M3ToFloat(0x7f)));
  EXPECT_TRUE(std::isnan(F8E4M3ToFloat(0xff)));
  EXPECT_EQ(F8E4M3ToFloat(0x01), std::ldexp(1.0f, -9));  // smallest subnormal
  EXPECT_EQ(F8E4M3ToFloat(0x38), 1.0f);
  EXPECT_EQ(FloatToF8E4M3(1000.0f), 0x7e);  // saturates
  EXPECT_EQ(FloatToF8E4M3(-1000.0f), 0xfe);
  for (int code = 0; code < 256; ++code) {
    const float f = F8E4M3ToFloat(static_cast<uint8_t>(code));
    if (std::isnan(f)) continue;
    if (f == 0.0f && code == 0x80) continue;  // -0 keeps its sign bit
    ASSERT_EQ(FloatToF8E4M3(f), code) << code;
  }
}

TEST(DTypeTest, Fp8E5M2) {
  EXPECT_EQ(F8E5M2ToFloat(0x7b), 57344.0f);
  EXPECT_TRUE(std::isinf(F8E5M2ToFloat(0x7c)));
  EXPECT_TRUE(std::isnan(F8E5M2ToFloat(0x7d)));
  EXPECT_EQ(F8E5M2ToFloat(0x3c), 1.0f);
  for (int code = 0; code < 256; ++code) {
    const float f = F8E5M2ToFloat(static_cast<uint8_t>(code));
    if (!std::isfinite(f)) continue;
    ASSERT_EQ(FloatToF8E5M2(f), code) << code;
  }
}

// Every finite non-negative value of a narrow dtype, ascending: decoded
// from every code, the oracle of truncation.
std::vector<float> NonNegativeValues(DType dtype) {
  std::vector<float> values;
  const int codes = DTypeSize(dtype) == 1 ? 256 : 65536;
  for (int code = 0; code < codes; ++code) {
    float v = 0;
    switch (dtype) {
      case DType::kBF16:
        v = Bf16ToFloat(static_cast<uint16_t>(code));
        break;
      case DType::kF16:
        v = F16ToFloat(static_cast<uint16_t>(code));
        break;
      case DType::kF8E4M3:
        v = F8E4M3ToFloat(static_cast<uint8_t>(code));
        break;
      default:
        v = F8E5M2ToFloat(static_cast<uint8_t>(code));
        break;
    }
    if (std::isfinite(v) && !std::signbit(v)) values.push_back(v);
  }
  std::sort(values.begin(), values.end());
  return values;
}

// Rounding towards zero gives the largest representable magnitude at or
// below |x| (the largest finite above the range), with x's sign: checked
// against every code of each narrow dtype on values of every binade.
TEST(DTypeTest, RoundTowardZeroIsTheLargestMagnitudeNotAbove) {
  std::mt19937_64 rng(31);
  for (DType dtype :
       {DType::kBF16, DType::kF16, DType::kF8E4M3, DType::kF8E5M2}) {
    const std::vector<float> values = NonNegativeValues(dtype);
    std::vector<float> inputs(values.begin(), values.end());
    for (int i = 0; i < 20000; ++i) {
      const int e = static_cast<int>(rng() % 300) - 150;
      const double m = 1.0 + static_cast<double>(rng() % (1u << 23)) / 8388608;
      inputs.push_back(static_cast<float>(std::ldexp(m, e)));
    }
    inputs.push_back(std::numeric_limits<float>::max());
    for (float x : inputs) {
      if (!std::isfinite(x)) continue;  // infinities pass through, below
      for (float signed_x : {x, -x}) {
        const float got = RoundTowardZeroToDType(signed_x, dtype);
        auto at_most = std::upper_bound(values.begin(), values.end(), x);
        const float want = std::copysign(*(at_most - 1), signed_x);
        ASSERT_EQ(got, want) << DTypeName(dtype) << " x=" << signed_x;
      }
    }
    EXPECT_TRUE(std::isnan(RoundTowardZeroToDType(NAN, dtype)));
  }
  EXPECT_TRUE(std::isinf(RoundTowardZeroToDType(INFINITY, DType::kBF16)));
  EXPECT_EQ(RoundTowardZeroToDType(1.0f + 1e-7f, DType::kF32), 1.0f + 1e-7f);
}

TEST(DTypeTest, UlpDistance) {
  const float one = 1.0f;
  const float next_bf16 = 1.0f + std::ldexp(1.0f, -7);
  EXPECT_EQ(UlpDistance(one, next_bf16, DType::kBF16), 1u);
  EXPECT_EQ(UlpDistance(one, one, DType::kBF16), 0u);
  EXPECT_EQ(UlpDistance(-0.0, 0.0, DType::kF32), 0u);
  // Across zero: the smallest positive and negative subnormals are 2 apart.
  EXPECT_EQ(
      UlpDistance(std::ldexp(1.0, -149), -std::ldexp(1.0, -149), DType::kF32),
      2u);
  EXPECT_EQ(UlpDistance(1.0, 1.0 + std::ldexp(1.0, -52), DType::kF64), 1u);
  EXPECT_EQ(UlpDistance(NAN, 1.0, DType::kF32),
            std::numeric_limits<uint64_t>::max());
  EXPECT_EQ(UlpDistance(NAN, NAN, DType::kF32), 0u);
  EXPECT_EQ(UlpDistance(1.0, 2.0, DType::kF8E4M3), 8u);  // 3 mantissa bits
}

TEST(TensorTest, CheckLayout) {
  Tensor ok(DType::kBF16, {2, 3});
  EXPECT_TRUE(ok.CheckLayout("t", 1 << 20).ok());
  Tensor wrong(DType::kF32, {2, 3}, std::string(8, '\0'));
  absl::Status st = wrong.CheckLayout("k_pages", 1 << 20);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("k_pages"), absl::string_view::npos);
  Tensor huge(DType::kF32, {}, "");
  // A shape whose element count overflows int64 is rejected, not allocated.
  Tensor overflow(DType::kF32, {int64_t{1} << 40, int64_t{1} << 40}, "");
  st = overflow.CheckLayout("q", int64_t{1} << 40);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  Tensor over_cap(DType::kF32, {1 << 20}, "");
  st = over_cap.CheckLayout("q", 1024);
  EXPECT_NE(st.message().find("limit"), absl::string_view::npos);
  Tensor negative(DType::kF32, {-1}, "");
  EXPECT_FALSE(negative.CheckLayout("q", 1024).ok());
  (void)huge;
}

}  // namespace
}  // namespace attnaudit
