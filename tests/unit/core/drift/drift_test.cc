// ComputeDrift and WorstHeads against hand-computed cases and a naive
// long-double recomputation.
#include "core/drift/drift.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace attnaudit {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

DenseView View(const std::vector<double>& v, std::vector<int64_t> shape) {
  DenseView view;
  view.values = v.data();
  view.shape = std::move(shape);
  return view;
}

DriftStats MustDrift(const std::vector<double>& cand,
                     const std::vector<double>& base,
                     const std::vector<int64_t>& shape,
                     const DriftOptions& options = {}) {
  absl::StatusOr<DriftStats> stats =
      ComputeDrift(View(cand, shape), View(base, shape), options);
  EXPECT_TRUE(stats.ok()) << stats.status();
  return stats.ok() ? *stats : DriftStats{};
}

// The next bf16 value above x (x a positive bf16 value): bit pattern + 1,
// built here from the IEEE layout rather than through dtype.h.
double NextBf16Up(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, 4);
  bits += 1u << 16;
  float y;
  std::memcpy(&y, &bits, 4);
  return y;
}

TEST(ComputeDriftTest, HandComputedMoments) {
  // diffs 3, -4, 0, 1: max 4, mean 2, rms sqrt((9+16+0+1)/4) = sqrt(6.5).
  const std::vector<double> base = {1, 10, 5, -2};
  const std::vector<double> cand = {4, 6, 5, -1};
  DriftOptions opt;
  opt.tolerance = 1.0;  // 3 and 4 exceed it; 1 does not (strict >)
  const DriftStats s = MustDrift(cand, base, {4}, opt);
  EXPECT_EQ(s.count, 4);
  EXPECT_EQ(s.max_abs, 4.0);
  EXPECT_EQ(s.mean_abs, 2.0);
  EXPECT_DOUBLE_EQ(s.rms, std::sqrt(6.5));
  // |diff|/|base|: 3, 0.4, 0, 0.5
  EXPECT_DOUBLE_EQ(s.max_rel, 3.0);
  EXPECT_EQ(s.over_tolerance, 2);
  EXPECT_EQ(s.tolerance, 1.0);
  EXPECT_EQ(s.worst.batch, 1);
  EXPECT_EQ(s.worst.query, -1);
  EXPECT_EQ(s.worst_candidate, 6.0);
  EXPECT_EQ(s.worst_baseline, 10.0);
  EXPECT_EQ(s.nonfinite_mismatch, 0);
}

TEST(ComputeDriftTest, MaxRelUsesSmallestNormalOfUlpDtypeForZeroBaseline) {
  const std::vector<double> base = {0.0};
  const std::vector<double> cand = {0.5};
  DriftOptions opt;
  opt.ulp_dtype = DType::kF16;  // smallest normal 2^-14
  EXPECT_DOUBLE_EQ(MustDrift(cand, base, {1}, opt).max_rel, 0.5 * 16384.0);
  opt.ulp_dtype = DType::kF32;  // 2^-126
  EXPECT_DOUBLE_EQ(MustDrift(cand, base, {1}, opt).max_rel,
                   std::ldexp(0.5, 126));
}

TEST(ComputeDriftTest, Bf16NeighboursAreOneUlpApart) {
  DriftOptions opt;
  opt.ulp_dtype = DType::kBF16;
  // 1 and 1 + 2^-7 are adjacent bf16 values; 1 + 2^-6 is two steps away.
  const std::vector<double> base = {1.0, 1.0, 3.0, -0.25};
  const std::vector<double> cand = {1.0 + 1.0 / 128, 1.0 + 1.0 / 64,
                                    NextBf16Up(3.0f), -0.25};
  const DriftStats s = MustDrift(cand, base, {4}, opt);
  EXPECT_EQ(s.max_ulp, 2.0);
  EXPECT_DOUBLE_EQ(s.mean_ulp, (1.0 + 2.0 + 1.0 + 0.0) / 4);
  EXPECT_EQ(s.ulp_dtype, DType::kBF16);
}

TEST(ComputeDriftTest, UlpDistanceCountsAcrossZero) {
  DriftOptions opt;
  opt.ulp_dtype = DType::kBF16;
  const double tiny = std::ldexp(1.0, -133);  // smallest bf16 subnormal
  const DriftStats s = MustDrift({tiny}, {-tiny}, {1}, opt);
  EXPECT_EQ(s.max_ulp, 2.0);  // -tiny -> 0 -> +tiny
}

