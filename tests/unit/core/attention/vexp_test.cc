#include "core/attention/vexp.h"

#include <cmath>
#include <limits>
#include <vector>

#include "core/tensor/dtype.h"
#include "gtest/gtest.h"

namespace attnaudit {
namespace {

// Against long-double exp rounded to the target type: within 2 ulp over the
// softmax range, 0 at and below underflow, exact at 0.
TEST(VexpTest, F64WithinTwoUlps) {
  std::vector<double> x;
  for (double v = 0.0; v > -760.0; v -= 0.0137) x.push_back(v);
  x.push_back(-0.0);
  x.push_back(-std::numeric_limits<double>::infinity());
  x.push_back(-1e-300);
  std::vector<double> e(x.size());
  ExpNonPositiveF64(x.data(), static_cast<int64_t>(x.size()), e.data());
  for (size_t i = 0; i < x.size(); ++i) {
    const double want =
        static_cast<double>(std::exp(static_cast<long double>(x[i])));
    if (x[i] < -745.2) {
      EXPECT_LE(e[i], 5e-324) << x[i];
      continue;
    }
    if (want < 1e-300) continue;  // subnormal results: relative ulps are moot
    EXPECT_LE(UlpDistance(e[i], want, DType::kF64), 2u) << "x=" << x[i];
  }
  EXPECT_EQ(e[x.size() - 2], 0.0);  // exp(-inf)
}

TEST(VexpTest, F32WithinTwoUlps) {
  std::vector<float> x;
  for (float v = 0.0f; v > -110.0f; v -= 0.00731f) x.push_back(v);
  x.push_back(-std::numeric_limits<float>::infinity());
  std::vector<float> e(x.size());
  ExpNonPositiveF32(x.data(), static_cast<int64_t>(x.size()), e.data());
  for (size_t i = 0; i < x.size(); ++i) {
    const float want =
        static_cast<float>(std::exp(static_cast<long double>(x[i])));
    if (x[i] < -103.98f) {
      EXPECT_LE(e[i], 1.5e-45f) << x[i];
      continue;
    }
    if (want < 1e-37f) continue;
    EXPECT_LE(UlpDistance(e[i], want, DType::kF32), 2u) << "x=" << x[i];
  }
  EXPECT_EQ(e.back(), 0.0f);
  float zero = 0.0f, one = 0.0f;
  ExpNonPositiveF32(&zero, 1, &one);
  EXPECT_EQ(one, 1.0f);
}

}  // namespace
}  // namespace attnaudit
