#include "core/tensor/dtype.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

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
