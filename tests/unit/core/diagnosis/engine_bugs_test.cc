// The diagnosis on engine bugs that real engines have shown and the
// simulator does not make (docs/DIAGNOSIS.md): a row read with one key
// fewer or more, V read from the K buffer, KV heads permuted, the window
// ignored, another row's page, a stale page without the engine's LSE (vLLM
// CPU and HF return none), K pages in vLLM's CPU layout read as plain
// pages, and the RoPE configuration wrong for a pre-RoPE snapshot. Engine
// outputs come from the long-double oracle on the buggy case; the snapshot
// holds the truth.
#include <algorithm>
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "core/audit/audit.h"
#include "gtest/gtest.h"
#include "tests/unit/core/testing/attention_oracle.h"
#include "tests/unit/core/testing/snapshot_builder.h"

namespace attnaudit {
namespace {

constexpr int64_t kPage = 8;

testing::PagingOptions Paging(KvLayout layout = KvLayout::kNHD) {
  testing::PagingOptions p;
  p.page_size = kPage;
  p.layout = layout;
  p.permute_pages = true;
  p.page_id_base = 1000;
  p.junk_unused_slots = false;
  return p;
}

// The engine's outputs from the oracle on `engine`; without its LSE when
// `with_lse` is false (vLLM's CPU attention and HF return none).
void SetEngine(const testing::LogicalCase& engine, bool with_lse, Snapshot* s) {
  const testing::OracleResult o = testing::OracleAttention(engine);
  const std::vector<int64_t> shape = {engine.batch, engine.queries,
                                      engine.q_heads, engine.head_dim};
  s->engine.out = testing::MakeFloatTensor(
      DType::kBF16, shape, std::vector<double>(o.out.begin(), o.out.end()));
  s->engine.lse = Tensor();
  // The oracle's engine keeps fp32 scores: declared, the audit sees what an
  // undeclared engine's widest envelope would hide.
  s->precision.profile = EngineProfile::kFlashDecoding;
  if (with_lse) {
    s->engine.lse = testing::MakeFloatTensor(
        DType::kF32, {engine.batch, engine.queries, engine.q_heads},
        std::vector<double>(o.lse_declared.begin(), o.lse_declared.end()));
  }
}

AuditReport Audit(const Snapshot& s) {
  AuditOptions a;
  a.threads = 2;
  a.include_merge_orders = false;
  absl::StatusOr<AuditReport> r = RunAudit(s, a);
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? *std::move(r) : AuditReport();
}

// The engine's page id of row b's logical block j.
int64_t PageOf(const Snapshot& s, int64_t b, int64_t j) {
  return s.block_table.IntAt(b * s.block_table.shape()[1] + j);
}

const Diagnosis& Top(const AuditReport& r) {
  static const Diagnosis none;
  EXPECT_EQ(r.verdict, Verdict::kDrift);
  EXPECT_FALSE(r.diagnoses.empty());
  return r.diagnoses.empty() ? none : r.diagnoses[0];
}

// Row `b`'s K/V of token t from `from`'s token u (same width).
void CopyToken(const testing::LogicalCase& from, int64_t fb, int64_t u,
               testing::LogicalCase* to, int64_t b, int64_t t) {
  const int64_t w = to->kv_heads * to->head_dim;
  std::copy_n(from.k[fb].begin() + u * w, w, to->k[b].begin() + t * w);
  std::copy_n(from.v[fb].begin() + u * w, w, to->v[b].begin() + t * w);
}

// Row b of *c without its newest key.
void DropNewestKey(int64_t b, testing::LogicalCase* c) {
  const int64_t w = c->kv_heads * c->head_dim;
  c->k[b].resize(c->k[b].size() - w);
  c->v[b].resize(c->v[b].size() - w);
  c->positions[b].pop_back();
}

class EngineBugTest : public ::testing::TestWithParam<bool> {};

TEST_P(EngineBugTest, OneKeyFewer) {
  const testing::LogicalCase c = testing::PeakedBf16Case(21);
  Snapshot s = testing::BuildSnapshot(c, Paging());
  testing::LogicalCase engine = c;
  DropNewestKey(1, &engine);
  SetEngine(engine, GetParam(), &s);
  // Declared as a flash-decoding kernel: an undeclared engine's envelope
  // (16-bit scores of either rounding) is wide enough to pass one key in
  // 61 of a peaked row.
  s.precision.profile = EngineProfile::kFlashDecoding;
  const AuditReport report = Audit(s);
  const Diagnosis& top = Top(report);
  EXPECT_EQ(top.hypothesis, "seq-len-off-by-one") << top.summary;
  EXPECT_EQ(top.location.row, 1);
  EXPECT_TRUE(absl::StartsWith(top.detail, "-1")) << top.detail;
}

TEST_P(EngineBugTest, OneKeyMore) {
  // The slot after row 1's last key holds an old sequence's data: read as
  // a key, it takes a share of the softmax.
  const testing::LogicalCase c = testing::PeakedBf16Case(22);
  testing::PagingOptions paging = Paging();
  paging.junk_unused_slots = true;
  paging.junk_value = 0.25;
  paging.junk_v_value = -3.0;
  Snapshot s = testing::BuildSnapshot(c, paging);
  testing::LogicalCase engine = c;
  const int64_t w = c.kv_heads * c.head_dim;
  engine.k[1].resize(engine.k[1].size() + w, paging.junk_value);
  engine.v[1].resize(engine.v[1].size() + w, paging.junk_v_value);
  engine.positions[1].push_back(c.query_positions[1]);
  SetEngine(engine, GetParam(), &s);
  // Declared as a flash-decoding kernel: an undeclared engine's envelope
  // (16-bit scores of either rounding) is wide enough to pass one key in
  // 61 of a peaked row.
  s.precision.profile = EngineProfile::kFlashDecoding;
  const AuditReport report = Audit(s);
  const Diagnosis& top = Top(report);
  EXPECT_EQ(top.hypothesis, "seq-len-off-by-one") << top.summary;
  EXPECT_EQ(top.location.row, 1);
  EXPECT_TRUE(absl::StartsWith(top.detail, "+1")) << top.detail;
}

TEST_P(EngineBugTest, OneKeyFewerMovesTheSlidingWindow) {
  // An engine that counts row 1 a key short places its query a key early:
  // the newest key drops out and the key before the window's start (in
  // block 4 of 8; the window is 24 of 61 keys) comes in.
  testing::LogicalCase c = testing::PeakedBf16Case(28);
  c.sliding_window = 24;
  Snapshot s = testing::BuildSnapshot(c, Paging());
  testing::LogicalCase engine = c;
  DropNewestKey(1, &engine);
  engine.query_positions[1] -= 1;
  SetEngine(engine, GetParam(), &s);
  const AuditReport report = Audit(s);
  const Diagnosis& top = Top(report);
  EXPECT_EQ(top.hypothesis, "seq-len-off-by-one") << top.summary;
  EXPECT_EQ(top.location.row, 1);
  EXPECT_EQ(top.location.logical_block, 7);
  EXPECT_TRUE(top.explains) << top.summary;
  EXPECT_TRUE(absl::StartsWith(top.detail, "-1")) << top.detail;
  EXPECT_TRUE(absl::StrContains(top.detail, "window")) << top.detail;
}

TEST_P(EngineBugTest, ValuesReadFromTheKeyBuffer) {
  const testing::LogicalCase c = testing::PeakedBf16Case(23);
  Snapshot s = testing::BuildSnapshot(c, Paging());
  testing::LogicalCase engine = c;
  engine.v = engine.k;
  SetEngine(engine, GetParam(), &s);
  const AuditReport report = Audit(s);
  const Diagnosis& top = Top(report);
  EXPECT_EQ(top.hypothesis, "v-from-k") << top.summary;
  EXPECT_TRUE(top.explains);
}

TEST_P(EngineBugTest, KvHeadsInReverseOrder) {
  const testing::LogicalCase c = testing::PeakedBf16Case(24);
  Snapshot s = testing::BuildSnapshot(c, Paging());
  testing::LogicalCase engine = c;
  const int64_t D = c.head_dim, H = c.kv_heads;
  for (int64_t b = 0; b < c.batch; ++b) {
    for (int64_t t = 0; t < c.SeqLen(b); ++t) {
      for (int64_t g = 0; g < H; ++g) {
        for (int64_t i = 0; i < D; ++i) {
          const int64_t to = (t * H + g) * D + i,
                        from = (t * H + H - 1 - g) * D + i;
          engine.k[b][to] = c.k[b][from];
          engine.v[b][to] = c.v[b][from];
        }
      }
    }
  }
  SetEngine(engine, GetParam(), &s);
  const AuditReport report = Audit(s);
  const Diagnosis& top = Top(report);
  EXPECT_EQ(top.hypothesis, "kv-heads-permuted") << top.summary;
  EXPECT_TRUE(absl::StrContains(top.detail, "reverse")) << top.detail;
}

TEST_P(EngineBugTest, SlidingWindowIgnored) {
  testing::LogicalCase c = testing::PeakedBf16Case(25);
  c.sliding_window = 24;
  Snapshot s = testing::BuildSnapshot(c, Paging());
  testing::LogicalCase engine = c;
  engine.sliding_window = 0;
  SetEngine(engine, GetParam(), &s);
  const AuditReport report = Audit(s);
  const Diagnosis& top = Top(report);
  EXPECT_EQ(top.hypothesis, "window-ignored") << top.summary;
}

TEST_P(EngineBugTest, ABlockTableEntryNamingAnotherRowsPage) {
  const testing::LogicalCase c = testing::PeakedBf16Case(26);
  Snapshot s = testing::BuildSnapshot(c, Paging());
  testing::LogicalCase engine = c;
  for (int64_t t = 2 * kPage; t < 3 * kPage; ++t) {
    CopyToken(c, 0, t, &engine, 1, t);  // row 1's block 2 reads row 0's
  }
  SetEngine(engine, GetParam(), &s);
  const AuditReport report = Audit(s);
  const Diagnosis& top = Top(report);
  EXPECT_EQ(top.hypothesis, "foreign-page") << top.summary;
  EXPECT_EQ(top.location.row, 1);
  EXPECT_EQ(top.location.logical_block, 2);
  EXPECT_EQ(top.location.page, PageOf(s, 1, 2));
  EXPECT_EQ(top.location.other_page, PageOf(s, 0, 2));
}

TEST(EngineBugNoLseTest, StalePageIsLocatedWithoutTheEnginesLse) {
  const testing::LogicalCase c = testing::PeakedBf16Case(27);
  Snapshot s = testing::BuildSnapshot(c, Paging());
  testing::LogicalCase engine = c;
  testing::TestRng rng(99);
  const int64_t w = c.kv_heads * c.head_dim;
  for (int64_t t = 3 * kPage; t < 4 * kPage; ++t) {
    for (int64_t i = 0; i < w; ++i) {
      engine.k[1][t * w + i] =
          RoundToDType(static_cast<float>(rng.Normal()), DType::kBF16);
      engine.v[1][t * w + i] =
          RoundToDType(static_cast<float>(rng.Normal()), DType::kBF16);
    }
  }
  SetEngine(engine, /*with_lse=*/false, &s);
  const AuditReport report = Audit(s);
  const Diagnosis& top = Top(report);
  EXPECT_EQ(top.hypothesis, "stale-page") << top.summary;
  EXPECT_EQ(top.location.row, 1);
  EXPECT_EQ(top.location.logical_block, 3);
  EXPECT_EQ(top.location.page, PageOf(s, 1, 3));
  // Located by the stale fit from out alone (the stale state's share fitted
  // per cell): it fits better than every other block by the fit's margin,
  // so its place is known and it explains.
  EXPECT_TRUE(top.explains) << top.summary;
  EXPECT_GE(top.score, 0.9);
}

// As in torch's flash-decoding fixture (tests/conformance): a page of
// fresh N(0, 1) keys and values, with the engine's LSE. The stale state is
// the softmax average of the page's values, far tighter than one value: a
// fit that drew it like one value would lose to unstructured drift and
// leave the page unexplained.
TEST(EngineBugLseTest, StalePageOfFreshContentIsNamed) {
  const testing::LogicalCase c = testing::PeakedBf16Case(27);
  Snapshot s = testing::BuildSnapshot(c, Paging());
  testing::LogicalCase engine = c;
  testing::TestRng rng(7);
  const int64_t w = c.kv_heads * c.head_dim;
  for (int64_t t = 2 * kPage; t < 3 * kPage; ++t) {
    for (int64_t i = 0; i < w; ++i) {
      engine.k[1][t * w + i] =
          RoundToDType(static_cast<float>(rng.Normal()), DType::kBF16);
      engine.v[1][t * w + i] =
          RoundToDType(static_cast<float>(rng.Normal()), DType::kBF16);
    }
  }
  SetEngine(engine, /*with_lse=*/true, &s);
  const AuditReport report = Audit(s);
  const Diagnosis& top = Top(report);
  EXPECT_EQ(top.hypothesis, "stale-page") << top.summary;
  EXPECT_EQ(top.location.row, 1);
  EXPECT_EQ(top.location.logical_block, 2);
  EXPECT_EQ(top.location.page, PageOf(s, 1, 2));
  EXPECT_TRUE(top.explains) << top.summary;
}

TEST(EngineBugNoLseTest, KPagesInVllmsCpuLayoutReadAsPlainPages) {
  // vLLM's CPU cache stores each (page, KV head) K block transposed,
  // [D, page]; a client that views it as [page, D] sends that memory.
  const testing::LogicalCase c = testing::PeakedBf16Case(28);
  Snapshot s = testing::BuildSnapshot(c, Paging(KvLayout::kHND));
  SetEngine(c, /*with_lse=*/false, &s);
  const int64_t D = c.head_dim, block = kPage * D;
  Tensor naive = s.k_pages;
  const uint16_t* from = s.k_pages.data<uint16_t>();
  uint16_t* to = naive.mutable_data<uint16_t>();
  for (int64_t start = 0; start < s.k_pages.num_elements(); start += block) {
    for (int64_t f = 0; f < block; ++f) {
      const int64_t dim = f / kPage, slot = f % kPage;
      to[start + f] = from[start + slot * D + dim];
    }
  }
  s.k_pages = naive;
  const AuditReport report = Audit(s);
  const Diagnosis& top = Top(report);
  EXPECT_EQ(top.hypothesis, "layout") << top.summary;
  EXPECT_TRUE(absl::StrContains(top.detail, "vllm_cpu")) << top.detail;
}

TEST(EngineBugNoLseTest, WrongRopeThetaOfAPreRopeSnapshot) {
  testing::LogicalCase c = testing::PeakedBf16Case(29);
  c.rope.theta = 500000;
  c.rope.q_state = RopeState::kPreRope;
  Snapshot s = testing::BuildSnapshot(c, Paging());
  testing::LogicalCase engine = c;
  engine.rope.theta = 10000;
  SetEngine(testing::PostRopeEquivalent(engine), /*with_lse=*/false, &s);
  const AuditReport report = Audit(s);
  const Diagnosis& top = Top(report);
  EXPECT_EQ(top.hypothesis, "rope-theta") << top.summary;
  EXPECT_TRUE(absl::StrContains(top.detail, "theta 10000")) << top.detail;
}

// Unused slots of a partly filled page may hold anything, NaN included:
// they are never visible, so they must not turn a DRIFT into INVALID when
// the diagnosis reads that page in another block's place.
TEST_P(EngineBugTest, NanInUnusedSlotsLeavesTheDriftDiagnosed) {
  const testing::LogicalCase c = testing::PeakedBf16Case(30);
  testing::PagingOptions paging = Paging();
  paging.junk_unused_slots = true;
  paging.junk_value = std::nan("");
  paging.junk_v_value = std::nan("");
  Snapshot s = testing::BuildSnapshot(c, paging);
  testing::LogicalCase engine = c;
  for (int64_t t = 2 * kPage; t < 3 * kPage; ++t) {
    CopyToken(c, 0, t, &engine, 1, t);  // row 1's block 2 reads row 0's
  }
  SetEngine(engine, GetParam(), &s);
  const AuditReport report = Audit(s);
  EXPECT_EQ(report.verdict, Verdict::kDrift) << report.invalid_reason;
  const Diagnosis& top = Top(report);
  EXPECT_EQ(top.hypothesis, "foreign-page") << top.summary;
}

INSTANTIATE_TEST_SUITE_P(WithAndWithoutLse, EngineBugTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "EngineLse" : "NoEngineLse";
                         });

}  // namespace
}  // namespace attnaudit
