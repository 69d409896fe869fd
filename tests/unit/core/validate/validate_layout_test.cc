// Valid snapshots pass, and the ResolvedLayout / TokenOwner of a
// hand-built snapshot match hand-computed values for every sharding rule.
#include <functional>
#include <string>
#include <vector>

#include "core/validate/validate.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/core/testing/snapshot_builder.h"
#include "tests/unit/core/validate/validate_test_util.h"

namespace attnaudit {
namespace testing {
namespace {

using ::testing::ElementsAre;

struct ValidCase {
  std::string name;
  SnapshotSpec spec;
  std::function<void(Snapshot*)> mutate = [](Snapshot*) {};
};

std::ostream& operator<<(std::ostream& os, const ValidCase& c) {
  return os << c.name;
}

class ValidTest : public ::testing::TestWithParam<ValidCase> {};

TEST_P(ValidTest, Passes) {
  Snapshot s = BuildSnapshot(GetParam().spec);
  GetParam().mutate(&s);
  const absl::StatusOr<ResolvedLayout> layout = ValidateSnapshot(s);
  ASSERT_TRUE(IsValid(layout));
  // The layout agrees with the block table it came from.
  const SnapshotSpec& spec = GetParam().spec;
  ASSERT_EQ(layout->block_pages.size(), spec.seq_lens.size());
  for (size_t b = 0; b < spec.seq_lens.size(); ++b) {
    EXPECT_EQ(layout->seq_lens[b], spec.seq_lens[b]);
    const size_t blocks =
        static_cast<size_t>(CeilDiv(spec.seq_lens[b], spec.page_size));
    ASSERT_EQ(layout->block_pages[b].size(), blocks);
    ASSERT_EQ(layout->block_owners[b].size(), blocks);
    for (size_t j = 0; j < blocks; ++j) {
      EXPECT_EQ(
          layout->block_pages[b][j],
          PageOfBlock(s, static_cast<int64_t>(b), static_cast<int64_t>(j)));
    }
  }
}

SnapshotSpec With(std::function<void(SnapshotSpec*)> f) {
  SnapshotSpec spec;
  f(&spec);
  return spec;
}

std::vector<ValidCase> ValidCases() {
  return {
      {"Baseline", {}},
      {"HarnessSharedPages",
       With([](SnapshotSpec* s) { s->shared_prefix_blocks = 3; })},
      {"NonzeroOffset128",
       With([](SnapshotSpec* s) { s->position_offset = 128; })},
      {"Offset4096Gapped", With([](SnapshotSpec* s) {
         s->position_offset = 4096;
         s->position_stride = 5;
       })},
      {"PartialLastPage", With([](SnapshotSpec* s) {
         s->seq_lens = {5, 6};
       })},
      {"OneTokenRow", With([](SnapshotSpec* s) {
         s->seq_lens = {1, 6};
         s->queries = 1;
       })},
      {"QueriesAnywhereInCache", With([](SnapshotSpec* s) {
         s->query_positions = {{0, 3}, {1, 5}};
       })},
      {"SharedPrefixDifferentLengths", With([](SnapshotSpec* s) {
         s->seq_lens = {3, 6};
         s->shared_prefix_blocks = 2;
       })},
      {"HndLayout", With([](SnapshotSpec* s) {
         s->kv_layout = KvLayout::kHND;
         s->seq_lens = {5, 6};
       })},
      {"PageIds", With([](SnapshotSpec* s) {
         s->with_page_ids = true;
         s->spare_pages = 1;
       })},
      {"I64Indices", With([](SnapshotSpec* s) {
         s->index_dtype = DType::kI64;
         s->with_page_ids = true;
       })},
      {"NoKeyRopePositions",
       With([](SnapshotSpec* s) { s->with_key_rope_positions = false; })},
      {"SparePagesAndExtraColumns", With([](SnapshotSpec* s) {
         s->spare_pages = 3;
         s->extra_blocks = 2;
       })},
      {"UnpermutedPages",
       With([](SnapshotSpec* s) { s->permute_pages = false; })},
      {"Bf16", With([](SnapshotSpec* s) {
         s->q_dtype = DType::kBF16;
         s->kv_dtype = DType::kBF16;
       })},
      {"F16F64", With([](SnapshotSpec* s) {
         s->q_dtype = DType::kF64;
         s->kv_dtype = DType::kF16;
       })},
      {"Fp8E4M3PerTensorScales",
       With([](SnapshotSpec* s) { s->kv_dtype = DType::kF8E4M3; }),
       [](Snapshot* s) {
         s->k_scale = MakeFloatTensor(DType::kF32, {}, {0.25});
         s->v_scale = MakeFloatTensor(DType::kF32, {}, {3.0});
       }},
      {"Fp8E5M2PerHeadScales",
       With([](SnapshotSpec* s) { s->kv_dtype = DType::kF8E5M2; }),
       [](Snapshot* s) {
         s->k_scale = MakeFloatTensor(DType::kF32, {2}, {0.5, 2.0});
       }},
      {"HeadsOneToOne", With([](SnapshotSpec* s) { s->kv_heads = 4; })},
      {"SingleKvHead", With([](SnapshotSpec* s) { s->kv_heads = 1; })},
      {"ExplicitOwnersHarness",
       {},
       [](Snapshot* s) {
         SetExplicitOwners(s, 2, {{0, 1, 0}, {0, 1, 0}});
       }},
      {"TokenInterleaved",
       {},
       [](Snapshot* s) {
         s->cp.world_size = 2;
         s->cp.sharding = CpSharding::kTokenInterleaved;
         s->cp.interleave_size = 3;
       }},
      {"PageInterleavedOddWorld",
       {},
       [](Snapshot* s) {
         s->cp.world_size = 3;
         s->cp.sharding = CpSharding::kPageInterleaved;
         s->cp.rank_out = Tensor(DType::kF32, {3, 2, 2, 4, 8});
         s->cp.rank_lse = Tensor(DType::kF32, {3, 2, 2, 4});
       }},
      {"EngineOutputsAndLogprobs",
       {},
       [](Snapshot* s) {
         AddEngineOutputs(s, DType::kBF16);
         AddLogprobInputs(s, 11);
         s->engine.logprobs = Tensor(DType::kF32, {2, 2});
         SetInt(&s->active_mask, 2, 0);
       }},
  };
}

INSTANTIATE_TEST_SUITE_P(Variants, ValidTest, ::testing::ValuesIn(ValidCases()),
                         [](const ::testing::TestParamInfo<ValidCase>& i) {
                           return i.param.name;
                         });

// Hand-built snapshot, P=4, 5 pages, gapped positions from offset 100
// (step 3), rows of 9 and 6 tokens sharing page 3 as their first block;
// page 2 unused; the last pages of both rows partially used.
//   page 0: 112 115 118 121   (row 0 block 1)
//   page 1: 112 115  -1  -1   (row 1 block 1)
//   page 2:  -1  -1  -1  -1   (spare)
//   page 3: 100 103 106 109   (block 0 of both rows)
//   page 4: 124  -1  -1  -1   (row 0 block 2)
Snapshot HandSnapshot(KvLayout layout, bool with_page_ids) {
  Snapshot s;
  s.kv_layout = layout;
  s.q = Tensor(DType::kF32, {2, 1, 2, 4});
  FillUniform(&s.q, 1);
  const std::vector<int64_t> pool = layout == KvLayout::kNHD
                                        ? std::vector<int64_t>{5, 4, 1, 4}
                                        : std::vector<int64_t>{5, 1, 4, 4};
  s.k_pages = Tensor(DType::kF32, pool);
  s.v_pages = Tensor(DType::kF32, pool);
  FillUniform(&s.k_pages, 2);
  FillUniform(&s.v_pages, 3);
  std::vector<int64_t> table = {3, 0, 4, -1, 3, 1, -1, -1};
  if (with_page_ids) {
    s.page_ids = MakeIntTensor(DType::kI64, {5}, {10, 20, 30, 40, 50});
    for (int64_t& e : table) e = e < 0 ? -1 : 10 * (e + 1);
  }
  s.block_table = MakeIntTensor(DType::kI32, {2, 4}, table);
  s.kv_seq_lens = MakeIntTensor(DType::kI32, {2}, {9, 6});
  s.slot_positions = MakeIntTensor(DType::kI32, {5, 4}, {112, 115, 118, 121,  //
                                                         112, 115, -1,  -1,   //
                                                         -1,  -1,  -1,  -1,   //
                                                         100, 103, 106, 109,  //
                                                         124, -1,  -1,  -1});
  s.query_positions = MakeIntTensor(DType::kI32, {2, 1}, {124, 115});
  return s;
}

class HandLayoutTest
    : public ::testing::TestWithParam<std::pair<KvLayout, bool>> {
 protected:
  Snapshot Make() const {
    return HandSnapshot(GetParam().first, GetParam().second);
  }
};

TEST_P(HandLayoutTest, ResolvesPagesAndDims) {
  const Snapshot s = Make();
  const absl::StatusOr<ResolvedLayout> layout = ValidateSnapshot(s);
  ASSERT_TRUE(IsValid(layout));
  EXPECT_EQ(layout->dims.batch, 2);
  EXPECT_EQ(layout->dims.queries, 1);
  EXPECT_EQ(layout->dims.q_heads, 2);
  EXPECT_EQ(layout->dims.kv_heads, 1);
  EXPECT_EQ(layout->dims.head_dim, 4);
  EXPECT_EQ(layout->dims.num_pages, 5);
  EXPECT_EQ(layout->dims.page_size, 4);
  EXPECT_EQ(layout->dims.max_blocks, 4);
  EXPECT_THAT(layout->seq_lens, ElementsAre(9, 6));
  ASSERT_EQ(layout->block_pages.size(), 2u);
  EXPECT_THAT(layout->block_pages[0], ElementsAre(3, 0, 4));
  EXPECT_THAT(layout->block_pages[1], ElementsAre(3, 1));
  EXPECT_THAT(layout->block_owners[0], ElementsAre(0, 0, 0));
  EXPECT_THAT(layout->block_owners[1], ElementsAre(0, 0));
  for (int64_t t = 0; t < 9; ++t) EXPECT_EQ(TokenOwner(s, *layout, 0, t), 0);
}

TEST_P(HandLayoutTest, PageInterleavedOwners) {
  Snapshot s = Make();
  s.cp.world_size = 2;
  s.cp.sharding = CpSharding::kPageInterleaved;
  const absl::StatusOr<ResolvedLayout> layout = ValidateSnapshot(s);
  ASSERT_TRUE(IsValid(layout));
  EXPECT_THAT(layout->block_owners[0], ElementsAre(0, 1, 0));
  EXPECT_THAT(layout->block_owners[1], ElementsAre(0, 1));
  // Tokens 0-3 block 0, 4-7 block 1, 8 block 2.
  const std::vector<int32_t> row0 = {0, 0, 0, 0, 1, 1, 1, 1, 0};
  for (int64_t t = 0; t < 9; ++t) {
    EXPECT_EQ(TokenOwner(s, *layout, 0, t), row0[t]) << t;
  }
  EXPECT_EQ(TokenOwner(s, *layout, 1, 5), 1);
}

TEST_P(HandLayoutTest, ExplicitOwners) {
  Snapshot s = Make();
  SetExplicitOwners(&s, 3, {{2, 0, 1}, {1, 2}});
  const absl::StatusOr<ResolvedLayout> layout = ValidateSnapshot(s);
  ASSERT_TRUE(IsValid(layout));
  EXPECT_THAT(layout->block_owners[0], ElementsAre(2, 0, 1));
  EXPECT_THAT(layout->block_owners[1], ElementsAre(1, 2));
  EXPECT_EQ(TokenOwner(s, *layout, 0, 3), 2);
  EXPECT_EQ(TokenOwner(s, *layout, 0, 4), 0);
  EXPECT_EQ(TokenOwner(s, *layout, 0, 8), 1);
  EXPECT_EQ(TokenOwner(s, *layout, 1, 0), 1);
  EXPECT_EQ(TokenOwner(s, *layout, 1, 5), 2);
}

// Token-interleaved owners follow the global position, not the index:
// row 0 positions 100,103,...,124; with I=8, world 2: position/8 =
// 12,12,13,13,14,14,14,15,15 -> ranks 0,0,1,1,0,0,0,1,1.
TEST_P(HandLayoutTest, TokenInterleavedUsesGlobalPositions) {
  Snapshot s = Make();
  s.cp.world_size = 2;
  s.cp.sharding = CpSharding::kTokenInterleaved;
  s.cp.interleave_size = 8;
  absl::StatusOr<ResolvedLayout> layout = ValidateSnapshot(s);
  ASSERT_TRUE(IsValid(layout));
  const std::vector<int32_t> row0 = {0, 0, 1, 1, 0, 0, 0, 1, 1};
  for (int64_t t = 0; t < 9; ++t) {
    EXPECT_EQ(TokenOwner(s, *layout, 0, t), row0[t]) << t;
  }
  // Block entries hold the rank of the block's first token.
  EXPECT_THAT(layout->block_owners[0], ElementsAre(0, 0, 1));
  EXPECT_THAT(layout->block_owners[1], ElementsAre(0, 0));
  // World 3, I=1: every position is 1 mod 3, so every token is on rank 1
  // (an index-based rule would give 0,1,2,0,...).
  s.cp.world_size = 3;
  s.cp.interleave_size = 1;
  layout = ValidateSnapshot(s);
  ASSERT_TRUE(IsValid(layout));
  for (int64_t t = 0; t < 9; ++t) EXPECT_EQ(TokenOwner(s, *layout, 0, t), 1);
  for (int64_t t = 0; t < 6; ++t) EXPECT_EQ(TokenOwner(s, *layout, 1, t), 1);
  EXPECT_THAT(layout->block_owners[0], ElementsAre(1, 1, 1));
}

TEST_P(HandLayoutTest, TokenOwnerOutOfRangeIsMinusOne) {
  Snapshot s = Make();
  s.cp.world_size = 2;
  s.cp.sharding = CpSharding::kPageInterleaved;
  const absl::StatusOr<ResolvedLayout> layout = ValidateSnapshot(s);
  ASSERT_TRUE(IsValid(layout));
  EXPECT_EQ(TokenOwner(s, *layout, 2, 0), -1);
  EXPECT_EQ(TokenOwner(s, *layout, -1, 0), -1);
  EXPECT_EQ(TokenOwner(s, *layout, 1, 6), -1);  // row 1 has 6 tokens
  EXPECT_EQ(TokenOwner(s, *layout, 0, -1), -1);
}

TEST_P(HandLayoutTest, QueryMustBeInOwnRow) {
  Snapshot s = Make();
  SetInt(&s.query_positions, 1, 118);  // in row 0's cache, not row 1's
  EXPECT_TRUE(IsInvalid(ValidateSnapshot(s), "query_positions[1][0]",
                        "present in row 1"));
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, HandLayoutTest,
    ::testing::Values(std::make_pair(KvLayout::kNHD, false),
                      std::make_pair(KvLayout::kHND, false),
                      std::make_pair(KvLayout::kNHD, true),
                      std::make_pair(KvLayout::kHND, true)));

// One page used by two rows at different logical block indices: valid when
// its positions fit both rows' order, rejected when they do not.
TEST(SharedPageTest, DifferentLogicalIndicesMustAgreeOnOrder) {
  Snapshot s = HandSnapshot(KvLayout::kNHD, false);
  // Row 1 = [page 3, page 0]: 100..109, 112..121, the same page 0 that is
  // row 0's block 1.
  s.block_table =
      MakeIntTensor(DType::kI32, {2, 4}, {3, 0, 4, -1, 3, 0, -1, -1});
  s.kv_seq_lens = MakeIntTensor(DType::kI32, {2}, {9, 8});
  s.slot_positions = MakeIntTensor(DType::kI32, {5, 4}, {112, 115, 118, 121,  //
                                                         -1,  -1,  -1,  -1,   //
                                                         -1,  -1,  -1,  -1,   //
                                                         100, 103, 106, 109,  //
                                                         124, -1,  -1,  -1});
  s.query_positions = MakeIntTensor(DType::kI32, {2, 1}, {124, 121});
  ASSERT_TRUE(IsValid(ValidateSnapshot(s)));
  // Page 0 at logical block 0 of row 1 and block 1 of row 0: row 1 then
  // continues with page 3 (100...) which goes backwards.
  s.block_table =
      MakeIntTensor(DType::kI32, {2, 4}, {3, 0, 4, -1, 0, 3, -1, -1});
  EXPECT_TRUE(IsInvalid(ValidateSnapshot(s), "slot_positions[3][0]",
                        "row 1 logical token 4"));
}

}  // namespace
}  // namespace testing
}  // namespace attnaudit
