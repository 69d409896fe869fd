// Compiled with the SIMD sources' flags (attnaudit_simd_sources), so the
// targets compiled here are the ones the hot loops are compiled for, and
// ActiveSimdTarget asks the dispatcher itself which one it picks.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "core/simd/targets.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include "core/simd/targets.h"
#include "hwy/highway.h"
#include "hwy/targets.h"

HWY_BEFORE_NAMESPACE();
namespace attnaudit {
namespace HWY_NAMESPACE {

int64_t ThisTarget() { return HWY_TARGET; }

}  // namespace HWY_NAMESPACE
}  // namespace attnaudit
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace attnaudit {

HWY_EXPORT(ThisTarget);

std::vector<int64_t> CompiledSimdTargets() {
  std::vector<int64_t> out;
  const int64_t supported = hwy::SupportedTargets();
  for (int64_t bits = HWY_TARGETS & supported; bits != 0; bits &= bits - 1) {
    out.push_back(bits & -bits);  // lower bits are better targets
  }
  return out;
}

std::string SimdTargetName(int64_t target) { return hwy::TargetName(target); }

std::string ActiveSimdTarget() {
  return SimdTargetName(HWY_DYNAMIC_DISPATCH(ThisTarget)());
}

void ForceSimdTargetForTest(int64_t target) {
  hwy::SetSupportedTargetsForTest(target);
}

}  // namespace attnaudit
#endif  // HWY_ONCE
