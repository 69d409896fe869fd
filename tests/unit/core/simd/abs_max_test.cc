// AbsMaxima on every target against a naive oracle: each element converted
// to double, non-finite ones skipped, the largest |x| kept. Random bit
// patterns of every encoding (so NaN, infinities, subnormals and both
// zeros all occur), rows of lengths that leave every tail, strided rows,
// merged partials.
#include "core/simd/abs_max.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "core/simd/targets.h"
#include "core/tensor/dtype.h"
#include "gtest/gtest.h"

namespace attnaudit {
namespace {

constexpr DType kEncodings[] = {DType::kF64, DType::kF32,    DType::kBF16,
                                DType::kF16, DType::kF8E4M3, DType::kF8E5M2};

// `count` elements of `dtype`, random bits.
std::vector<uint8_t> RandomBits(std::mt19937_64& rng, DType dtype,
                                int64_t count) {
  std::vector<uint8_t> bytes(static_cast<size_t>(count * DTypeSize(dtype)));
  for (uint8_t& b : bytes) b = static_cast<uint8_t>(rng());
  return bytes;
}

// The oracle: per element of a row, the largest finite |x| over `rows`
// rows `stride` elements apart.
std::vector<double> Naive(const std::vector<uint8_t>& bytes, DType dtype,
                          int64_t rows, int64_t stride, int64_t n) {
  std::vector<double> m(static_cast<size_t>(n), 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t i = 0; i < n; ++i) {
      const double x = LoadAsDouble(bytes.data(), dtype, r * stride + i);
      if (std::isfinite(x)) m[i] = std::max(m[i], std::fabs(x));
    }
  }
  return m;
}

void ExpectEqual(const AbsMaxima& got, const std::vector<double>& want,
                 DType dtype, int64_t n) {
  double all = 0;
  for (int64_t i = 0; i < n; ++i) {
    // f64 maxima come back as float: compare at float precision.
    EXPECT_EQ(got.At(i), static_cast<float>(want[i]))
        << DTypeName(dtype) << " element " << i << " of " << n;
    all = std::max(all, want[i]);
  }
  EXPECT_EQ(got.Max(), static_cast<float>(all)) << DTypeName(dtype);
}

class AbsMaximaTest : public ::testing::TestWithParam<int64_t> {
 protected:
  void SetUp() override { ForceSimdTargetForTest(GetParam()); }
  void TearDown() override { ForceSimdTargetForTest(0); }
};

TEST_P(AbsMaximaTest, RandomEncodingsMatchTheNaiveMaxima) {
  std::mt19937_64 rng(7);
  for (DType dtype : kEncodings) {
    ASSERT_TRUE(AbsMaxima::Supports(dtype)) << DTypeName(dtype);
    for (int64_t n : {1, 3, 8, 15, 16, 17, 33, 64, 96, 128, 130, 256}) {
      const int64_t rows = 5;
      const int64_t stride = n + 3;
      const std::vector<uint8_t> bytes = RandomBits(rng, dtype, rows * stride);
      AbsMaxima strided(dtype, n);
      strided.AddRows(bytes.data(), rows, stride);
      ExpectEqual(strided, Naive(bytes, dtype, rows, stride, n), dtype, n);
      // Row by row, in two partials merged: the same maxima.
      AbsMaxima first(dtype, n), second(dtype, n);
      for (int64_t r = 0; r < rows; ++r) {
        (r % 2 ? second : first)
            .Add(bytes.data() + r * stride * DTypeSize(dtype));
      }
      first.Merge(second);
      ExpectEqual(first, Naive(bytes, dtype, rows, stride, n), dtype, n);
    }
  }
}

TEST_P(AbsMaximaTest, NonFiniteValuesAreSkippedAndSignsIgnored) {
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> row = {-3.5f, inf,   -inf,   std::nanf(""),
                                  2.0f,  -0.0f, 1e-40f, 0.25f};
  AbsMaxima m(DType::kF32, 8);
  m.Add(row.data());
  EXPECT_EQ(m.At(0), 3.5f);
  EXPECT_EQ(m.At(1), 0.0f);
  EXPECT_EQ(m.At(2), 0.0f);
  EXPECT_EQ(m.At(3), 0.0f);
  EXPECT_EQ(m.At(5), 0.0f);
  EXPECT_EQ(m.At(6), 1e-40f);
  EXPECT_EQ(m.Max(), 3.5f);
  // bf16: the largest finite magnitude stays, an infinity next to it not.
  const std::vector<uint16_t> bf16 = {0xff7f, 0x7f80, 0xffc1, 0x0001};
  AbsMaxima b(DType::kBF16, 4);
  b.Add(bf16.data());
  EXPECT_EQ(b.At(0), Bf16ToFloat(0x7f7f));
  EXPECT_EQ(b.At(1), 0.0f);
  EXPECT_EQ(b.At(2), 0.0f);
  EXPECT_EQ(b.At(3), Bf16ToFloat(0x0001));
}

TEST(AbsMaximaSupportTest, OnlyFloatingEncodings) {
  EXPECT_FALSE(AbsMaxima::Supports(DType::kI32));
  EXPECT_FALSE(AbsMaxima::Supports(DType::kI64));
  EXPECT_FALSE(AbsMaxima::Supports(DType::kBool));
  EXPECT_FALSE(AbsMaxima::Supports(DType::kInvalid));
}

INSTANTIATE_TEST_SUITE_P(Targets, AbsMaximaTest,
                         ::testing::ValuesIn(CompiledSimdTargets()),
                         [](const ::testing::TestParamInfo<int64_t>& info) {
                           return SimdTargetName(info.param);
                         });

}  // namespace
}  // namespace attnaudit
