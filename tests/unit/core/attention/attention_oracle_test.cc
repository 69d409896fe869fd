// R (fp64 reference) and P (fp32 per-block replay) against the naive
// long-double oracle (tests/unit/core/testing/attention_oracle.h) on random
// shapes, layouts, dtypes and attention variants.
//
// Tolerances are the error bounds documented in attention_oracle.h:
// R within both ReferenceBound (worst-case fp64 bound) and 1e-12 relative
// (measured errors are ~1e-15 relative to max|V|), P within
// ReplayBound (fp32, linear in the merged block count k) plus half an ulp
// of the output dtype for the one final downcast.
#include "tests/unit/core/testing/attention_oracle.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/unit/core/attention/run_attention.h"
#include "tests/unit/core/testing/snapshot_builder.h"

namespace attnaudit {
namespace testing {
namespace {

// Compares one case against the oracle; `label` names it in failures.
void ExpectMatchesOracle(const LogicalCase& c, const PagingOptions& p,
                         const std::string& label) {
  SCOPED_TRACE(label);
  const Snapshot s = BuildSnapshot(c, p);
  absl::StatusOr<AttentionRun> run = RunAttention(s);
  ASSERT_TRUE(run.ok()) << run.status();
  const AttentionResults& r = run->results;
  const bool pre = c.rope.q_state == RopeState::kPreRope ||
                   c.rope.k_state == RopeState::kPreRope;
  const LogicalCase post = pre ? PostRopeEquivalent(c) : c;
  const OracleResult o = OracleAttention(post);

  // Provenance: merge orders, block count, visible keys.
  const auto orders = OracleMergeOrders(post, p.page_size);
  EXPECT_EQ(r.merge_orders, orders);
  int64_t k_max = 0;
  for (const auto& row : orders) {
    for (const auto& q : row) k_max = std::max<int64_t>(k_max, q.size());
  }
  EXPECT_EQ(r.max_merged_blocks, k_max);
  EXPECT_EQ(r.max_visible_keys,
            *std::max_element(o.visible.begin(), o.visible.end()));

  const ErrorBound rb = ReferenceBound(post, o);
  const ErrorBound pb = ReplayBound(post, o, p.page_size, k_max);
  // Besides the worst-case bound, R must sit within 1e-12 of the oracle,
  // relative to max|V| (out) and max(1, |lse|) (lse): fp64 accumulation
  // over these sizes errs by ~1e-15, so this has three orders of margin
  // and still fails on any fp32-level shortcut.
  const double v = std::max(1.0, static_cast<double>(o.max_abs_v));
  const double lm = std::max(1.0, static_cast<double>(o.max_abs_lse));
  const DType out_dtype = EffectiveOutputDType(s);

  // P is downcast once, at the final write: every value is representable
  // in the output dtype (R is not rounded at all).
  for (size_t i = 0; i < r.replay_out.size(); ++i) {
    const float as_float = static_cast<float>(r.replay_out[i]);
    ASSERT_EQ(static_cast<double>(RoundToDType(as_float, out_dtype)),
              r.replay_out[i])
        << "P.out[" << i << "] is not a " << DTypeName(out_dtype) << " value";
  }

  ASSERT_EQ(r.reference_out.size(), o.out.size());
  double worst_r = 0, worst_p = 0;
  size_t at_r = 0, at_p = 0;
  for (size_t i = 0; i < o.out.size(); ++i) {
    const double want = static_cast<double>(o.out[i]);
    const double er =
        std::fabs(r.reference_out[i] - want) / std::min(rb.out, 1e-12 * v);
    const double ep =
        std::fabs(r.replay_out[i] - want) / (pb.out + HalfUlp(want, out_dtype));
    if (!(er <= worst_r)) worst_r = er, at_r = i;
    if (!(ep <= worst_p)) worst_p = ep, at_p = i;
  }
  EXPECT_LE(worst_r, 1.0) << "R.out[" << at_r << "]=" << r.reference_out[at_r]
                          << " oracle " << (double)o.out[at_r] << " bound "
                          << std::min(rb.out, 1e-12 * v);
  EXPECT_LE(worst_p, 1.0) << "P.out[" << at_p << "]=" << r.replay_out[at_p]
                          << " oracle " << (double)o.out[at_p] << " bound "
                          << pb.out;
  ASSERT_EQ(r.reference_lse.size(), o.lse_declared.size());
  for (size_t i = 0; i < o.lse_declared.size(); ++i) {
    const double want = static_cast<double>(o.lse_declared[i]);
    ASSERT_NEAR(r.reference_lse[i], want, std::min(rb.lse, 1e-12 * lm))
        << "R.lse[" << i << "]";
    ASSERT_NEAR(r.replay_lse[i], want, pb.lse) << "P.lse[" << i << "]";
  }
}

struct Shape {
  int64_t q_heads, kv_heads, head_dim, queries;
  std::vector<int64_t> seq_lens;
  int64_t page_size;
  DType q_dtype, kv_dtype, out_dtype;
  KvLayout layout;
  int64_t offset, max_gap;
  bool permute, spread;
};

RandomCaseOptions OptionsFor(const Shape& sh, uint64_t seed) {
  RandomCaseOptions o;
  o.batch = static_cast<int64_t>(sh.seq_lens.size());
  o.queries = sh.queries;
  o.q_heads = sh.q_heads;
  o.kv_heads = sh.kv_heads;
  o.head_dim = sh.head_dim;
  o.seq_lens = sh.seq_lens;
  o.q_dtype = sh.q_dtype;
  o.kv_dtype = sh.kv_dtype;
  o.position_offset = sh.offset;
  o.max_gap = sh.max_gap;
  o.spread_queries = sh.spread;
  o.seed = seed;
  return o;
}

PagingOptions PagingFor(const Shape& sh, uint64_t seed) {
  PagingOptions p;
  p.page_size = sh.page_size;
  p.layout = sh.layout;
  p.permute_pages = sh.permute;
  p.permutation_seed = seed;
  p.spare_pages = seed % 3;
  p.extra_blocks = seed % 2;
  p.index_dtype = seed % 2 ? DType::kI32 : DType::kI64;
  p.key_rope_positions = seed % 3 == 1;
  return p;
}

constexpr DType F32 = DType::kF32, BF16 = DType::kBF16, F16 = DType::kF16,
                E4M3 = DType::kF8E4M3, E5M2 = DType::kF8E5M2, F64 = DType::kF64,
                SAME = DType::kInvalid;
constexpr KvLayout NHD = KvLayout::kNHD, HND = KvLayout::kHND;

// GQA ratios 1/4/7/8, D 64/128/256, Sq 1-4, gapped positions, offsets,
// partial last pages, page sizes 1/16/64, permuted pages, NHD/HND and
// every KV dtype.
const std::vector<Shape>& Shapes() {
  static const auto* shapes = new std::vector<Shape>{
      {2, 2, 64, 1, {37, 64}, 16, F32, F32, SAME, NHD, 0, 0, false, false},
      {8,
       2,
       128,
       2,
       {100, 33},
       16,
       BF16,
       BF16,
       SAME,
       HND,
       4096,
       3,
       true,
       false},
      {7, 1, 128, 3, {65, 7}, 64, F32, F16, SAME, NHD, 0, 1, true, true},
      {8, 1, 256, 4, {50, 80}, 1, BF16, BF16, SAME, NHD, 17, 0, true, true},
      {8, 2, 64, 1, {130, 17}, 16, BF16, E4M3, BF16, HND, 4096, 0, true, false},
      {8, 1, 64, 2, {40, 41}, 16, F32, E5M2, F32, HND, 0, 2, false, true},
      {3, 3, 256, 4, {200, 64}, 64, F32, F32, SAME, NHD, 4096, 2, true, true},
      {7, 1, 64, 1, {9, 1}, 1, F16, F16, SAME, HND, 5, 0, true, false},
      {32, 8, 128, 1, {300}, 16, BF16, BF16, SAME, NHD, 0, 0, true, false},
      {8, 1, 128, 3, {64, 128}, 64, F32, F32, BF16, NHD, 128, 0, false, true},
      {4, 1, 128, 2, {257, 3}, 16, F16, BF16, F32, HND, 1 << 20, 5, true, true},
      // fp64 q and pages: R must read them unrounded (the oracle's 1e-12
      // relative bound fails if they are narrowed to fp32 on the way).
      {4, 2, 64, 1, {70, 33}, 16, F64, F64, F32, NHD, 0, 1, true, false},
  };
  return *shapes;
}

TEST(AttentionOracleTest, RandomShapesMatchTheOracle) {
  uint64_t seed = 1000;
  for (const Shape& sh : Shapes()) {
    ++seed;
    LogicalCase c = RandomCase(OptionsFor(sh, seed));
    c.output_dtype = sh.out_dtype;
    ExpectMatchesOracle(c, PagingFor(sh, seed),
                        absl::StrCat("shape #", seed - 1000, " Hq=", sh.q_heads,
                                     " Hkv=", sh.kv_heads, " D=", sh.head_dim,
                                     " P=", sh.page_size));
  }
}

// Windows of both conventions, with few-query snapshots whose older
// queries still see blocks the newest query's window has left.
TEST(AttentionOracleTest, SlidingWindowsMatchTheOracle) {
  uint64_t seed = 2000;
  for (auto conv : {SlidingWindowConvention::kHuggingFace,
                    SlidingWindowConvention::kFlashLeft}) {
    for (int64_t window : {1, 2, 7, 40, 1000}) {
      for (int64_t page : {1, 16}) {
        const Shape sh{8,    2,   64,   3,    {100, 57},
                       page, F32, BF16, SAME, page == 1 ? NHD : HND,
                       4096, 1,   true, true};
        LogicalCase c = RandomCase(OptionsFor(sh, ++seed));
        c.sliding_window = window;
        c.window_convention = conv;
        ExpectMatchesOracle(
            c, PagingFor(sh, seed),
            absl::StrCat("window ", window, " convention ",
                         static_cast<int>(conv), " page ", page));
      }
    }
  }
}

TEST(AttentionOracleTest, SoftCapAndCustomScaleMatchTheOracle) {
  uint64_t seed = 3000;
  for (double cap : {0.0, 5.0, 50.0}) {
    for (double scale : {0.0, 0.37, 1.0 / 16}) {
      const Shape sh{4,   2,    128, 2, {70, 45}, 16,   F32,
                     F32, SAME, NHD, 0, 0,        true, false};
      RandomCaseOptions o = OptionsFor(sh, ++seed);
      o.q_std = 6;  // scores of several units, so the cap bites
      LogicalCase c = RandomCase(o);
      c.softcap = cap;
      c.softmax_scale = scale;
      ExpectMatchesOracle(c, PagingFor(sh, seed),
                          absl::StrCat("cap ", cap, " scale ", scale));
    }
  }
}

// Sinks: one more logit in the denominator; the LSE reported with or
// without it as the engine declared.
TEST(AttentionOracleTest, SinksMatchTheOracleWithBothLseConventions) {
  uint64_t seed = 4000;
  for (bool includes : {false, true}) {
    for (double sink_level : {-3.0, 0.0, 4.0, 12.0}) {
      const Shape sh{8,    1,    64,  2, {90, 20}, 16,   BF16,
                     BF16, SAME, HND, 0, 0,        true, false};
      LogicalCase c = RandomCase(OptionsFor(sh, ++seed));
      TestRng rng(seed);
      c.sinks.resize(static_cast<size_t>(c.q_heads));
      for (float& x : c.sinks) {
        x = static_cast<float>(sink_level + rng.Uniform(-1, 1));
      }
      c.lse_includes_sinks = includes;
      ExpectMatchesOracle(
          c, PagingFor(sh, seed),
          absl::StrCat("sinks ~", sink_level, " includes ", includes));
    }
  }
}

// gpt-oss-like layer: GQA 8, D 64, window 128, sinks, bf16.
TEST(AttentionOracleTest, WindowSinksAndSoftCapTogether) {
  const Shape sh{16,   2,    64,  4,    {300, 129}, 16,   BF16,
                 BF16, SAME, NHD, 4096, 0,          true, true};
  LogicalCase c = RandomCase(OptionsFor(sh, 5001));
  c.sliding_window = 128;
  c.softcap = 30;
  c.sinks.assign(static_cast<size_t>(c.q_heads), 1.5f);
  c.lse_includes_sinks = true;
  ExpectMatchesOracle(c, PagingFor(sh, 5001), "gpt-oss-like");
}

// A sink far above every score (finite, so valid input) must not overflow
// the reference: the LSE including it is ~ the sink logit itself.
TEST(AttentionOracleTest, SinkFarAboveTheScoresDoesNotOverflow) {
  const Shape sh{4,   2,    64,  1, {40, 12}, 16,    F32,
                 F32, SAME, NHD, 0, 0,        false, false};
  for (bool includes : {false, true}) {
    LogicalCase c = RandomCase(OptionsFor(sh, 5100));
    c.sinks = {750.0f, -2.0f, 1000.0f, 0.5f};
    c.lse_includes_sinks = includes;
    ExpectMatchesOracle(c, PagingFor(sh, 5100),
                        absl::StrCat("huge sinks, includes ", includes));
  }
}

// Pre-RoPE q and/or K: R and P must equal the oracle run on the post-RoPE
// equivalent (RoPE in fp32 with the library's RopeTable, one cast to the
// declared output dtype, as the engine would have stored it).
TEST(AttentionOracleTest, PreRopeInputsMatchTheOracleOnTheirPostRopeValues) {
  struct RopeCase {
    const char* name;
    RopeState q, k;
    RopeStyle style;
    int64_t rotary_dim;
    RopeScalingType scaling;
    DType kv_dtype, q_out;
  };
  const std::vector<RopeCase> cases = {
      {"neox pre/pre bf16", RopeState::kPreRope, RopeState::kPreRope,
       RopeStyle::kNeox, 0, RopeScalingType::kNone, BF16, SAME},
      {"gptj partial pre/pre", RopeState::kPreRope, RopeState::kPreRope,
       RopeStyle::kGptj, 32, RopeScalingType::kNone, F32, SAME},
      {"llama3 q pre only", RopeState::kPreRope, RopeState::kPostRope,
       RopeStyle::kNeox, 0, RopeScalingType::kLlama3, F16, BF16},
      {"yarn k pre only", RopeState::kPostRope, RopeState::kPreRope,
       RopeStyle::kNeox, 0, RopeScalingType::kYarn, BF16, SAME},
      {"linear pre/pre f16 q out", RopeState::kPreRope, RopeState::kPreRope,
       RopeStyle::kNeox, 48, RopeScalingType::kLinear, F32, F16},
  };
  uint64_t seed = 6000;
  for (const RopeCase& rc : cases) {
    const Shape sh{8,    2,   64,          2,    {77, 30},
                   16,   F32, rc.kv_dtype, SAME, seed % 2 ? HND : NHD,
                   4096, 2,   true,        true};
    LogicalCase c = RandomCase(OptionsFor(sh, ++seed));
    c.rope.q_state = rc.q;
    c.rope.k_state = rc.k;
    c.rope.style = rc.style;
    c.rope.rotary_dim = rc.rotary_dim;
    c.rope.theta = 500000;
    c.rope.scaling.type = rc.scaling;
    c.rope.scaling.factor = 4;
    if (rc.q == RopeState::kPreRope) c.rope.q_output_dtype = rc.q_out;
    c.output_dtype = F32;
    ExpectMatchesOracle(c, PagingFor(sh, seed), rc.name);
  }
}

}  // namespace
}  // namespace testing
}  // namespace attnaudit