TEST(ComputeDriftTest, UlpOfValuesBelowTheUlpDtypeResolutionIsZero) {
  DriftOptions opt;
  opt.ulp_dtype = DType::kBF16;
  // 1 + 2^-10 rounds to 1 in bf16: a nonzero diff of zero bf16 ULPs.
  const DriftStats s = MustDrift({1.0 + 1.0 / 1024}, {1.0}, {1}, opt);
  EXPECT_EQ(s.max_ulp, 0.0);
  EXPECT_DOUBLE_EQ(s.max_abs, 1.0 / 1024);
}

TEST(ComputeDriftTest, UlpAgreesWithUlpDistanceForEveryFloatingDtype) {
  // ComputeDrift inlines the f32/bf16/f64 encodings; they must give what
  // dtype.h's UlpDistance gives, including across zero, for subnormals and
  // for doubles that round twice on the way to bf16.
  std::mt19937_64 rng(3);
  std::uniform_real_distribution<double> mantissa(1.0, 2.0);
  std::uniform_int_distribution<int> exponent(-140, 12);
  std::uniform_int_distribution<int> coin(0, 3);
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF16, DType::kF64,
                   DType::kF8E4M3, DType::kF8E5M2}) {
    DriftOptions opt;
    opt.ulp_dtype = dt;
    for (int i = 0; i < 3000; ++i) {
      const double a =
          (coin(rng) ? 1 : -1) * std::ldexp(mantissa(rng), exponent(rng));
      double b;
      switch (coin(rng)) {
        case 0:
          b = -a;
          break;
        case 1:
          b = a * (1 + 1e-3 * (mantissa(rng) - 1.5));
          break;
        case 2:
          b = std::nextafter(a, 0.0);
          break;
        default:
          b = (coin(rng) ? 1 : -1) * std::ldexp(mantissa(rng), exponent(rng));
      }
      const DriftStats s = MustDrift({a}, {b}, {1}, opt);
      ASSERT_EQ(s.max_ulp, static_cast<double>(UlpDistance(a, b, dt)))
          << DTypeName(dt) << " a=" << a << " b=" << b;
    }
  }
}

TEST(ComputeDriftTest, ExactNearestRankP99) {
  // |diff| = 1..1000 in a scrambled order: rank ceil(0.99 * 1000) = 990.
  std::vector<double> base(1000, 0.0);
  std::vector<double> cand(1000);
  for (int i = 0; i < 1000; ++i) cand[i] = ((i * 337) % 1000) + 1;
  EXPECT_EQ(MustDrift(cand, base, {1000}).p99_abs, 990.0);
  // 101 values: ceil(99.99) = 100, the second largest.
  std::vector<double> base2(101, 0.0);
  std::vector<double> cand2(101);
  for (int i = 0; i < 101; ++i) cand2[i] = -(i + 1.0);
  EXPECT_EQ(MustDrift(cand2, base2, {101}).p99_abs, 100.0);
  // One value: it is its own p99.
  EXPECT_EQ(MustDrift({2.5}, {0.0}, {1}).p99_abs, 2.5);
}

TEST(ComputeDriftTest, P99HasNoSizeLimit) {
  // 2^24 + 3 elements (torch.quantile's limit is 2^24); |diff| = i % 1000.
  const int64_t n = (int64_t{1} << 24) + 3;
  std::vector<double> base(n, 0.0);
  std::vector<double> cand(n);
  for (int64_t i = 0; i < n; ++i) cand[i] = static_cast<double>(i % 1000);
  const DriftStats s = MustDrift(cand, base, {n});
  // n = 16777219 = 16777 * 1000 + 219: values 0..218 occur 16778 times,
  // 219..999 occur 16777 times. The rank is ceil(0.99 n) = 16609447; values
  // up to 988 fill 219 * 16778 + 770 * 16777 = 16592672 slots and up to 989
  // fill 16609449, so the rank-th smallest is 989.
  const int64_t rank = (99 * n + 99) / 100;
  ASSERT_EQ(rank, 16609447);
  EXPECT_EQ(s.p99_abs, 989.0);
  EXPECT_EQ(s.count, n);
}

