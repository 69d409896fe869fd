#include <cmath>

#include "gtest/gtest.h"
#include "sim/simulator.h"

namespace attnaudit {
namespace {

struct Expected {
  const char* name;
  int64_t hq, hkv, d;
  double theta;
  RopeStyle style;
  int64_t rotary_dim;
  RopeScalingType scaling;
  int64_t window;
  double softcap;
  bool sinks;
};

// The published model configs (docs/SIMULATOR.md, "Presets"), written out
// by hand.
const Expected kExpected[] = {
    {"llama3-8b", 32, 8, 128, 500000, RopeStyle::kNeox, 128,
     RopeScalingType::kLlama3, 0, 0, false},
    {"qwen3-8b", 32, 8, 128, 1e6, RopeStyle::kNeox, 128, RopeScalingType::kNone,
     0, 0, false},
    {"gemma2-9b", 16, 8, 256, 10000, RopeStyle::kNeox, 256,
     RopeScalingType::kNone, 4096, 50, false},
    {"gpt-oss-20b", 64, 8, 64, 150000, RopeStyle::kNeox, 64,
     RopeScalingType::kYarn, 128, 0, true},
    {"glm4-9b", 32, 2, 128, 10000, RopeStyle::kGptj, 64, RopeScalingType::kNone,
     0, 0, false},
    {"phi4-mini", 24, 8, 128, 10000, RopeStyle::kNeox, 96,
     RopeScalingType::kNone, 0, 0, false},
};

TEST(PresetsTest, ShapesMatchTheModelConfigs) {
  ASSERT_EQ(PresetNames().size(), std::size(kExpected));
  for (const Expected& e : kExpected) {
    SCOPED_TRACE(e.name);
    absl::StatusOr<ModelPreset> p = FindPreset(e.name);
    ASSERT_TRUE(p.ok()) << p.status();
    EXPECT_EQ(p->name, e.name);
    EXPECT_EQ(p->q_heads, e.hq);
    EXPECT_EQ(p->kv_heads, e.hkv);
    EXPECT_EQ(p->head_dim, e.d);
    EXPECT_EQ(p->rope.theta, e.theta);
    EXPECT_EQ(p->rope.style, e.style);
    EXPECT_EQ(p->rope.rotary_dim, e.rotary_dim);
    EXPECT_EQ(p->rope.scaling.type, e.scaling);
    EXPECT_EQ(p->sliding_window, e.window);
    EXPECT_EQ(p->logit_softcap, e.softcap);
    EXPECT_EQ(p->has_sinks, e.sinks);
  }
}

TEST(PresetsTest, ScalingParameters) {
  ModelPreset llama = FindPreset("llama3-8b").value();
  EXPECT_EQ(llama.rope.scaling.factor, 8.0);
  EXPECT_EQ(llama.rope.scaling.low_freq_factor, 1.0);
  EXPECT_EQ(llama.rope.scaling.high_freq_factor, 4.0);
  EXPECT_EQ(llama.rope.scaling.original_max_position, 8192);
  ModelPreset oss = FindPreset("gpt-oss-20b").value();
  EXPECT_EQ(oss.rope.scaling.factor, 32.0);
  EXPECT_EQ(oss.rope.scaling.original_max_position, 4096);
  // Gemma 2: query_pre_attn_scalar 256 -> 1/16.
  EXPECT_DOUBLE_EQ(FindPreset("gemma2-9b")->softmax_scale, 1.0 / 16.0);
}

TEST(PresetsTest, UnknownPresetListsTheNames) {
  absl::StatusOr<ModelPreset> p = FindPreset("llama2");
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), absl::StatusCode::kNotFound);
  for (const std::string& name : PresetNames()) {
    EXPECT_NE(p.status().message().find(name), std::string::npos) << name;
  }
}

TEST(PresetsTest, FaultNamesRoundTrip) {
  const std::vector<std::string> names = FaultNames();
  EXPECT_EQ(names.size(), 19u);
  for (const std::string& name : names) {
    absl::StatusOr<Fault> f = ParseFault(name);
    ASSERT_TRUE(f.ok()) << name;
    EXPECT_NE(*f, Fault::kNone);
    EXPECT_EQ(FaultName(*f), name);
  }
  EXPECT_EQ(ParseFault("none").value(), Fault::kNone);
  absl::StatusOr<Fault> bad = ParseFault("bit-flip");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().message().rfind("fault:", 0), 0u);
  EXPECT_NE(bad.status().message().find("k-rope-twice"), std::string::npos);
}

}  // namespace
}  // namespace attnaudit
