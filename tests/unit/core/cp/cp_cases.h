// Small CP snapshots for the schedule and replay tests: random logical
// cases laid out under each sharding, validated and prepared, with the
// single-rank R and P to compare against.
#ifndef ATTNAUDIT_TESTS_UNIT_CORE_CP_CP_CASES_H_
#define ATTNAUDIT_TESTS_UNIT_CORE_CP_CP_CASES_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/attention/attention.h"
#include "core/attention/unit_states.h"
#include "core/validate/validate.h"
#include "gtest/gtest.h"
#include "tests/unit/core/testing/snapshot_builder.h"

namespace attnaudit {
namespace testing {

// How a case shards its keys.
struct CpLayout {
  CpSharding sharding = CpSharding::kPageInterleaved;
  int64_t world = 2;
  int64_t interleave = 1;  // token interleaving only
};

inline std::string Describe(const CpLayout& l) {
  const char* name = l.sharding == CpSharding::kExplicitOwners    ? "owners"
                     : l.sharding == CpSharding::kPageInterleaved ? "page"
                                                                  : "token";
  return absl::StrCat(name, " W=", l.world,
                      l.sharding == CpSharding::kTokenInterleaved
                          ? absl::StrCat(" I=", l.interleave)
                          : std::string());
}

// A validated, prepared snapshot and its single-rank R and P. Heap
// allocated: PreparedAttention points into it.
struct CpCase {
  Snapshot snapshot;
  ResolvedLayout layout;
  PreparedAttention prepared;
  AttentionResults single;  // R and P of the single-rank pass
  UnitStates states;        // its unit states, R's included
};

struct CpCaseOptions {
  DType kv_dtype = DType::kBF16;
  int64_t page_size = 4;
  // Rows shorter than the world size, unequal rows, one longer row.
  std::vector<int64_t> seq_lens = {2, 23, 9};
  int64_t window = 0;
  bool sinks = false;
  bool hnd = false;
  bool pre_rope_k = false;
  uint64_t seed = 1;
};

inline std::unique_ptr<CpCase> MakeCpCase(const CpLayout& l,
                                          const CpCaseOptions& o) {
  RandomCaseOptions r;
  r.batch = static_cast<int64_t>(o.seq_lens.size());
  r.queries = 2;
  r.q_heads = 6;
  r.kv_heads = 3;
  r.head_dim = 16;
  r.seq_lens = o.seq_lens;
  r.max_gap = 1;
  r.position_offset = 5;
  r.spread_queries = true;
  r.kv_dtype = o.kv_dtype;
  r.q_std = 1.5;  // peaked enough that a wrong weight shows
  r.seed = o.seed;
  LogicalCase c = RandomCase(r);
  c.sliding_window = o.window;
  if (o.sinks) c.sinks = {0.5f, -1.0f, 2.0f, 0.0f, 1.0f, 3.0f};
  if (o.pre_rope_k) {
    c.rope.k_state = RopeState::kPreRope;
    c.rope.theta = 10000.0;
  }
  PagingOptions p;
  p.page_size = o.page_size;
  p.permute_pages = true;
  p.layout = o.hnd ? KvLayout::kHND : KvLayout::kNHD;
  p.sharding = l.sharding;
  p.cp_world_size = l.world;
  p.interleave_size = l.interleave;
  p.owner_seed = o.seed + 11;
  auto out = std::make_unique<CpCase>();
  out->snapshot = BuildSnapshot(c, p);
  absl::StatusOr<ResolvedLayout> layout = ValidateSnapshot(out->snapshot);
  EXPECT_TRUE(layout.ok()) << layout.status();
  if (!layout.ok()) return nullptr;
  out->layout = *layout;
  absl::StatusOr<PreparedAttention> prepared =
      PrepareAttention(out->snapshot, out->layout, 2);
  EXPECT_TRUE(prepared.ok()) << prepared.status();
  if (!prepared.ok()) return nullptr;
  out->prepared = *std::move(prepared);
  out->states.has_reference = true;
  AttentionRunOptions run;
  run.threads = 2;
  run.unit_states = &out->states;
  absl::StatusOr<AttentionResults> single =
      ComputeAttention(out->prepared, run);
  EXPECT_TRUE(single.ok()) << single.status();
  if (!single.ok()) return nullptr;
  out->single = *std::move(single);
  return out;
}

// Every CP layout of the test matrix for one world size: explicit owners,
// page interleaving, and token interleaving with I in {1, 3, page size}.
inline std::vector<CpLayout> LayoutsFor(int64_t world, int64_t page_size) {
  std::vector<CpLayout> out;
  out.push_back({CpSharding::kExplicitOwners, world, 1});
  out.push_back({CpSharding::kPageInterleaved, world, 1});
  for (int64_t i : {int64_t{1}, int64_t{3}, page_size}) {
    out.push_back({CpSharding::kTokenInterleaved, world, i});
  }
  return out;
}

}  // namespace testing
}  // namespace attnaudit

#endif  // ATTNAUDIT_TESTS_UNIT_CORE_CP_CP_CASES_H_
