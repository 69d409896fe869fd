// Which SIMD targets this binary carries and which one runs. The core's hot
// loops (core/simd/simd-inl.h users) are compiled for each target in
// CompiledSimdTargets() and dispatched at run time to the best one the CPU
// supports; tests force each target in turn to check that every target
// computes the same bits. Thread-safe.
#ifndef ATTNAUDIT_CORE_SIMD_TARGETS_H_
#define ATTNAUDIT_CORE_SIMD_TARGETS_H_

#include <cstdint>
#include <string>
#include <vector>

namespace attnaudit {

// Highway target bits compiled into the core and supported by this CPU,
// best first.
std::vector<int64_t> CompiledSimdTargets();

// Name of a target bit ("AVX3" is AVX-512, "AVX2", "SSE4").
std::string SimdTargetName(int64_t target);

// The target the dispatched loops use now (the best one, unless a test
// restricted them with ForceSimdTargetForTest).
std::string ActiveSimdTarget();

// Restricts dispatch to `target` (one of CompiledSimdTargets()); 0 undoes
// it. For tests and benchmarks only: not safe while other threads run
// dispatched code.
void ForceSimdTargetForTest(int64_t target);

}  // namespace attnaudit

#endif  // ATTNAUDIT_CORE_SIMD_TARGETS_H_
