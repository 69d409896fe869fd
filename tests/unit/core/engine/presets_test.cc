// The engine presets table: one row per name, each resolvable, and the
// lookups. The Python client's copy is checked against it by
// tests/python/test_presets.py.
#include "core/engine/presets.h"

#include <set>
#include <string>

#include "core/engine/arithmetic.h"
#include "gtest/gtest.h"

namespace attnaudit {
namespace {

TEST(EnginePresetsTest, EachNameOnceAndFoundByName) {
  std::set<std::string> names;
  for (const EnginePreset& preset : kEnginePresets) {
    EXPECT_TRUE(names.insert(std::string(preset.name)).second) << preset.name;
    EXPECT_EQ(FindEnginePreset(preset.name), &preset);
    // A preset names a profile: never the undeclared or the custom one.
    EXPECT_NE(preset.profile, EngineProfile::kUnspecified) << preset.name;
    EXPECT_NE(preset.profile, EngineProfile::kCustom) << preset.name;
  }
  EXPECT_EQ(FindEnginePreset("no-such-engine"), nullptr);
  EXPECT_EQ(FindEnginePreset(""), nullptr);
}

TEST(EnginePresetsTest, KnownPresets) {
  const EnginePreset* vllm_cpu = FindEnginePreset("vllm-cpu");
  ASSERT_NE(vllm_cpu, nullptr);
  EXPECT_EQ(vllm_cpu->profile, EngineProfile::kVllmCpu);
  EXPECT_EQ(vllm_cpu->cast_point, RopeCastPoint::kCosSin);
  EXPECT_EQ(EngineProfileName(vllm_cpu->profile), "vllm-cpu");
  const EnginePreset* hf_sdpa = FindEnginePreset("hf-sdpa");
  ASSERT_NE(hf_sdpa, nullptr);
  EXPECT_EQ(hf_sdpa->profile, EngineProfile::kTorchFlashCpu);
  EXPECT_EQ(hf_sdpa->cast_point, RopeCastPoint::kEachOp);
}

TEST(EnginePresetsTest, FamiliesOnceAndNotTheDefault) {
  std::set<std::string> families;
  for (const FamilyCastPoint& f : kHfFamilyCastPoints) {
    EXPECT_TRUE(families.insert(std::string(f.family)).second) << f.family;
    // A family listed rounds differently from the default: else it need
    // not be listed.
    EXPECT_NE(f.cast_point, kHfDefaultCastPoint) << f.family;
  }
}

TEST(EnginePresetsTest, CastPointNamesAreTheWiresLowerCase) {
  EXPECT_EQ(RopeCastPointName(RopeCastPoint::kAfterRope), "after_rope");
  EXPECT_EQ(RopeCastPointName(RopeCastPoint::kCosSin), "cos_sin");
  EXPECT_EQ(RopeCastPointName(RopeCastPoint::kEachOp), "each_op");
}

}  // namespace
}  // namespace attnaudit