TEST(ComputeDriftTest, P99IsTheOrderStatisticForAnySpreadOfDiffs) {
  // The selection narrows by digits of the |diff| bit patterns; spreads
  // that put the rank in an empty, a crowded or the only bucket, with zeros,
  // subnormals, DBL_MAX (the clamp) and ties, against a full sort.
  const double max = std::numeric_limits<double>::max();
  std::mt19937_64 rng(5);
  std::uniform_int_distribution<int> exponent(-1074, 1023);
  std::uniform_int_distribution<int> pick(0, 9);
  auto sorted_rank = [](std::vector<double> d) {
    std::sort(d.begin(), d.end());
    return d[(99 * d.size() + 99) / 100 - 1];
  };
  for (int n : {1, 2, 5, 99, 100, 101, 1000, 1024, 1025, 4097}) {
    for (int spread = 0; spread < 4; ++spread) {
      std::vector<double> cand(n), base(n, 0.0), diffs(n);
      for (int i = 0; i < n; ++i) {
        switch (spread) {
          case 0:  // all equal
            cand[i] = 0.75;
            break;
          case 1:  // mostly zero, a few large
            cand[i] = pick(rng) == 0 ? 3.0 + i : 0.0;
            break;
          case 2:  // one binade, one mantissa prefix: the last nth_element
            cand[i] = 1.0 + std::ldexp(static_cast<double>(i % 37), -45);
            break;
          default:  // every binade, subnormals and the clamp
            cand[i] = pick(rng) == 0 ? max : std::ldexp(1.0, exponent(rng));
            if (i % 3 == 0) base[i] = -cand[i];  // |diff| > DBL_MAX: clamped
        }
        diffs[i] = std::min(std::fabs(cand[i] - base[i]), max);
      }
      EXPECT_EQ(MustDrift(cand, base, {n}).p99_abs, sorted_rank(diffs))
          << "n=" << n << " spread " << spread;
    }
  }
}

TEST(ComputeDriftTest, WorstLocationDecodesShapeAndPrefersFirstOnTies) {
  const std::vector<int64_t> shape = {2, 3, 4, 5};
  std::vector<double> base(120, 0.0);
  std::vector<double> cand(120, 0.0);
  // (1,2,3,4) is flat 119; a tie at (0,1,2,3) = 20+10+3 = 33 comes first.
  cand[119] = -7.0;
  cand[33] = 7.0;
  DriftStats s = MustDrift(cand, base, shape);
  EXPECT_EQ(s.worst.batch, 0);
  EXPECT_EQ(s.worst.query, 1);
  EXPECT_EQ(s.worst.head, 2);
  EXPECT_EQ(s.worst.dim, 3);
  cand[33] = 6.0;
  s = MustDrift(cand, base, shape);
  EXPECT_EQ(s.worst.batch, 1);
  EXPECT_EQ(s.worst.query, 2);
  EXPECT_EQ(s.worst.head, 3);
  EXPECT_EQ(s.worst.dim, 4);
  EXPECT_EQ(s.worst_candidate, -7.0);

  // lse [B,Sq,Hq]: d = -1.  flat 23 = (1,2,3).
  std::vector<double> lse_c(24, 0.0), lse_b(24, 0.0);
  lse_c[23] = 1.0;
  s = MustDrift(lse_c, lse_b, {2, 3, 4});
  EXPECT_EQ(s.worst.batch, 1);
  EXPECT_EQ(s.worst.query, 2);
  EXPECT_EQ(s.worst.head, 3);
  EXPECT_EQ(s.worst.dim, -1);

  // log-probs [B,Sq]: h = d = -1.
  s = MustDrift({0, 0, 0, 0, 3, 0}, {0, 0, 0, 0, 0, 0}, {2, 3});
  EXPECT_EQ(s.worst.batch, 1);
  EXPECT_EQ(s.worst.query, 1);
  EXPECT_EQ(s.worst.head, -1);
  EXPECT_EQ(s.worst.dim, -1);
}

TEST(ComputeDriftTest, CandidateNaNWhereBaselineFiniteIsVisibleNotAveraged) {
  const std::vector<int64_t> shape = {1, 1, 2, 2};
  const std::vector<double> base = {1, 2, 3, 4};
  const std::vector<double> cand = {1, 2.5, kNaN, 4};
  const DriftStats s = MustDrift(cand, base, shape);
  EXPECT_EQ(s.candidate_nan, 1);
  EXPECT_EQ(s.baseline_nan, 0);
  EXPECT_EQ(s.nonfinite_mismatch, 1);
  EXPECT_EQ(s.first_nonfinite_mismatch.head, 1);
  EXPECT_EQ(s.first_nonfinite_mismatch.dim, 0);
  EXPECT_EQ(s.count, 3);
  EXPECT_EQ(s.max_abs, 0.5);
  EXPECT_DOUBLE_EQ(s.mean_abs, 0.5 / 3);
  EXPECT_FALSE(std::isnan(s.rms));
}

