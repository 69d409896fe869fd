// The GPU kernels' arithmetic run on one CPU thread: the fused pass of
// kernels/attention_kernels.cu and the drift reduction of
// kernels/drift_kernels.cu with their threads replaced by loops, step for
// step in the kernels' order and with kernels/math/ and
// core/attention/merge_step.h doing every operation. Test-only; the oracle
// they are compared with is the CPU core (core/attention, core/drift).
#ifndef ATTNAUDIT_TESTS_UNIT_KERNELS_KERNEL_EMULATOR_H_
#define ATTNAUDIT_TESTS_UNIT_KERNELS_KERNEL_EMULATOR_H_

#include "core/attention/attention.h"
#include "core/attention/unit_states.h"
#include "kernels/math/drift_reduce.h"

namespace attnaudit {
namespace testing {

// R, P (finished by the core's final-write functions, as CudaBackend does)
// and, when `states` is not null, every unit's P and R states. P's unit
// states are merged after the runs in the second step's two-phase unit
// tree (kernels/math/split_merge.h). splits > 1 emulates the split-KV
// pass: each row's runs cut as kmath::SplitRuns cuts them, R restarted
// per split and combined.
AttentionResults EmulateFusedPass(const PreparedAttention& p,
                                  UnitStates* states, int64_t splits = 1);

// The drift reduction in kernels/math/drift_reduce.h's shape, for
// kmath::DriftBlocks(in.n) blocks: the grid-stride partials, the block
// trees, the last block's combine and the radix select of the p99.
kmath::DriftTotals EmulateDrift(const kmath::DriftInput& in);

}  // namespace testing
}  // namespace attnaudit

#endif  // ATTNAUDIT_TESTS_UNIT_KERNELS_KERNEL_EMULATOR_H_
