// Structure, determinism, options and fp8 quantisation of Synthesize.
#include "sim/simulator.h"

#include <cmath>
#include <set>

#include "core/fingerprint/fingerprint.h"
#include "core/validate/validate.h"
#include "gtest/gtest.h"

namespace attnaudit {
namespace {

SynthOptions Small(const std::string& preset) {
  SynthOptions o;
  o.preset = preset;
  o.batch = 3;
  o.context = 70;
  o.queries = 2;
  o.page_size = 16;
  o.split_tokens = 32;
  o.vocab = 64;
  o.seed = 7;
  return o;
}

void ExpectSameTensor(const Tensor& a, const Tensor& b, const char* what) {
  EXPECT_EQ(a.dtype(), b.dtype()) << what;
  EXPECT_EQ(a.shape(), b.shape()) << what;
  EXPECT_TRUE(a.bytes() == b.bytes()) << what;
}

TEST(SimulatorTest, LayoutShapesAndPositions) {
  SynthOptions o = Small("llama3-8b");
  absl::StatusOr<Snapshot> s = Synthesize(o);
  ASSERT_TRUE(s.ok()) << s.status();
  const SnapshotDims d = DimsOf(*s);
  EXPECT_EQ(d.batch, 3);
  EXPECT_EQ(d.queries, 2);
  EXPECT_EQ(d.q_heads, 32);
  EXPECT_EQ(d.kv_heads, 8);
  EXPECT_EQ(d.head_dim, 128);
  EXPECT_EQ(d.page_size, 16);
  // Rows 70, 63, 56 tokens: 5 + 4 + 4 pages, all referenced, none shared.
  EXPECT_EQ(d.num_pages, 13);
  EXPECT_EQ(d.max_blocks, 5);
  EXPECT_EQ(s->kv_seq_lens.IntAt(0), 70);
  EXPECT_EQ(s->kv_seq_lens.IntAt(1), 63);
  EXPECT_EQ(s->kv_seq_lens.IntAt(2), 56);
  EXPECT_EQ(s->q.dtype(), DType::kBF16);
  EXPECT_EQ(s->k_pages.dtype(), DType::kBF16);
  EXPECT_EQ(s->engine.out.dtype(), DType::kBF16);
  EXPECT_EQ(s->engine.lse.dtype(), DType::kF32);
  EXPECT_EQ(s->rope.q_state, RopeState::kPreRope);
  EXPECT_EQ(s->rope.k_state, RopeState::kPostRope);
  EXPECT_EQ(s->labels.model, "llama3-8b");
  EXPECT_EQ(s->labels.engine, "attnaudit-sim");
  EXPECT_EQ(s->labels.backend, "flash-decoding");
  // Queries are the last Sq tokens; positions follow the slots.
  for (int64_t b = 0; b < 3; ++b) {
    const int64_t len = s->kv_seq_lens.IntAt(b);
    std::set<int64_t> pages;
    int64_t first = -1;
    for (int64_t i = 0; i < len; ++i) {
      const int64_t page = s->block_table.IntAt(b * 5 + i / 16);
      pages.insert(page);
      const int64_t pos = s->slot_positions.IntAt(page * 16 + i % 16);
      if (i == 0) first = pos;
      EXPECT_EQ(pos, first + i) << "row " << b << " token " << i;
    }
    EXPECT_EQ(s->query_positions.IntAt(b * 2 + 0), first + len - 2);
    EXPECT_EQ(s->query_positions.IntAt(b * 2 + 1), first + len - 1);
    // Unused tail entries are -1.
    for (int64_t k = (len + 15) / 16; k < 5; ++k) {
      EXPECT_EQ(s->block_table.IntAt(b * 5 + k), -1);
    }
    EXPECT_EQ(first, b == 1 ? 1003 : 0);  // row 1 starts at an offset
  }
  // The unused slots of partial last pages are marked -1 (row 0: tokens
  // 64..69 in slots 0..5 of its fifth page).
  const int64_t last_page = s->block_table.IntAt(0 * 5 + 4);
  EXPECT_EQ(s->slot_positions.IntAt(last_page * 16 + 5), 69);
  EXPECT_EQ(s->slot_positions.IntAt(last_page * 16 + 6), -1);
  // Everything but the last query is active.
  EXPECT_EQ(s->active_mask.IntAt(0), 1);
  EXPECT_EQ(s->active_mask.IntAt(5), 0);
}

TEST(SimulatorTest, EveryPresetValidates) {
  for (const std::string& name : PresetNames()) {
    SCOPED_TRACE(name);
    SynthOptions o = Small(name);
    o.permute_pages = true;
    o.prefix = 40;
    absl::StatusOr<Snapshot> s = Synthesize(o);
    ASSERT_TRUE(s.ok()) << s.status();
    absl::StatusOr<ResolvedLayout> layout = ValidateSnapshot(*s);
    ASSERT_TRUE(layout.ok()) << layout.status();
    std::string recomputed;
    EXPECT_TRUE(VerifyPrefixFingerprint(*s, *layout, &recomputed).ok());
    EXPECT_EQ(recomputed, s->prefix.fingerprint);
  }
}

TEST(SimulatorTest, SameSeedSameBytesOtherSeedOtherData) {
  SynthOptions o = Small("gpt-oss-20b");
  o.permute_pages = true;
  o.threads = 1;
  Snapshot a = Synthesize(o).value();
  o.threads = 2;
  Snapshot b = Synthesize(o).value();
  ExpectSameTensor(a.q, b.q, "q");
  ExpectSameTensor(a.k_pages, b.k_pages, "k_pages");
  ExpectSameTensor(a.v_pages, b.v_pages, "v_pages");
  ExpectSameTensor(a.block_table, b.block_table, "block_table");
  ExpectSameTensor(a.sinks, b.sinks, "sinks");
  ExpectSameTensor(a.engine.out, b.engine.out, "engine.out");
  ExpectSameTensor(a.engine.lse, b.engine.lse, "engine.lse");
  ExpectSameTensor(a.engine.logprobs, b.engine.logprobs, "engine.logprobs");
  o.seed = 8;
  Snapshot c = Synthesize(o).value();
  EXPECT_FALSE(a.q.bytes() == c.q.bytes());
  EXPECT_FALSE(a.k_pages.bytes() == c.k_pages.bytes());
  EXPECT_FALSE(a.block_table.bytes() == c.block_table.bytes());
}

TEST(SimulatorTest, PermutationScattersPagesButKeepsContent) {
  SynthOptions o = Small("qwen3-8b");
  Snapshot plain = Synthesize(o).value();
  o.permute_pages = true;
  Snapshot perm = Synthesize(o).value();
  EXPECT_FALSE(plain.block_table.bytes() == perm.block_table.bytes());
  const SnapshotDims d = DimsOf(plain);
  const int64_t row_bytes = d.kv_heads * d.head_dim * 2;
  for (int64_t b = 0; b < d.batch; ++b) {
    for (int64_t i = 0; i < plain.kv_seq_lens.IntAt(b); ++i) {
      const int64_t pa = plain.block_table.IntAt(b * d.max_blocks + i / 16);
      const int64_t pb = perm.block_table.IntAt(b * d.max_blocks + i / 16);
      const int64_t sa = pa * 16 + i % 16, sb = pb * 16 + i % 16;
      ASSERT_EQ(plain.k_pages.bytes().compare(sa * row_bytes, row_bytes,
                                              perm.k_pages.bytes(),
                                              sb * row_bytes, row_bytes),
                0);
    }
  }
}

TEST(SimulatorTest, SharedPrefixSharesFullPagesAndContent) {
  SynthOptions o = Small("llama3-8b");
  o.prefix = 40;  // two full pages of 16 and 8 tokens of a third
  Snapshot s = Synthesize(o).value();
  const SnapshotDims d = DimsOf(s);
  EXPECT_EQ(d.num_pages, 2 + 3 + 2 + 2);
  const int64_t row_bytes = d.kv_heads * d.head_dim * 2;
  for (int64_t b = 1; b < d.batch; ++b) {
    EXPECT_EQ(s.block_table.IntAt(b * 5 + 0), s.block_table.IntAt(0));
    EXPECT_EQ(s.block_table.IntAt(b * 5 + 1), s.block_table.IntAt(1));
    EXPECT_NE(s.block_table.IntAt(b * 5 + 2), s.block_table.IntAt(2));
    // Tokens 32..39 live in per-row pages with identical content; 40 differs.
    const int64_t p0 = s.block_table.IntAt(2),
                  pb = s.block_table.IntAt(b * 5 + 2);
    for (int64_t slot = 0; slot < 9; ++slot) {
      const bool same = s.k_pages.bytes().compare((p0 * 16 + slot) * row_bytes,
                                                  row_bytes, s.k_pages.bytes(),
                                                  (pb * 16 + slot) * row_bytes,
                                                  row_bytes) == 0;
      EXPECT_EQ(same, slot < 8) << "row " << b << " slot " << slot;
    }
  }
  EXPECT_TRUE(s.prefix.enabled);
  EXPECT_EQ(s.prefix.length, 40);
  EXPECT_EQ(s.prefix.fingerprint.size(), 64u);
}

TEST(SimulatorTest, Fp8QuantisationRoundTrips) {
  SynthOptions o = Small("phi4-mini");
  Snapshot ref = Synthesize(o).value();  // bf16: the values before fp8
  o.kv_dtype = DType::kF8E4M3;
  Snapshot s = Synthesize(o).value();
  ASSERT_EQ(s.k_pages.dtype(), DType::kF8E4M3);
  ASSERT_EQ(s.k_scale.shape(), std::vector<int64_t>{8});
  EXPECT_EQ(s.q.dtype(), DType::kBF16);
  EXPECT_EQ(s.engine.out.dtype(), DType::kBF16);
  const SnapshotDims d = DimsOf(s);
  for (const bool is_k : {true, false}) {
    const Tensor& pages = is_k ? s.k_pages : s.v_pages;
    const Tensor& orig = is_k ? ref.k_pages : ref.v_pages;
    const Tensor& scale = is_k ? s.k_scale : s.v_scale;
    std::vector<double> amax(d.kv_heads, 0.0);
    for (int64_t slot = 0; slot < d.num_pages * d.page_size; ++slot) {
      if (s.slot_positions.IntAt(slot) < 0) continue;
      for (int64_t h = 0; h < d.kv_heads; ++h) {
        for (int64_t j = 0; j < d.head_dim; ++j) {
          const int64_t e = (slot * d.kv_heads + h) * d.head_dim + j;
          const double x = orig.DoubleAt(e);
          const double code = pages.DoubleAt(e);
          const double deq = code * scale.DoubleAt(h);
          // Half an e4m3 ulp (2^-4 relative), or half the subnormal quantum.
          ASSERT_LE(std::fabs(deq - x),
                    std::max(std::ldexp(std::fabs(x), -4),
                             std::ldexp(scale.DoubleAt(h), -10)) *
                        (1 + 1e-6))
              << (is_k ? "K" : "V") << " element " << e;
          amax[h] = std::max(amax[h], std::fabs(code));
        }
      }
    }
    // Per-head scales map each head's largest value to the top of e4m3.
    for (int64_t h = 0; h < d.kv_heads; ++h) EXPECT_EQ(amax[h], 448.0);
  }
}

TEST(SimulatorTest, BadOptionsNameTheField) {
  struct Case {
    const char* field;
    SynthOptions options;
  };
  std::vector<Case> cases;
  SynthOptions o = Small("llama3-8b");
  cases.push_back({"batch:", o});
  cases.back().options.batch = 0;
  cases.push_back({"context:", o});
  cases.back().options.context = 0;
  cases.push_back({"queries:", o});
  cases.back().options.queries = 65;
  cases.push_back({"page_size:", o});
  cases.back().options.page_size = 0;
  cases.push_back({"kv_dtype:", o});
  cases.back().options.kv_dtype = DType::kF8E5M2;
  cases.push_back({"prefix:", o});
  cases.back().options.prefix = 57;  // the shortest row has 56 tokens
  cases.push_back({"preset:", o});
  cases.back().options.preset = "mistral";
  cases.push_back({"context:", o});
  cases.back().options.batch = 4096;
  cases.back().options.context = 1 << 20;  // terabytes of KV
  for (const Case& c : cases) {
    absl::StatusOr<Snapshot> s = Synthesize(c.options);
    ASSERT_FALSE(s.ok()) << c.field;
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(s.status().message().rfind(c.field, 0), 0u) << s.status();
  }
}

TEST(SimulatorTest, LayerParitySelectsSlidingLayers) {
  SynthOptions o = Small("gemma2-9b");
  o.layer = 0;
  EXPECT_EQ(Synthesize(o)->sliding_window, 4096);
  o.layer = 1;
  Snapshot s = Synthesize(o).value();
  EXPECT_EQ(s.sliding_window, 0);
  EXPECT_EQ(s.labels.layer, 1);
  EXPECT_EQ(s.logit_softcap, 50.0);
}

}  // namespace
}  // namespace attnaudit