TEST(ComputeDriftTest, InfinityRules) {
  // equal +inf: diff 0, counted; +inf vs finite, -inf vs +inf: mismatches;
  // NaN vs NaN: agree, not counted as a value.
  const std::vector<double> base = {kInf, 1.0, kInf, kNaN, -kInf, 5.0};
  const std::vector<double> cand = {kInf, kInf, -kInf, kNaN, 3.0, 5.0};
  const DriftStats s = MustDrift(cand, base, {6});
  EXPECT_EQ(s.count, 2);  // the equal infinities and the 5.0 pair
  EXPECT_EQ(s.max_abs, 0.0);
  EXPECT_EQ(s.nonfinite_mismatch, 3);
  EXPECT_EQ(s.first_nonfinite_mismatch.batch, 1);
  EXPECT_EQ(s.candidate_inf, 3);
  EXPECT_EQ(s.baseline_inf, 3);
  EXPECT_EQ(s.candidate_nan, 1);
  EXPECT_EQ(s.baseline_nan, 1);
  EXPECT_EQ(s.max_ulp, 0.0);
}

TEST(ComputeDriftTest, MaskSelectsBatchQueryGroups) {
  // [B=2, Sq=2, H=1, D=2]; mask keeps (0,1) and (1,0).
  const std::vector<int64_t> shape = {2, 2, 1, 2};
  const std::vector<double> base(8, 0.0);
  const std::vector<double> cand = {100, 100, 1, 2, 3, 4, kNaN, 100};
  const uint8_t mask[4] = {0, 1, 1, 0};
  DriftOptions opt;
  opt.active_mask = mask;
  opt.tolerance = 2.5;
  const DriftStats s = MustDrift(cand, base, shape, opt);
  EXPECT_EQ(s.count, 4);
  EXPECT_EQ(s.max_abs, 4.0);
  EXPECT_DOUBLE_EQ(s.mean_abs, 2.5);
  EXPECT_EQ(s.over_tolerance, 2);
  EXPECT_EQ(s.candidate_nan, 0);  // the NaN sits in an inactive group
  EXPECT_EQ(s.nonfinite_mismatch, 0);
  EXPECT_EQ(s.worst.batch, 1);
  EXPECT_EQ(s.worst.query, 0);
  EXPECT_EQ(s.worst.dim, 1);

  // Log-probs [B, Sq] use the same mask one element per group.
  const uint8_t none[4] = {0, 0, 0, 0};
  opt.active_mask = none;
  const DriftStats empty = MustDrift({1, 2, 3, 4}, {0, 0, 0, 0}, {2, 2}, opt);
  EXPECT_EQ(empty.count, 0);
  EXPECT_EQ(empty.max_abs, 0.0);
  EXPECT_EQ(empty.worst.batch, -1);
}

TEST(ComputeDriftTest, RejectsMismatchedShapesAndNullValues) {
  const std::vector<double> a = {1, 2, 3, 4};
  absl::StatusOr<DriftStats> s =
      ComputeDrift(View(a, {2, 2}), View(a, {4}), DriftOptions{});
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.status().message().rfind("candidate: shape [2,2]", 0), 0u)
      << s.status();

  DenseView null_view;
  null_view.shape = {4};
  s = ComputeDrift(null_view, View(a, {4}), DriftOptions{});
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().message().rfind("candidate:", 0), 0u) << s.status();

  s = ComputeDrift(View(a, {1, 1, 1, 2, 2}), View(a, {1, 1, 1, 2, 2}),
                   DriftOptions{});
  EXPECT_FALSE(s.ok());
}

// Independent ordered index of a float: sign-magnitude bits mapped to a
// monotone integer (the oracle for f32 ULP distances).
int64_t OrderedF32(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  const int64_t mag = bits & 0x7fffffffu;
  return (bits >> 31) ? -mag : mag;
}

