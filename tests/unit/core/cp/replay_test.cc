// The CPU CP replay (core/cp/replay) over the in-process transport: for
// every world size, sharding, interleave, strategy and execution, the
// deterministic combine equals the single-rank replay P bit for bit, and
// the engine-order combine is within P-R's tolerance of R. Unit states are
// compared with the single pass's (the rank's buffer must not matter).
#include "core/cp/replay/replay.h"

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/cp/replay/combine.h"
#include "core/cp/schedule/schedule.h"
#include "core/verdict/verdict.h"
#include "gtest/gtest.h"
#include "tests/unit/core/cp/cp_cases.h"

namespace attnaudit {
namespace testing {
namespace {

double MaxAbsFinite(const std::vector<double>& v) {
  double m = 0;
  for (double x : v) {
    if (std::isfinite(x)) m = std::max(m, std::fabs(x));
  }
  return m;
}

// P-R's tolerances for this case (the CP combines are replays too).
Tolerances ReplayTolerances(const CpCase& c) {
  ToleranceInputs in;
  in.comparison = Comparison::kReplayVsReference;
  in.output_dtype = c.prepared.output_dtype;
  in.kv_dtype = c.snapshot.k_pages.dtype();
  in.max_merged_blocks = std::max<int64_t>(1, c.single.max_merged_blocks);
  in.max_context = std::max<int64_t>(1, c.single.max_visible_keys);
  in.max_abs_out_reference = MaxAbsFinite(c.single.reference_out);
  in.max_abs_lse_reference = MaxAbsFinite(c.single.reference_lse);
  return ComputeTolerances(in, {});
}

void ExpectBitIdentical(const std::vector<double>& got,
                        const std::vector<double>& want,
                        const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(double)),
            0)
      << what;
}

void ExpectWithin(const std::vector<double>& got,
                  const std::vector<double>& want, double tol,
                  const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double worst = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    worst = std::max(worst, std::fabs(got[i] - want[i]));
  }
  EXPECT_LE(worst, tol) << what;
}

// Runs one strategy and execution on a case and checks everything.
void CheckReplay(const CpCase& c, const CpLayout& l, CpReplayStrategy strategy,
                 CpExecution execution) {
  const PreparedAttention& p = c.prepared;
  const std::string what =
      absl::StrCat(Describe(l), " ", CpReplayStrategyName(strategy), " ",
                   CpExecutionName(execution),
                   " kv=", DTypeName(c.snapshot.k_pages.dtype()));
  const CpShards shards = PlanShards(p.units, l.world, p.dims.page_size);
  // A small budget: several passes for the larger cases.
  const CpSchedule schedule(shards, strategy, p.dims.kv_heads, CpTokenBytes(p),
                            2 * 4 * CpTokenBytes(p));
  CpReplayOptions o;
  o.threads = 3;
  o.execution = execution;
  absl::StatusOr<CpReplayRun> run = RunCpReplay(p, schedule, o);
  ASSERT_TRUE(run.ok()) << what << ": " << run.status();
  EXPECT_EQ(run->execution, execution) << what;
  EXPECT_EQ(run->rank_compute_seconds.size(), static_cast<size_t>(l.world));
  // Every unit state as the single pass computed it.
  ASSERT_EQ(run->states.p_lse.size(), c.states.p_lse.size()) << what;
  EXPECT_EQ(std::memcmp(run->states.p_lse.data(), c.states.p_lse.data(),
                        c.states.p_lse.size() * sizeof(float)),
            0)
      << what;
  EXPECT_EQ(std::memcmp(run->states.p_out.data(), c.states.p_out.data(),
                        c.states.p_out.size() * sizeof(float)),
            0)
      << what;
  const CpCombined det = CombineDeterministic(p, run->states, 2);
  ExpectBitIdentical(det.out, c.single.replay_out, what + " deterministic out");
  ExpectBitIdentical(det.lse, c.single.replay_lse, what + " deterministic lse");
  const Tolerances tol = ReplayTolerances(c);
  const CpCombined eng = CombineEngineOrder(p, schedule, run->states, 2);
  ExpectWithin(eng.out, c.single.reference_out, tol.out_abs,
               what + " engine-order out vs R");
  ExpectWithin(eng.lse, c.single.reference_lse, tol.lse_abs,
               what + " engine-order lse vs R");
}

struct MatrixCase {
  int64_t world;
  DType kv;
};

class CpReplayMatrixTest : public ::testing::TestWithParam<MatrixCase> {};

