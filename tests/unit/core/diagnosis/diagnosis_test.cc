// The diagnosis (core/diagnosis/diagnosis.h) names the bug and its place.
// Part 1: every fault of the engine simulator (sim/, independent of
// core/attention) on small snapshots, through the audit pipeline: the top
// diagnosis is the injected bug, with its variant, and for one-place
// faults the row, logical block and page. Part 2: what the simulator does
// not produce (an LSE declared in the wrong base, sinks in the LSE,
// context-parallel shards, engine page ids), with engine outputs from the
// long-double test oracle; "unexplained"; the time limit; and no diagnosis
// when nothing drifts.
#include "core/diagnosis/diagnosis.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/attention/attention.h"
#include "core/audit/audit.h"
#include "core/rope_check/rope_check.h"
#include "core/validate/validate.h"
#include "gtest/gtest.h"
#include "sim/simulator.h"
#include "tests/unit/core/testing/attention_oracle.h"
#include "tests/unit/core/testing/snapshot_builder.h"

namespace attnaudit {
namespace {

AuditReport Audit(const Snapshot& s) {
  AuditOptions a;
  a.threads = 2;
  a.include_merge_orders = false;
  absl::StatusOr<AuditReport> r = RunAudit(s, a);
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? *std::move(r) : AuditReport();
}

// ---------------------------------------------------------------------------
// Part 1: the simulator's faults.

struct FaultCase {
  const char* fault;
  const char* preset;
  const char* hypothesis;  // the expected top diagnosis
  const char* detail;      // a substring of its detail ("" : any)
  int64_t layer = 1;
  int64_t magnitude = 1;
  int64_t context = 300;
  int64_t head_dim = 0;  // 0: the preset's
};

SynthOptions Options(const FaultCase& c) {
  SynthOptions o;
  o.preset = c.preset;
  o.batch = 2;
  o.context = c.context;
  o.page_size = 16;
  o.split_tokens = 64;
  o.permute_pages = true;
  o.q_heads = 8;
  o.kv_heads = 2;
  o.vocab = 64;
  o.layer = c.layer;
  o.seed = 5;
  o.threads = 2;
  o.fault = ParseFault(c.fault).value();
  o.fault_magnitude = c.magnitude;
  o.head_dim = c.head_dim;
  if (o.fault == Fault::kBf16RunningOut) {
    o.split_tokens = 16;
    o.context = 2048;
  }
  return o;
}

class SimFaultTest : public ::testing::TestWithParam<FaultCase> {};

TEST_P(SimFaultTest, TopDiagnosisIsTheInjectedBug) {
  const FaultCase& c = GetParam();
  SynthDetails site;
  absl::StatusOr<Snapshot> s = Synthesize(Options(c), &site);
  ASSERT_TRUE(s.ok()) << s.status();
  const AuditReport r = Audit(*s);
  ASSERT_EQ(r.verdict, Verdict::kDrift) << site.fault;
  ASSERT_TRUE(r.diagnosis_run.ran);
  EXPECT_TRUE(r.diagnosis_run.complete) << r.diagnosis_run.note;
  ASSERT_FALSE(r.diagnoses.empty());
  const Diagnosis& top = r.diagnoses[0];
  EXPECT_EQ(top.hypothesis, c.hypothesis) << top.summary << "\n" << site.fault;
  EXPECT_TRUE(absl::StrContains(top.detail, c.detail))
      << top.detail << " vs " << c.detail << " (" << top.summary << ")";
  EXPECT_GT(top.score, 0.5);
  EXPECT_FALSE(top.summary.empty());
  EXPECT_GT(r.provenance.timings.diagnosis_seconds, 0);
  // The evidence: what the hypothesis leaves is below the drift (out, or
  // for an LSE-only bug the LSE).
  EXPECT_LE(top.after.out_max_abs, top.before.out_max_abs) << top.summary;
  EXPECT_LE(top.after.lse_max_abs, top.before.lse_max_abs) << top.summary;
  EXPECT_TRUE(top.after.out_max_abs < top.before.out_max_abs ||
              top.after.lse_max_abs < top.before.lse_max_abs)
      << top.summary;
  if (site.fault_block >= 0) {  // one-place faults: the place
    const DiagnosisLocation& l = top.location;
    EXPECT_EQ(l.row, site.fault_row) << top.summary;
    if (site.fault_other_block >= 0 && top.hypothesis == "swapped-pages") {
      EXPECT_EQ(std::min(l.logical_block, l.other_logical_block),
                std::min(site.fault_block, site.fault_other_block));
      EXPECT_EQ(std::max(l.logical_block, l.other_logical_block),
                std::max(site.fault_block, site.fault_other_block));
    } else {
      EXPECT_EQ(l.logical_block, site.fault_block) << top.summary;
      EXPECT_EQ(l.page, site.fault_page) << top.summary;
    }
    if (top.hypothesis == "duplicate-page") {
      EXPECT_EQ(l.other_logical_block, site.fault_other_block);
      EXPECT_EQ(l.other_page, site.fault_other_page);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    AllFaults, SimFaultTest,
    ::testing::Values(
        FaultCase{"stale-page", "llama3-8b", "stale-page", ""},
        FaultCase{"drop-block", "qwen3-8b", "drop-block", ""},
        FaultCase{"duplicate-page", "phi4-mini", "duplicate-page", ""},
        FaultCase{"swapped-pages", "llama3-8b", "swapped-pages", ""},
        FaultCase{"rope-offset", "qwen3-8b", "rope-offset", "+1"},
        FaultCase{"rope-offset", "llama3-8b", "rope-offset", "-3", 1, -3},
        FaultCase{"k-rope-twice", "phi4-mini", "k-rope-twice", ""},
        FaultCase{"k-rope-missing", "qwen3-8b", "k-rope-missing", ""},
        FaultCase{"rope-style", "glm4-9b", "rope-style", "q rotated with NeoX"},
        FaultCase{"lse-base2", "llama3-8b", "lse-base", "in base 2, declared"},
        FaultCase{"wrong-scale", "llama3-8b", "wrong-scale", "applied twice"},
        // Gemma 2's 1/16 with a head dim of 128: the kernel's 1/sqrt(128).
        FaultCase{"wrong-scale", "gemma2-9b", "wrong-scale",
                  "the kernel's default", 1, 1, 300, 128},
        FaultCase{"gqa-mapping", "llama3-8b", "gqa-mapping", "h % Hkv"},
        FaultCase{"window-off-by-one", "gpt-oss-20b", "window-off-by-one",
                  "window 129 instead of 128", 0},
        FaultCase{"sinks-missing", "gpt-oss-20b", "sinks-missing", "", 0},
        FaultCase{"softcap-missing", "gemma2-9b", "softcap-missing", ""},
        FaultCase{"fp8-scale", "llama3-8b", "fp8-scale", "K dequantised with"},
        FaultCase{"fp8-scale-twice", "qwen3-8b", "fp8-scale",
                  "K and V scales applied twice"},
        FaultCase{"fp8-scale-missing", "llama3-8b", "fp8-scale",
                  "K and V scales not applied"},
        FaultCase{"bf16-running-out", "llama3-8b", "low-precision", "noise"}),
    [](const ::testing::TestParamInfo<FaultCase>& info) {
      std::string name = std::string(info.param.fault) + "_" +
                         info.param.preset + "_" + std::to_string(info.index);
      for (char& ch : name) {
        if (ch == '-') ch = '_';
      }
      return name;
    });

TEST(SimFaultTest, GqaMappingNamesTheHeadsItMoves) {
  // Hq = 8, Hkv = 2: head h reads KV head h / 4 but the engine h % 2, so
  // heads 1, 3, 4 and 6 move and 0, 2, 5 and 7 do not.
  FaultCase c{"gqa-mapping", "llama3-8b", "gqa-mapping", ""};
  const AuditReport r = Audit(Synthesize(Options(c)).value());
  ASSERT_FALSE(r.diagnoses.empty());
  EXPECT_EQ(r.diagnoses[0].location.heads, (std::vector<int64_t>{1, 3, 4, 6}));
}

// A stale page in a context-parallel engine: the block, its page and the
// rank whose shard holds it (page interleaving: block j lives on rank
// j mod W).
TEST(SimFaultTest, StalePageOfACpEngineNamesItsRank) {
  FaultCase c{"stale-page", "llama3-8b", "stale-page", ""};
  SynthOptions o = Options(c);
  o.cp_world_size = 3;
  o.cp_sharding = CpSharding::kPageInterleaved;
  SynthDetails site;
  absl::StatusOr<Snapshot> s = Synthesize(o, &site);
  ASSERT_TRUE(s.ok()) << s.status();
  const AuditReport r = Audit(*s);
  ASSERT_EQ(r.verdict, Verdict::kDrift) << site.fault;
  ASSERT_FALSE(r.diagnoses.empty());
  const Diagnosis& top = r.diagnoses[0];
  ASSERT_EQ(top.hypothesis, "stale-page") << top.summary;
  EXPECT_EQ(top.location.row, site.fault_row);
  EXPECT_EQ(top.location.logical_block, site.fault_block) << top.summary;
  EXPECT_EQ(top.location.cp_rank, site.fault_block % 3) << top.summary;
  EXPECT_TRUE(absl::StrContains(top.summary,
                                absl::StrCat("CP rank ", site.fault_block % 3)))
      << top.summary;
}

// The simulator's CP faults over every preset, sharding and W = 2..4 (each
// preset with two of the shardings, two seeds): the top diagnosis of a
// faulty snapshot. `bf16-combine` rounds the partial LSEs and the combine's
// weights and sums to bf16; its LSE moves by ~2^-9 |lse|, far beyond the
// LSE tolerance, which a located stale page can also account for (a page
// of unknown content can add any mass), so the combine is only named when
// its recomputation reproduces the engine's rounding.
struct CpFaultRun {
  int runs = 0, top = 0;
  std::string misses;
};

CpFaultRun RunCpFault(const char* cp_fault, const char* hypothesis) {
  CpFaultRun run;
  const CpSharding shardings[] = {CpSharding::kPageInterleaved,
                                  CpSharding::kTokenInterleaved,
                                  CpSharding::kExplicitOwners};
  int i = 0;
  for (const std::string& preset : PresetNames()) {
    for (uint64_t seed : {11, 12}) {
      FaultCase c{"stale-page", preset.c_str(), "", ""};
      SynthOptions o = Options(c);
      o.fault = Fault::kNone;
      o.seed = seed;
      o.layer = i % 2;
      o.cp_world_size = 2 + i % 3;
      o.cp_sharding = shardings[i % 3];
      o.cp_interleave = 8;
      o.cp_fault = ParseCpFault(cp_fault).value();
      ++i;
      SynthDetails site;
      absl::StatusOr<Snapshot> s = Synthesize(o, &site);
      if (!s.ok()) continue;  // a rank the fault cannot show on
      const AuditReport r = Audit(*s);
      ++run.runs;
      const std::string top =
          r.diagnoses.empty() ? "(none)" : r.diagnoses[0].hypothesis;
      if (r.verdict == Verdict::kDrift && top == hypothesis) {
        ++run.top;
      } else {
        absl::StrAppend(&run.misses, preset, " W=", o.cp_world_size, " seed ",
                        seed, ": ", top, "; ");
      }
    }
  }
  return run;
}

// Every case but one: the recomputation starts from R's partials, which
// differ from the engine's by less than a bf16 rounding, so a rare partial
// on a rounding boundary of the bf16 sums could leave more than the noise
// a correct engine shows. Before the combine's LSE rounding was modelled,
// none of these was named cp-bf16-combine (a located stale page won).
TEST(SimFaultTest, Bf16CombineIsNamedAcrossPresetsAndShardings) {
  const CpFaultRun run = RunCpFault("bf16-combine", "cp-bf16-combine");
  ASSERT_GE(run.runs, 10);
  EXPECT_GE(run.top, run.runs - 1) << run.misses;
}

// The other combine faults keep their names with the bf16 combine among
// the candidates (it must not explain a partial left out or a rank's LSE
// in base 2).
TEST(SimFaultTest, OtherCpFaultsAreNotTakenForABf16Combine) {
  for (const auto& [fault, hypothesis] :
       {std::pair<const char*, const char*>{"drop-shard", "cp-missing-shard"},
        {"lse-base2-rank", "cp-lse-base"}}) {
    const CpFaultRun run = RunCpFault(fault, hypothesis);
    ASSERT_GE(run.runs, 10) << fault;
    EXPECT_EQ(run.top, run.runs) << fault << ": " << run.misses;
  }
}

// A rank that returns garbage where it holds no key leaves the final
// output right (docs/SIMULATOR.md): only the rank's check drifts. The rows
// examined have no drift beyond noise, and no hypothesis may claim to
// explain that noise (a recomputation near R removes some of it by chance).
TEST(SimFaultTest, NothingExplainsARowThatDoesNotDrift) {
  for (uint64_t seed : {1, 2}) {
    FaultCase c{"stale-page", "gpt-oss-20b", "", ""};
    SynthOptions o = Options(c);
    o.fault = Fault::kNone;
    o.q_heads = o.kv_heads = 0;  // the preset's 64 / 8
    o.context = 700;
    o.split_tokens = 256;
    o.permute_pages = false;
    o.layer = 0;
    o.seed = seed;
    o.cp_world_size = 2;
    o.cp_sharding = CpSharding::kExplicitOwners;
    o.cp_fault = CpFault::kEmptyRankGarbage;
    absl::StatusOr<Snapshot> s = Synthesize(o);
    ASSERT_TRUE(s.ok()) << s.status();
    const AuditReport r = Audit(*s);
    EXPECT_EQ(r.verdict, Verdict::kDrift) << seed;
    for (const Diagnosis& d : r.diagnoses) {
      EXPECT_FALSE(d.explains) << seed << ": " << d.summary;
      EXPECT_LT(d.score, 0.5) << seed << ": " << d.summary;
    }
  }
}

TEST(SimFaultTest, NoDiagnosisWithoutDrift) {
  FaultCase c{"stale-page", "llama3-8b", "", ""};
  SynthOptions o = Options(c);
  o.fault = Fault::kNone;
  const AuditReport r = Audit(Synthesize(o).value());
  EXPECT_EQ(r.verdict, Verdict::kPass);
  EXPECT_FALSE(r.diagnosis_run.ran);
  EXPECT_TRUE(r.diagnoses.empty());
  EXPECT_EQ(r.provenance.timings.diagnosis_seconds, 0);
}

TEST(SimFaultTest, HypothesesThatDoNotApplyAreNotReported) {
  // llama3-8b has no soft-cap, window, sinks or fp8 scales.
  FaultCase c{"rope-offset", "llama3-8b", "", ""};
  const AuditReport r = Audit(Synthesize(Options(c)).value());
  for (const Diagnosis& d : r.diagnoses) {
    for (const char* name :
         {"softcap-missing", "window-off-by-one", "sinks-missing",
          "sinks-in-lse", "fp8-scale", "cp-missing-shard"}) {
      EXPECT_NE(d.hypothesis, name);
    }
  }
}

// ---------------------------------------------------------------------------
// Part 2: cases built from a logical truth, engine outputs from the oracle.

// The oracle's out and LSE (key-only or declared) as the engine's outputs.
void SetEngine(const testing::OracleResult& o, DType out_dtype,
               std::vector<int64_t> shape, Snapshot* s,
               const std::vector<long double>* lse = nullptr) {
  std::vector<double> out(o.out.begin(), o.out.end());
  s->engine.out = testing::MakeFloatTensor(out_dtype, shape, out);
  const std::vector<long double>& l = lse ? *lse : o.lse_declared;
  shape.pop_back();
  s->engine.lse = testing::MakeFloatTensor(
      DType::kF32, shape, std::vector<double>(l.begin(), l.end()));
  // The oracle's engine keeps fp32 scores: declared, the audit sees what an
  // undeclared engine's widest envelope would hide.
  s->precision.profile = EngineProfile::kFlashDecoding;
}

std::vector<int64_t> OutShape(const testing::LogicalCase& c) {
  return {c.batch, c.queries, c.q_heads, c.head_dim};
}

TEST(DiagnosisCaseTest, LseInBaseEDeclaredBase2) {
  const testing::LogicalCase c = testing::PeakedBf16Case(1);
  testing::PagingOptions paging;
  paging.page_size = 8;
  Snapshot s = testing::BuildSnapshot(c, paging);
  const testing::OracleResult o = testing::OracleAttention(c);
  SetEngine(o, DType::kBF16, OutShape(c), &s);
  s.engine.lse_base = LseBase::k2;  // but the values are natural logs
  const AuditReport r = Audit(s);
  ASSERT_FALSE(r.diagnoses.empty());
  EXPECT_EQ(r.diagnoses[0].hypothesis, "lse-base");
  EXPECT_EQ(r.diagnoses[0].detail, "engine LSE in base e, declared base 2");
  EXPECT_TRUE(r.diagnoses[0].explains);
}

TEST(DiagnosisCaseTest, SinksInTheLseAgainstTheDeclaration) {
  testing::LogicalCase c = testing::PeakedBf16Case(2);
  c.sinks.assign(8, 1.5f);
  c.lse_includes_sinks = false;
  testing::PagingOptions paging;
  paging.page_size = 8;
  Snapshot s = testing::BuildSnapshot(c, paging);
  const testing::OracleResult o = testing::OracleAttention(c);
  // The engine reports the LSE with the sinks while declaring it without.
  // Declared as a flash-decoding kernel: an undeclared engine's envelope
  // (16-bit scores) is wide enough to pass the sink term, ~1e-3 here.
  SetEngine(o, DType::kBF16, OutShape(c), &s, &o.lse_with_sinks);
  s.precision.profile = EngineProfile::kFlashDecoding;
  const AuditReport r = Audit(s);
  ASSERT_FALSE(r.diagnoses.empty());
  EXPECT_EQ(r.diagnoses[0].hypothesis, "sinks-in-lse");
  EXPECT_TRUE(r.diagnoses[0].explains);
}

// The case with the tokens of row `row` for which keep(t) is false removed
// (the oracle then sees only the rest).
testing::LogicalCase Without(testing::LogicalCase c, int64_t row,
                             const std::function<bool(int64_t)>& keep) {
  const int64_t width = c.kv_heads * c.head_dim;
  std::vector<double> k, v;
  std::vector<int64_t> pos;
  for (int64_t t = 0; t < c.SeqLen(row); ++t) {
    if (!keep(t)) continue;
    k.insert(k.end(), c.k[row].begin() + t * width,
             c.k[row].begin() + (t + 1) * width);
    v.insert(v.end(), c.v[row].begin() + t * width,
             c.v[row].begin() + (t + 1) * width);
    pos.push_back(c.positions[row][t]);
  }
  c.k[row] = k;
  c.v[row] = v;
  c.positions[row] = pos;
  return c;
}

TEST(DiagnosisCaseTest, DroppedBlockIsNamedByTheEnginesPageId) {
  const testing::LogicalCase c = testing::PeakedBf16Case(3);
  testing::PagingOptions paging;
  paging.page_size = 8;
  paging.permute_pages = true;
  paging.page_id_base = 1000;  // page i has id 1000 + 7 i
  Snapshot s = testing::BuildSnapshot(c, paging);
  // Row 1's engine skipped logical block 2 (tokens 16..23).
  const testing::LogicalCase dropped =
      Without(c, 1, [](int64_t t) { return t / 8 != 2; });
  SetEngine(testing::OracleAttention(dropped), DType::kBF16, OutShape(c), &s);
  const AuditReport r = Audit(s);
  ASSERT_FALSE(r.diagnoses.empty());
  const Diagnosis& top = r.diagnoses[0];
  EXPECT_EQ(top.hypothesis, "drop-block") << top.summary;
  EXPECT_EQ(top.location.row, 1);
  EXPECT_EQ(top.location.logical_block, 2);
  // The id the block table holds for row 1, block 2.
  EXPECT_EQ(top.location.page,
            s.block_table.IntAt(1 * s.block_table.shape()[1] + 2));
  EXPECT_GE(top.location.page, 1000);
  EXPECT_TRUE(
      absl::StrContains(top.summary, std::to_string(top.location.page)));
}

// Two rows each skipped a block: a page account of one row leaves the
// other's drift unexplained, so none explains E (a one-row account that
// claimed it would name a wrong cause for half the drift); the places are
// still named as candidates.
TEST(DiagnosisCaseTest, APageOfOneRowDoesNotExplainAnotherRowsDrift) {
  const testing::LogicalCase c = testing::PeakedBf16Case(3);
  testing::PagingOptions paging;
  paging.page_size = 8;
  paging.permute_pages = true;
  Snapshot s = testing::BuildSnapshot(c, paging);
  const testing::LogicalCase one =
      Without(c, 1, [](int64_t t) { return t / 8 != 2; });
  SetEngine(testing::OracleAttention(one), DType::kBF16, OutShape(c), &s);
  const AuditReport single = Audit(s);
  ASSERT_FALSE(single.diagnoses.empty());
  EXPECT_TRUE(single.diagnoses[0].explains) << single.diagnoses[0].summary;

  const testing::LogicalCase both =
      Without(one, 0, [](int64_t t) { return t / 8 != 4; });
  SetEngine(testing::OracleAttention(both), DType::kBF16, OutShape(c), &s);
  const AuditReport r = Audit(s);
  ASSERT_EQ(r.verdict, Verdict::kDrift);
  ASSERT_FALSE(r.diagnoses.empty());
  bool named = false;
  for (const Diagnosis& d : r.diagnoses) {
    EXPECT_FALSE(d.explains && d.location.logical_block >= 0) << d.summary;
    named |= d.hypothesis == "drop-block" &&
             ((d.location.row == 1 && d.location.logical_block == 2) ||
              (d.location.row == 0 && d.location.logical_block == 4));
  }
  EXPECT_TRUE(named);
}

// Context parallelism: pages interleaved over 3 ranks (block j on rank
// j % 3); the engine's combine goes wrong for rank 1.
struct CpCase {
  testing::LogicalCase c;
  Snapshot s;
};

CpCase MakeCp(uint64_t seed) {
  CpCase cp;
  cp.c = testing::PeakedBf16Case(seed);
  testing::PagingOptions paging;
  paging.page_size = 8;
  paging.sharding = CpSharding::kPageInterleaved;
  paging.cp_world_size = 3;
  cp.s = testing::BuildSnapshot(cp.c, paging);
  return cp;
}

bool OnRank(int64_t t, int64_t rank) { return (t / 8) % 3 == rank; }

testing::LogicalCase RankOnly(const testing::LogicalCase& c, int64_t rank,
                              bool keep) {
  testing::LogicalCase out = c;
  for (int64_t b = 0; b < c.batch; ++b) {
    out = Without(out, b, [&](int64_t t) { return OnRank(t, rank) == keep; });
  }
  return out;
}

// Long-double merge of two oracle results, the second's LSE times `factor`.
testing::OracleResult Merge(const testing::OracleResult& a,
                            const testing::OracleResult& b, long double factor,
                            int64_t dim) {
  testing::OracleResult m = a;
  for (size_t i = 0; i < a.lse_keys.size(); ++i) {
    const long double la = a.lse_keys[i], lb = b.lse_keys[i] * factor;
    const long double hi = std::max(la, lb);
    const long double wa = std::exp(la - hi), wb = std::exp(lb - hi);
    for (int64_t d = 0; d < dim; ++d) {
      m.out[i * dim + d] =
          (wa * a.out[i * dim + d] + wb * b.out[i * dim + d]) / (wa + wb);
    }
    m.lse_keys[i] = m.lse_declared[i] = hi + std::log(wa + wb);
  }
  return m;
}

TEST(DiagnosisCaseTest, CpMissingShardNamesTheRank) {
  CpCase cp = MakeCp(4);
  SetEngine(testing::OracleAttention(RankOnly(cp.c, 1, false)), DType::kBF16,
            OutShape(cp.c), &cp.s);
  const AuditReport r = Audit(cp.s);
  ASSERT_FALSE(r.diagnoses.empty());
  EXPECT_EQ(r.diagnoses[0].hypothesis, "cp-missing-shard")
      << r.diagnoses[0].summary;
  EXPECT_EQ(r.diagnoses[0].location.cp_rank, 1);
  EXPECT_TRUE(r.diagnoses[0].explains);
}

TEST(DiagnosisCaseTest, CpDoubledShardNamesTheRank) {
  CpCase cp = MakeCp(5);
  const testing::OracleResult all = testing::OracleAttention(cp.c);
  const testing::OracleResult mine =
      testing::OracleAttention(RankOnly(cp.c, 1, true));
  SetEngine(Merge(all, mine, 1.0L, cp.c.head_dim), DType::kBF16, OutShape(cp.c),
            &cp.s);
  const AuditReport r = Audit(cp.s);
  ASSERT_FALSE(r.diagnoses.empty());
  EXPECT_EQ(r.diagnoses[0].hypothesis, "cp-doubled-shard")
      << r.diagnoses[0].summary;
  EXPECT_EQ(r.diagnoses[0].location.cp_rank, 1);
}

TEST(DiagnosisCaseTest, CpRankLseInBase2NamesTheRank) {
  CpCase cp = MakeCp(6);
  const testing::OracleResult rest =
      testing::OracleAttention(RankOnly(cp.c, 2, false));
  const testing::OracleResult mine =
      testing::OracleAttention(RankOnly(cp.c, 2, true));
  SetEngine(Merge(rest, mine, 1.0L / std::log(2.0L), cp.c.head_dim),
            DType::kBF16, OutShape(cp.c), &cp.s);
  const AuditReport r = Audit(cp.s);
  ASSERT_FALSE(r.diagnoses.empty());
  EXPECT_EQ(r.diagnoses[0].hypothesis, "cp-lse-base") << r.diagnoses[0].summary;
  EXPECT_EQ(r.diagnoses[0].location.cp_rank, 2);
  EXPECT_TRUE(absl::StrContains(r.diagnoses[0].detail, "base 2"));
}

TEST(DiagnosisCaseTest, AnUnknownBugIsUnexplained) {
  // One head's output replaced by another head's: no hypothesis of the
  // catalogue does that.
  const testing::LogicalCase c = testing::PeakedBf16Case(7);
  testing::PagingOptions paging;
  paging.page_size = 8;
  Snapshot s = testing::BuildSnapshot(c, paging);
  testing::OracleResult o = testing::OracleAttention(c);
  const int64_t D = c.head_dim;
  for (int64_t d = 0; d < D; ++d) o.out[5 * D + d] = o.out[2 * D + d] * 0.5L;
  SetEngine(o, DType::kBF16, OutShape(c), &s);
  const AuditReport r = Audit(s);
  ASSERT_EQ(r.verdict, Verdict::kDrift);
  ASSERT_FALSE(r.diagnoses.empty());
  EXPECT_EQ(r.diagnoses[0].hypothesis, "unexplained") << r.diagnoses[0].summary;
  EXPECT_FALSE(r.diagnoses[0].explains);
}

TEST(DiagnosisTest, StopsAtItsTimeLimitAndSaysSo) {
  const testing::LogicalCase c = testing::PeakedBf16Case(8);
  testing::PagingOptions paging;
  paging.page_size = 8;
  Snapshot s = testing::BuildSnapshot(c, paging);
  const testing::LogicalCase dropped =
      Without(c, 0, [](int64_t t) { return t / 8 != 1; });
  SetEngine(testing::OracleAttention(dropped), DType::kBF16, OutShape(c), &s);
  AuditOptions a;
  a.threads = 1;
  a.diagnosis_max_seconds = 1e-9;
  const AuditReport r = RunAudit(s, a).value();
  ASSERT_TRUE(r.diagnosis_run.ran);
  EXPECT_FALSE(r.diagnosis_run.complete);
  EXPECT_TRUE(absl::StrContains(r.diagnosis_run.note, "time limit"));
}

TEST(DiagnosisTest, RejectsMissingInputs) {
  DiagnosisInputs in;
  EXPECT_EQ(Diagnose(in, DiagnosisOptions()).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(DiagnosisTest, HypothesisNamesAreABoundedUniqueSet) {
  // A metric label: a fixed set that every name a report can carry is in,
  // the RoPE checks' diagnoses included.
  const std::vector<std::string>& names = HypothesisNames();
  EXPECT_LE(names.size(), 48u);
  for (const std::string& rope : RopeHypothesisNames()) {
    EXPECT_NE(std::find(names.begin(), names.end(), rope), names.end()) << rope;
  }
  for (size_t i = 0; i < names.size(); ++i) {
    for (size_t j = i + 1; j < names.size(); ++j) EXPECT_NE(names[i], names[j]);
  }
  EXPECT_NE(std::find(names.begin(), names.end(), "unexplained"), names.end());
}

}  // namespace
}  // namespace attnaudit
