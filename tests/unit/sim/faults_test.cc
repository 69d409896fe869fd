// Every fault changes what the simulated engine computes — far beyond the
// clean engine's own error against the naive oracle — while the snapshot's
// true data stays exactly the clean one's.
#include <cmath>

#include "gtest/gtest.h"
#include "sim/simulator.h"
#include "tests/unit/sim/naive_oracle.h"

namespace attnaudit {
namespace {

SynthOptions Base(const std::string& preset) {
  SynthOptions o;
  o.preset = preset;
  o.batch = 2;
  o.context = 200;
  o.queries = 1;
  o.page_size = 16;
  o.split_tokens = 64;
  o.vocab = 64;
  o.seed = 3;
  o.permute_pages = true;
  return o;
}

void ExpectSameTrueData(const Snapshot& a, const Snapshot& b) {
  EXPECT_TRUE(a.q.bytes() == b.q.bytes());
  EXPECT_TRUE(a.k_pages.bytes() == b.k_pages.bytes());
  EXPECT_TRUE(a.v_pages.bytes() == b.v_pages.bytes());
  EXPECT_TRUE(a.k_scale.bytes() == b.k_scale.bytes());
  EXPECT_TRUE(a.v_scale.bytes() == b.v_scale.bytes());
  EXPECT_TRUE(a.block_table.bytes() == b.block_table.bytes());
  EXPECT_TRUE(a.slot_positions.bytes() == b.slot_positions.bytes());
  EXPECT_TRUE(a.query_positions.bytes() == b.query_positions.bytes());
  EXPECT_TRUE(a.kv_seq_lens.bytes() == b.kv_seq_lens.bytes());
  EXPECT_TRUE(a.lm_head.bytes() == b.lm_head.bytes());
  EXPECT_EQ(a.softmax_scale, b.softmax_scale);
  EXPECT_EQ(a.engine.lse_base, LseBase::kE);
  EXPECT_EQ(b.engine.lse_base, LseBase::kE);
}

struct FaultCase {
  const char* fault;
  const char* preset;
};

class FaultTest : public ::testing::TestWithParam<FaultCase> {};

TEST_P(FaultTest, ChangesTheEngineFarBeyondItsNoise) {
  const FaultCase& c = GetParam();
  SynthOptions o = Base(c.preset);
  if (std::string(c.fault) == "fp8-scale") o.kv_dtype = DType::kF8E4M3;
  Snapshot clean = Synthesize(o).value();
  o.fault = ParseFault(c.fault).value();
  SynthDetails details;
  absl::StatusOr<Snapshot> faulty = Synthesize(o, &details);
  ASSERT_TRUE(faulty.ok()) << faulty.status();
  EXPECT_TRUE(details.notes.empty());
  EXPECT_EQ(details.fault.rfind(c.fault, 0), 0u) << details.fault;
  ExpectSameTrueData(clean, *faulty);

  const testing::OracleResult oracle = testing::NaiveAttention(clean);
  const testing::OracleDistance clean_dist =
      testing::CompareToOracle(clean, oracle);
  const testing::OracleDistance fault_dist =
      testing::CompareToOracle(*faulty, oracle);
  ASSERT_LE(clean_dist.out_ratio, 1.0);
  ASSERT_LE(clean_dist.lse_ratio, 1.0);
  if (o.fault == Fault::kLseBase2) {
    // Only the LSE changes, by exactly the factor log2(e).
    EXPECT_TRUE(clean.engine.out.bytes() == faulty->engine.out.bytes());
    EXPECT_TRUE(clean.engine.logprobs.bytes() ==
                faulty->engine.logprobs.bytes());
    for (int64_t i = 0; i < clean.engine.lse.num_elements(); ++i) {
      const double ratio =
          faulty->engine.lse.DoubleAt(i) / clean.engine.lse.DoubleAt(i);
      EXPECT_NEAR(ratio, 1.0 / std::log(2.0), 1e-6);
    }
    EXPECT_GT(fault_dist.lse_ratio, 100.0);
    return;
  }
  // out moves by at least 20 times the clean engine's tolerance somewhere.
  EXPECT_GT(fault_dist.out_ratio, 20.0) << details.fault;
  EXPECT_FALSE(clean.engine.logprobs.bytes() ==
               faulty->engine.logprobs.bytes());
}

INSTANTIATE_TEST_SUITE_P(
    AllFaults, FaultTest,
    ::testing::Values(FaultCase{"stale-page", "llama3-8b"},
                      FaultCase{"stale-page", "gpt-oss-20b"},
                      FaultCase{"swapped-pages", "llama3-8b"},
                      FaultCase{"swapped-pages", "gpt-oss-20b"},
                      FaultCase{"rope-offset", "qwen3-8b"},
                      FaultCase{"rope-offset", "glm4-9b"},
                      FaultCase{"k-rope-twice", "phi4-mini"},
                      FaultCase{"lse-base2", "llama3-8b"},
                      FaultCase{"wrong-scale", "gemma2-9b"},
                      FaultCase{"wrong-scale", "llama3-8b"},
                      FaultCase{"gqa-mapping", "glm4-9b"},
                      FaultCase{"gqa-mapping", "gpt-oss-20b"},
                      FaultCase{"drop-block", "qwen3-8b"},
                      FaultCase{"drop-block", "gpt-oss-20b"},
                      FaultCase{"fp8-scale", "llama3-8b"}),
    [](const ::testing::TestParamInfo<FaultCase>& info) {
      std::string name =
          std::string(info.param.fault) + "_" + info.param.preset;
      for (char& ch : name) {
        if (ch == '-') ch = '_';
      }
      return name;
    });

TEST(FaultAdjustTest, Fp8ScaleSwitchesTheCacheToFp8) {
  SynthOptions o = Base("qwen3-8b");
  o.fault = Fault::kFp8Scale;
  SynthDetails details;
  Snapshot s = Synthesize(o, &details).value();
  EXPECT_EQ(s.k_pages.dtype(), DType::kF8E4M3);
  ASSERT_EQ(details.notes.size(), 1u);
  EXPECT_NE(details.notes[0].find("fp8_e4m3"), std::string::npos);
  SynthOptions again = o;
  EXPECT_EQ(AdjustForFault(&again).size(), 1u);
  EXPECT_TRUE(AdjustForFault(&again).empty());  // idempotent
}

TEST(FaultAdjustTest, SwappedPagesWithFullPagesGetsAPartialLastPage) {
  SynthOptions o = Base("llama3-8b");
  o.batch = 1;
  o.context = 256;  // 16 full pages: a swap of two would be harmless
  o.fault = Fault::kSwappedPages;
  SynthOptions adjusted = o;
  ASSERT_EQ(AdjustForFault(&adjusted).size(), 1u);
  EXPECT_EQ(adjusted.context, 248);  // the last page half full
  SynthDetails details;
  Snapshot faulty = Synthesize(o, &details).value();
  EXPECT_EQ(faulty.kv_seq_lens.IntAt(0), 248);
  const testing::OracleResult oracle = testing::NaiveAttention(faulty);
  EXPECT_GT(testing::CompareToOracle(faulty, oracle).out_ratio, 20.0)
      << details.fault;
  // With Sq > 1 the full last page is already partly visible: no change.
  o.queries = 2;
  adjusted = o;
  EXPECT_TRUE(AdjustForFault(&adjusted).empty());
}

TEST(FaultAdjustTest, SwappedPagesThatCannotShowIsAnError) {
  SynthOptions o = Base("qwen3-8b");
  o.page_size = 1;  // every page full and fully visible to the one query
  o.fault = Fault::kSwappedPages;
  absl::StatusOr<Snapshot> s = Synthesize(o);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().message().rfind("fault:", 0), 0u) << s.status();
  // A sliding-window edge makes it visible again, even with page_size 1.
  o.preset = "gpt-oss-20b";
  absl::StatusOr<Snapshot> w = Synthesize(o);
  ASSERT_TRUE(w.ok()) << w.status();
  const testing::OracleResult oracle = testing::NaiveAttention(*w);
  EXPECT_GT(testing::CompareToOracle(*w, oracle).out_ratio, 20.0);
}

// gemma2-9b's window holds 4096 keys: at a context of 2048 the key one past
// the window does not exist and the fault would write a clean snapshot.
TEST(FaultAdjustTest, AWindowFaultTheContextCannotShowIsAnError) {
  SynthOptions o = Base("gemma2-9b");
  o.context = 2048;
  o.fault = Fault::kWindowOffByOne;
  absl::StatusOr<Snapshot> s = Synthesize(o);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(
      s.status().message().rfind("fault: window-off-by-one cannot show", 0), 0u)
      << s.status();
  o.context = 4200;
  EXPECT_TRUE(Synthesize(o).ok());
}

// Why swapped-pages must involve a partial page: swapping two fully visible
// blocks leaves the set of visible keys unchanged, so a decode kernel's
// output only moves by summation-order rounding.
TEST(FaultAdjustTest, SwappingTwoFullyVisiblePagesIsHarmless) {
  SynthOptions o = Base("llama3-8b");
  o.batch = 1;
  o.context = 256;
  o.split_tokens = 1024;  // one split: only the order inside it changes
  Snapshot s = Synthesize(o).value();
  const testing::OracleResult oracle = testing::NaiveAttention(s);
  // Swap blocks 2 and 9 in the snapshot itself: still the same attention.
  Snapshot swapped = s;
  int32_t* table = swapped.block_table.mutable_data<int32_t>();
  std::swap(table[2], table[9]);
  const testing::OracleResult oracle_swapped = testing::NaiveAttention(swapped);
  for (size_t i = 0; i < oracle.out.size(); ++i) {
    ASSERT_NEAR(static_cast<double>(oracle.out[i]),
                static_cast<double>(oracle_swapped.out[i]), 1e-15);
  }
}

}  // namespace
}  // namespace attnaudit
