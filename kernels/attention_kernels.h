// The fused R + P pass on the GPU: the launchers. Their parameters are
// plain data (kernels/pass_params.h) planned by kernels/pass_plan.h; the
// kernels' source is kernels/attention_device.inc (compiled by nvcc in
// attention_kernels.cu, and run on the CPU by the tests' SIMT emulator);
// their per-block arithmetic is kernels/math/ (the CPU core's operation
// order, shared source).
//
// One thread block per (batch row, KV head, chunk of query positions, tile
// of the GQA group's query heads -- one tile unless the group is too large
// for a block's shared memory): it
// reads each of the row's runs (a KV page through the block table, or a
// chunk a CP rank received) once, K then V, a stage of `runs_per_stage`
// runs at a time: asynchronous 16-byte copies (smaller when the rows are
// not 16-byte aligned) fill the raw stage while the block computes the
// stage before it from its widened copy. Every phase of a stage runs its
// runs and units side by side (after the scores, a warp per row of R or
// per (row, unit) of P, with a max and a sum in key order), so a stage
// costs a few barriers whatever its runs. From each stage the block
// computes every query head of the GQA group and every query position of
// the chunk:
//   - R: the fp64 online softmax per run (a logical block), as the CPU's;
//   - P: per unit (a run's units, core/attention/units.h) the fp32 partial
//     state, stored with a presence flag (and, for the CP reference
//     partials, R's unit states too).
// LaunchSplitMerge, the second step, merges each query's P unit states in
// the contract's tree over the unit indices (core/attention/merge_tree.h;
// two phases, kernels/math/split_merge.h), one thread per (query, four
// elements, first-phase block) and then per (query, four elements), each
// merge's weights computed once for the four: a chain of about
// 2 sqrt(units) dependent merges, not one per unit. The stored states cost
// (D + 1) x 4 bytes per (unit, query, query head) -- a quarter of the K/V
// bytes at W1's shape (GQA group 4, pages of 16) -- from the backend's
// pool.
// Split-KV: a decode row (one query position, a long context) is one block
// per KV head -- far fewer blocks than a GPU has multiprocessors. With
// splits > 1 each row's runs are cut into `splits` contiguous ranges
// (kmath::SplitRuns), one thread block per (row, range, KV head, query
// chunk): R's online softmax restarts per range and its state is stored
// per split, and the second step combines the splits (same P either way).
// Outputs stay unfinished (R: acc, m, l; P: the merged out and lse): the
// host finishes them with the core's FinishReferenceState /
// FinishReplayState (sinks, V scale, the one rounding), so the final write
// is the CPU's code.
//
// Thread safety: a launch touches only its own buffers; launches on
// different streams may overlap. Errors come back as a status (launch
// configuration) or from the stream (execution).
#ifndef ATTNAUDIT_KERNELS_ATTENTION_KERNELS_H_
#define ATTNAUDIT_KERNELS_ATTENTION_KERNELS_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/pass_params.h"

namespace attnaudit {
namespace cuda_internal {

// Launches the pass on `stream` for every (row, split, KV head, query
// chunk); *specialized (when not null) says whether the kernel built for
// the params' head dim and dtype ran (params.specialized allows it).
absl::Status LaunchFusedPass(const PassParams& params, cudaStream_t stream,
                             bool* specialized = nullptr);

// The pass's second step (SplitMergeParams).
absl::Status LaunchSplitMerge(const SplitMergeParams& params,
                              cudaStream_t stream);

// The CP ring's local fill: a rank's tokens from the pool into its slot.
absl::Status LaunchGather(const GatherParams& params, cudaStream_t stream);

}  // namespace cuda_internal
}  // namespace attnaudit

#endif  // ATTNAUDIT_KERNELS_ATTENTION_KERNELS_H_
