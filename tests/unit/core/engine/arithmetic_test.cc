// Engine precision profiles (core/engine/arithmetic.h): what each profile
// resolves to; the score-error bound behind EngineScoreError against
// perturbed long-double softmaxes; and an engine that rounds its scores to
// bf16 (Hugging Face eager) audited with and without its declaration.
#include "core/engine/arithmetic.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "core/audit/audit.h"
#include "core/verdict/verdict.h"
#include "gtest/gtest.h"
#include "tests/unit/core/testing/attention_oracle.h"
#include "tests/unit/core/testing/snapshot_builder.h"

namespace attnaudit {
namespace {

const double kEpsF32 = std::ldexp(1.0, -23);
const double kEpsBf16 = std::ldexp(1.0, -7);

TEST(PrecisionTest, ProfilesResolveToTheirKernelsArithmetic) {
  EnginePrecision p;
  p.profile = EngineProfile::kHfEager;
  EngineArithmetic a =
      ResolveEngineArithmetic(p, DType::kBF16, DType::kBF16, 128);
  EXPECT_EQ(a.score_epsilon, kEpsBf16);  // two bf16 roundings of the score
  EXPECT_EQ(a.probability_epsilon, kEpsBf16);
  p.profile = EngineProfile::kFlashDecoding;
  a = ResolveEngineArithmetic(p, DType::kBF16, DType::kBF16, 128);
  EXPECT_EQ(a.score_epsilon, 8 * kEpsF32);  // log2(128) + 1 fp32 roundings
  EXPECT_EQ(a.exp_epsilon, 2 * kEpsF32);
  p.profile = EngineProfile::kTorchFlashCpu;
  a = ResolveEngineArithmetic(p, DType::kF32, DType::kF32, 64);
  EXPECT_EQ(a.exp_epsilon, 20 * kEpsF32);
  EXPECT_EQ(a.probability_epsilon, kEpsF32);
  // Undeclared: the widest envelope -- scores rounded twice to the model
  // dtype, either way (a whole ulp each), the loosest exp, probabilities in
  // the model dtype, output and RoPE of either rounding.
  a = ResolveEngineArithmetic({}, DType::kBF16, DType::kBF16, 64);
  EXPECT_EQ(a.profile, EngineProfile::kUnspecified);
  EXPECT_TRUE(a.undeclared);
  EXPECT_EQ(a.exp_epsilon, 20 * kEpsF32);
  EXPECT_EQ(a.probability_epsilon, kEpsBf16);
  EXPECT_EQ(a.score_epsilon, 2 * kEpsBf16);
  EXPECT_EQ(a.output_rounding, ResolvedRounding::kEither);
  EXPECT_EQ(a.rope_rounding, ResolvedRounding::kEither);
  // Explicit fields replace the profile's.
  p.profile = EngineProfile::kCustom;
  p.score_dtype = DType::kF16;
  p.exp_ulps = 7;
  p.split_keys = 64;
  a = ResolveEngineArithmetic(p, DType::kF32, DType::kF32, 64);
  EXPECT_EQ(a.score_epsilon, std::ldexp(1.0, -10));
  EXPECT_EQ(a.exp_epsilon, 7 * kEpsF32);
  EXPECT_EQ(a.split_keys, 64);
  EXPECT_EQ(EngineProfileName(EngineProfile::kVllmCpu), "vllm-cpu");
}

// The LSE of scores each moved by up to eps |s_j| (every sign pattern's
// worst: all up or all down) stays within EngineScoreError, whose bound is
// sum_j p_j |s_j| <= max|lse| + ln L.
TEST(PrecisionTest, ScoreErrorBoundsTheLseOfPerturbedScores) {
  testing::TestRng rng(5);
  for (int trial = 0; trial < 300; ++trial) {
    const int64_t L = rng.UniformInt(1, 2000);
    const double spread = rng.Uniform(0.1, 12.0);
    const double shift = rng.Uniform(-30.0, 30.0);
    std::vector<long double> s(static_cast<size_t>(L));
    for (long double& x : s) x = shift + spread * rng.Normal();
    auto lse = [&](long double factor_up, long double factor_down) {
      long double m = -INFINITY;
      std::vector<long double> y(s.size());
      for (size_t j = 0; j < s.size(); ++j) {
        y[j] = s[j] * (s[j] > 0 ? factor_up : factor_down);
        m = std::max(m, y[j]);
      }
      long double sum = 0;
      for (long double x : y) sum += std::exp(x - m);
      return m + std::log(sum);
    };
    const long double exact = lse(1, 1);
    ToleranceInputs in;
    in.max_context = L;
    in.max_abs_lse_reference = static_cast<double>(std::fabs(exact));
    in.engine.score_epsilon = kEpsBf16;
    const double bound = EngineScoreError(in);
    const long double eps = kEpsBf16;
    for (const auto& [up, down] :
         {std::pair<long double, long double>{1 + eps, 1 - eps},
          {1 - eps, 1 + eps}}) {
      EXPECT_LE(std::fabs(static_cast<double>(lse(up, down) - exact)), bound)
          << "L=" << L << " spread=" << spread << " shift=" << shift;
    }
  }
}

// Hugging Face eager attention in bf16, emulated: q.k^T written as bf16,
// times the scale in bf16, softmax in fp32, probabilities cast to bf16,
// P.V accumulated in fp32, the output cast to bf16.
std::vector<double> HfEager(const testing::LogicalCase& c) {
  std::vector<double> out(
      static_cast<size_t>(c.batch * c.queries * c.q_heads * c.head_dim));
  const int64_t D = c.head_dim, group = c.q_heads / c.kv_heads;
  auto bf16 = [](double x) {
    return static_cast<double>(
        RoundToDType(static_cast<float>(x), DType::kBF16));
  };
  for (int64_t b = 0; b < c.batch; ++b) {
    for (int64_t q = 0; q < c.queries; ++q) {
      for (int64_t h = 0; h < c.q_heads; ++h) {
        const int64_t g = h / group, L = c.SeqLen(b);
        const double* qv = &c.q[((b * c.queries + q) * c.q_heads + h) * D];
        std::vector<float> score(static_cast<size_t>(L));
        float m = -INFINITY;
        for (int64_t t = 0; t < L; ++t) {
          double dot = 0;
          for (int64_t i = 0; i < D; ++i) {
            dot += qv[i] * c.k[b][(t * c.kv_heads + g) * D + i];
          }
          score[t] =
              static_cast<float>(bf16(bf16(dot) * bf16(c.EffectiveScale())));
          m = std::max(m, score[t]);
        }
        float sum = 0;
        for (float& x : score) sum += (x = std::exp(x - m));
        for (int64_t i = 0; i < D; ++i) {
          float acc = 0;
          for (int64_t t = 0; t < L; ++t) {
            acc += static_cast<float>(bf16(score[t] / sum)) *
                   static_cast<float>(c.v[b][(t * c.kv_heads + g) * D + i]);
          }
          out[((b * c.queries + q) * c.q_heads + h) * D + i] = bf16(acc);
        }
      }
    }
  }
  return out;
}

TEST(PrecisionTest, BF16ScoresPassWhenDeclaredAndAreFlaggedWhenNot) {
  int flagged = 0;
  for (uint64_t seed = 1; seed <= 6; ++seed) {
    testing::RandomCaseOptions o;
    o.batch = 2;
    o.q_heads = 4;
    o.kv_heads = 2;
    o.head_dim = 64;
    o.seq_lens = {90, 140};
    o.q_dtype = DType::kBF16;
    o.kv_dtype = DType::kBF16;
    o.q_std = 1.5;
    o.seed = seed;
    testing::LogicalCase c = testing::RandomCase(o);
    c.output_dtype = DType::kBF16;
    testing::PagingOptions paging;
    paging.page_size = 16;
    paging.permute_pages = true;
    Snapshot s = testing::BuildSnapshot(c, paging);
    s.engine.out = testing::MakeFloatTensor(
        DType::kBF16, {c.batch, c.queries, c.q_heads, c.head_dim}, HfEager(c));
    AuditOptions options;
    options.threads = 1;
    options.diagnose = false;
    s.precision.profile = EngineProfile::kHfEager;
    const AuditReport declared = RunAudit(s, options).value();
    EXPECT_EQ(declared.verdict, Verdict::kPass) << "seed " << seed;
    EXPECT_EQ(declared.provenance.engine_profile, "hf-eager");
    s.precision.profile = EngineProfile::kFlashDecoding;
    const AuditReport undeclared = RunAudit(s, options).value();
    flagged += undeclared.verdict == Verdict::kDrift ? 1 : 0;
  }
  // The reason the profile exists: bf16 scores are noise a flash-decoding
  // kernel does not make.
  EXPECT_GT(flagged, 0);
}

// Declared roundings: a truncated score rounding costs a whole ulp; a
// truncated output and truncated probabilities lean towards zero, known.
TEST(PrecisionTest, RoundingsResolveToTheirErrorsAndLean) {
  EnginePrecision p;
  p.profile = EngineProfile::kHfEager;
  p.score_rounding = Rounding::kTowardZero;
  p.probability_rounding = Rounding::kTowardZero;
  p.output_rounding = Rounding::kTowardZero;
  EngineArithmetic a =
      ResolveEngineArithmetic(p, DType::kBF16, DType::kBF16, 128);
  EXPECT_EQ(a.score_epsilon, 2 * kEpsBf16);
  EXPECT_EQ(a.output_rounding, ResolvedRounding::kTowardZero);
  EXPECT_EQ(a.rope_rounding, ResolvedRounding::kNearestEven);
  OutputLean lean = ExpectedOutputLean(a);
  EXPECT_EQ(lean.ulps, 0.5);
  EXPECT_EQ(lean.relative, 0.5 * kEpsBf16);
  EXPECT_TRUE(lean.known);
  // A declared profile without roundings rounds to nearest: no lean.
  EnginePrecision vllm;
  vllm.profile = EngineProfile::kVllmCpu;
  lean = ExpectedOutputLean(
      ResolveEngineArithmetic(vllm, DType::kBF16, DType::kBF16, 128));
  EXPECT_EQ(lean.ulps, 0.0);
  EXPECT_EQ(lean.relative, 0.0);
  // Undeclared: a quarter ulp each way, unknown.
  lean = ExpectedOutputLean(
      ResolveEngineArithmetic({}, DType::kBF16, DType::kBF16, 128));
  EXPECT_EQ(lean.ulps, 0.25);
  EXPECT_FALSE(lean.known);
}

TEST(PrecisionTest, OnlyFieldsPastEveryProfileAreOverrides) {
  EnginePrecision p;
  p.profile = EngineProfile::kCustom;
  p.exp_ulps = 20;
  p.score_dtype = DType::kBF16;
  EXPECT_TRUE(PrecisionOverrides(p).empty());
  p.exp_ulps = 21;
  p.probability_dtype = DType::kF8E5M2;
  const std::vector<std::string> lines = PrecisionOverrides(p);
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(lines[0], "precision.exp_ulps 21 (profiles: at most 20)");
  EXPECT_EQ(lines[1],
            "precision.probability_dtype fp8_e5m2 (profiles: 16 bits or "
            "wider)");
}

TEST(PrecisionTest, TheSourceIsNamed) {
  EnginePrecision p;
  EXPECT_EQ(PrecisionSourceName(p), "undeclared");
  p.output_rounding = Rounding::kTowardZero;
  EXPECT_EQ(PrecisionSourceName(p), "declared");
  p.source = PrecisionSource::kPreset;
  EXPECT_EQ(PrecisionSourceName(p), "preset");
  p.source = PrecisionSource::kMeasured;
  EXPECT_EQ(PrecisionSourceName(p), "measured");
}

}  // namespace
}  // namespace attnaudit
