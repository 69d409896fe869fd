// The simulated engine against a naive long-double attention: a clean
// engine must sit within its own arithmetic (fp32, split-KV) plus one
// rounding of out — and no closer than a few ulps' worth of noise would make
// the drift statistics meaningless, so the test also checks it is nonzero.
#include <cmath>

#include "gtest/gtest.h"
#include "sim/simulator.h"
#include "tests/unit/sim/naive_oracle.h"

namespace attnaudit {
namespace {

struct Case {
  const char* preset;
  int64_t batch, context, queries, page_size, split;
  DType kv;
  bool permute;
  int64_t prefix;
};

class EngineOracleTest : public ::testing::TestWithParam<Case> {};

TEST_P(EngineOracleTest, MatchesNaiveLongDoubleWithinOutputRounding) {
  const Case& c = GetParam();
  SynthOptions o;
  o.preset = c.preset;
  o.batch = c.batch;
  o.context = c.context;
  o.queries = c.queries;
  o.page_size = c.page_size;
  o.split_tokens = c.split;
  o.kv_dtype = c.kv;
  o.permute_pages = c.permute;
  o.prefix = c.prefix;
  o.vocab = 32;
  o.seed = 11;
  absl::StatusOr<Snapshot> s = Synthesize(o);
  ASSERT_TRUE(s.ok()) << s.status();
  const testing::OracleResult oracle = testing::NaiveAttention(*s);
  const testing::OracleDistance dist = testing::CompareToOracle(*s, oracle);
  EXPECT_LE(dist.out_ratio, 1.0);
  EXPECT_LE(dist.lse_ratio, 1.0);
  // The engine really is a different computation (fp32, splits): not
  // bit-identical to the oracle rounded once.
  int64_t differing = 0;
  for (int64_t i = 0; i < s->engine.out.num_elements(); ++i) {
    const float once =
        RoundToDType(static_cast<float>(oracle.out[i]), s->engine.out.dtype());
    differing += s->engine.out.FloatAt(i) != once;
  }
  for (size_t i = 0; i < oracle.lse.size(); ++i) {
    differing += s->engine.lse.FloatAt(i) != static_cast<float>(oracle.lse[i]);
  }
  EXPECT_GT(differing, 0);
}

INSTANTIATE_TEST_SUITE_P(
    Presets, EngineOracleTest,
    ::testing::Values(
        Case{"llama3-8b", 3, 75, 1, 16, 32, DType::kBF16, true, 0},
        Case{"llama3-8b", 2, 40, 3, 5, 7, DType::kF32, false, 0},
        Case{"qwen3-8b", 2, 50, 4, 8, 16, DType::kF16, true, 20},
        Case{"glm4-9b", 2, 64, 2, 16, 256, DType::kBF16, false, 0},
        // One-token splits: the split count is capped at 128 (3-token splits).
        Case{"qwen3-8b", 1, 300, 2, 16, 1, DType::kBF16, false, 0},
        Case{"phi4-mini", 2, 33, 1, 4, 8, DType::kF8E4M3, true, 0},
        // gpt-oss: window 128 is active (rows longer than the window), sinks.
        Case{"gpt-oss-20b", 2, 300, 3, 16, 64, DType::kBF16, true, 0},
        Case{"gpt-oss-20b", 1, 150, 2, 1, 16, DType::kF32, false, 0},
        // gemma2: soft-cap, 1/16 scale and the 4096 window edge.
        Case{"gemma2-9b", 1, 4150, 2, 64, 512, DType::kBF16, true, 0}),
    [](const ::testing::TestParamInfo<Case>& info) {
      std::string name = info.param.preset;
      for (char& ch : name) {
        if (ch == '-') ch = '_';
      }
      return name + "_" + std::to_string(info.index);
    });

}  // namespace
}  // namespace attnaudit
