// FinitePairTerms (the SIMD terms of ComputeDrift) on every compiled SIMD
// target, against the element-by-element definition written here with
// dtype.h's general UlpDistance; and ComputeDrift's statistics, which must
// have the same bits on every target and as the definition's element-order
// sums.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/drift/drift.h"
#include "core/drift/pair_terms_internal.h"
#include "core/simd/targets.h"
#include "core/tensor/dtype.h"
#include "gtest/gtest.h"

namespace attnaudit {
namespace {

constexpr double kMax = std::numeric_limits<double>::max();

bool SameBits(double a, double b) { return std::memcmp(&a, &b, sizeof a) == 0; }

double Tiny(DType dtype) {
  return dtype == DType::kBF16
             ? std::ldexp(1.0, -126)
             : static_cast<double>(std::numeric_limits<float>::min());
}

// Values that stress each step: signed zeros, subnormal doubles, floats at
// and past FLT_MAX (the f32 rounding overflows), bf16 rounding ties of
// both parities, differences past DBL_MAX (the clamp), and noise.
std::vector<double> Adversarial(std::mt19937_64& rng, int n) {
  const double ties[] = {
      1.0 + std::ldexp(1.0, -8),      // bf16 tie, even neighbour below
      1.0 + 3 * std::ldexp(1.0, -8),  // bf16 tie, odd neighbour below
      -(1.0 + std::ldexp(1.0, -8)),
      static_cast<double>(std::numeric_limits<float>::max()),
      3.4028235677973366e38,  // halfway past FLT_MAX: rounds to inf
      1e39,
      -1e300,
      kMax,
      -kMax,
      0.0,
      -0.0,
      4.9e-324,
      -1e-310,
      std::ldexp(1.0, -126),
      std::ldexp(1.0, -149)};
  std::normal_distribution<double> normal(0.0, 1.0);
  std::uniform_int_distribution<int> pick(0, 3 * std::size(ties));
  std::vector<double> v(static_cast<size_t>(n));
  for (double& x : v) {
    const size_t k = static_cast<size_t>(pick(rng));
    x = k < std::size(ties) ? ties[k] : normal(rng);
  }
  return v;
}

// A baseline near c (a few ULPs of the dtype), equal, or unrelated.
std::vector<double> Near(std::mt19937_64& rng, const std::vector<double>& c) {
  std::uniform_int_distribution<int> kind(0, 4);
  std::normal_distribution<double> normal(0.0, 1.0);
  std::vector<double> r(c.size());
  for (size_t i = 0; i < c.size(); ++i) {
    switch (kind(rng)) {
      case 0:
        r[i] = c[i];
        break;
      case 1:
        r[i] = -c[i];
        break;
      case 2:
        r[i] = normal(rng);
        break;
      default:
        r[i] = c[i] * (1 + 1e-3 * normal(rng));
        if (!std::isfinite(r[i])) r[i] = c[i];  // c was near DBL_MAX
    }
  }
  return r;
}

TEST(FinitePairTermsTest, EveryTargetGivesTheDefinitionsBits) {
  std::mt19937_64 rng(7);
  for (int64_t target : CompiledSimdTargets()) {
    ForceSimdTargetForTest(target);
    for (DType dtype : {DType::kF32, DType::kBF16}) {
      for (int n : {1, 3, 7, 8, 9, 16, 31, 64, 257}) {
        const std::vector<double> c = Adversarial(rng, n);
        const std::vector<double> r = Near(rng, c);
        std::vector<double> ad(c.size()), ulps(c.size());
        double max_rel = 0.5;  // kept when every ratio is below it
        const std::string what = absl::StrCat(SimdTargetName(target), " ",
                                              DTypeName(dtype), " n=", n);
        ASSERT_TRUE(drift_internal::FinitePairTerms(
            c.data(), r.data(), n, dtype, Tiny(dtype), ad.data(), ulps.data(),
            &max_rel))
            << what;
        double want_rel = 0.5;
        for (int i = 0; i < n; ++i) {
          const double want_ad = std::min(std::fabs(c[i] - r[i]), kMax);
          want_rel = std::max(want_rel,
                              want_ad / std::max(std::fabs(r[i]), Tiny(dtype)));
          ASSERT_TRUE(SameBits(ad[i], want_ad)) << what << " i=" << i;
          ASSERT_EQ(ulps[i],
                    static_cast<double>(UlpDistance(c[i], r[i], dtype)))
              << what << " " << c[i] << " vs " << r[i];
        }
        EXPECT_TRUE(SameBits(max_rel, want_rel)) << what;
      }
    }
  }
  ForceSimdTargetForTest(0);
}

TEST(FinitePairTermsTest, ANonFiniteSideAnywhereWritesNothing) {
  const double bad[] = {std::numeric_limits<double>::quiet_NaN(),
                        std::numeric_limits<double>::infinity(),
                        -std::numeric_limits<double>::infinity()};
  for (int64_t target : CompiledSimdTargets()) {
    ForceSimdTargetForTest(target);
    for (int n : {1, 8, 13}) {
      for (int at = 0; at < n; ++at) {
        for (bool in_baseline : {false, true}) {
          std::vector<double> c(n, 1.0), r(n, 2.0);
          (in_baseline ? r : c)[at] = bad[at % 3];
          std::vector<double> ad(n, -7.0), ulps(n, -7.0);
          double max_rel = -7.0;
          EXPECT_FALSE(drift_internal::FinitePairTerms(
              c.data(), r.data(), n, DType::kF32, 1e-38, ad.data(), ulps.data(),
              &max_rel))
              << SimdTargetName(target) << " n=" << n << " at " << at;
          EXPECT_EQ(max_rel, -7.0);
          EXPECT_EQ(std::count(ad.begin(), ad.end(), -7.0), n);
          EXPECT_EQ(std::count(ulps.begin(), ulps.end(), -7.0), n);
        }
      }
    }
  }
  ForceSimdTargetForTest(0);
}

// The statistics' sums in element order, and the counts, as defined in
// docs/NUMERICS.md, for pairs without NaN/Inf.
struct Definition {
  int64_t count = 0, over = 0, worst = -1;
  double max_abs = 0, max_rel = 0, max_ulp = 0;
  double sum_abs = 0, sum_sq = 0, sum_ulp = 0;
};

Definition Define(const std::vector<double>& c, const std::vector<double>& r,
                  DType dtype, double tolerance) {
  Definition d;
  for (size_t i = 0; i < c.size(); ++i) {
    const double ad = std::min(std::fabs(c[i] - r[i]), kMax);
    ++d.count;
    d.sum_abs += ad;
    d.sum_sq += ad * ad;
    if (d.worst < 0 || ad > d.max_abs) {
      d.max_abs = ad;
      d.worst = static_cast<int64_t>(i);
    }
    d.over += ad > tolerance;
    if (ad > 0) {
      d.max_rel =
          std::max(d.max_rel, ad / std::max(std::fabs(r[i]), Tiny(dtype)));
      const double u = static_cast<double>(UlpDistance(c[i], r[i], dtype));
      d.max_ulp = std::max(d.max_ulp, u);
      d.sum_ulp += u;
    }
  }
  return d;
}

TEST(FinitePairTermsTest, ComputeDriftKeepsElementOrderOnEveryTarget) {
  std::mt19937_64 rng(3);
  std::normal_distribution<double> normal(0.0, 1.0);
  // 2 x 1 x 4 x 300: several 256-pair blocks and a tail; ties in |diff|
  // (repeated pairs) test that the first worst element wins.
  const std::vector<int64_t> shape = {2, 1, 4, 300};
  std::vector<double> c(2400), r(2400);
  for (size_t i = 0; i < c.size(); ++i) {
    r[i] = normal(rng);
    c[i] = i % 11 == 0 ? r[i] : r[i] + 1e-2 * normal(rng);
  }
  for (size_t i = 1000; i < 2400; i += 700) {
    c[i] = 5.0;
    r[i] = 1.0;
  }
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    const Definition want = Define(c, r, dtype, 1e-2);
    for (int64_t target : CompiledSimdTargets()) {
      ForceSimdTargetForTest(target);
      DriftOptions o;
      o.ulp_dtype = dtype;
      o.tolerance = 1e-2;
      absl::StatusOr<DriftStats> s =
          ComputeDrift({c.data(), shape}, {r.data(), shape}, o);
      ASSERT_TRUE(s.ok()) << s.status();
      const std::string what =
          absl::StrCat(SimdTargetName(target), " ", DTypeName(dtype));
      EXPECT_EQ(s->count, want.count) << what;
      EXPECT_EQ(s->over_tolerance, want.over) << what;
      EXPECT_EQ(s->max_abs, want.max_abs) << what;
      EXPECT_EQ(s->max_rel, want.max_rel) << what;
      EXPECT_EQ(s->max_ulp, want.max_ulp) << what;
      const double n = static_cast<double>(want.count);
      EXPECT_TRUE(SameBits(s->mean_abs, want.sum_abs / n)) << what;
      EXPECT_TRUE(SameBits(s->rms, std::sqrt(want.sum_sq / n))) << what;
      EXPECT_TRUE(SameBits(s->mean_ulp, want.sum_ulp / n)) << what;
      EXPECT_EQ(s->worst.dim, want.worst % 300) << what;
      EXPECT_EQ(s->worst.head, (want.worst / 300) % 4) << what;
      EXPECT_EQ(s->worst.batch, want.worst / 1200) << what;
    }
    ForceSimdTargetForTest(0);
  }
}

TEST(FinitePairTermsTest, WorstHeadsKeepsElementOrderOnEveryTarget) {
  // 3 rows x 5 heads x 70: rows with a NaN or an Inf take the scalar path,
  // the others the SIMD terms; both must give the definition's bits.
  std::mt19937_64 rng(9);
  std::normal_distribution<double> normal(0.0, 1.0);
  const int64_t rows = 3, heads = 5, dim = 70;
  std::vector<double> c(rows * heads * dim), r(c.size());
  for (size_t i = 0; i < c.size(); ++i) {
    r[i] = normal(rng);
    c[i] = i % 9 == 0 ? r[i] : r[i] + 1e-3 * normal(rng) * (1 + i % 5);
  }
  c[1 * dim + 3] = std::numeric_limits<double>::quiet_NaN();
  r[7 * dim + 69] = std::numeric_limits<double>::infinity();
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    std::vector<double> sum(heads, 0.0), max_abs(heads, 0.0),
        max_ulp(heads, 0.0);
    std::vector<int64_t> count(heads, 0);
    for (size_t i = 0; i < c.size(); ++i) {
      if (!std::isfinite(c[i]) || !std::isfinite(r[i])) continue;
      const size_t h = (i / dim) % heads;
      const double ad = std::fabs(c[i] - r[i]);
      sum[h] += ad;
      ++count[h];
      max_abs[h] = std::max(max_abs[h], ad);
      max_ulp[h] = std::max(
          max_ulp[h], static_cast<double>(UlpDistance(c[i], r[i], dtype)));
    }
    for (int64_t target : CompiledSimdTargets()) {
      ForceSimdTargetForTest(target);
      const std::vector<HeadSummary> got =
          WorstHeads({c.data(), {rows, 1, heads, dim}},
                     {r.data(), {rows, 1, heads, dim}}, dtype, heads);
      ASSERT_EQ(got.size(), static_cast<size_t>(heads));
      for (const HeadSummary& g : got) {
        const std::string what = absl::StrCat(
            SimdTargetName(target), " ", DTypeName(dtype), " head ", g.head);
        EXPECT_EQ(g.max_abs, max_abs[g.head]) << what;
        EXPECT_EQ(g.max_ulp, max_ulp[g.head]) << what;
        EXPECT_TRUE(SameBits(g.mean_abs, sum[g.head] / count[g.head])) << what;
      }
    }
    ForceSimdTargetForTest(0);
  }
}

}  // namespace
}  // namespace attnaudit
