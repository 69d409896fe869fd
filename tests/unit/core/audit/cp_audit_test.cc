// The audit's context-parallel section on simulated CP engines (sim/):
// clean sharded engines pass everywhere; every CP fault is DRIFT over at
// least 50 random placements (model shapes, world sizes, shardings,
// interleaves, contexts, dtypes, ranks picked from the seed) and is
// attributed right: a per-rank fault makes the faulted rank and only it
// DRIFT in cp.ranks while cp.combine passes; drop-shard and bf16-combine
// leave every rank passing and make cp.combine DRIFT.
#include <functional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/audit/audit.h"
#include "gtest/gtest.h"
#include "sim/simulator.h"
#include "tests/unit/core/testing/snapshot_builder.h"

namespace attnaudit {
namespace {

using testing::TestRng;

// One random CP placement.
SynthOptions RandomPlacement(uint64_t seed, CpFault fault) {
  TestRng rng(seed * 7919 + static_cast<uint64_t>(fault));
  static const char* kPresets[] = {"llama3-8b", "glm4-9b", "gpt-oss-20b",
                                   "qwen3-8b"};
  static const int64_t kWorlds[] = {2, 3, 4, 5, 8};
  static const CpSharding kShardings[] = {CpSharding::kExplicitOwners,
                                          CpSharding::kTokenInterleaved,
                                          CpSharding::kPageInterleaved};
  SynthOptions o;
  o.preset = kPresets[rng.UniformInt(0, 3)];
  o.layer = rng.UniformInt(0, 1);  // gpt-oss: window on even layers
  o.batch = 2;
  o.queries = rng.UniformInt(1, 2);
  o.page_size = rng.UniformInt(0, 1) == 0 ? 8 : 16;
  o.context = rng.UniformInt(24, 160);
  o.kv_dtype = rng.UniformInt(0, 5) == 0   ? DType::kF32
               : rng.UniformInt(0, 4) == 0 ? DType::kF8E4M3
                                           : DType::kBF16;
  o.permute_pages = true;
  o.vocab = 32;
  o.threads = 2;
  o.seed = seed;
  o.cp_world_size = kWorlds[rng.UniformInt(0, 4)];
  o.cp_sharding = kShardings[rng.UniformInt(0, 2)];
  const int64_t interleaves[] = {1, 3, o.page_size};
  o.cp_interleave = interleaves[rng.UniformInt(0, 2)];
  o.cp_fault = fault;
  return o;
}

std::string Describe(const SynthOptions& o, const SynthDetails& d) {
  return absl::StrCat(o.preset, " W=", o.cp_world_size,
                      " sharding=", static_cast<int>(o.cp_sharding),
                      " I=", o.cp_interleave, " P=", o.page_size,
                      " L=", o.context, " kv=", DTypeName(o.kv_dtype),
                      " seed=", o.seed, " fault: ", d.fault);
}

AuditReport Audit(const Snapshot& s, CpStrategy strategy) {
  AuditOptions options;
  options.threads = 2;
  options.cp_strategy = strategy;
  absl::StatusOr<AuditReport> report = AuditSnapshot(s, options);
  EXPECT_TRUE(report.ok()) << report.status();
  return report.ok() ? *std::move(report) : AuditReport();
}

// Runs placements until `want` of them could carry the fault (a fault
// that cannot show on a placement is refused by the simulator).
void ForPlacements(
    CpFault fault, int want,
    const std::function<void(const SynthOptions&, const SynthDetails&,
                             const Snapshot&)>& check) {
  int accepted = 0;
  uint64_t seed = 1;
  for (; accepted < want && seed < static_cast<uint64_t>(want) * 3; ++seed) {
    const SynthOptions o = RandomPlacement(seed, fault);
    SynthDetails details;
    absl::StatusOr<Snapshot> s = Synthesize(o, &details);
    if (!s.ok()) {
      ASSERT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument)
          << s.status();
      continue;
    }
    ++accepted;
    check(o, details, *s);
  }
  EXPECT_EQ(accepted, want) << CpFaultName(fault);
}

TEST(CpAuditTest, CleanShardedEnginesPassEverywhere) {
  ForPlacements(
      CpFault::kNone, 20,
      [](const SynthOptions& o, const SynthDetails& d, const Snapshot& s) {
        for (CpStrategy strategy : {CpStrategy::kRing, CpStrategy::kPartials}) {
          const AuditReport r = Audit(s, strategy);
          const std::string what = Describe(o, d);
          EXPECT_EQ(r.verdict, Verdict::kPass) << what;
          ASSERT_TRUE(r.cp.present) << what;
          EXPECT_TRUE(r.cp.skipped.empty()) << what;
          EXPECT_TRUE(r.cp.deterministic_matches_replay) << what;
          EXPECT_EQ(r.cp.engine_order.verdict, Verdict::kPass) << what;
          EXPECT_EQ(r.cp.deterministic.verdict, Verdict::kPass) << what;
          ASSERT_EQ(r.cp.ranks.size(), static_cast<size_t>(o.cp_world_size));
          for (const CpRankCheck& rank : r.cp.ranks) {
            EXPECT_EQ(rank.check.verdict, Verdict::kPass)
                << what << " rank " << rank.rank;
          }
          EXPECT_TRUE(r.cp.has_combine);
          EXPECT_EQ(r.cp.combine.verdict, Verdict::kPass) << what;
          EXPECT_EQ(r.provenance.timings.cp_rank_compute_seconds.size(),
                    static_cast<size_t>(o.cp_world_size));
        }
      });
}

void ExpectRankFault(CpFault fault) {
  ForPlacements(
      fault, 50,
      [](const SynthOptions& o, const SynthDetails& d, const Snapshot& s) {
        const AuditReport r = Audit(s, CpStrategy::kAuto);
        const std::string what = Describe(o, d);
        EXPECT_EQ(r.verdict, Verdict::kDrift) << what;
        ASSERT_GE(d.cp_fault_rank, 0) << what;
        ASSERT_EQ(r.cp.ranks.size(), static_cast<size_t>(o.cp_world_size));
        for (const CpRankCheck& rank : r.cp.ranks) {
          EXPECT_EQ(rank.check.verdict, rank.rank == d.cp_fault_rank
                                            ? Verdict::kDrift
                                            : Verdict::kPass)
              << what << " rank " << rank.rank;
        }
        EXPECT_EQ(r.cp.combine.verdict, Verdict::kPass) << what;
      });
}

void ExpectCombineFault(CpFault fault) {
  ForPlacements(
      fault, 50,
      [](const SynthOptions& o, const SynthDetails& d, const Snapshot& s) {
        const AuditReport r = Audit(s, CpStrategy::kAuto);
        const std::string what = Describe(o, d);
        EXPECT_EQ(r.verdict, Verdict::kDrift) << what;
        ASSERT_EQ(r.cp.ranks.size(), static_cast<size_t>(o.cp_world_size));
        for (const CpRankCheck& rank : r.cp.ranks) {
          EXPECT_EQ(rank.check.verdict, Verdict::kPass)
              << what << " rank " << rank.rank;
        }
        EXPECT_EQ(r.cp.combine.verdict, Verdict::kDrift) << what;
      });
}

TEST(CpAuditTest, LseBase2OnOneRankBlamesThatRank) {
  ExpectRankFault(CpFault::kLseBase2Rank);
}
TEST(CpAuditTest, GarbageFromAnEmptyRankBlamesThatRank) {
  ExpectRankFault(CpFault::kEmptyRankGarbage);
}
TEST(CpAuditTest, AStalePageOfOneShardBlamesThatRank) {
  ExpectRankFault(CpFault::kStaleRankPage);
}
TEST(CpAuditTest, ADroppedShardBlamesTheCombine) {
  ExpectCombineFault(CpFault::kDropShard);
}
TEST(CpAuditTest, ABf16CombineBlamesTheCombine) {
  ExpectCombineFault(CpFault::kBf16Combine);
}

TEST(CpAuditTest, AnExplicitRankIsHonouredOrRefusedNamingTheOption) {
  SynthOptions o = RandomPlacement(3, CpFault::kLseBase2Rank);
  o.cp_sharding = CpSharding::kPageInterleaved;
  o.cp_world_size = 4;
  o.context = 200;
  o.cp_fault_rank = 2;
  SynthDetails d;
  absl::StatusOr<Snapshot> s = Synthesize(o, &d);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(d.cp_fault_rank, 2);
  const AuditReport r = Audit(*s, CpStrategy::kRing);
  EXPECT_EQ(r.cp.strategy, "ring");
  EXPECT_FALSE(r.cp.strategy_chosen);
  EXPECT_EQ(r.cp.ranks[2].check.verdict, Verdict::kDrift);
  // Rank 3 holds no key of a 20-token row with 16-token pages.
  o.context = 20;
  o.batch = 1;
  o.page_size = 16;
  o.cp_fault_rank = 3;
  absl::StatusOr<Snapshot> refused = Synthesize(o, &d);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("cp_fault_rank"), std::string::npos)
      << refused.status();
}

