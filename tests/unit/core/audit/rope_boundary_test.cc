// A pre-RoPE snapshot with the engine's RoPE table: a rotated q element
// whose fp32 value sits exactly on an f16 midpoint, which the engine (its
// libm a cos ulp away) stores one f16 ulp the other way. The engine's side
// is the long-double oracle on the engine's own rotated q (rotated here, in
// the test, as the engine would), not attnaudit's.
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "core/attention/attention.h"
#include "core/audit/audit.h"
#include "core/tensor/dtype.h"
#include "core/validate/validate.h"
#include "gtest/gtest.h"
#include "tests/unit/core/testing/attention_oracle.h"
#include "tests/unit/core/testing/snapshot_builder.h"

namespace attnaudit {
namespace testing {
namespace {

constexpr int64_t kD = 8;
constexpr int64_t kHalf = kD / 2;

std::vector<float> InvFreq() {
  std::vector<float> f(kHalf);
  for (int64_t i = 0; i < kHalf; ++i) {
    f[i] = static_cast<float>(std::pow(10000.0, -2.0 * i / kD));
  }
  return f;
}

// The engine's NeoX rotation of one head in fp32, narrowed to f16.
std::vector<double> EngineRotate(const double* x, int64_t position) {
  const std::vector<float> freq = InvFreq();
  std::vector<double> out(kD);
  for (int64_t i = 0; i < kHalf; ++i) {
    const float angle = static_cast<float>(position) * freq[i];
    const float c = std::cos(angle), s = std::sin(angle);
    const float x1 = static_cast<float>(x[i]),
                x2 = static_cast<float>(x[i + kHalf]);
    out[i] = RoundToDType(x1 * c - x2 * s, DType::kF16);
    out[i + kHalf] = RoundToDType(x2 * c + x1 * s, DType::kF16);
  }
  return out;
}

bool IsF16Midpoint(float y) {
  const float r = RoundToDType(y, DType::kF16);
  return r != y && RoundToDType(2.0f * y - r, DType::kF16) == 2.0f * y - r &&
         std::fabs(2.0f * y - r - r) > 0;
}

struct Planted {
  LogicalCase pre;            // what the snapshot carries (pre-RoPE q)
  std::vector<double> q_eng;  // the engine's rotated q
};

// B 1, Sq 2 (rows at the last two positions), Hq 2, Hkv 1, D 8, f16. Every
// key's dim `dim` is 4 so that a flip of q's dim `dim` moves every score of
// its row alike: the LSE moves by the whole flip, out not at all.
Planted Build(bool plant, uint64_t seed = 7) {
  RandomCaseOptions o;
  o.batch = 1;
  o.queries = 2;
  o.q_heads = 2;
  o.kv_heads = 1;
  o.head_dim = kD;
  o.seq_lens = {40};
  o.q_dtype = o.kv_dtype = DType::kF16;
  o.seed = seed;
  LogicalCase c = RandomCase(o);
  c.output_dtype = DType::kF16;
  c.rope.q_state = RopeState::kPreRope;
  c.rope.k_state = RopeState::kPostRope;
  c.rope.style = RopeStyle::kNeox;
  c.rope.theta = 10000;
  c.rope.rotary_dim = kD;
  const int64_t pos0 = c.query_positions[0];
  int64_t planted_pair = -1;
  if (plant) {
    // Row 0, head 0: x1 an f16 in [4, 8) and x2 a small f16 whose fp32
    // rotation x1 c - x2 s lands on an f16 midpoint of [2, 8) (ours rounds
    // to even).
    const std::vector<float> freq = InvFreq();
    bool found = false;
    for (int64_t i = 0; i < kHalf && !found; ++i) {
      const float cs = std::cos(static_cast<float>(pos0) * freq[i]);
      const float sn = std::sin(static_cast<float>(pos0) * freq[i]);
      // The f16 values of [4, 8): 2^-8 apart.
      for (int k = 0; k < 1024 * 64 && !found; ++k) {
        const float x1 = 4.0f + static_cast<float>(k % 1024) / 256.0f;
        const float x2 = static_cast<float>(k / 1024 - 32) / 64.0f;
        const float y = x1 * cs - x2 * sn;
        if (IsF16Midpoint(y) && std::fabs(y) > 2.0f) {
          for (auto& key : c.k) {
            for (int64_t j = 0; j < static_cast<int64_t>(key.size()) / kD;
                 ++j) {
              key[j * kD + i] = 4.0;
            }
          }
          c.q[i] = x1;
          c.q[i + kHalf] = x2;
          planted_pair = i;
          found = true;
        }
      }
    }
    EXPECT_TRUE(found);
  }
  Planted p{c, {}};
  for (int64_t row = 0; row < 2 * 2; ++row) {
    const std::vector<double> r =
        EngineRotate(&c.q[row * kD], c.query_positions[row / 2]);
    p.q_eng.insert(p.q_eng.end(), r.begin(), r.end());
  }
  if (planted_pair >= 0) {
    // The engine's libm puts it on the other side: the other neighbour.
    const int64_t i = planted_pair;
    const float angle = static_cast<float>(pos0) * InvFreq()[i];
    const float y = static_cast<float>(c.q[i]) * std::cos(angle) -
                    static_cast<float>(c.q[i + kHalf]) * std::sin(angle);
    const double ours = p.q_eng[i];
    p.q_eng[i] = 2.0 * static_cast<double>(y) - ours;
    EXPECT_NE(p.q_eng[i], ours);
  }
  return p;
}

// The snapshot: pre-RoPE q, the engine's inv_freq, a declared engine, and
// the engine's out (f16) and LSE (fp32) from the oracle on `q_eng`.
Snapshot WithEngine(const Planted& p) {
  PagingOptions paging;
  paging.page_size = 16;
  Snapshot s = BuildSnapshot(p.pre, paging);
  const std::vector<float> freq = InvFreq();
  s.rope_table.inv_freq = MakeFloatTensor(
      DType::kF32, {kHalf}, std::vector<double>(freq.begin(), freq.end()));
  s.precision.profile = EngineProfile::kFlashDecoding;
  LogicalCase post = p.pre;
  post.rope.q_state = RopeState::kPostRope;
  post.q = p.q_eng;
  const OracleResult o = OracleAttention(post);
  std::vector<double> out(o.out.begin(), o.out.end());
  RoundTo(&out, DType::kF16);
  std::vector<double> lse(o.lse_declared.size());
  for (size_t i = 0; i < lse.size(); ++i) {
    lse[i] = static_cast<float>(o.lse_declared[i]);
  }
  s.engine.out = MakeFloatTensor(DType::kF16, {1, 2, 2, kD}, out);
  s.engine.lse = MakeFloatTensor(DType::kF32, {1, 2, 2}, lse);
  return s;
}

AuditReport MustAudit(const Snapshot& s) {
  absl::StatusOr<AuditReport> r = RunAudit(s, AuditOptions{});
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? *std::move(r) : AuditReport{};
}

bool Says(const AuditReport& r, const std::string& needle) {
  for (const std::string& line : r.provenance.sensitivity) {
    if (line.find(needle) != std::string::npos) return true;
  }
  return false;
}

TEST(RopeBoundaryTest, AFlipAtAnF16MidpointPassesOnItsRowsWidenedTolerance) {
  const AuditReport r = MustAudit(WithEngine(Build(true)));
  const ComparisonResult* er = r.Find(Comparison::kEngineVsReference);
  ASSERT_NE(er, nullptr);
  // The flip moves row 0 head 0's LSE past the snapshot-wide tolerance:
  // the scalar alone (the old behaviour) drifts.
  EXPECT_GT(er->lse.max_abs, er->lse.tolerance);
  EXPECT_EQ(er->lse.over_tolerance, 0);
  EXPECT_EQ(er->verdict, Verdict::kPass);
  EXPECT_EQ(r.verdict, Verdict::kPass);
  EXPECT_TRUE(Says(r, "lie at a rounding boundary of f16"));
}

TEST(RopeBoundaryTest, AStalePositionOnTheOtherRowStillDrifts) {
  Planted p = Build(true);
  // Row 1 (both heads) rotated one position late by the engine.
  for (int64_t h = 0; h < 2; ++h) {
    const int64_t row = 2 + h;
    const std::vector<double> late =
        EngineRotate(&p.pre.q[row * kD], p.pre.query_positions[1] + 1);
    for (int64_t i = 0; i < kD; ++i) p.q_eng[row * kD + i] = late[i];
  }
  const AuditReport r = MustAudit(WithEngine(p));
  EXPECT_EQ(r.verdict, Verdict::kDrift);
}

TEST(RopeBoundaryTest, NoAmbiguousElementKeepsTheScalarTolerances) {
  // The first draw whose 32 rotated q elements are all clear of an f16
  // boundary (about one in a hundred elements is not).
  Snapshot s;
  bool clear = false;
  for (uint64_t seed = 1; seed <= 50 && !clear; ++seed) {
    s = WithEngine(Build(false, seed));
    absl::StatusOr<ResolvedLayout> layout = ValidateSnapshot(s);
    ASSERT_TRUE(layout.ok()) << layout.status();
    absl::StatusOr<PreparedAttention> prepared =
        PrepareAttention(s, *layout, 1);
    ASSERT_TRUE(prepared.ok()) << prepared.status();
    EXPECT_EQ(prepared->rope_score_uncertainty, 0.0);
    clear =
        prepared->slack_cells.empty() && prepared->ambiguous_q_elements == 0;
  }
  ASSERT_TRUE(clear);
  const AuditReport r = MustAudit(s);
  const ComparisonResult* er = r.Find(Comparison::kEngineVsReference);
  ASSERT_NE(er, nullptr);
  EXPECT_EQ(er->lse.over_tolerance, 0);
  EXPECT_EQ(r.verdict, Verdict::kPass);
  EXPECT_FALSE(Says(r, "rounding boundary"));
}

}  // namespace
}  // namespace testing
}  // namespace attnaudit
