// Phase 4 rules: q, active K/V and lm_head values must be finite; engine
// outputs may hold anything. Also FirstNonFinite against the exact decoders
// of core/tensor as the oracle.
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/validate/validate.h"
#include "core/validate/validate_internal.h"
#include "gtest/gtest.h"
#include "tests/unit/core/testing/snapshot_builder.h"
#include "tests/unit/core/validate/validate_test_util.h"

namespace attnaudit {
namespace testing {
namespace {

constexpr double kNan = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

// Writes the raw bit pattern of one element.
void SetBits(Tensor* t, int64_t index, uint64_t bits) {
  const int size = DTypeSize(t->dtype());
  std::memcpy(static_cast<char*>(t->mutable_raw()) + index * size, &bits,
              size);  // little-endian: the low bytes
}

std::string KvPath(const Snapshot& s, const char* field, int64_t page,
                   int64_t slot, int64_t head, int64_t d) {
  return s.kv_layout == KvLayout::kNHD
             ? absl::StrCat(field, "[", page, "][", slot, "][", head, "][", d,
                            "]")
             : absl::StrCat(field, "[", page, "][", head, "][", slot, "][", d,
                            "]");
}

// Harness acceptance case 8: NaN at [0,0,0,0] of q, k, v.
TEST(FiniteTest, NanQAtOrigin) {
  Snapshot s = BuildSnapshot({});
  SetFloat(&s.q, 0, kNan);
  EXPECT_TRUE(IsInvalid(ValidateSnapshot(s), "q[0][0][0][0]", "not finite"));
}

TEST(FiniteTest, NanKAtOrigin) {
  Snapshot s = BuildSnapshot({});  // no spare pages: page 0 is active
  SetFloat(&s.k_pages, 0, kNan);
  EXPECT_TRUE(
      IsInvalid(ValidateSnapshot(s), "k_pages[0][0][0][0]", "not finite"));
}

TEST(FiniteTest, NanVAtOrigin) {
  Snapshot s = BuildSnapshot({});
  SetFloat(&s.v_pages, 0, kNan);
  EXPECT_TRUE(
      IsInvalid(ValidateSnapshot(s), "v_pages[0][0][0][0]", "not finite"));
}

TEST(FiniteTest, InfInLastQElementNamesIt) {
  Snapshot s = BuildSnapshot({});
  SetFloat(&s.q, s.q.num_elements() - 1, -kInf);
  EXPECT_TRUE(IsInvalid(ValidateSnapshot(s), "q[1][1][3][7]", "not finite"));
}

class FiniteLayoutTest : public ::testing::TestWithParam<KvLayout> {};

// A partially used last page: its active slot is checked, its unused slot
// is not, in either layout (the per-slot / per-head scan paths).
TEST_P(FiniteLayoutTest, PartialPageChecksOnlyActiveSlots) {
  SnapshotSpec spec;
  spec.seq_lens = {5, 6};
  spec.kv_layout = GetParam();
  const Snapshot base = BuildSnapshot(spec);
  const int64_t page = PageOfBlock(base, 0, 2);  // slot 0 active, slot 1 not

  Snapshot inactive = base;
  SetFloat(&inactive.k_pages, KvIndex(inactive, page, 1, 1, 5), kNan);
  SetFloat(&inactive.v_pages, KvIndex(inactive, page, 1, 0, 0), kInf);
  EXPECT_TRUE(IsValid(ValidateSnapshot(inactive)));

  Snapshot active = base;
  SetFloat(&active.k_pages, KvIndex(active, page, 0, 1, 5), kNan);
  EXPECT_TRUE(IsInvalid(ValidateSnapshot(active),
                        KvPath(active, "k_pages", page, 0, 1, 5),
                        "not finite"));
  Snapshot active_v = base;
  SetFloat(&active_v.v_pages, KvIndex(active_v, page, 0, 0, 7), -kInf);
  EXPECT_TRUE(IsInvalid(ValidateSnapshot(active_v),
                        KvPath(active_v, "v_pages", page, 0, 0, 7),
                        "not finite"));
}

// A fully used page in the other layout: the whole-page scan reports the
// element in the tensor's own index order.
TEST_P(FiniteLayoutTest, FullPageNamesElementInLayoutOrder) {
  SnapshotSpec spec;
  spec.kv_layout = GetParam();
  Snapshot s = BuildSnapshot(spec);
  const int64_t page = PageOfBlock(s, 1, 1);
  SetFloat(&s.k_pages, KvIndex(s, page, 1, 1, 5), kNan);
  EXPECT_TRUE(IsInvalid(ValidateSnapshot(s),
                        KvPath(s, "k_pages", page, 1, 1, 5), "not finite"));
}

// Exhaustive over every K and V element of a pool with partial pages, a
// shared page and spare pages: a lone NaN is rejected exactly when its slot
// is reached by some row (oracle: the block table and lengths, read here
// independently), and the error names that element.
TEST_P(FiniteLayoutTest, LoneNanRejectedIffSlotActive) {
  SnapshotSpec spec;
  spec.seq_lens = {5, 3, 6};
  spec.queries = 1;
  spec.shared_prefix_blocks = 1;
  spec.spare_pages = 2;
  spec.kv_layout = GetParam();
  const Snapshot base = BuildSnapshot(spec);
  const SnapshotDims d = DimsOf(base);
  std::vector<bool> active(d.num_pages * d.page_size, false);
  for (int64_t b = 0; b < d.batch; ++b) {
    for (int64_t i = 0; i < spec.seq_lens[b]; ++i) {
      active[PageOfBlock(base, b, i / d.page_size) * d.page_size +
             i % d.page_size] = true;
    }
  }
  int rejected = 0;
  for (const char* field : {"k_pages", "v_pages"}) {
    for (int64_t page = 0; page < d.num_pages; ++page) {
      for (int64_t slot = 0; slot < d.page_size; ++slot) {
        for (int64_t h = 0; h < d.kv_heads; ++h) {
          for (int64_t e = 0; e < d.head_dim; ++e) {
            Snapshot s = base;
            Tensor* t = field[0] == 'k' ? &s.k_pages : &s.v_pages;
            SetFloat(t, KvIndex(s, page, slot, h, e), kNan);
            const absl::StatusOr<ResolvedLayout> r = ValidateSnapshot(s);
            if (active[page * d.page_size + slot]) {
              ++rejected;
              ASSERT_TRUE(IsInvalid(r, KvPath(s, field, page, slot, h, e),
                                    "not finite"));
            } else {
              ASSERT_TRUE(IsValid(r)) << field << " page " << page;
            }
          }
        }
      }
    }
  }
  // 5 + 3 + 6 tokens, the first block (2 slots) shared by all three rows:
  // 14 - 2 * 2 = 10 active slots.
  EXPECT_EQ(rejected, 2 * 10 * d.kv_heads * d.head_dim);
}

INSTANTIATE_TEST_SUITE_P(Layouts, FiniteLayoutTest,
                         ::testing::Values(KvLayout::kNHD, KvLayout::kHND));

TEST(FiniteTest, SparePageMayHoldGarbage) {
  SnapshotSpec spec;
  spec.spare_pages = 2;
  Snapshot s = BuildSnapshot(spec);
  const SnapshotDims d = DimsOf(s);
  std::vector<bool> used(d.num_pages, false);
  for (int64_t b = 0; b < d.batch; ++b) {
    for (int64_t j = 0; j < 3; ++j) used[PageOfBlock(s, b, j)] = true;
  }
  int spare = 0;
  for (int64_t page = 0; page < d.num_pages; ++page) {
    if (used[page]) continue;
    ++spare;
    for (int64_t k = 0; k < 2; ++k) {
      SetFloat(&s.k_pages, KvIndex(s, page, k, 0, 0), kNan);
      SetFloat(&s.v_pages, KvIndex(s, page, k, 1, 7), kInf);
    }
  }
  ASSERT_EQ(spare, 2);
  EXPECT_TRUE(IsValid(ValidateSnapshot(s)));
}

TEST(FiniteTest, LmHeadMustBeFinite) {
  Snapshot s = BuildSnapshot({});
  AddLogprobInputs(&s, 11);
  SetFloat(&s.lm_head, 3 * 32 + 17, kNan);
  EXPECT_TRUE(IsInvalid(ValidateSnapshot(s), "lm_head[3][17]", "not finite"));
}

// NaN in engine outputs is drift to measure, not bad input.
TEST(FiniteTest, EngineOutputsMayBeNonFinite) {
  Snapshot s = BuildSnapshot({});
  AddEngineOutputs(&s);
  AddLogprobInputs(&s);
  s.engine.logprobs = Tensor(DType::kF32, {2, 2});
  SetFloat(&s.engine.out, 0, kNan);
  SetFloat(&s.engine.lse, 3, kInf);
  SetFloat(&s.engine.logprobs, 1, kNan);
  s.cp.world_size = 2;
  s.cp.sharding = CpSharding::kPageInterleaved;
  s.cp.rank_out = Tensor(DType::kF32, {2, 2, 2, 4, 8});
  s.cp.rank_lse = Tensor(DType::kF32, {2, 2, 2, 4});
  SetFloat(&s.cp.rank_out, 5, kNan);
  SetFloat(&s.cp.rank_lse, 0, -kInf);
  EXPECT_TRUE(IsValid(ValidateSnapshot(s)));
}

struct BitsCase {
  DType dtype;
  uint64_t bits;
  bool finite;
};

class KvBitsTest : public ::testing::TestWithParam<BitsCase> {};

// Special codes of every KV dtype, written as raw bits into an active slot.
TEST_P(KvBitsTest, ActiveSlotCode) {
  const BitsCase& c = GetParam();
  SnapshotSpec spec;
  spec.kv_dtype = c.dtype;
  spec.q_dtype = c.dtype == DType::kF64 ? DType::kF64 : DType::kF32;
  Snapshot s = BuildSnapshot(spec);
  const int64_t page = PageOfBlock(s, 0, 1);
  SetBits(&s.v_pages, KvIndex(s, page, 1, 0, 3), c.bits);
  if (c.finite) {
    EXPECT_TRUE(IsValid(ValidateSnapshot(s)));
  } else {
    EXPECT_TRUE(IsInvalid(ValidateSnapshot(s),
                          KvPath(s, "v_pages", page, 1, 0, 3), "not finite"));
  }
}

INSTANTIATE_TEST_SUITE_P(
    Codes, KvBitsTest,
    ::testing::Values(BitsCase{DType::kBF16, 0x7fc0, false},  // NaN
                      BitsCase{DType::kBF16, 0xff80, false},  // -inf
                      BitsCase{DType::kBF16, 0x7f7f, true},   // max finite
                      BitsCase{DType::kF16, 0x7c00, false},   // +inf
                      BitsCase{DType::kF16, 0xfe01, false},   // NaN
                      BitsCase{DType::kF16, 0x7bff, true},    // 65504
                      BitsCase{DType::kF8E4M3, 0x7f, false},  // NaN
                      BitsCase{DType::kF8E4M3, 0xff, false},  // -NaN
                      BitsCase{DType::kF8E4M3, 0x7e, true},   // 448
                      BitsCase{DType::kF8E4M3, 0xfe, true},   // -448
                      BitsCase{DType::kF8E5M2, 0x7c, false},  // +inf
                      BitsCase{DType::kF8E5M2, 0xfe, false},  // NaN
                      BitsCase{DType::kF8E5M2, 0x7b, true},   // 57344
                      BitsCase{DType::kF32, 0x7f800000, false},
                      BitsCase{DType::kF32, 0x7f7fffff, true},
                      BitsCase{DType::kF64, 0xfff8000000000000ull, false},
                      BitsCase{DType::kF64, 0x7fefffffffffffffull, true},
                      BitsCase{DType::kF64, 0x0000000000000001ull,
                               true}));  // subnormal

// Exhaustive over every 8- and 16-bit code: FirstNonFinite agrees with
// std::isfinite of the exact decoder in core/tensor.
TEST(FirstNonFiniteTest, MatchesDecoderOnEveryNarrowCode) {
  for (DType dt : {DType::kBF16, DType::kF16, DType::kF8E4M3, DType::kF8E5M2}) {
    const int size = DTypeSize(dt);
    const uint32_t codes = size == 1 ? 256u : 65536u;
    for (uint32_t c = 0; c < codes; ++c) {
      char buf[2];
      std::memcpy(buf, &c, size);
      const bool finite = std::isfinite(LoadAsDouble(buf, dt, 0));
      ASSERT_EQ(validate_internal::FirstNonFinite(buf, dt, 1), finite ? -1 : 0)
          << DTypeName(dt) << " code " << c;
    }
  }
}

// Locations across chunk boundaries are exact (the scan works in chunks).
TEST(FirstNonFiniteTest, ReportsFirstIndexAcrossChunks) {
  for (DType dt : {DType::kF32, DType::kF64, DType::kBF16, DType::kF8E5M2}) {
    const int64_t n = 10000;
    for (int64_t where :
         {int64_t{0}, int64_t{2047}, int64_t{2048}, int64_t{6001}, n - 1}) {
      Tensor t(dt, {n});
      FillUniform(&t, 5);
      EXPECT_EQ(validate_internal::FirstNonFinite(t.raw(), dt, n), -1);
      SetFloat(&t, where, kNan);
      if (where + 3 < n) SetFloat(&t, where + 3, kInf);  // a later one
      EXPECT_EQ(validate_internal::FirstNonFinite(t.raw(), dt, n), where)
          << DTypeName(dt);
    }
  }
}

}  // namespace
}  // namespace testing
}  // namespace attnaudit