TEST(ComputeDriftTest, MatchesLongDoubleRecomputationOnRandomData) {
  std::mt19937_64 rng(42);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const std::vector<int64_t> shape = {3, 2, 8, 64};
  const int64_t n = 3 * 2 * 8 * 64;
  std::vector<double> base(n), cand(n);
  for (int64_t i = 0; i < n; ++i) {
    const float b = normal(rng) * 3.0f;
    // Candidates near the baseline, a few exactly equal, a few far.
    float c = b + normal(rng) * 1e-3f;
    if (i % 17 == 0) c = b;
    if (i % 211 == 0) c = b + normal(rng);
    base[i] = b;
    cand[i] = c;
  }
  const uint8_t mask[6] = {1, 0, 1, 1, 1, 0};
  DriftOptions opt;
  opt.ulp_dtype = DType::kF32;
  opt.tolerance = 2e-3;
  opt.active_mask = mask;
  const DriftStats s = MustDrift(cand, base, shape, opt);

  long double sum = 0, sum_sq = 0, sum_ulp = 0, max_abs = 0, max_rel = 0,
              max_ulp = 0;
  int64_t count = 0, over = 0, worst = -1;
  std::vector<double> diffs;
  const int64_t inner = 8 * 64;
  for (int64_t i = 0; i < n; ++i) {
    if (!mask[i / inner]) continue;
    const long double d = std::fabs(static_cast<long double>(cand[i]) -
                                    static_cast<long double>(base[i]));
    ++count;
    sum += d;
    sum_sq += d * d;
    if (worst < 0 || d > max_abs) {
      max_abs = d;
      worst = i;
    }
    const long double denom =
        std::max<long double>(std::fabs(base[i]), std::ldexp(1.0L, -126));
    max_rel = std::max(max_rel, d / denom);
    const long double ulp = std::llabs(OrderedF32(static_cast<float>(cand[i])) -
                                       OrderedF32(static_cast<float>(base[i])));
    max_ulp = std::max(max_ulp, ulp);
    sum_ulp += ulp;
    over += d > 2e-3L;
    diffs.push_back(static_cast<double>(d));
  }
  std::sort(diffs.begin(), diffs.end());
  const size_t rank = static_cast<size_t>(std::ceil(0.99L * count));
  EXPECT_EQ(s.count, count);
  EXPECT_EQ(s.over_tolerance, over);
  EXPECT_EQ(s.max_abs, static_cast<double>(max_abs));
  EXPECT_NEAR(s.mean_abs, static_cast<double>(sum / count),
              1e-12 * static_cast<double>(sum / count));
  EXPECT_NEAR(s.rms, static_cast<double>(std::sqrt(sum_sq / count)),
              1e-12 * s.rms);
  EXPECT_NEAR(s.max_rel, static_cast<double>(max_rel), 1e-12 * s.max_rel);
  EXPECT_EQ(s.max_ulp, static_cast<double>(max_ulp));
  EXPECT_NEAR(s.mean_ulp, static_cast<double>(sum_ulp / count),
              1e-9 * s.mean_ulp);
  EXPECT_EQ(s.p99_abs, diffs[rank - 1]);
  EXPECT_EQ(s.worst.batch, worst / (2 * inner));
  EXPECT_EQ(s.worst.query, (worst / inner) % 2);
  EXPECT_EQ(s.worst.head, (worst / 64) % 8);
  EXPECT_EQ(s.worst.dim, worst % 64);
}

TEST(WorstHeadsTest, RanksHeadsByMaxAbs) {
  // [1, 1, 4, 2]: head maxima 0.1, 0.5, 0.9, 0.5 (head 1 and 3 tie).
  const std::vector<int64_t> shape = {1, 1, 4, 2};
  const std::vector<double> base(8, 1.0);
  const std::vector<double> cand = {1.1, 1.0, 1.5, 1.25, 1.9, 1.0, 1.0, 0.5};
  const std::vector<HeadSummary> heads =
      WorstHeads(View(cand, shape), View(base, shape), DType::kF32, 3);
  ASSERT_EQ(heads.size(), 3u);
  EXPECT_EQ(heads[0].head, 2);
  EXPECT_NEAR(heads[0].max_abs, 0.9, 1e-15);
  EXPECT_NEAR(heads[0].mean_abs, 0.45, 1e-15);
  EXPECT_EQ(heads[1].head, 1);  // tie with head 3: lower index first
  EXPECT_NEAR(heads[1].mean_abs, 0.375, 1e-15);
  EXPECT_EQ(heads[2].head, 3);
  EXPECT_NEAR(heads[2].mean_abs, 0.25, 1e-15);
  // 1.0 -> 1.5 in f32: 0.5 / 2^-23 steps.
  EXPECT_EQ(heads[1].max_ulp, 0.5 * 8388608.0);

  EXPECT_TRUE(
      WorstHeads(View(cand, shape), View(base, shape), DType::kF32, 0).empty());
  EXPECT_TRUE(
      WorstHeads(View(cand, {8}), View(base, {8}), DType::kF32, 2).empty());
  EXPECT_EQ(
      WorstHeads(View(cand, shape), View(base, shape), DType::kF32, 10).size(),
      4u);
}

}  // namespace
}  // namespace attnaudit
