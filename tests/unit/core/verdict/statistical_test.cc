// The statistical detector (core/verdict/statistical.h) on synthetic
// differences whose distribution the test controls: a plain bf16 rounding
// of exact values is clean; more rounding noise, a coherent shift and
// rounding towards zero fire, in the group where they happen.
#include "core/verdict/statistical.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/tensor/dtype.h"
#include "gtest/gtest.h"
#include "tests/unit/core/testing/snapshot_builder.h"

namespace attnaudit {
namespace {

using testing::TestRng;

struct Data {
  int64_t batch = 8, queries = 1, heads = 16, dim = 128;
  std::vector<double> reference;  // R, exact
  std::vector<double> engine;     // E, bf16 values
  int64_t size() const { return batch * queries * heads * dim; }
};

// R ~ N(0, 1); E = R rounded to bf16 (round to nearest even): what a
// correct engine with an exact fp32 result writes.
Data CleanBf16(uint64_t seed) {
  Data d;
  TestRng rng(seed);
  for (int64_t i = 0; i < d.size(); ++i) {
    d.reference.push_back(rng.Normal());
    d.engine.push_back(
        RoundToDType(static_cast<float>(d.reference.back()), DType::kBF16));
  }
  return d;
}

StatisticalResult Detect(const Data& d) {
  StatisticalInputs in;
  in.output_dtype = DType::kBF16;
  in.kv_dtype = DType::kBF16;
  in.max_context = 4096;
  in.max_merged_blocks = 256;
  return RunStatisticalTest(d.engine.data(), d.reference.data(),
                            d.reference.data(), d.batch, d.queries, d.heads,
                            d.dim, in);
}

const StatisticalGroup* Scope(const StatisticalResult& r, const char* scope) {
  for (const StatisticalGroup& g : r.worst) {
    if (g.scope == scope) return &g;
  }
  return nullptr;
}

TEST(NoiseUnitTest, IsTheUlpOfTheMagnitudeFlooredByTheRow) {
  const double eps = std::ldexp(1.0, -7);
  // 1.5 lies in [1, 2): bf16 spacing 2^-7.
  EXPECT_EQ(NoiseUnit(1.5, 0.0, eps, DType::kBF16), eps);
  EXPECT_EQ(NoiseUnit(-0.3, 0.0, eps, DType::kBF16), std::ldexp(eps, -2));
  // A near-zero element takes half the row's rms as its magnitude.
  EXPECT_EQ(NoiseUnit(1e-9, 2.0, eps, DType::kBF16), eps);
  // Never below the output dtype's smallest normal.
  EXPECT_GT(NoiseUnit(0.0, 0.0, eps, DType::kBF16), 0.0);
}

TEST(NoiseUnitTest, IsEpsilonTimesTheBinadeStartForEveryMagnitude) {
  // The definition, with frexp/ldexp: m = f 2^e, f in [0.5, 1), unit =
  // eps 2^(e-1); the implementation reads the exponent field instead.
  for (double eps : {std::ldexp(1.0, -7), std::ldexp(1.0, -23) * 3.7, 5.0}) {
    for (int k = -1074; k <= 1023; k += 7) {
      for (double f : {1.0, 1.5, 1.9999999}) {
        const double x = std::ldexp(f, k);
        for (DType dt : {DType::kBF16, DType::kF16, DType::kF64}) {
          const double smallest = dt == DType::kF16   ? std::ldexp(1.0, -14)
                                  : dt == DType::kF64 ? std::ldexp(1.0, -1022)
                                                      : std::ldexp(1.0, -126);
          const double m = std::max({std::fabs(x), 0.5 * 0.25, smallest});
          int e = 0;
          std::frexp(m, &e);
          const double want = std::ldexp(eps, e - 1);
          EXPECT_EQ(NoiseUnit(-x, 0.25, eps, dt), want)
              << "x=" << x << " eps=" << eps << " " << DTypeName(dt);
          const double m0 = std::max(std::fabs(x), smallest);
          std::frexp(m0, &e);
          EXPECT_EQ(NoiseUnit(x, 0.0, eps, dt), std::ldexp(eps, e - 1))
              << "x=" << x << " eps=" << eps << " " << DTypeName(dt);
        }
      }
    }
  }
}

TEST(BernsteinLimitTest, ShrinksWithTheSampleAndGrowsWithConfidence) {
  const double a = BernsteinLimit(0.1, 0.1, 1.0, 100, 1e-6);
  const double b = BernsteinLimit(0.1, 0.1, 1.0, 10000, 1e-6);
  const double c = BernsteinLimit(0.1, 0.1, 1.0, 10000, 1e-9);
  EXPECT_GT(a, b);
  EXPECT_GT(c, b);
  EXPECT_GT(b, 0.1);
  // n -> infinity: the mean itself.
  EXPECT_NEAR(BernsteinLimit(0.1, 0.1, 1.0, int64_t{1} << 40, 1e-6), 0.1, 1e-4);
}

TEST(StatisticalTest, PlainRoundingIsClean) {
  for (uint64_t seed : {1, 2, 3, 4, 5}) {
    const StatisticalResult r = Detect(CleanBf16(seed));
    ASSERT_TRUE(r.computed);
    EXPECT_EQ(r.fired_groups, 0) << seed;
    EXPECT_EQ(r.groups, 1 + 8 + 16);
    // z of a round-to-nearest is within half a unit: mean z^2 <= 1/12
    // (less for elements whose unit is floored by the row).
    const StatisticalGroup* all = Scope(r, "all");
    ASSERT_NE(all, nullptr);
    EXPECT_LT(all->rms, std::sqrt(1.0 / 12.0) + 0.01);
    EXPECT_GT(all->rms, 0.1);
    EXPECT_LT(std::fabs(all->mean), 0.05);
  }
}

TEST(StatisticalTest, MoreRoundingNoiseFiresTheRmsTest) {
  // An intermediate rounded to bf16 a dozen times on the way (a bf16
  // running output): every element carries ~3.5 roundings' worth of noise.
  Data d = CleanBf16(7);
  TestRng rng(8);
  for (int64_t i = 0; i < d.size(); ++i) {
    float x = static_cast<float>(d.reference[i]);
    for (int step = 0; step < 12; ++step) {
      // Rescaled and rescaled back, in bf16 both times.
      const float w = 1.0f + 0.25f * static_cast<float>(rng.Uniform(0, 1));
      x = RoundToDType(RoundToDType(x * w, DType::kBF16) / w, DType::kBF16);
    }
    d.engine[i] = x;
  }
  const StatisticalResult r = Detect(d);
  EXPECT_GT(r.fired_groups, 0);
  const StatisticalGroup* all = Scope(r, "all");
  ASSERT_NE(all, nullptr);
  EXPECT_TRUE(all->fired);
  EXPECT_GT(all->rms, all->rms_limit);
}

TEST(StatisticalTest, RoundingTowardsZeroFiresTheBiasTest) {
  // Truncation instead of round-to-nearest: every element loses up to one
  // unit in magnitude, below the tolerance's two ULPs everywhere.
  Data d = CleanBf16(9);
  for (int64_t i = 0; i < d.size(); ++i) {
    const float x = static_cast<float>(d.reference[i]);
    uint32_t bits = FloatToBits(x) & 0xffff0000u;  // bf16 by truncation
    d.engine[i] = BitsToFloat(bits);
  }
  const StatisticalResult r = Detect(d);
  const StatisticalGroup* all = Scope(r, "all");
  ASSERT_NE(all, nullptr);
  EXPECT_TRUE(all->fired);
  EXPECT_LT(all->bias, -all->mean_limit);
}

// The same truncating engine declared as such (the lean added back: half
// an ulp), or of unknown rounding (a quarter added back, as much again
// allowed): clean; the lean itself is no excuse for rounding noise.
TEST(StatisticalTest, ADeclaredOrUnknownTruncationIsClean) {
  Data d = CleanBf16(9);
  for (int64_t i = 0; i < d.size(); ++i) {
    d.engine[i] = RoundTowardZeroToDType(static_cast<float>(d.reference[i]),
                                         DType::kBF16);
  }
  StatisticalInputs in;
  in.output_dtype = DType::kBF16;
  in.kv_dtype = DType::kBF16;
  in.max_context = 4096;
  in.max_merged_blocks = 256;
  auto detect = [&](const StatisticalInputs& inputs) {
    return RunStatisticalTest(d.engine.data(), d.reference.data(),
                              d.reference.data(), d.batch, d.queries, d.heads,
                              d.dim, inputs);
  };
  EXPECT_GT(detect(in).fired_groups, 0);  // assumed to round to nearest
  StatisticalInputs truncating = in;
  truncating.shrink_ulps = 0.5;
  EXPECT_EQ(detect(truncating).fired_groups, 0);
  StatisticalInputs either = in;
  either.shrink_ulps = 0.25;
  either.shrink_known = false;
  EXPECT_EQ(detect(either).fired_groups, 0);
  // A round-to-nearest engine is clean under "either" too.
  Data nearest = CleanBf16(9);
  EXPECT_EQ(RunStatisticalTest(nearest.engine.data(), nearest.reference.data(),
                               nearest.reference.data(), d.batch, d.queries,
                               d.heads, d.dim, either)
                .fired_groups,
            0);
  // Twice the noise of a rounding still fires under "either".
  TestRng rng(10);
  for (int64_t i = 0; i < d.size(); ++i) {
    const double ulp = std::ldexp(1.0, std::ilogb(d.reference[i]) - 7);
    d.engine[i] += 2.0 * ulp * (rng.Uniform(0, 1) - 0.5) * 2.0;
  }
  EXPECT_GT(detect(either).fired_groups, 0);
}

TEST(StatisticalTest, ADriftConfinedToOneRowFiresThatRow) {
  // Row 2 (b=2) off by 3 units rms; the rest clean.
  Data d = CleanBf16(11);
  TestRng rng(12);
  const int64_t per_row = d.heads * d.dim;
  for (int64_t i = 2 * per_row; i < 3 * per_row; ++i) {
    const double u =
        NoiseUnit(d.reference[i], 0.0, std::ldexp(1.0, -7), DType::kBF16);
    d.engine[i] = d.reference[i] + 3.0 * u * rng.Normal();
  }
  const StatisticalResult r = Detect(d);
  const StatisticalGroup* row = Scope(r, "row");
  ASSERT_NE(row, nullptr);
  EXPECT_TRUE(row->fired);
  EXPECT_EQ(row->where.batch, 2);
  EXPECT_EQ(row->where.query, 0);
}

TEST(StatisticalTest, NonFiniteElementsAreLeftOut) {
  Data d = CleanBf16(13);
  d.engine[5] = std::nan("");
  d.engine[6] = INFINITY;
  const StatisticalResult r = Detect(d);
  ASSERT_TRUE(r.computed);
  EXPECT_EQ(r.fired_groups, 0);
  const StatisticalGroup* all = Scope(r, "all");
  ASSERT_NE(all, nullptr);
  EXPECT_EQ(all->count, d.size() - 2);
}

// The "all" group's figures, element by element in storage order: cell
// sums (z^2, z, z * sign) in element order, each cell's mean z and mean
// z * sign added cell by cell. The detector works on several heads' cells
// side by side; it must give these bits for any head count.
struct AllGroup {
  int64_t count = 0;
  double rms = 0, mean = 0, bias = 0;
};

AllGroup NaiveAllGroup(const Data& d, double epsilon) {
  int64_t n = 0, cells = 0;
  double z2 = 0, z_cells = 0, zs_cells = 0;
  for (int64_t cell = 0; cell < d.size() / d.dim; ++cell) {
    const int64_t base = cell * d.dim;
    double ss = 0;
    for (int64_t i = base; i < base + d.dim; ++i) {
      if (std::isfinite(d.reference[i])) ss += d.reference[i] * d.reference[i];
    }
    const double row_rms = std::sqrt(ss / static_cast<double>(d.dim));
    int64_t cn = 0;
    double cz2 = 0, cz = 0, czs = 0;
    for (int64_t i = base; i < base + d.dim; ++i) {
      const double diff = d.engine[i] - d.reference[i];
      if (!std::isfinite(diff) || !std::isfinite(d.reference[i])) continue;
      const double z =
          diff / NoiseUnit(d.reference[i], row_rms, epsilon, DType::kBF16);
      ++cn;
      cz2 += z * z;
      cz += z;
      czs += z * (d.reference[i] < 0 ? -1.0 : 1.0);
    }
    if (cn == 0) continue;
    n += cn;
    z2 += cz2;
    ++cells;
    z_cells += cz / static_cast<double>(cn);
    zs_cells += czs / static_cast<double>(cn);
  }
  AllGroup g;
  g.count = n;
  g.rms = std::sqrt(z2 / static_cast<double>(n));
  g.mean = z_cells / static_cast<double>(cells);
  g.bias = zs_cells / static_cast<double>(cells);
  return g;
}

TEST(StatisticalTest, FiguresAreTheElementOrderSumsForAnyHeadCount) {
  for (int64_t heads : {1, 3, 4, 5, 8, 11}) {
    Data d = CleanBf16(100 + static_cast<uint64_t>(heads));
    d.batch = 3;
    d.heads = heads;
    d.dim = 72;
    d.reference.resize(static_cast<size_t>(d.size()));
    d.engine.resize(static_cast<size_t>(d.size()));
    TestRng rng(7 + static_cast<uint64_t>(heads));
    for (int64_t i = 0; i < d.size(); ++i) {
      // Noisier than a rounding, so the sums carry many bits.
      d.engine[i] = d.reference[i] * (1.0 + 0.01 * rng.Normal());
    }
    d.engine[3] = std::nan("");
    d.reference[d.size() - 2] = INFINITY;
    const StatisticalResult r = Detect(d);
    const StatisticalGroup* all = Scope(r, "all");
    ASSERT_NE(all, nullptr) << heads << " heads";
    const AllGroup want = NaiveAllGroup(d, r.noise_epsilon);
    EXPECT_EQ(all->count, want.count) << heads << " heads";
    EXPECT_EQ(all->rms, want.rms) << heads << " heads";
    EXPECT_EQ(all->mean, want.mean) << heads << " heads";
    EXPECT_EQ(all->bias, want.bias) << heads << " heads";
  }
}

TEST(StatisticalNoiseTest, EpsilonFollowsTheDtypesAndTheFp8Scores) {
  StatisticalInputs in;
  in.output_dtype = DType::kBF16;
  in.kv_dtype = DType::kBF16;
  EXPECT_EQ(StatisticalNoise(in).epsilon, std::ldexp(1.0, -7));
  in.output_dtype = in.kv_dtype = DType::kF16;
  EXPECT_EQ(StatisticalNoise(in).epsilon, std::ldexp(1.0, -10));
  // fp8 KV: scores of magnitude Lambda move with the dequant rounding.
  in.output_dtype = DType::kBF16;
  in.kv_dtype = DType::kF8E4M3;
  in.max_abs_lse_reference = 40;
  EXPECT_GT(StatisticalNoise(in).epsilon, 4 * std::ldexp(1.0, -7));
  // f32: fp32 accumulation over the context.
  in.output_dtype = in.kv_dtype = DType::kF32;
  in.max_context = 1 << 16;
  EXPECT_GE(StatisticalNoise(in).epsilon, 256 * std::ldexp(1.0, -23));
  // E-P carries both sides' noise.
  in.comparison = Comparison::kEngineVsReplay;
  const double ep = StatisticalNoise(in).mean_square;
  in.comparison = Comparison::kEngineVsReference;
  EXPECT_GT(ep, StatisticalNoise(in).mean_square);
}

}  // namespace
}  // namespace attnaudit
