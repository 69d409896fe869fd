// The GPU kernels' arithmetic run on one CPU thread: the fused pass of
// kernels/attention_kernels.cu with its threads replaced by loops, step for
// step in the kernel's order and with kernels/math/ and
// core/attention/merge_step.h doing every operation. Test-only; the oracle
// it is compared with is the CPU core (core/attention), bit for bit.
#ifndef ATTNAUDIT_TESTS_UNIT_KERNELS_KERNEL_EMULATOR_H_
#define ATTNAUDIT_TESTS_UNIT_KERNELS_KERNEL_EMULATOR_H_

#include "core/attention/attention.h"
#include "core/attention/unit_states.h"

namespace attnaudit {
namespace testing {

// R, P (finished by the core's final-write functions, as CudaBackend does)
// and, when `states` is not null, every unit's P and R states. splits > 1
// emulates the split-KV pass: each row's runs cut as kmath::SplitRuns cuts
// them, R restarted per split and combined, P's unit states folded after
// (kernels/math/split_merge.h).
AttentionResults EmulateFusedPass(const PreparedAttention& p,
                                  UnitStates* states, int64_t splits = 1);

}  // namespace testing
}  // namespace attnaudit

#endif  // ATTNAUDIT_TESTS_UNIT_KERNELS_KERNEL_EMULATOR_H_
