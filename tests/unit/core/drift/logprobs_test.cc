// SelectedLogprobs against hand-computed softmaxes, and CompareLogprobs
// against the direct k1/k3/ratio formulas in long double.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/drift/drift.h"
#include "core/simd/targets.h"
#include "core/tensor/dtype.h"
#include "gtest/gtest.h"

namespace attnaudit {
namespace {

DenseView View(const std::vector<double>& v, std::vector<int64_t> shape) {
  DenseView view;
  view.values = v.data();
  view.shape = std::move(shape);
  return view;
}

Tensor F32Tensor(std::vector<int64_t> shape, const std::vector<float>& v) {
  std::string bytes(v.size() * sizeof(float), '\0');
  std::memcpy(&bytes[0], v.data(), bytes.size());
  return Tensor(DType::kF32, std::move(shape), std::move(bytes));
}

Tensor I64Tensor(std::vector<int64_t> shape, const std::vector<int64_t>& v) {
  std::string bytes(v.size() * sizeof(int64_t), '\0');
  std::memcpy(&bytes[0], v.data(), bytes.size());
  return Tensor(DType::kI64, std::move(shape), std::move(bytes));
}

bool StartsWith(const absl::Status& s, const std::string& prefix) {
  return std::string(s.message()).rfind(prefix, 0) == 0;
}

// A 3-token vocabulary: hidden (1, 2), rows (1,0), (0,1), (1,1) give logits
// (1, 2, 3). log p(2) = 3 - ln(e + e^2 + e^3) = -ln(1 + e^-1 + e^-2).
TEST(SelectedLogprobsTest, ThreeTokenVocabularyByHand) {
  const std::vector<double> out = {1.0, 2.0};  // [1, 1, 1, 2]
  const Tensor head = F32Tensor({3, 2}, {1, 0, 0, 1, 1, 1});
  const Tensor ids = I64Tensor({1, 1}, {2});
  absl::StatusOr<std::vector<double>> lp =
      SelectedLogprobs(View(out, {1, 1, 1, 2}), head, ids, nullptr, 1.0);
  ASSERT_TRUE(lp.ok()) << lp.status();
  ASSERT_EQ(lp->size(), 1u);
  const double expected = -std::log(1.0 + std::exp(-1.0) + std::exp(-2.0));
  EXPECT_NEAR((*lp)[0], expected, 1e-15);
  EXPECT_NEAR((*lp)[0], -0.40760596444438, 1e-13);

  // Temperature 2: logits (0.5, 1, 1.5); log p(0) = 0.5 - ln(sum e^z).
  const Tensor id0 = I64Tensor({1, 1}, {0});
  lp = SelectedLogprobs(View(out, {1, 1, 1, 2}), head, id0, nullptr, 2.0);
  ASSERT_TRUE(lp.ok());
  EXPECT_NEAR((*lp)[0],
              0.5 - std::log(std::exp(0.5) + std::exp(1.0) + std::exp(1.5)),
              1e-15);
}

TEST(SelectedLogprobsTest, HeadMajorFlatteningAndMask) {
  // [B=1, Sq=2, Hq=2, D=1]: token 0 hidden (h0, h1) = (3, -1); token 1
  // inactive. Rows: (1, 0) -> 3, (0, 1) -> -1.
  const std::vector<double> out = {3.0, -1.0, 100.0, 100.0};
  const Tensor head = F32Tensor({2, 2}, {1, 0, 0, 1});
  const Tensor ids = I64Tensor({1, 2}, {1, -5});  // inactive id is ignored
  const uint8_t mask[2] = {1, 0};
  absl::StatusOr<std::vector<double>> lp =
      SelectedLogprobs(View(out, {1, 2, 2, 1}), head, ids, mask, 1.0);
  ASSERT_TRUE(lp.ok()) << lp.status();
  ASSERT_EQ(lp->size(), 2u);
  EXPECT_NEAR((*lp)[0], -1.0 - std::log(std::exp(3.0) + std::exp(-1.0)), 1e-15);
  EXPECT_EQ((*lp)[1], 0.0);
}

TEST(SelectedLogprobsTest, StableForHugeLogitsAndBf16Head) {
  // logits (1000, 1001) with a bf16 head: no overflow; log p(1) =
  // -ln(1 + e^-1).
  const std::vector<double> out = {1000.0, 1.0};
  std::string bytes(8, '\0');
  const uint16_t rows[4] = {0x3f80, 0x0000, 0x3f80, 0x3f80};  // 1,0 / 1,1
  std::memcpy(&bytes[0], rows, 8);
  const Tensor head(DType::kBF16, {2, 2}, bytes);
  const Tensor ids = I64Tensor({1, 1}, {1});
  absl::StatusOr<std::vector<double>> lp =
      SelectedLogprobs(View(out, {1, 1, 1, 2}), head, ids, nullptr, 1.0);
  ASSERT_TRUE(lp.ok()) << lp.status();
  EXPECT_NEAR((*lp)[0], -std::log1p(std::exp(-1.0)), 1e-13);
}

// lm_head in `dtype` holding `values` (already representable in it), and
// the same values as an f64 head.
Tensor HeadIn(DType dtype, std::vector<int64_t> shape,
              const std::vector<double>& values) {
  std::string bytes(values.size() * DTypeSize(dtype), '\0');
  for (size_t i = 0; i < values.size(); ++i) {
    char* at = &bytes[i * DTypeSize(dtype)];
    const float f = static_cast<float>(values[i]);
    if (dtype == DType::kF64) {
      std::memcpy(at, &values[i], 8);
    } else if (dtype == DType::kF32) {
      std::memcpy(at, &f, 4);
    } else {
      const uint16_t h = dtype == DType::kBF16 ? FloatToBf16(f) : FloatToF16(f);
      std::memcpy(at, &h, 2);
    }
  }
  return Tensor(dtype, std::move(shape), std::move(bytes));
}

TEST(SelectedLogprobsTest, EveryHeadDtypeAndTargetGivesTheF64HeadsBits) {
  // The logits read bf16/f32/f64 rows widened in registers and f16 rows
  // through a widened copy; every way, on every SIMD target, must give
  // the bits of the same values held as f64. Shapes with tails: hidden
  // 4 x 131 (not a multiple of any vector), vocab 37 (a partial block).
  std::mt19937_64 rng(17);
  std::normal_distribution<double> normal(0.0, 1.0);
  const int64_t batch = 3, heads = 4, dim = 131, vocab = 37;
  std::vector<double> out(batch * heads * dim);
  for (double& x : out) x = normal(rng);
  const std::vector<int64_t> out_shape = {batch, 1, heads, dim};
  const Tensor ids = I64Tensor({batch, 1}, {5, 0, 36});
  for (DType dtype : {DType::kBF16, DType::kF16, DType::kF32, DType::kF64}) {
    std::vector<double> w(vocab * heads * dim);
    for (double& x : w) {  // values the dtype holds exactly
      const float f = static_cast<float>(0.05 * normal(rng));
      x = dtype == DType::kBF16  ? Bf16ToFloat(FloatToBf16(f))
          : dtype == DType::kF16 ? F16ToFloat(FloatToF16(f))
                                 : f;
    }
    const Tensor head = HeadIn(dtype, {vocab, heads * dim}, w);
    const Tensor head64 = HeadIn(DType::kF64, {vocab, heads * dim}, w);
    LmHeadNorms want_norms;
    absl::StatusOr<std::vector<std::vector<double>>> want =
        SelectedLogprobsForEach({View(out, out_shape)}, head64, ids, nullptr,
                                0.7, 1, &want_norms);
    ASSERT_TRUE(want.ok()) << want.status();
    // The f64 head itself against long double: norms and log-probs.
    long double max_l1 = 0, max_l2 = 0;
    for (int64_t v = 0; v < vocab; ++v) {
      long double l1 = 0, l2 = 0;
      for (int64_t e = 0; e < heads * dim; ++e) {
        l1 += std::fabs(w[v * heads * dim + e]);
        l2 += static_cast<long double>(w[v * heads * dim + e]) *
              w[v * heads * dim + e];
      }
      max_l1 = std::max(max_l1, l1);
      max_l2 = std::max(max_l2, std::sqrt(l2));
    }
    EXPECT_NEAR(want_norms.max_row_l1, static_cast<double>(max_l1),
                1e-13 * static_cast<double>(max_l1));
    EXPECT_NEAR(want_norms.max_row_l2, static_cast<double>(max_l2),
                1e-13 * static_cast<double>(max_l2));
    const int64_t id[] = {5, 0, 36};
    for (int64_t b = 0; b < batch; ++b) {
      std::vector<long double> z(vocab, 0.0L);
      long double top = -1e300L, sum = 0;
      for (int64_t v = 0; v < vocab; ++v) {
        for (int64_t e = 0; e < heads * dim; ++e) {
          z[v] += static_cast<long double>(out[b * heads * dim + e]) *
                  w[v * heads * dim + e];
        }
        z[v] /= 0.7L;
        top = std::max(top, z[v]);
      }
      for (long double x : z) sum += std::exp(x - top);
      EXPECT_NEAR((*want)[0][b],
                  static_cast<double>(z[id[b]] - top - std::log(sum)), 1e-12)
          << DTypeName(dtype) << " row " << b;
    }
    for (int64_t target : CompiledSimdTargets()) {
      ForceSimdTargetForTest(target);
      for (int threads : {1, 3}) {
        LmHeadNorms norms;
        absl::StatusOr<std::vector<std::vector<double>>> got =
            SelectedLogprobsForEach({View(out, out_shape)}, head, ids, nullptr,
                                    0.7, threads, &norms);
        ASSERT_TRUE(got.ok()) << got.status();
        const std::string what =
            absl::StrCat(DTypeName(dtype), " ", SimdTargetName(target));
        EXPECT_EQ((*got)[0], (*want)[0]) << what;
        EXPECT_EQ(norms.max_row_l1, want_norms.max_row_l1) << what;
        EXPECT_EQ(norms.max_row_l2, want_norms.max_row_l2) << what;
      }
    }
    ForceSimdTargetForTest(0);
  }
}

TEST(SelectedLogprobsTest, NaNInOutStaysVisible) {
  const std::vector<double> out = {std::numeric_limits<double>::quiet_NaN(),
                                   1.0};
  const Tensor head = F32Tensor({2, 2}, {1, 0, 0, 1});
  const Tensor ids = I64Tensor({1, 1}, {1});
  absl::StatusOr<std::vector<double>> lp =
      SelectedLogprobs(View(out, {1, 1, 1, 2}), head, ids, nullptr, 1.0);
  ASSERT_TRUE(lp.ok());
  EXPECT_TRUE(std::isnan((*lp)[0]));
}

TEST(SelectedLogprobsTest, ErrorsNameTheField) {
  const std::vector<double> out = {1.0, 2.0, 3.0, 4.0};  // [1, 2, 1, 2]
  const DenseView view = View(out, {1, 2, 1, 2});
  const Tensor head = F32Tensor({3, 2}, {1, 0, 0, 1, 1, 1});
  const Tensor ids = I64Tensor({1, 2}, {0, 3});

  absl::StatusOr<std::vector<double>> lp =
      SelectedLogprobs(view, head, ids, nullptr, 1.0);
  ASSERT_FALSE(lp.ok());
  EXPECT_EQ(lp.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(StartsWith(lp.status(), "selected_token_ids[0][1]: token id 3"))
      << lp.status();

  const Tensor wide = F32Tensor({2, 3}, {1, 0, 0, 1, 1, 1});
  lp = SelectedLogprobs(view, wide, I64Tensor({1, 2}, {0, 1}), nullptr, 1.0);
  ASSERT_FALSE(lp.ok());
  EXPECT_TRUE(StartsWith(lp.status(), "lm_head:")) << lp.status();

  const Tensor truncated(DType::kF32, {3, 2}, std::string(20, '\0'));
  lp = SelectedLogprobs(view, truncated, I64Tensor({1, 2}, {0, 1}), nullptr,
                        1.0);
  ASSERT_FALSE(lp.ok());
  EXPECT_TRUE(StartsWith(lp.status(), "lm_head:")) << lp.status();

  lp = SelectedLogprobs(view, head, I64Tensor({2}, {0, 1}), nullptr, 1.0);
  ASSERT_FALSE(lp.ok());
  EXPECT_TRUE(StartsWith(lp.status(), "selected_token_ids:")) << lp.status();

  lp = SelectedLogprobs(view, head, I64Tensor({1, 2}, {0, 1}), nullptr, 0.0);
  ASSERT_FALSE(lp.ok());
  EXPECT_TRUE(StartsWith(lp.status(), "temperature:")) << lp.status();

  lp = SelectedLogprobs(View(out, {4}), head, I64Tensor({1, 2}, {0, 1}),
                        nullptr, 1.0);
  ASSERT_FALSE(lp.ok());
  EXPECT_TRUE(StartsWith(lp.status(), "out:")) << lp.status();
}

TEST(CompareLogprobsTest, HandComputedPair) {
  // d = lp_cand - lp_ref = (0.1, -0.2); log r = (-0.1, 0.2).
  const std::vector<double> cand = {-1.0, -2.2};
  const std::vector<double> ref = {-1.1, -2.0};
  const LogprobAgreement a =
      CompareLogprobs(View(cand, {1, 2}), View(ref, {1, 2}), nullptr);
  EXPECT_EQ(a.count, 2);
  EXPECT_NEAR(a.k1_kl, (0.1 - 0.2) / 2, 1e-15);
  EXPECT_NEAR(a.mean_abs_diff, 0.15, 1e-15);
  EXPECT_NEAR(a.max_abs_diff, 0.2, 1e-15);
  const double r1 = std::exp(-0.1), r2 = std::exp(0.2);
  EXPECT_NEAR(a.k3_kl, ((r1 - 1 + 0.1) + (r2 - 1 - 0.2)) / 2, 1e-15);
  EXPECT_NEAR(a.ratio_mean, (r1 + r2) / 2, 1e-15);
  EXPECT_NEAR(a.ratio_min, r1, 1e-15);
  EXPECT_NEAR(a.ratio_max, r2, 1e-15);
  EXPECT_NEAR(a.ratio_std, (r2 - r1) / 2, 1e-15);
}

TEST(CompareLogprobsTest, MatchesDirectFormulasInLongDouble) {
  std::mt19937_64 rng(7);
  std::normal_distribution<double> normal(0.0, 1.0);
  const int64_t b = 4, s = 50;
  std::vector<double> cand(b * s), ref(b * s);
  std::vector<uint8_t> mask(b * s);
  for (int64_t i = 0; i < b * s; ++i) {
    ref[i] = -std::fabs(normal(rng)) * 3;
    // Mix tiny (1e-7) and sizeable (0.3) differences: k3 must stay accurate
    // for both.
    cand[i] = ref[i] + normal(rng) * (i % 3 == 0 ? 0.3 : 1e-7);
    mask[i] = (i % 5) != 0;
  }
  cand[3] = std::numeric_limits<double>::quiet_NaN();  // skipped
  const LogprobAgreement a =
      CompareLogprobs(View(cand, {b, s}), View(ref, {b, s}), mask.data());

  long double k1 = 0, k3 = 0, sum_abs = 0, max_abs = 0, sum_r = 0,
              min_r = 1e30L, max_r = 0;
  std::vector<long double> ratios;
  for (int64_t i = 0; i < b * s; ++i) {
    if (!mask[i] || std::isnan(cand[i])) continue;
    const long double log_r = static_cast<long double>(ref[i]) - cand[i];
    const long double r = std::exp(log_r);
    k1 += -log_r;
    k3 += r - 1 - log_r;  // long double keeps the tiny terms
    sum_abs += std::fabs(log_r);
    max_abs = std::max(max_abs, std::fabs(log_r));
    sum_r += r;
    min_r = std::min(min_r, r);
    max_r = std::max(max_r, r);
    ratios.push_back(r);
  }
  const long double n = ratios.size();
  long double var = 0;
  for (long double r : ratios) var += (r - sum_r / n) * (r - sum_r / n);
  ASSERT_EQ(a.count, static_cast<int64_t>(ratios.size()));
  EXPECT_NEAR(a.k1_kl, static_cast<double>(k1 / n), 1e-15);
  EXPECT_NEAR(a.k3_kl, static_cast<double>(k3 / n), 1e-12 * (k3 / n));
  EXPECT_NEAR(a.mean_abs_diff, static_cast<double>(sum_abs / n), 1e-15);
  EXPECT_NEAR(a.max_abs_diff, static_cast<double>(max_abs), 1e-15);
  EXPECT_NEAR(a.ratio_mean, static_cast<double>(sum_r / n), 1e-14);
  EXPECT_NEAR(a.ratio_min, static_cast<double>(min_r), 1e-15);
  EXPECT_NEAR(a.ratio_max, static_cast<double>(max_r), 1e-14);
  EXPECT_NEAR(a.ratio_std, static_cast<double>(std::sqrt(var / n)), 1e-13);
  EXPECT_GE(a.k3_kl, 0.0);
}

TEST(CompareLogprobsTest, K3OfTinyDifferencesIsAccurate) {
  // log r = 1e-8 for every token: k3 = r - 1 - log r ~ x^2/2 = 5e-17; the
  // naive double formula would return 0 or garbage at this size.
  const std::vector<double> ref = {-1.0};
  const std::vector<double> cand = {-1.0 - 1e-8};
  const double x = ref[0] - cand[0];  // the representable log r
  const LogprobAgreement a =
      CompareLogprobs(View(cand, {1, 1}), View(ref, {1, 1}), nullptr);
  EXPECT_NEAR(a.k3_kl, x * x / 2 + x * x * x / 6, 1e-12 * x * x);
}

}  // namespace
}  // namespace attnaudit
