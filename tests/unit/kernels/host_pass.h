// The CUDA backend's attention pass run on the CPU: the backend's own plan
// (kernels/pass_plan.h) and the kernels' own source (kernels/
// attention_device.inc) under the SIMT emulator (simt.h), step for step as
// CudaBackend::RunAttention takes them, with host buffers in place of the
// device pool. What a GPU run of the same code gives, bit for bit, without
// a GPU. Test-only; not thread-safe (one emulated launch at a time).
#ifndef ATTNAUDIT_TESTS_UNIT_KERNELS_HOST_PASS_H_
#define ATTNAUDIT_TESTS_UNIT_KERNELS_HOST_PASS_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "core/attention/attention.h"
#include "core/attention/unit_states.h"
#include "kernels/pass_params.h"
#include "tests/unit/kernels/simt.h"

namespace attnaudit {
namespace testing {

// The device the plan is made for (an H200 by default) and the backend's
// options.
struct HostPassOptions {
  int64_t max_shared = 232448;  // opt-in shared memory per block
  int multiprocessors = 132;
  int64_t free_bytes = int64_t{1} << 31;  // of the pool, for the splits
  int64_t max_splits = 0;                 // CudaBackendOptions's
  int64_t max_stage_runs = 0;
  AttentionPasses passes = AttentionPasses::kBoth;
  bool record_merge_orders = false;
  simt::ThreadOrder order = simt::ThreadOrder::kFirstToLast;
  bool specialized = true;        // CudaBackendOptions::specialized_kernels
  bool tree_every_level = false;  // ...::unit_tree_every_level
};

struct HostPassRun {
  AttentionResults results;
  cuda_internal::PassParams params;  // the fused pass's launch shape
  std::vector<simt::Launch> launches;
};

// R and P of `p` as the GPU pass computes them (and, when `states` is not
// null, every unit's states, as CudaBackend fills them); an error when the
// plan refuses the snapshot or the emulator finds a fault in the kernels.
absl::StatusOr<HostPassRun> RunPassOnHost(const PreparedAttention& p,
                                          UnitStates* states,
                                          const HostPassOptions& options = {});

// The CP fill kernel (GatherKernel) over host buffers.
absl::Status RunGatherOnHost(const cuda_internal::GatherParams& params);

}  // namespace testing
}  // namespace attnaudit

#endif  // ATTNAUDIT_TESTS_UNIT_KERNELS_HOST_PASS_H_
