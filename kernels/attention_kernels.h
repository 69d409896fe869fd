// The fused R + P pass on the GPU: the launch parameters (plain data, set
// up by the host side of the CUDA backend) and the launcher. The kernel
// itself is attention_kernels.cu; its per-block arithmetic is
// kernels/math/ (the CPU core's operation order, shared source).
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

namespace attnaudit {
namespace cuda_internal {

// One run of tokens: a page of the pool or a chunk a CP rank holds.
struct PassRun {
  int64_t k_offset = 0;    // bytes from k_base to token 0, KV head 0
  int64_t v_offset = 0;    // bytes from v_base
  int64_t pos_offset = 0;  // index of token 0's position in `positions`
  int32_t n = 0;           // tokens
  int32_t unit_begin = 0;  // the run's units: units[unit_begin, unit_end)
  int32_t unit_end = 0;
  int32_t pad = 0;
};

// A unit inside its run.
struct PassUnit {
  int32_t index = 0;  // the unit's index in its row's plan
  int32_t first = 0;  // first token within the run
  int32_t count = 0;
  int32_t pad = 0;
};

// Tokens a stage aims for: enough that a stage's barriers and one-thread
// steps are shared by several pages (by 64 pages of one token).
constexpr int64_t kPassStageTokens = 64;

// Byte offsets of a thread block's shared-memory sections (see
// attention_kernels.cu), which LaunchFusedPass sets from the block's shape.
// They live in the kernel's parameters, not in registers.
struct PassLayout {
  int32_t raw_k = 0, raw_v = 0;                // one stage as read: K, then V
  int32_t k32 = 0, v32 = 0, k64 = 0, v64 = 0;  // the stage widened
  int32_t q32 = 0, q64 = 0;
  int32_t vis = 0, vcount = 0, run_n = 0, tok = 0, units = 0;
  int32_t s32 = 0, e32 = 0, s64 = 0, e64 = 0, re64 = 0;
  int32_t r_acc = 0, r_m = 0, r_l = 0;
  int32_t total = 0;
};

struct PassParams {
  // Inputs (device pointers).
  const char* k_base = nullptr;
  const char* v_base = nullptr;
  int k_dtype = 0;  // core DType numbers (kernels/math/widen.h)
  int v_dtype = 0;
  int64_t k_row_stride = 0;   // elements between tokens of a run
  int64_t k_head_stride = 0;  // elements between KV heads
  int64_t v_row_stride = 0;
  int64_t v_head_stride = 0;
  const int64_t* positions = nullptr;
  const double* q = nullptr;                 // [B,Sq,Hq,D] post-RoPE
  const int64_t* query_positions = nullptr;  // [B,Sq]
  const double* k_scale = nullptr;           // [Hkv]
  int64_t queries = 0;
  int64_t q_heads = 0;
  int64_t kv_heads = 0;
  int64_t head_dim = 0;
  int64_t max_run = 0;  // most tokens of any run (<= page size)
  double softmax_scale = 1;
  double softcap = 0;
  int64_t window = 0;
  int window_inclusive = 0;
  // Work: rows [row_begin, row_begin + rows); row b's runs are
  // runs[row_runs[b - row_begin] .. row_runs[b - row_begin + 1]).
  int64_t row_begin = 0;
  int64_t rows = 0;
  const PassRun* runs = nullptr;
  const int32_t* row_runs = nullptr;
  const PassUnit* units = nullptr;
  // A ring rank computes only the (b, g) it owns: (b * Hkv + g) % owner_world
  // == owner_rank; owner_world 0 computes every item.
  int64_t owner_world = 0;
  int64_t owner_rank = 0;
  int64_t queries_per_block = 1;  // query positions per thread block
  // The GQA group's query heads are cut into head_tiles tiles of
  // ceil(group / head_tiles) heads, one thread block each, when the whole
  // group does not fit a block's shared memory (each tile reads the K/V).
  int64_t head_tiles = 1;
  int64_t runs_per_stage = 1;  // runs read and computed together
  PassLayout layout;           // set by LaunchFusedPass
  // Split-KV (above): blocks per row along its runs; R's state of split s
  // goes to r_* at s * r_split_stride + the query's index, and each stored
  // P unit state sets its flag in p_state_present.
  int64_t splits = 1;
  int64_t r_split_stride = 0;
  unsigned char* p_state_present = nullptr;
  // What to compute.
  int reference = 0;       // R's running state into r_*
  int store_p_states = 0;  // every unit's P state into p_state_* (P)
  int store_r_states = 0;  // every unit's R state into r_state_*
  // Outputs (device pointers), indexed by query (b, sq, h) or by state
  // ((unit_base[b] + unit) * Sq + sq) * Hq + h.
  double* r_acc = nullptr;  // [B,Sq,Hq,D]
  double* r_m = nullptr;    // [B,Sq,Hq]
  double* r_l = nullptr;
  const int64_t* unit_base = nullptr;  // [B + 1]
  float* p_state_out = nullptr;
  float* p_state_lse = nullptr;
  double* r_state_out = nullptr;
  double* r_state_lse = nullptr;
  int* kv_non_finite = nullptr;  // set to 1 when a K/V value is not finite
  // Byte alignment every K/V row start shares (16, 8, 4 or 1): the width
  // of the asynchronous copies.
  int copy_width = 1;
};

// Shared memory one thread block needs for these parameters (their
// queries_per_block and runs_per_stage).
int64_t PassSharedBytes(const PassParams& params);

// Picks queries_per_block (as many as fit, for the K/V reuse) -- and, when
// even one query position of the whole GQA group does not fit, the fewest
// head_tiles that do -- then runs_per_stage (up to kPassStageTokens tokens,
// fewer when two blocks would not fit a multiprocessor; at most
// max_stage_runs when > 0); false when one query head, one position and
// one run do not fit `max_shared` bytes (a page too large: the caller
// reports Unimplemented).
bool FitPassToSharedMemory(PassParams* params, int64_t max_shared,
                           int64_t max_stage_runs = 0);

// Launches the pass on `stream` for every (row, split, KV head, query
// chunk).
absl::Status LaunchFusedPass(const PassParams& params, cudaStream_t stream);

// The pass's second step for rows [row_begin, row_begin + rows): P's unit
// tree (two kernels) and, split-KV, R's split combine (one thread per
// query and element).
struct SplitMergeParams {
  int64_t row_begin = 0;
  int64_t rows = 0;
  int64_t queries = 0;
  int64_t q_heads = 0;
  int64_t head_dim = 0;
  // P: unit states indexed as PassParams's; null p_out skips P.
  const int64_t* unit_base = nullptr;  // [B + 1]
  const float* p_state_out = nullptr;
  const float* p_state_lse = nullptr;
  const unsigned char* p_state_present = nullptr;
  float* p_out = nullptr;
  float* p_lse = nullptr;
  // The first phase's roots: tree_blocks blocks of tree_block units per
  // query (tree_block = kmath::TreeBlockUnits of the most units a row
  // has); scratch for rows x queries x query heads x tree_blocks roots.
  int64_t tree_block = 1;
  int64_t tree_blocks = 1;
  float* tree_out = nullptr;  // [query][block][D]
  float* tree_lse = nullptr;  // [query][block]
  // R: `splits` partial states r_part_* (split stride r_split_stride); null
  // r_acc skips R.
  int64_t splits = 1;
  int64_t r_split_stride = 0;
  const double* r_part_acc = nullptr;
  const double* r_part_m = nullptr;
  const double* r_part_l = nullptr;
  double* r_acc = nullptr;
  double* r_m = nullptr;
  double* r_l = nullptr;
};

absl::Status LaunchSplitMerge(const SplitMergeParams& params,
                              cudaStream_t stream);

// One token a CP rank copies from the pool into its slot (the ring's local
// fill): its position and its K and V rows of every KV head. Offsets in
// bytes (positions: index into the pool's positions).
struct GatherToken {
  int64_t k_src = 0;  // from k_base: the token's row of KV head 0
  int64_t v_src = 0;
  int64_t pos_src = 0;
  int64_t pos_dst = 0;  // from the slot
  int64_t k_dst = 0;    // the token's Hkv rows, contiguous
  int64_t v_dst = 0;
};

struct GatherParams {
  const char* k_base = nullptr;
  const char* v_base = nullptr;
  const int64_t* positions = nullptr;
  char* slot = nullptr;
  const GatherToken* tokens = nullptr;
  int64_t count = 0;
  int64_t kv_heads = 0;
  int64_t k_row_bytes = 0;  // D * K element size
  int64_t v_row_bytes = 0;
  int64_t k_head_stride_bytes = 0;
  int64_t v_head_stride_bytes = 0;
};

absl::Status LaunchGather(const GatherParams& params, cudaStream_t stream);

}  // namespace cuda_internal
}  // namespace attnaudit

#endif  // ATTNAUDIT_KERNELS_ATTENTION_KERNELS_H_
