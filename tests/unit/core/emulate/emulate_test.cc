// The emulated engine (core/emulate) against an engine written here in
// fp32 the way Hugging Face's eager attention runs on a CPU (bf16 q.k^T by
// a sequential fp32 sum, rounded; the scaling and a soft-cap's three steps
// rounded again; softmax in fp32 cast to bf16; P.V summed in fp32 and
// written in bf16): clean, it passes E-M; with the bugs that pass the
// 16-bit-score E-R worst case (a soft-cap dropped, Gemma-3's scale taken as
// 1/sqrt(D)), E-M drifts.
#include "core/emulate/emulate.h"

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "core/audit/audit.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/core/testing/snapshot_builder.h"

namespace attnaudit {
namespace testing {
namespace {

using ::testing::HasSubstr;

float Bf16(float x) { return RoundToDType(x, DType::kBF16); }

// How the test's engine computes, and which bug it has.
struct EagerEngine {
  float scale = 0;    // the scale the engine uses
  float softcap = 0;  // the soft-cap it applies (0: none)
};

// One query head of one row: the engine's bf16 output over the row's keys
// (every key visible: a decode query at the row's last position).
void EagerHead(const LogicalCase& c, const EagerEngine& eng, int64_t b,
               int64_t h, std::vector<double>* out) {
  const int64_t D = c.head_dim, L = c.SeqLen(b);
  const int64_t g = h / (c.q_heads / c.kv_heads);
  const double* q = &c.q[(b * c.q_heads + h) * D];
  std::vector<float> scores(static_cast<size_t>(L));
  for (int64_t j = 0; j < L; ++j) {
    const double* k = &c.k[b][(j * c.kv_heads + g) * D];
    float dot = 0;
    for (int64_t i = 0; i < D; ++i) {
      dot += static_cast<float>(q[i]) * static_cast<float>(k[i]);
    }
    float s = Bf16(Bf16(dot) * eng.scale);
    if (eng.softcap > 0) {
      s = Bf16(s / eng.softcap);
      s = Bf16(std::tanh(s));
      s = Bf16(s * eng.softcap);
    }
    scores[j] = s;
  }
  float m = scores[0];
  for (float s : scores) m = std::max(m, s);
  float total = 0;
  for (float& s : scores) {
    s = std::exp(s - m);
    total += s;
  }
  std::vector<float> acc(static_cast<size_t>(D), 0.0f);
  for (int64_t j = 0; j < L; ++j) {
    const float p = Bf16(scores[j] / total);
    const double* v = &c.v[b][(j * c.kv_heads + g) * D];
    for (int64_t i = 0; i < D; ++i) acc[i] += p * static_cast<float>(v[i]);
  }
  for (int64_t i = 0; i < D; ++i) {
    (*out)[(b * c.q_heads + h) * D + i] = Bf16(acc[i]);
  }
}

// A Gemma-like decode batch: bf16, 16 query heads over 4 KV heads, D 128,
// soft-cap 50, q scaled so the logits reach the cap's bend.
LogicalCase GemmaLike(uint64_t seed) {
  RandomCaseOptions o;
  o.batch = 4;
  o.queries = 1;
  o.q_heads = 16;
  o.kv_heads = 4;
  o.head_dim = 128;
  o.seq_lens = {300, 417, 129, 520};
  o.q_dtype = o.kv_dtype = DType::kBF16;
  o.q_std = 4.0;
  o.seed = seed;
  LogicalCase c = RandomCase(o);
  c.output_dtype = DType::kBF16;
  c.softcap = 50.0;
  c.softmax_scale = 1.0 / std::sqrt(144.0);  // query_pre_attn_scalar 144
  return c;
}

Snapshot WithEagerEngine(const LogicalCase& c, const EagerEngine& eng) {
  std::vector<double> out(c.q.size());
  for (int64_t b = 0; b < c.batch; ++b) {
    for (int64_t h = 0; h < c.q_heads; ++h) EagerHead(c, eng, b, h, &out);
  }
  PagingOptions paging;
  paging.page_size = 16;
  paging.permute_pages = true;
  Snapshot s = BuildSnapshot(c, paging);
  s.engine.out = MakeFloatTensor(
      DType::kBF16, {c.batch, c.queries, c.q_heads, c.head_dim}, out);
  s.precision.profile = EngineProfile::kHfEager;
  return s;
}

AuditReport MustAudit(const Snapshot& s) {
  absl::StatusOr<AuditReport> r = RunAudit(s, AuditOptions{});
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? *std::move(r) : AuditReport{};
}

const EagerEngine kClean{static_cast<float>(1.0 / 12.0), 50.0f};

TEST(EmulateTest, ACleanEagerEnginePassesItsEmulation) {
  for (uint64_t seed : {1, 2, 3}) {
    const LogicalCase c = GemmaLike(seed);
    const AuditReport r = MustAudit(WithEagerEngine(c, kClean));
    const ComparisonResult* em = r.Find(Comparison::kEngineVsEmulation);
    ASSERT_NE(em, nullptr) << seed;
    EXPECT_EQ(em->verdict, Verdict::kPass) << seed;
    for (const std::string& reason : em->reasons) ADD_FAILURE() << reason;
    EXPECT_EQ(r.verdict, Verdict::kPass) << seed;
    // Tight: a few bf16 ulps of the output, far below E-R's worst case.
    const ComparisonResult* er = r.Find(Comparison::kEngineVsReference);
    ASSERT_NE(er, nullptr);
    EXPECT_LT(em->out.tolerance, er->out.tolerance / 10) << seed;
  }
}

TEST(EmulateTest, BugsUnderTheScoresWorstCaseDriftAgainstTheEmulation) {
  struct Bug {
    const char* name;
    const char* hypothesis;
    EagerEngine engine;
  };
  const Bug bugs[] = {
      {"softcap-missing",
       "softcap-missing",
       {static_cast<float>(1.0 / 12.0), 0.0f}},
      {"scale 1/sqrt(128) for 1/sqrt(144)",
       "wrong-scale",
       {static_cast<float>(1.0 / std::sqrt(128.0)), 50.0f}},
  };
  for (const Bug& bug : bugs) {
    const LogicalCase c = GemmaLike(4);
    const AuditReport r = MustAudit(WithEagerEngine(c, bug.engine));
    const ComparisonResult* em = r.Find(Comparison::kEngineVsEmulation);
    ASSERT_NE(em, nullptr) << bug.name;
    EXPECT_EQ(em->verdict, Verdict::kDrift) << bug.name;
    EXPECT_EQ(r.verdict, Verdict::kDrift) << bug.name;
    EXPECT_GT(em->out.over_tolerance, 0) << bug.name;
    // Only E-M drifted: the diagnosis scores its hypotheses against
    // E - M + R; the bug leads, and nothing else claims to explain.
    const ComparisonResult* er = r.Find(Comparison::kEngineVsReference);
    ASSERT_NE(er, nullptr);
    EXPECT_NE(er->verdict, Verdict::kDrift) << bug.name;
    EXPECT_THAT(r.diagnosis_run.note,
                HasSubstr("scored against the emulated engine"))
        << bug.name;
    for (const Diagnosis& d : r.diagnoses) {
      if (d.explains) {
        EXPECT_EQ(d.hypothesis, bug.hypothesis) << bug.name;
      }
    }
    ASSERT_FALSE(r.diagnoses.empty()) << bug.name;
    EXPECT_EQ(r.diagnoses[0].hypothesis, bug.hypothesis) << bug.name;
  }
}

// One row, one head, built so that a correct engine's heavy probability
// lands on the other side of a bf16 rounding boundary than M's: key B's
// exact q.k lies 4.5 * 2^-23 above the bf16 tie 4.515625, which an fp32
// sum of its terms in order loses (each small term is under half an fp32
// ulp of the running sum), so the engine's score is 4.5 and M's 4.53125.
// That moves the normaliser by p_B (1 - e^-1/32) = 2.3e-4 relative, and key
// A's probability, 0.68547 exactly with M's scores, 1.1e-4 relative below
// the bf16 midpoint 0.685546875, crosses it: the engine writes P_A = 0.6875,
// M 0.68359375, and the output moves by that bf16 ulp times |v_A| = 1.
// (The seed-81 Gemma-3 draw of the conformance sweep: a key of weight 0.006
// flipping, a probability of 0.59 crossing.) The engine is the test's
// honest fp32 one; the numbers were found by searching scores and filler
// counts with it.
LogicalCase FlipAcrossAProbabilityBoundary() {
  LogicalCase c;
  c.head_dim = 8;
  c.q_dtype = c.kv_dtype = c.output_dtype = DType::kBF16;
  c.softmax_scale = 1.0;
  const int64_t kFillers = 9;
  const int64_t L = 2 + kFillers;
  c.q = {1, 1, 1, 1, 1, 0, 0, 0};
  const double tiny = 1.5 * std::ldexp(1.0, -23);
  std::vector<std::vector<double>> k = {{9.0625, 0, 0, 0, 0, 0, 0, 0},
                                        {4.5, 0.015625, tiny, tiny, tiny}};
  // out[0] = P_A - 2.23 * sum(P_F): small, so that the move is many of its
  // ulps; out[1] = sum(P) ~ 1, the snapshot's scale for E-R.
  std::vector<std::vector<double>> v = {{1.0, 1.0}, {0.0, 1.0}};
  for (int64_t j = 0; j < kFillers; ++j) {
    k.push_back({6.0625});
    v.push_back({-2.234375, 1.0});
  }
  c.k.assign(1, {});
  c.v.assign(1, {});
  for (int64_t j = 0; j < L; ++j) {
    k[j].resize(8, 0.0);
    v[j].resize(8, 0.0);
    c.k[0].insert(c.k[0].end(), k[j].begin(), k[j].end());
    c.v[0].insert(c.v[0].end(), v[j].begin(), v[j].end());
  }
  c.positions.assign(1, {});
  for (int64_t j = 0; j < L; ++j) c.positions[0].push_back(j);
  c.query_positions = {L - 1};
  return c;
}

TEST(EmulateTest, AFlippedScoreMovingAnotherProbabilityAcrossARounding) {
  const LogicalCase c = FlipAcrossAProbabilityBoundary();
  const EagerEngine engine{1.0f, 0.0f};
  // The premise, from the engine alone: its P_A is 0.6875, where the exact
  // softmax of M's scores (B at 4.53125) rounds to 0.68359375.
  std::vector<double> out(c.q.size());
  EagerHead(c, engine, 0, 0, &out);
  double z = 0;
  for (double s : {9.0625, 4.53125}) z += std::exp(s - 9.0625);
  z += 9 * std::exp(6.0625 - 9.0625);
  ASSERT_EQ(Bf16(static_cast<float>(1.0 / z)), 0.68359375f);
  const double moved = 0.6875 - 0.68359375;

  const Snapshot s = WithEagerEngine(c, engine);
  const AuditReport r = MustAudit(s);
  const ComparisonResult* em = r.Find(Comparison::kEngineVsEmulation);
  ASSERT_NE(em, nullptr);
  EXPECT_GE(em->out.max_abs, moved / 2);
  EXPECT_EQ(em->out.over_tolerance, 0);
  EXPECT_EQ(em->verdict, Verdict::kPass);
  for (const std::string& reason : em->reasons) ADD_FAILURE() << reason;
  EXPECT_EQ(r.verdict, Verdict::kPass);
  for (const ComparisonResult& cr : r.comparisons) {
    for (const std::string& reason : cr.reasons) ADD_FAILURE() << reason;
  }
}

// Undeclared roundings or no 16-bit scores: no emulation.
TEST(EmulateTest, PlansOnlyForDeclaredSixteenBitScores) {
  EngineArithmetic a;
  a.score_dtype = DType::kF32;
  PreparedAttention p;
  EXPECT_FALSE(PlanEmulation(p, a).run);
  EXPECT_TRUE(PlanEmulation(p, a).skipped.empty());
  a.score_dtype = DType::kBF16;
  a.undeclared = true;
  EXPECT_FALSE(PlanEmulation(p, a).run);
  EXPECT_FALSE(PlanEmulation(p, a).skipped.empty());
  a.undeclared = false;
  p.v_dtype = DType::kBF16;
  p.output_dtype = DType::kBF16;
  a.profile = EngineProfile::kHfEager;
  const EmulationPlan plan = PlanEmulation(p, a);
  EXPECT_TRUE(plan.run);
  EXPECT_EQ(plan.score_dtype, DType::kBF16);
  EXPECT_FALSE(plan.center_scores);
}

}  // namespace
}  // namespace testing
}  // namespace attnaudit
