// Target selection by cpuid (see dispatch.h), and the per-target
// self-report that tests use to check which version really ran. Compiled
// with the SIMD sources' flags, so the targets match theirs.
// clang-format off: foreach_target.h must come first, before the
// headers it re-includes for every target.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "core/simd/targets.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
// clang-format on

#include <atomic>

#include "core/simd/dispatch.h"
#include "core/simd/targets.h"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace attnaudit {
namespace HWY_NAMESPACE {

int64_t ThisTarget() { return HWY_TARGET; }

}  // namespace HWY_NAMESPACE
}  // namespace attnaudit
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace attnaudit {
namespace {

constexpr int64_t kTargets[3] = {HWY_AVX3, HWY_AVX2, HWY_SSE4};

// What each Highway target needs of the CPU (and of the OS, for the wider
// registers: libgcc's cpu model checks XCR0).
bool CpuRuns(int index) {
  __builtin_cpu_init();
  switch (index) {
    case 0:
      return __builtin_cpu_supports("avx512f") &&
             __builtin_cpu_supports("avx512vl") &&
             __builtin_cpu_supports("avx512dq") &&
             __builtin_cpu_supports("avx512bw") && CpuRuns(1);
    case 1:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
             __builtin_cpu_supports("bmi") && __builtin_cpu_supports("bmi2") &&
             CpuRuns(2);
    default:
      return __builtin_cpu_supports("sse4.2") &&
             __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("aes");
  }
}

int BestIndex() {
  for (int i = 0; i < 2; ++i) {
    if (CpuRuns(i)) return i;
  }
  return 2;  // the baseline every build runs on
}

std::atomic<int> forced_index{-1};

int IndexOf(int64_t target) {
  for (int i = 0; i < 3; ++i) {
    if (kTargets[i] == target) return i;
  }
  return -1;
}

}  // namespace

namespace simd_internal {

int ChosenTargetIndex() {
  static const int best = BestIndex();
  const int forced = forced_index.load(std::memory_order_relaxed);
  return forced >= 0 ? forced : best;
}

}  // namespace simd_internal

ATTNAUDIT_SIMD_EXPORT(ThisTarget);

std::vector<int64_t> CompiledSimdTargets() {
  std::vector<int64_t> out;
  for (int i = 0; i < 3; ++i) {
    if (CpuRuns(i)) out.push_back(kTargets[i]);
  }
  return out;
}

std::string SimdTargetName(int64_t target) {
  switch (target) {
    case HWY_AVX3:
      return "AVX3";
    case HWY_AVX2:
      return "AVX2";
    case HWY_SSE4:
      return "SSE4";
    default:
      return "unknown";
  }
}

std::string ActiveSimdTarget() {
  return SimdTargetName(ATTNAUDIT_SIMD_DISPATCH(ThisTarget)());
}

void ForceSimdTargetForTest(int64_t target) {
  forced_index.store(target == 0 ? -1 : IndexOf(target),
                     std::memory_order_relaxed);
}

}  // namespace attnaudit
#endif  // HWY_ONCE