TEST_P(CpReplayMatrixTest, DeterministicIsPBitForBitAndEngineOrderNearR) {
  const MatrixCase m = GetParam();
  CpCaseOptions o;
  o.kv_dtype = m.kv;
  o.seed = static_cast<uint64_t>(m.world * 10 + static_cast<int>(m.kv));
  // Variants rotate with the world size so every one meets every sharding.
  o.window = m.world % 2 == 1 ? 11 : 0;
  o.sinks = m.world % 3 != 0;
  o.hnd = m.world == 4 || m.world == 5;
  o.pre_rope_k = m.world == 3 && m.kv != DType::kF8E4M3;
  for (const CpLayout& l : LayoutsFor(m.world, o.page_size)) {
    SCOPED_TRACE(Describe(l));
    const auto c = MakeCpCase(l, o);
    ASSERT_NE(c, nullptr);
    for (CpReplayStrategy s :
         {CpReplayStrategy::kRing, CpReplayStrategy::kPartials}) {
      for (CpExecution e :
           {CpExecution::kLockstep, CpExecution::kThreadPerRank}) {
        CheckReplay(*c, l, s, e);
      }
    }
  }
}

std::vector<MatrixCase> Matrix() {
  std::vector<MatrixCase> out;
  for (int64_t w : {1, 2, 3, 4, 5, 8}) {
    for (DType kv : {DType::kBF16, DType::kF32, DType::kF8E4M3}) {
      out.push_back({w, kv});
    }
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(Worlds, CpReplayMatrixTest,
                         ::testing::ValuesIn(Matrix()),
                         [](const ::testing::TestParamInfo<MatrixCase>& info) {
                           return absl::StrCat("W", info.param.world, "_",
                                               DTypeName(info.param.kv));
                         });

// Contexts shorter than W everywhere: most ranks hold nothing, and a ring
// still runs every rank through the same steps.
TEST(CpReplayTest, EveryRowShorterThanTheWorld) {
  CpCaseOptions o;
  o.seq_lens = {2, 3, 2};
  o.page_size = 2;
  for (const CpLayout& l : LayoutsFor(8, o.page_size)) {
    const auto c = MakeCpCase(l, o);
    ASSERT_NE(c, nullptr);
    for (CpReplayStrategy s :
         {CpReplayStrategy::kRing, CpReplayStrategy::kPartials}) {
      CheckReplay(*c, l, s, CpExecution::kLockstep);
    }
  }
}

// The lock-step execution runs W ranks on fewer threads ("in turns").
TEST(CpReplayTest, MoreRanksThanThreads) {
  CpCaseOptions o;
  o.seq_lens = {40, 17};
  const CpLayout l{CpSharding::kTokenInterleaved, 8, 3};
  const auto c = MakeCpCase(l, o);
  ASSERT_NE(c, nullptr);
  const PreparedAttention& p = c->prepared;
  const CpShards shards = PlanShards(p.units, l.world, p.dims.page_size);
  const CpSchedule schedule(shards, CpReplayStrategy::kRing, p.dims.kv_heads,
                            CpTokenBytes(p), int64_t{1} << 20);
  CpReplayOptions opt;
  opt.threads = 1;
  opt.workers = 2;
  absl::StatusOr<CpReplayRun> run = RunCpReplay(p, schedule, opt);
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(run->execution, CpExecution::kLockstep);
  EXPECT_EQ(run->rounds, 8);
  const CpCombined det = CombineDeterministic(p, run->states, 1);
  ExpectBitIdentical(det.out, c->single.replay_out, "deterministic out");
}

TEST(CpReplayTest, CancelledBeforeTheFirstStep) {
  const auto c = MakeCpCase({CpSharding::kPageInterleaved, 3, 1}, {});
  ASSERT_NE(c, nullptr);
  const PreparedAttention& p = c->prepared;
  const CpShards shards = PlanShards(p.units, 3, p.dims.page_size);
  const CpSchedule schedule(shards, CpReplayStrategy::kRing, p.dims.kv_heads,
                            CpTokenBytes(p), int64_t{1} << 20);
  for (CpExecution e : {CpExecution::kLockstep, CpExecution::kThreadPerRank}) {
    std::atomic<bool> cancelled{true};
    CpReplayOptions opt;
    opt.execution = e;
    opt.cancelled = &cancelled;
    absl::StatusOr<CpReplayRun> run = RunCpReplay(p, schedule, opt);
    EXPECT_EQ(run.status().code(), absl::StatusCode::kCancelled)
        << CpExecutionName(e);
  }
}

TEST(CpReplayTest, BuffersOverTheLimitAreRefused) {
  const auto c = MakeCpCase({CpSharding::kPageInterleaved, 4, 1}, {});
  ASSERT_NE(c, nullptr);
  const PreparedAttention& p = c->prepared;
  const CpShards shards = PlanShards(p.units, 4, p.dims.page_size);
  const CpSchedule schedule(shards, CpReplayStrategy::kRing, p.dims.kv_heads,
                            CpTokenBytes(p), int64_t{1} << 20);
  CpReplayOptions opt;
  opt.max_buffer_bytes = 1024;
  absl::StatusOr<CpReplayRun> run = RunCpReplay(p, schedule, opt);
  EXPECT_EQ(run.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(run.status().message().find("cp.world_size"), std::string::npos)
      << run.status();
}

}  // namespace
}  // namespace testing
}  // namespace attnaudit
