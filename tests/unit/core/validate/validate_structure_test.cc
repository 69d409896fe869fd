// Phase 1 rules: presence, byte layouts, dtypes, ranks, shapes, limits.
#include <string>
#include <utility>
#include <vector>

#include "core/validate/validate.h"
#include "gtest/gtest.h"
#include "tests/unit/core/testing/snapshot_builder.h"
#include "tests/unit/core/validate/validate_test_util.h"

namespace attnaudit {
namespace testing {
namespace {

using Mut = std::function<void(Snapshot*, ValidationLimits*)>;

// A float tensor with the shape of `t` (to test "must contain integers").
Tensor AsFloat(const Tensor& t) { return Tensor(DType::kF32, t.shape()); }

// `t` with one more element along dim `axis`.
Tensor Grown(const Tensor& t, int axis) {
  std::vector<int64_t> shape = t.shape();
  shape[axis] += 1;
  return Tensor(t.dtype(), shape);
}

SnapshotSpec WithPageIds() {
  SnapshotSpec spec;
  spec.with_page_ids = true;
  return spec;
}

SnapshotSpec Fp8() {
  SnapshotSpec spec;
  spec.kv_dtype = DType::kF8E4M3;
  return spec;
}

void Explicit(Snapshot* s) { SetExplicitOwners(s, 2, {{0, 1, 0}, {0, 1, 0}}); }

class StructureTest : public ::testing::TestWithParam<InvalidCase> {};

TEST_P(StructureTest, Rejects) {
  // RunInvalidCase asserts the code and the message of each case.
  EXPECT_NO_FATAL_FAILURE(RunInvalidCase(GetParam()));
}

std::vector<InvalidCase> PresenceCases() {
  return {
      {"MissingQ", [](Snapshot* s, ValidationLimits*) { s->q = Tensor(); }, "q",
       "required"},
      {"MissingKPages",
       [](Snapshot* s, ValidationLimits*) { s->k_pages = Tensor(); }, "k_pages",
       "required"},
      {"MissingVPages",
       [](Snapshot* s, ValidationLimits*) { s->v_pages = Tensor(); }, "v_pages",
       "required"},
      {"MissingBlockTable",
       [](Snapshot* s, ValidationLimits*) { s->block_table = Tensor(); },
       "block_table", "required"},
      {"MissingKvSeqLens",
       [](Snapshot* s, ValidationLimits*) { s->kv_seq_lens = Tensor(); },
       "kv_seq_lens", "required"},
      {"MissingQueryPositions",
       [](Snapshot* s, ValidationLimits*) { s->query_positions = Tensor(); },
       "query_positions", "required"},
      {"MissingSlotPositions",
       [](Snapshot* s, ValidationLimits*) { s->slot_positions = Tensor(); },
       "slot_positions", "required"},
      {"UnknownDtypeWithBytes",
       [](Snapshot* s, ValidationLimits*) {
         s->sinks = Tensor(DType::kInvalid, {4}, std::string(16, '\0'));
       },
       "sinks", "dtype is missing or unknown"},
  };
}
INSTANTIATE_TEST_SUITE_P(Presence, StructureTest,
                         ::testing::ValuesIn(PresenceCases()), CaseName);

std::vector<InvalidCase> LayoutCases() {
  return {
      {"BytesShorterThanShape",
       [](Snapshot* s, ValidationLimits*) {
         s->q.mutable_bytes()->resize(s->q.bytes().size() - 4);
       },
       "q", "bytes"},
      {"BytesLongerThanShape",
       [](Snapshot* s, ValidationLimits*) {
         s->slot_positions.mutable_bytes()->append(4, '\0');
       },
       "slot_positions", "bytes"},
      {"NegativeDim",
       [](Snapshot* s, ValidationLimits*) {
         s->block_table = Tensor(DType::kI32, {-2, 3}, "");
       },
       "block_table", "negative"},
      {"ShapeOverflowsInt64",
       [](Snapshot* s, ValidationLimits*) {
         s->v_pages = Tensor(DType::kF32,
                             {int64_t{1} << 40, int64_t{1} << 40, 1, 1}, "");
       },
       "v_pages", "overflows"},
      {"MaxTensorBytes",
       [](Snapshot* s, ValidationLimits* l) { l->max_tensor_bytes = 511; }, "q",
       "511"},  // q is 2*2*4*8 f32 = 512 bytes
      {"MaxTotalBytes",
       [](Snapshot* s, ValidationLimits* l) { l->max_total_bytes = 1000; },
       "snapshot", "limits.max_total_bytes=1000"},
  };
}
INSTANTIATE_TEST_SUITE_P(Layout, StructureTest,
                         ::testing::ValuesIn(LayoutCases()), CaseName);

std::vector<InvalidCase> DTypeCases() {
  std::vector<InvalidCase> cases = {
      // Harness acceptance case 23: q as int32.
      {"QNotFloating",
       [](Snapshot* s, ValidationLimits*) {
         s->q = Tensor(DType::kI32, s->q.shape());
       },
       "q", "floating-point"},
      {"KPagesNotFloating",
       [](Snapshot* s, ValidationLimits*) {
         s->k_pages = Tensor(DType::kI32, s->k_pages.shape());
       },
       "k_pages", "floating-point"},
      {"VPagesBool",
       [](Snapshot* s, ValidationLimits*) {
         s->v_pages = Tensor(DType::kBool, s->v_pages.shape());
       },
       "v_pages", "floating-point"},
      {"KvDtypeMismatch",
       [](Snapshot* s, ValidationLimits*) {
         s->v_pages = Tensor(DType::kBF16, s->v_pages.shape());
       },
       "v_pages", "differs from k_pages dtype"},
      {"EngineOutNotFloating",
       [](Snapshot* s, ValidationLimits*) {
         AddEngineOutputs(s);
         s->engine.out = Tensor(DType::kI32, s->engine.out.shape());
       },
       "engine.out", "floating-point"},
      {"SinksNotF32",
       [](Snapshot* s, ValidationLimits*) {
         s->sinks = Tensor(DType::kF64, {4});
       },
       "sinks", "must be f32"},
      {"ScaleNotF32",
       [](Snapshot* s, ValidationLimits*) {
         s->k_scale = Tensor(DType::kF64, {});
       },
       "k_scale", "must be f32", Fp8()},
      {"ActiveMaskNotBool",
       [](Snapshot* s, ValidationLimits*) {
         AddLogprobInputs(s);
         s->active_mask = Tensor(DType::kI32, s->active_mask.shape());
       },
       "active_mask", "must be bool"},
  };
  // Every integer field: "must contain integers".
  struct IntField {
    const char* name;
    const char* path;
    Mut mutate;
    SnapshotSpec spec = {};
  };
  const std::vector<IntField> ints = {
      {"BlockTable", "block_table",
       [](Snapshot* s, ValidationLimits*) {
         s->block_table = AsFloat(s->block_table);
       }},
      {"KvSeqLens", "kv_seq_lens",
       [](Snapshot* s, ValidationLimits*) {
         s->kv_seq_lens = AsFloat(s->kv_seq_lens);
       }},
      {"QueryPositions", "query_positions",
       [](Snapshot* s, ValidationLimits*) {
         s->query_positions = AsFloat(s->query_positions);
       }},
      {"SlotPositions", "slot_positions",
       [](Snapshot* s, ValidationLimits*) {
         s->slot_positions = AsFloat(s->slot_positions);
       }},
      {"KeyRopePositions", "key_rope_positions",
       [](Snapshot* s, ValidationLimits*) {
         s->key_rope_positions = AsFloat(s->key_rope_positions);
       }},
      {"PageIds", "page_ids",
       [](Snapshot* s, ValidationLimits*) {
         s->page_ids = AsFloat(s->page_ids);
       },
       WithPageIds()},
      {"BlockOwners", "cp.block_owners",
       [](Snapshot* s, ValidationLimits*) {
         Explicit(s);
         s->cp.block_owners = AsFloat(s->cp.block_owners);
       }},
      {"SelectedTokenIds", "selected_token_ids",
       [](Snapshot* s, ValidationLimits*) {
         AddLogprobInputs(s);
         s->selected_token_ids = AsFloat(s->selected_token_ids);
       }},
  };
  for (const IntField& f : ints) {
    cases.push_back({std::string("IntegerRequired") + f.name, f.mutate, f.path,
                     "must contain integers", f.spec});
  }
  return cases;
}
INSTANTIATE_TEST_SUITE_P(DTypes, StructureTest,
                         ::testing::ValuesIn(DTypeCases()), CaseName);

// q and the page pools (CheckStructure: CheckQuery, CheckPagePools).
std::vector<InvalidCase> PoolShapeCases() {
  return {
      {"QRank3",
       [](Snapshot* s, ValidationLimits*) {
         s->q = Tensor(DType::kF32, {2, 2, 32});
       },
       "q", "[B, Sq, Hq, D]"},
      {"QZeroQueries",
       [](Snapshot* s, ValidationLimits*) {
         s->q = Tensor(DType::kF32, {2, 0, 4, 8});
       },
       "q", "positive dimensions"},
      {"KvShapeMismatch",
       [](Snapshot* s, ValidationLimits*) {
         s->v_pages = Grown(s->v_pages, 0);
       },
       "v_pages", "differs from k_pages shape"},
      {"HeadDimMismatch",
       [](Snapshot* s, ValidationLimits*) {
         s->k_pages = Grown(s->k_pages, 3);
         s->v_pages = Grown(s->v_pages, 3);
       },
       "k_pages", "head dim 9 differs from q head dim 8"},
      {"HqNotDivisibleByHkv",
       [](Snapshot* s, ValidationLimits*) {
         s->k_pages = Tensor(DType::kF32, {6, 2, 3, 8});
         s->v_pages = Tensor(DType::kF32, {6, 2, 3, 8});
       },
       "k_pages", "Hq=4 must be divisible by Hkv=3"},
      {"PageSizeZero",
       [](Snapshot* s, ValidationLimits*) {
         s->k_pages = Tensor(DType::kF32, {6, 0, 2, 8});
         s->v_pages = Tensor(DType::kF32, {6, 0, 2, 8});
       },
       "k_pages", "page size must be a positive integer"},
      {"KvLayoutUnknown",
       [](Snapshot* s, ValidationLimits*) {
         s->kv_layout = static_cast<KvLayout>(7);
       },
       "kv_layout", "unknown"},
      {"HndPoolDeclaredNhd",  // [N, Hkv=4, P=2, D] read as NHD: P=4
       [](Snapshot* s, ValidationLimits*) {
         s->kv_layout = KvLayout::kNHD;
         s->k_pages = Tensor(DType::kF32, {6, 4, 2, 8});
         s->v_pages = Tensor(DType::kF32, {6, 4, 2, 8});
       },
       "slot_positions", "[N=6, P=4]"},
  };
}

// The page table, lengths and positions.
std::vector<InvalidCase> TableShapeCases() {
  return {
      {"BlockTableRows",
       [](Snapshot* s, ValidationLimits*) {
         s->block_table = Grown(s->block_table, 0);
       },
       "block_table", "[B=2, M]"},
      {"KvSeqLensLength",
       [](Snapshot* s, ValidationLimits*) {
         s->kv_seq_lens = Grown(s->kv_seq_lens, 0);
       },
       "kv_seq_lens", "[B=2]"},
      {"QueryPositionsShape",
       [](Snapshot* s, ValidationLimits*) {
         s->query_positions = Grown(s->query_positions, 1);
       },
       "query_positions", "[B=2, Sq=2]"},
      {"SlotPositionsShape",
       [](Snapshot* s, ValidationLimits*) {
         s->slot_positions = Grown(s->slot_positions, 0);
       },
       "slot_positions", "[N=6, P=2]"},
      {"KeyRopePositionsShape",
       [](Snapshot* s, ValidationLimits*) {
         s->key_rope_positions = Grown(s->key_rope_positions, 1);
       },
       "key_rope_positions", "[N=6, P=2]"},
      {"PageIdsShape",
       [](Snapshot* s, ValidationLimits*) {
         s->page_ids = Grown(s->page_ids, 0);
       },
       "page_ids", "[N=6]", WithPageIds()},
  };
}

// Optional tensors: scales, sinks, CP, engine outputs, log-prob inputs.
std::vector<InvalidCase> OptionalShapeCases() {
  return {
      {"ScaleShape",
       [](Snapshot* s, ValidationLimits*) {
         s->v_scale = MakeFloatTensor(DType::kF32, {3}, {1, 1, 1});
       },
       "v_scale", "[Hkv=2]", Fp8()},
      {"SinksShape",
       [](Snapshot* s, ValidationLimits*) {
         s->sinks = Tensor(DType::kF32, {5});
       },
       "sinks", "[Hq=4]"},
      {"BlockOwnersShape",
       [](Snapshot* s, ValidationLimits*) {
         Explicit(s);
         s->cp.block_owners = Grown(s->cp.block_owners, 1);
       },
       "cp.block_owners", "[B=2, M=3]"},
      {"RankOutShape",
       [](Snapshot* s, ValidationLimits*) {
         s->cp.world_size = 2;
         s->cp.sharding = CpSharding::kPageInterleaved;
         s->cp.rank_out = Tensor(DType::kF32, {1, 2, 2, 4, 8});
         s->cp.rank_lse = Tensor(DType::kF32, {2, 2, 2, 4});
       },
       "cp.rank_out", "[world=2, B=2, Sq=2, Hq=4, D=8]"},
      {"RankLseShape",
       [](Snapshot* s, ValidationLimits*) {
         s->cp.world_size = 2;
         s->cp.sharding = CpSharding::kPageInterleaved;
         s->cp.rank_out = Tensor(DType::kF32, {2, 2, 2, 4, 8});
         s->cp.rank_lse = Tensor(DType::kF32, {2, 2, 2, 5});
       },
       "cp.rank_lse", "[world=2, B=2, Sq=2, Hq=4]"},
      {"EngineOutShape",
       [](Snapshot* s, ValidationLimits*) {
         AddEngineOutputs(s);
         s->engine.out = Grown(s->engine.out, 3);
       },
       "engine.out", "[B=2, Sq=2, Hq=4, D=8]"},
      {"EngineLseShape",
       [](Snapshot* s, ValidationLimits*) {
         AddEngineOutputs(s);
         s->engine.lse = Tensor(DType::kF32, {2, 2, 4, 1});
       },
       "engine.lse", "[B, Sq, Hq]"},
      {"EngineLogprobsShape",
       [](Snapshot* s, ValidationLimits*) {
         AddLogprobInputs(s);
         s->engine.logprobs = Tensor(DType::kF32, {2, 3});
       },
       "engine.logprobs", "[B=2, Sq=2]"},
      {"SelectedIdsShape",
       [](Snapshot* s, ValidationLimits*) {
         AddLogprobInputs(s);
         s->selected_token_ids = Tensor(DType::kI32, {2, 1});
       },
       "selected_token_ids", "[B=2, Sq=2]"},
      {"ActiveMaskShape",
       [](Snapshot* s, ValidationLimits*) {
         AddLogprobInputs(s);
         s->active_mask = Tensor(DType::kBool, {1, 2});
       },
       "active_mask", "[B=2, Sq=2]"},
      {"LmHeadHidden",
       [](Snapshot* s, ValidationLimits*) {
         AddLogprobInputs(s);
         s->lm_head = Tensor(DType::kF32, {11, 31});
       },
       "lm_head", "[V, Hq*D=32]"},
      {"LmHeadEmptyVocab",
       [](Snapshot* s, ValidationLimits*) {
         AddLogprobInputs(s);
         s->lm_head = Tensor(DType::kF32, {0, 32});
       },
       "lm_head", "vocabulary size must be positive"},
  };
}

std::vector<InvalidCase> ShapeCases() {
  std::vector<InvalidCase> cases = PoolShapeCases();
  for (auto* more : {&TableShapeCases, &OptionalShapeCases}) {
    for (InvalidCase& c : more()) cases.push_back(std::move(c));
  }
  return cases;
}
INSTANTIATE_TEST_SUITE_P(Shapes, StructureTest,
                         ::testing::ValuesIn(ShapeCases()), CaseName);

std::vector<InvalidCase> LimitCases() {
  return {
      {"MaxBatch", [](Snapshot*, ValidationLimits* l) { l->max_batch = 1; },
       "q", "batch size 2 exceeds limits.max_batch=1"},
      {"MaxQueries", [](Snapshot*, ValidationLimits* l) { l->max_queries = 1; },
       "q", "limits.max_queries=1"},
      {"MaxHeads", [](Snapshot*, ValidationLimits* l) { l->max_heads = 3; },
       "q", "limits.max_heads=3"},
      {"MaxHeadDim",
       [](Snapshot*, ValidationLimits* l) { l->max_head_dim = 4; }, "q",
       "limits.max_head_dim=4"},
      {"MaxPageSize",
       [](Snapshot*, ValidationLimits* l) { l->max_page_size = 1; }, "k_pages",
       "limits.max_page_size=1"},
      {"MaxBlocks", [](Snapshot*, ValidationLimits* l) { l->max_blocks = 2; },
       "block_table", "limits.max_blocks=2"},
      {"MaxContext", [](Snapshot*, ValidationLimits* l) { l->max_context = 5; },
       "kv_seq_lens[0]", "6 exceeds limits.max_context=5"},
      {"MaxCpWorldSize",
       [](Snapshot* s, ValidationLimits* l) {
         s->cp.world_size = 4;
         s->cp.sharding = CpSharding::kPageInterleaved;
         l->max_cp_world_size = 2;
       },
       "cp.world_size", "limits.max_cp_world_size=2"},
      {"MaxVocab",
       [](Snapshot* s, ValidationLimits* l) {
         AddLogprobInputs(s, 11);
         l->max_vocab = 10;
       },
       "lm_head", "limits.max_vocab=10"},
  };
}
INSTANTIATE_TEST_SUITE_P(Limits, StructureTest,
                         ::testing::ValuesIn(LimitCases()), CaseName);

}  // namespace
}  // namespace testing
}  // namespace attnaudit
