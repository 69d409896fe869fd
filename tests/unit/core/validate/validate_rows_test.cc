// Phase 3 rules: sequence lengths, block table, page ids, CP owners,
// logical positions, inactive slots, key RoPE positions, query positions.
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/validate/validate.h"
#include "gtest/gtest.h"
#include "tests/unit/core/testing/snapshot_builder.h"
#include "tests/unit/core/validate/validate_test_util.h"

namespace attnaudit {
namespace testing {
namespace {

// Default fixture: B=2, P=2, kv_seq_lens [6, 6], 6 pages, M=3, positions
// 0..5 per row, queries [[4,5],[4,5]], pages permuted.
constexpr int64_t kP = 2;

void SetSlot(Tensor* t, int64_t page, int64_t slot, int64_t v) {
  SetInt(t, page * kP + slot, v);
}

// Sets both slot_positions and key_rope_positions of one slot.
void SetPosition(Snapshot* s, int64_t page, int64_t slot, int64_t v) {
  SetSlot(&s->slot_positions, page, slot, v);
  SetSlot(&s->key_rope_positions, page, slot, v);
}

// A page no row references (spec.spare_pages > 0).
int64_t SparePage(const Snapshot& s) {
  const SnapshotDims d = DimsOf(s);
  for (int64_t page = 0; page < d.num_pages; ++page) {
    bool used = false;
    for (int64_t i = 0; i < d.batch * d.max_blocks; ++i) {
      used |= GetInt(s.block_table, i) == page;
    }
    if (!used) return page;
  }
  return -1;
}

SnapshotSpec Spec(std::vector<int64_t> lens, int64_t extra_blocks = 0,
                  int64_t spare_pages = 0) {
  SnapshotSpec spec;
  spec.seq_lens = std::move(lens);
  spec.extra_blocks = extra_blocks;
  spec.spare_pages = spare_pages;
  return spec;
}

SnapshotSpec WithPageIds() {
  SnapshotSpec spec;
  spec.with_page_ids = true;
  return spec;
}

class RowsTest : public ::testing::TestWithParam<InvalidCase> {};

TEST_P(RowsTest, Rejects) { RunInvalidCase(GetParam()); }

std::vector<InvalidCase> SeqLenAndTableCases() {
  return {
      {"SeqLenZero",
       [](Snapshot* s, ValidationLimits*) { SetInt(&s->kv_seq_lens, 1, 0); },
       "kv_seq_lens[1]", "0 is outside [1, 6]"},
      {"SeqLenNegative",
       [](Snapshot* s, ValidationLimits*) { SetInt(&s->kv_seq_lens, 0, -3); },
       "kv_seq_lens[0]", "-3 is outside [1, 6]"},
      {"SeqLenAboveCapacity",
       [](Snapshot* s, ValidationLimits*) { SetInt(&s->kv_seq_lens, 0, 7); },
       "kv_seq_lens[0]", "7 is outside [1, 6]"},
      {"PageOutOfRange",
       [](Snapshot* s, ValidationLimits*) { SetInt(&s->block_table, 1, 6); },
       "block_table[0][1]", "page 6 is out of range [0, 6)"},
      {"ActiveEntryMinusOne",
       [](Snapshot* s, ValidationLimits*) { SetInt(&s->block_table, 5, -1); },
       "block_table[1][2]", "page -1 is out of range [0, 6)"},
      {"DuplicatePageInRow",
       [](Snapshot* s, ValidationLimits*) {
         SetInt(&s->block_table, 2, GetInt(s->block_table, 0));
       },
       "block_table[0][2]", "already used by block 0 of this row"},
      // Harness acceptance case 19: an extra column that is not -1.
      {"UnusedEntryNotMinusOne",
       [](Snapshot* s, ValidationLimits*) { SetInt(&s->block_table, 3, 0); },
       "block_table[0][3]", "unused block_table entries must be -1",
       Spec({6, 6}, /*extra_blocks=*/1)},
      {"SeqLenShorterThanTable",
       [](Snapshot* s, ValidationLimits*) { SetInt(&s->kv_seq_lens, 1, 4); },
       "block_table[1][2]", "kv_seq_lens[1] needs 2 blocks"},
      {"PageIdNegative",
       [](Snapshot* s, ValidationLimits*) { SetInt(&s->page_ids, 2, -5); },
       "page_ids[2]", "negative", WithPageIds()},
      {"PageIdDuplicate",
       [](Snapshot* s, ValidationLimits*) {
         SetInt(&s->page_ids, 4, GetInt(s->page_ids, 1));
       },
       "page_ids[4]", "duplicate page id 1007 (also page_ids[1])",
       WithPageIds()},
      {"EntryNotInPageIds",
       [](Snapshot* s, ValidationLimits*) { SetInt(&s->block_table, 0, 3); },
       "block_table[0][0]", "page id 3 is not in page_ids", WithPageIds()},
  };
}
INSTANTIATE_TEST_SUITE_P(SeqLenAndTable, RowsTest,
                         ::testing::ValuesIn(SeqLenAndTableCases()), CaseName);

std::vector<InvalidCase> OwnerCases() {
  return {
      // Harness acceptance case 20.
      {"ActiveOwnerNegative",
       [](Snapshot* s, ValidationLimits*) {
         SetExplicitOwners(s, 2, {{0, -1, 0}, {0, 1, 0}});
       },
       "cp.block_owners[0][1]", "active cp_block_owners"},
      {"ActiveOwnerAtWorldSize",
       [](Snapshot* s, ValidationLimits*) {
         SetExplicitOwners(s, 2, {{0, 1, 0}, {0, 1, 2}});
       },
       "cp.block_owners[1][2]", "must be in [0, 2), got 2"},
      // Harness acceptance case 21: block_table tail -1, owner tail 0.
      {"UnusedOwnerNotMinusOne",
       [](Snapshot* s, ValidationLimits*) {
         SetExplicitOwners(s, 2, {{0, 1, 0, 0}, {0, 1, 0}});
       },
       "cp.block_owners[0][3]", "unused cp_block_owners entries must be -1",
       Spec({6, 6}, /*extra_blocks=*/1)},
  };
}
INSTANTIATE_TEST_SUITE_P(Owners, RowsTest, ::testing::ValuesIn(OwnerCases()),
                         CaseName);

std::vector<InvalidCase> PositionCases() {
  return {
      // Harness acceptance case 25: the first slot's position becomes 1,
      // so logical tokens 0 and 1 both claim position 1.
      {"PageIdentityBroken",
       [](Snapshot* s, ValidationLimits*) {
         SetPosition(s, PageOfBlock(*s, 0, 0), 0, 1);
       },
       "slot_positions", "strictly increasing global order"},
      {"ActiveSlotNegative",
       [](Snapshot* s, ValidationLimits*) {
         SetPosition(s, PageOfBlock(*s, 1, 1), 0, -1);
       },
       "slot_positions", "row 1 logical token 2"},
      {"BlocksOutOfOrder",  // swap row 0's first two blocks
       [](Snapshot* s, ValidationLimits*) {
         const int64_t a = GetInt(s->block_table, 0);
         SetInt(&s->block_table, 0, GetInt(s->block_table, 1));
         SetInt(&s->block_table, 1, a);
       },
       "slot_positions", "has position 0 after 3"},
      {"PartialPageTailNotMinusOne",
       [](Snapshot* s, ValidationLimits*) {
         SetSlot(&s->slot_positions, PageOfBlock(*s, 0, 2), 1, 5);
       },
       "slot_positions", "unused slot_positions entries must be -1",
       Spec({5, 6})},
      {"SparePageNotMinusOne",
       [](Snapshot* s, ValidationLimits*) {
         SetSlot(&s->slot_positions, SparePage(*s), 0, 9);
       },
       "slot_positions", "got 9", Spec({6, 6}, 0, /*spare_pages=*/1)},
      {"KeyRopeTailNotMinusOne",
       [](Snapshot* s, ValidationLimits*) {
         SetSlot(&s->key_rope_positions, PageOfBlock(*s, 0, 2), 1, 5);
       },
       "key_rope_positions", "unused key_rope_positions entries must be -1",
       Spec({5, 6})},
      {"KeyRopeMismatchOnActiveSlot",
       [](Snapshot* s, ValidationLimits*) {
         SetSlot(&s->key_rope_positions, PageOfBlock(*s, 1, 0), 1, 7);
       },
       "key_rope_positions", "7 must match the cached global position 1"},
      {"QueryNotInCache",
       [](Snapshot* s, ValidationLimits*) {
         SetInt(&s->query_positions, 1, 6);
       },
       "query_positions[0][1]", "must refer to a token present in row 0"},
      {"QueryNotIncreasing",
       [](Snapshot* s, ValidationLimits*) {
         SetInt(&s->query_positions, 2, 5);
         SetInt(&s->query_positions, 3, 4);
       },
       "query_positions[1][1]", "strictly increasing"},
      {"QueryRepeated",
       [](Snapshot* s, ValidationLimits*) {
         SetInt(&s->query_positions, 0, 5);
       },
       "query_positions[0][1]", "strictly increasing"},
      {"QueryNegative",
       [](Snapshot* s, ValidationLimits*) {
         SetInt(&s->query_positions, 0, -1);
       },
       "query_positions[0][0]", "negative"},
      {"QueryInGap",
       [](Snapshot* s, ValidationLimits*) {
         SetInt(&s->query_positions, 2, 9);  // positions are 0, 2, ..., 10
       },
       "query_positions[1][0]", "present in row 1",
       [] {
         SnapshotSpec spec;
         spec.position_stride = 2;
         return spec;
       }()},
  };
}
INSTANTIATE_TEST_SUITE_P(Positions, RowsTest,
                         ::testing::ValuesIn(PositionCases()), CaseName);

// The error names the exact slot of the first offending logical token.
TEST(RowsPathTest, IncreasingOrderErrorNamesFirstOffendingSlot) {
  Snapshot s = BuildSnapshot({});
  const int64_t page = PageOfBlock(s, 0, 0);
  SetPosition(&s, page, 0, 1);  // token 0 -> 1; token 1 is also 1
  EXPECT_TRUE(IsInvalid(ValidateSnapshot(s),
                        absl::StrCat("slot_positions[", page, "][1]"),
                        "row 0 logical token 1"));
}

TEST(RowsPathTest, UnusedSlotErrorNamesSlot) {
  SnapshotSpec spec;
  spec.seq_lens = {6, 5};
  Snapshot s = BuildSnapshot(spec);
  const int64_t page = PageOfBlock(s, 1, 2);
  SetSlot(&s.slot_positions, page, 1, 5);
  EXPECT_TRUE(IsInvalid(ValidateSnapshot(s),
                        absl::StrCat("slot_positions[", page, "][1]"),
                        "got 5"));
}

// A page shared by two rows of different lengths: the slot the shorter row
// does not reach is still active through the longer row, so it keeps its
// position; a slot neither row reaches must be -1.
TEST(RowsSharedPageTest, TailRuleAppliesOnlyToSlotsNoRowUses) {
  SnapshotSpec spec;
  spec.seq_lens = {3, 6};
  spec.shared_prefix_blocks = 2;
  Snapshot s = BuildSnapshot(spec);
  const int64_t shared = PageOfBlock(s, 0, 1);
  ASSERT_EQ(shared, PageOfBlock(s, 1, 1));
  EXPECT_EQ(GetInt(s.slot_positions, shared * kP + 1), 3);
  EXPECT_TRUE(IsValid(ValidateSnapshot(s)));

  // Now row 1 is also short: slot 1 of the shared page is used by no row.
  SnapshotSpec spec2 = spec;
  spec2.seq_lens = {3, 3};
  Snapshot t = BuildSnapshot(spec2);
  const int64_t page = PageOfBlock(t, 0, 1);
  ASSERT_TRUE(IsValid(ValidateSnapshot(t)));
  SetPosition(&t, page, 1, 3);
  EXPECT_TRUE(IsInvalid(ValidateSnapshot(t),
                        absl::StrCat("slot_positions[", page, "][1]"),
                        "unused"));
}

}  // namespace
}  // namespace testing
}  // namespace attnaudit
