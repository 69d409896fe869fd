// Runtime dispatch for the core's Highway code, without Highway's library.
//
// Why not HWY_EXPORT / HWY_DYNAMIC_DISPATCH: they live in libhwy.so, whose
// load-time initialiser calibrates a timer, a fixed cost of every process
// start that a small `attnaudit check` would notice. The per-target code is
// header-only; choosing among the targets is a cpuid check, done here once.
//
// The targets are fixed by attnaudit_simd_sources (cmake/): SSE4, AVX2 and
// AVX-512 ("AVX3"), compiled into every binary. A .cc written over
// core/simd/simd-inl.h exports a per-target function in its HWY_ONCE part:
//
//   ATTNAUDIT_SIMD_EXPORT(RunPassItemImpl);
//   void RunPassItem(...) { ATTNAUDIT_SIMD_DISPATCH(RunPassItemImpl)(...); }
//
// Thread-safe; ForceSimdTargetForTest (core/simd/targets.h) must not race
// with dispatched calls.
#ifndef ATTNAUDIT_CORE_SIMD_DISPATCH_H_
#define ATTNAUDIT_CORE_SIMD_DISPATCH_H_

#include <cstdint>

#include "hwy/highway.h"

namespace attnaudit {
namespace simd_internal {

// Index of the target in use: 0 AVX-512, 1 AVX2, 2 SSE4 (best first).
int ChosenTargetIndex();

}  // namespace simd_internal
}  // namespace attnaudit

#if !(HWY_TARGETS & HWY_AVX3) || !(HWY_TARGETS & HWY_AVX2) || \
    !(HWY_TARGETS & HWY_SSE4)
#error \
    "SIMD sources must be compiled for SSE4, AVX2 and AVX3 (attnaudit_simd_sources)"
#endif

// A table of the per-target versions of `fn`, best first.
#define ATTNAUDIT_SIMD_EXPORT(fn)                                       \
  static decltype(&::attnaudit::N_SSE4::fn) const fn##_SimdTable[3] = { \
      &::attnaudit::N_AVX3::fn, &::attnaudit::N_AVX2::fn,               \
      &::attnaudit::N_SSE4::fn}

// The version of `fn` for this CPU (or the target a test forced).
#define ATTNAUDIT_SIMD_DISPATCH(fn) \
  (*fn##_SimdTable[::attnaudit::simd_internal::ChosenTargetIndex()])

#endif  // ATTNAUDIT_CORE_SIMD_DISPATCH_H_
