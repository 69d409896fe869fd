// The RoPE checks (core/rope_check): an engine whose rotation follows the
// declared RoPE passes the rolling check under each cast point; an engine
// with a RoPE bug (position, rotation count, style, theta, scaling, rotary
// width) drifts and the diagnosis names the bug; the engine's table is
// checked against the model's definition; fp8 caches are requantised; and
// the audit pipeline reports the checks and their verdict.
#include "core/rope_check/rope_check.h"

#include <cstdint>
#include <string>
#include <vector>

#include "core/audit/audit.h"
#include "core/rope/rope.h"
#include "core/validate/validate.h"
#include "gtest/gtest.h"
#include "tests/unit/core/testing/snapshot_builder.h"

namespace attnaudit {
namespace {

constexpr int64_t kB = 2, kHq = 4, kHkv = 2, kD = 16, kP = 8;
const int64_t kLens[kB] = {11, 6};

// What the engine gets wrong, if anything.
struct EngineRope {
  RopeConfig q_config, k_config;  // what it rotates with
  int64_t q_delta = 0;            // q rotated at its position + delta
  int q_times = 1, k_times = 1;   // rotations applied
};

Tensor Bf16Tensor(std::vector<int64_t> shape, const std::vector<float>& v) {
  Tensor t(DType::kBF16, std::move(shape));
  uint16_t* d = t.mutable_data<uint16_t>();
  for (size_t i = 0; i < v.size(); ++i) d[i] = FloatToBf16(v[i]);
  return t;
}

Tensor I64Tensor(std::vector<int64_t> shape, const std::vector<int64_t>& v) {
  Tensor t(DType::kI64, std::move(shape));
  std::copy(v.begin(), v.end(), t.mutable_data<int64_t>());
  return t;
}

// x rotated `times` times as the engine does (its cast point, bf16).
std::vector<float> Rotate(const RopeConfig& config, const float* x, int64_t pos,
                          int times) {
  const RopeTable t = RopeTable::Create(config, kD).value();
  std::vector<float> c(t.inv_freq().size()), s(c.size());
  std::vector<float> y(x, x + kD);
  t.Angles(pos, c.data(), s.data());
  for (int i = 0; i < times; ++i) {
    t.RotateAs(y.data(), c.data(), s.data(), DType::kBF16, y.data());
  }
  return y;
}

// Two rows (11 and 6 tokens, positions base + t) in one page pool; q and
// the cache rotated by `engine`; the snapshot declares `declared` and
// carries this step's pre-RoPE q and keys.
Snapshot Build(const RopeConfig& declared, const EngineRope& engine,
               int64_t base) {
  testing::TestRng rng(11);
  auto bf16 = [&](double scale) {
    return RoundToDType(static_cast<float>(rng.Normal() * scale), DType::kBF16);
  };
  const int64_t pages = 3;  // row 0: pages 0, 1; row 1: page 2
  std::vector<float> k(pages * kP * kHkv * kD, 0.0f), v(k.size(), 0.0f);
  std::vector<int64_t> slot_pos(pages * kP, -1);
  std::vector<float> q_pre(kB * kHq * kD), k_pre(kB * kHkv * kD);
  std::vector<float> q(q_pre.size());
  const int64_t first_page[kB] = {0, 2};
  std::vector<int64_t> qpos(kB);
  for (int64_t b = 0; b < kB; ++b) {
    for (int64_t t = 0; t < kLens[b]; ++t) {
      const int64_t page = first_page[b] + t / kP, slot = t % kP;
      slot_pos[page * kP + slot] = base + t;
      for (int64_t g = 0; g < kHkv; ++g) {
        std::vector<float> x(kD);
        for (float& e : x) e = bf16(1.0);
        const int64_t at = ((page * kP + slot) * kHkv + g) * kD;
        const std::vector<float> y =
            Rotate(engine.k_config, x.data(), base + t, engine.k_times);
        std::copy(y.begin(), y.end(), k.begin() + at);
        for (int64_t i = 0; i < kD; ++i) v[at + i] = bf16(1.0);
        if (t == kLens[b] - 1) {
          std::copy(x.begin(), x.end(), k_pre.begin() + (b * kHkv + g) * kD);
        }
      }
    }
    qpos[b] = base + kLens[b] - 1;
    for (int64_t h = 0; h < kHq; ++h) {
      float* x = &q_pre[(b * kHq + h) * kD];
      for (int64_t i = 0; i < kD; ++i) x[i] = bf16(1.0);
      const std::vector<float> y =
          Rotate(engine.q_config, x, qpos[b] + engine.q_delta, engine.q_times);
      std::copy(y.begin(), y.end(), q.begin() + (b * kHq + h) * kD);
    }
  }
  Snapshot s;
  s.q = Bf16Tensor({kB, 1, kHq, kD}, q);
  s.k_pages = Bf16Tensor({pages, kP, kHkv, kD}, k);
  s.v_pages = Bf16Tensor({pages, kP, kHkv, kD}, v);
  s.block_table = I64Tensor({kB, 2}, {0, 1, 2, -1});
  s.kv_seq_lens = I64Tensor({kB}, {kLens[0], kLens[1]});
  s.query_positions = I64Tensor({kB, 1}, qpos);
  s.slot_positions = I64Tensor({pages, kP}, slot_pos);
  s.rope = declared;
  s.pre_rope.q = Bf16Tensor({kB, 1, kHq, kD}, q_pre);
  s.pre_rope.k = Bf16Tensor({kB, 1, kHkv, kD}, k_pre);
  return s;
}

RopeConfig Llama3(RopeCastPoint cast = RopeCastPoint::kAfterRope) {
  RopeConfig r;
  r.theta = 500000;
  r.cast_point = cast;
  r.scaling.type = RopeScalingType::kLlama3;
  r.scaling.factor = 8;
  r.scaling.low_freq_factor = 1;
  r.scaling.high_freq_factor = 4;
  r.scaling.original_max_position = 8192;
  return r;
}

// Dynamic NTK scaled for `length` (Hugging Face's rule at this step: the
// largest query position + 1, 30011 for Build's rows at base 30000).
RopeConfig Dynamic(int64_t length = 30011,
                   RopeCastPoint cast = RopeCastPoint::kAfterRope) {
  RopeConfig r;
  r.theta = 10000;
  r.cast_point = cast;
  r.scaling.type = RopeScalingType::kDynamic;
  r.scaling.factor = 8;
  r.scaling.original_max_position = 4096;
  r.scaling.sequence_length = length;
  return r;
}

// LongRoPE with Phi-3.5-like divisors; long factors past 4096.
RopeConfig LongRope(int64_t length = 30011,
                    RopeCastPoint cast = RopeCastPoint::kAfterRope) {
  RopeConfig r;
  r.theta = 10000;
  r.cast_point = cast;
  r.scaling.type = RopeScalingType::kLongRope;
  r.scaling.factor = 32;
  r.scaling.original_max_position = 4096;
  r.scaling.sequence_length = length;
  for (int64_t i = 0; i < kD / 2; ++i) {
    r.scaling.short_factor.push_back(1.0 + 0.1 * static_cast<double>(i));
    r.scaling.long_factor.push_back(1.0 + 0.8 * static_cast<double>(i * i));
  }
  return r;
}

// The engine's table: positions first..first+rows-1 (defined below).
EngineRopeTable TableOf(const RopeConfig& engine, int64_t first, int64_t rows);

struct Checked {
  std::vector<RopeCheckResult> checks;
  std::vector<Diagnosis> diagnoses;
};

Checked Check(const Snapshot& s) {
  absl::StatusOr<ResolvedLayout> layout = ValidateSnapshot(s);
  EXPECT_TRUE(layout.ok()) << layout.status();
  Checked out;
  if (!layout.ok()) return out;
  absl::StatusOr<std::vector<RopeCheckResult>> checks =
      RunRopeChecks(s, *layout);
  EXPECT_TRUE(checks.ok()) << checks.status();
  out.checks = *checks;
  out.diagnoses = DiagnoseRopeChecks(s, *layout, out.checks);
  return out;
}

Verdict VerdictOf(const Checked& c, const std::string& what) {
  for (const RopeCheckResult& r : c.checks) {
    if (r.what == what) return r.verdict;
  }
  return Verdict::kUnspecified;
}

TEST(RopeCheckTest, AnEngineFollowingTheDeclaredRopePassesUnderEachCastPoint) {
  for (RopeCastPoint cast : {RopeCastPoint::kAfterRope, RopeCastPoint::kCosSin,
                             RopeCastPoint::kEachOp}) {
    const RopeConfig config = Llama3(cast);
    const Checked c = Check(Build(config, {config, config}, 30000));
    ASSERT_EQ(c.checks.size(), 2u);
    for (const RopeCheckResult& r : c.checks) {
      EXPECT_EQ(r.verdict, Verdict::kPass) << r.what << ": " << r.max_abs;
      EXPECT_EQ(r.max_ulp, 0) << r.what << " cast " << static_cast<int>(cast);
      EXPECT_EQ(r.count, r.what == "q" ? kB * kHq * kD : kB * kHkv * kD);
    }
    EXPECT_TRUE(c.diagnoses.empty());
  }
}

TEST(RopeCheckTest, ARoundingOfAnotherCastPointIsWithinTolerance) {
  // An engine rounding cos/sin to bf16 while the snapshot declares fp32
  // cos/sin: ulps apart, no finding.
  const Checked c = Check(Build(
      Llama3(RopeCastPoint::kAfterRope),
      {Llama3(RopeCastPoint::kCosSin), Llama3(RopeCastPoint::kCosSin)}, 30000));
  EXPECT_EQ(VerdictOf(c, "q"), Verdict::kPass);
  EXPECT_EQ(VerdictOf(c, "k"), Verdict::kPass);
}

struct BugCase {
  const char* name;
  EngineRope engine;
  const char* check;       // the check that must drift
  const char* hypothesis;  // the top diagnosis
  int64_t base = 30000;
};

std::vector<BugCase> BugCases() {
  const RopeConfig good = Llama3();
  std::vector<BugCase> cases;
  cases.push_back({"q_offset", {good, good, 1}, "q", "rope-offset"});
  cases.push_back({"k_twice", {good, good, 0, 1, 2}, "k", "k-rope-twice"});
  cases.push_back({"q_missing", {good, good, 0, 0, 1}, "q", "q-rope-missing"});
  cases.push_back({"k_missing", {good, good, 0, 1, 0}, "k", "k-rope-missing"});
  RopeConfig theta = good;
  theta.theta = 10000;
  cases.push_back({"theta", {theta, theta}, "q", "rope-theta"});
  RopeConfig unscaled = good;
  unscaled.scaling = RopeScaling();
  cases.push_back(
      {"scaling", {unscaled, unscaled}, "q", "rope-scaling-ignored"});
  RopeConfig gptj = good;
  gptj.style = RopeStyle::kGptj;
  cases.push_back({"style", {gptj, gptj}, "k", "rope-style"});
  return cases;
}

TEST(RopeCheckTest, EngineRopeBugsDriftAndAreNamed) {
  for (const BugCase& bug : BugCases()) {
    SCOPED_TRACE(bug.name);
    const Checked c = Check(Build(Llama3(), bug.engine, bug.base));
    EXPECT_EQ(VerdictOf(c, bug.check), Verdict::kDrift);
    ASSERT_FALSE(c.diagnoses.empty());
    EXPECT_EQ(c.diagnoses[0].hypothesis, bug.hypothesis)
        << c.diagnoses[0].summary;
    EXPECT_TRUE(c.diagnoses[0].explains) << c.diagnoses[0].summary;
  }
}

TEST(RopeCheckTest, FullRotationWhereThePartialOneIsDeclared) {
  RopeConfig partial = Llama3();
  partial.rotary_dim = kD / 2;
  RopeConfig full = partial;
  full.rotary_dim = 0;
  const Checked c = Check(Build(partial, {full, full}, 30000));
  EXPECT_EQ(VerdictOf(c, "q"), Verdict::kDrift);
  ASSERT_FALSE(c.diagnoses.empty());
  EXPECT_EQ(c.diagnoses[0].hypothesis, "rope-partial-rotary");
}

// A clean engine passes under each sequence-length scaling and cast
// point, its table too; one that ignores the scaling, or scales for
// another length, drifts and is named.
TEST(RopeCheckTest, SequenceLengthScalingsPassCleanAndNameTheirBugs) {
  for (RopeCastPoint cast : {RopeCastPoint::kAfterRope, RopeCastPoint::kCosSin,
                             RopeCastPoint::kEachOp}) {
    for (const RopeConfig& config :
         {Dynamic(30011, cast), LongRope(30011, cast), LongRope(4096, cast)}) {
      SCOPED_TRACE(static_cast<int>(cast));
      SCOPED_TRACE(static_cast<int>(config.scaling.type));
      Snapshot s = Build(config, {config, config}, 30000);
      s.rope_table = TableOf(config, 30000, 16);
      const Checked c = Check(s);
      ASSERT_EQ(c.checks.size(), 3u);
      for (const RopeCheckResult& r : c.checks) {
        EXPECT_EQ(r.verdict, Verdict::kPass) << r.what << ": " << r.max_abs;
      }
      EXPECT_TRUE(c.diagnoses.empty());
    }
  }
  struct Bug {
    const char* name;
    RopeConfig declared, engine;
    const char* hypothesis;
  };
  RopeConfig plain = Dynamic();
  plain.scaling = RopeScaling();
  const Bug bugs[] = {
      {"dynamic ignored", Dynamic(), plain, "rope-scaling-ignored"},
      {"longrope ignored", LongRope(), plain, "rope-scaling-ignored"},
      // vLLM's fixed cache (factor x original length) where Hugging Face's
      // per-step length is declared.
      {"dynamic length", Dynamic(30011), Dynamic(32768), "rope-scaling-length"},
      {"longrope short factors", LongRope(30011), LongRope(4096),
       "rope-scaling-length"},
      {"longrope long factors", LongRope(4096), LongRope(30011),
       "rope-scaling-length"},
  };
  for (const Bug& bug : bugs) {
    SCOPED_TRACE(bug.name);
    Snapshot s = Build(bug.declared, {bug.engine, bug.engine}, 30000);
    const Checked c = Check(s);
    EXPECT_EQ(VerdictOf(c, "q"), Verdict::kDrift);
    EXPECT_EQ(VerdictOf(c, "k"), Verdict::kDrift);
    ASSERT_FALSE(c.diagnoses.empty());
    EXPECT_EQ(c.diagnoses[0].hypothesis, bug.hypothesis)
        << c.diagnoses[0].summary;
    EXPECT_TRUE(c.diagnoses[0].explains) << c.diagnoses[0].summary;
    // The engine's table tells the same story on its own.
    s.pre_rope = PreRopeInputs();
    s.rope_table = TableOf(bug.engine, 30000, 16);
    const Checked t = Check(s);
    EXPECT_EQ(VerdictOf(t, "table"), Verdict::kDrift);
    ASSERT_FALSE(t.diagnoses.empty());
    EXPECT_EQ(t.diagnoses[0].hypothesis, bug.hypothesis)
        << t.diagnoses[0].summary;
  }
}

// A partial-rotary model whose engine rotated the whole head and sent its
// (full-width) table: a valid snapshot whose table check drifts, named
// rope-partial-rotary, and whose rolling check (rotating with the
// declared config, not the table) drifts too.
TEST(RopeCheckTest, AFullHeadTableOnAPartialRotaryConfigDrifts) {
  RopeConfig partial = Llama3();
  partial.rotary_dim = kD / 2;
  RopeConfig full = partial;
  full.rotary_dim = 0;
  Snapshot s = Build(partial, {full, full}, 30000);
  s.rope_table = TableOf(full, 30000, 16);
  const Checked c = Check(s);
  ASSERT_EQ(c.checks.size(), 3u);
  EXPECT_EQ(VerdictOf(c, "table"), Verdict::kDrift);
  EXPECT_EQ(VerdictOf(c, "q"), Verdict::kDrift);
  EXPECT_EQ(VerdictOf(c, "k"), Verdict::kDrift);
  ASSERT_FALSE(c.diagnoses.empty());
  for (const Diagnosis& d : c.diagnoses) {
    if (d.hypothesis == "rope-partial-rotary") continue;
    EXPECT_FALSE(d.explains) << d.summary;
  }
  EXPECT_EQ(c.diagnoses[0].hypothesis, "rope-partial-rotary")
      << c.diagnoses[0].summary;
  EXPECT_TRUE(c.diagnoses[0].explains);
  const RopeCheckResult& table = c.checks.back();
  ASSERT_FALSE(table.reasons.empty());
  EXPECT_NE(table.reasons[0].find("rotated 16 dims"), std::string::npos)
      << table.reasons[0];

  // The table alone (no rolling inputs), inverse frequencies only or rows
  // only: still DRIFT, still named.
  s.pre_rope = PreRopeInputs();
  const EngineRopeTable both = s.rope_table;
  for (int part = 0; part < 2; ++part) {
    s.rope_table = both;
    if (part == 0) {
      s.rope_table.positions = Tensor();
      s.rope_table.cos = Tensor();
      s.rope_table.sin = Tensor();
    } else {
      s.rope_table.inv_freq = Tensor();
    }
    const Checked t = Check(s);
    EXPECT_EQ(VerdictOf(t, "table"), Verdict::kDrift) << part;
    ASSERT_FALSE(t.diagnoses.empty()) << part;
    EXPECT_EQ(t.diagnoses[0].hypothesis, "rope-partial-rotary") << part;
  }
  // A full-width table at position 0 alone matches the pass-through
  // everywhere; its width is the finding.
  s.rope_table = TableOf(full, 0, 1);
  s.rope_table.inv_freq = Tensor();
  const Checked zero = Check(s);
  EXPECT_EQ(VerdictOf(zero, "table"), Verdict::kDrift);
  ASSERT_FALSE(zero.diagnoses.empty());
  EXPECT_EQ(zero.diagnoses[0].hypothesis, "rope-partial-rotary");
}

// The engine's table: positions 0..T-1 as the engine computed them.
EngineRopeTable TableOf(const RopeConfig& engine, int64_t first, int64_t rows) {
  const RopeTable t = RopeTable::Create(engine, kD).value();
  const int64_t half = kD / 2;
  EngineRopeTable table;
  table.positions = Tensor(DType::kI64, {rows});
  table.cos = Tensor(DType::kF32, {rows, half});
  table.sin = Tensor(DType::kF32, {rows, half});
  for (int64_t r = 0; r < rows; ++r) {
    table.positions.mutable_data<int64_t>()[r] = first + r;
    t.Angles(first + r, table.cos.mutable_data<float>() + r * half,
             table.sin.mutable_data<float>() + r * half);
  }
  table.inv_freq = Tensor(DType::kF32, {half});
  std::copy(t.inv_freq().begin(), t.inv_freq().end(),
            table.inv_freq.mutable_data<float>());
  return table;
}

TEST(RopeCheckTest, TheEnginesTableIsCheckedAgainstTheModel) {
  const RopeConfig good = Llama3();
  Snapshot s = Build(good, {good, good}, 30000);
  s.rope_table = TableOf(good, 30000, 16);
  Checked c = Check(s);
  EXPECT_EQ(VerdictOf(c, "table"), Verdict::kPass);
  EXPECT_EQ(VerdictOf(c, "q"), Verdict::kPass);  // rotated with the rows
  RopeConfig theta = good;
  theta.theta = 10000;
  s.rope_table = TableOf(theta, 30000, 16);
  c = Check(s);
  EXPECT_EQ(VerdictOf(c, "table"), Verdict::kDrift);
  ASSERT_FALSE(c.diagnoses.empty());
  EXPECT_EQ(c.diagnoses[0].hypothesis, "rope-theta") << c.diagnoses[0].summary;
  EXPECT_GT(c.checks.back().max_angle_error, 0.1);
}

TEST(RopeCheckTest, Fp8KeysAreRequantisedBeforeTheComparison) {
  const RopeConfig good = Llama3();
  Snapshot s = Build(good, {good, good}, 100);
  // The cache as an fp8 engine stores it: rotated in bf16, then
  // quantised with the per-tensor scale.
  const float scale = 0.05f;
  Tensor fp8(DType::kF8E4M3, s.k_pages.shape());
  for (int64_t i = 0; i < s.k_pages.num_elements(); ++i) {
    fp8.mutable_data<uint8_t>()[i] =
        FloatToF8E4M3(s.k_pages.FloatAt(i) / scale);
  }
  s.k_pages = fp8;
  Tensor v8(DType::kF8E4M3, s.v_pages.shape());
  s.v_pages = v8;
  s.k_scale = Tensor(DType::kF32, {});
  s.k_scale.mutable_data<float>()[0] = scale;
  s.rope.k_output_dtype = DType::kBF16;  // accepted with post-RoPE fp8 K
  const Checked c = Check(s);
  EXPECT_EQ(VerdictOf(c, "k"), Verdict::kPass);
}

TEST(RopeCheckTest, TheAuditReportsTheChecksAndTheirDiagnosis) {
  const RopeConfig good = Llama3();
  const Snapshot s = Build(good, {good, good, 1}, 30000);
  AuditOptions options;
  options.threads = 1;
  absl::StatusOr<AuditReport> r = RunAudit(s, options);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->verdict, Verdict::kDrift);  // P-R passes; the check drifts
  ASSERT_EQ(r->rope_checks.size(), 2u);
  EXPECT_FALSE(r->rope_checks[0].reasons.empty());
  ASSERT_FALSE(r->diagnoses.empty());
  EXPECT_EQ(r->diagnoses[0].hypothesis, "rope-offset");
  EXPECT_EQ(r->diagnoses[0].detail, "+1");
  EXPECT_TRUE(r->diagnosis_run.ran);
}

}  // namespace
}  // namespace attnaudit