TEST(CpAuditTest, TheSectionDescribesTheShardsAndTheRun) {
  SynthOptions o = RandomPlacement(5, CpFault::kNone);
  o.cp_world_size = 3;
  o.cp_sharding = CpSharding::kTokenInterleaved;
  o.cp_interleave = 1;
  o.context = 10;
  o.batch = 2;
  o.queries = 1;
  absl::StatusOr<Snapshot> s = Synthesize(o);
  ASSERT_TRUE(s.ok()) << s.status();
  const AuditReport r = Audit(*s, CpStrategy::kAuto);
  EXPECT_EQ(r.cp.strategy, "partials");
  EXPECT_TRUE(r.cp.strategy_chosen);
  EXPECT_EQ(r.cp.world_size, 3);
  EXPECT_EQ(r.cp.sharding, CpSharding::kTokenInterleaved);
  ASSERT_EQ(r.cp.shard_tokens.size(), 2u);
  // Row 0: positions 0..9 -> 4, 3, 3 tokens; row 1 (length 3, positions
  // 1003..1005) -> one token each on ranks 1, 2, 0.
  EXPECT_EQ(r.cp.shard_tokens[0], (std::vector<int64_t>{4, 3, 3}));
  EXPECT_EQ(r.cp.shard_tokens[1], (std::vector<int64_t>{1, 1, 1}));
  EXPECT_EQ(r.cp.rounds, 1);
  const AuditReport ring = Audit(*s, CpStrategy::kRing);
  EXPECT_EQ(ring.cp.rounds, 3);
  EXPECT_GT(ring.cp.steps, 0);
}

TEST(CpAuditTest, OverTheStateLimitTheReplayIsSkippedNotFailed) {
  absl::StatusOr<Snapshot> s = Synthesize(RandomPlacement(9, CpFault::kNone));
  ASSERT_TRUE(s.ok()) << s.status();
  AuditOptions options;
  options.max_cp_state_bytes = 1000;
  absl::StatusOr<AuditReport> r = AuditSnapshot(*s, options);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->cp.present);
  EXPECT_NE(r->cp.skipped.find("over the limit"), std::string::npos)
      << r->cp.skipped;
  EXPECT_TRUE(r->cp.ranks.empty());
  EXPECT_EQ(r->verdict, Verdict::kPass);
}

}  // namespace
}  // namespace attnaudit
