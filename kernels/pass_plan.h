// The host side of a GPU attention pass that needs no GPU: from a prepared
// snapshot, the runs and units each thread block reads, the launch
// parameters, the shared-memory layout and fit, the split-KV choice, the
// output buffers' sizes and bindings, the second step's parameters and
// the final write. Plain C++ (no CUDA type), built on every machine: the
// CUDA backend plans its launches with it, and the tests run the kernels'
// own source on the CPU (tests/unit/kernels/simt.h) with the very same
// plan. Pure functions of their arguments; thread-safe.
#ifndef ATTNAUDIT_KERNELS_PASS_PLAN_H_
#define ATTNAUDIT_KERNELS_PASS_PLAN_H_

#include <cstdint>
#include <vector>

#include "core/attention/attention.h"
#include "kernels/pass_params.h"

namespace attnaudit {
namespace cuda_internal {

// Threads of a fused-pass block, and the resident blocks per
// multiprocessor its register budget is cut for (128 registers a thread):
// FitPassToSharedMemory sizes stages for two.
constexpr int kPassThreads = 256;
constexpr int kPassMinBlocksPerSm = 2;

// Where the pass finds a snapshot's inputs (device pointers on a GPU).
struct PassInputs {
  const char* k = nullptr;  // the K pool as prepared (pre-RoPE: rotated f32)
  const char* v = nullptr;
  const int64_t* positions = nullptr;        // [N * P] slot positions
  const double* q = nullptr;                 // [B,Sq,Hq,D]
  const int64_t* query_positions = nullptr;  // [B,Sq]
  const double* k_scale = nullptr;           // [Hkv]
  const int64_t* unit_base = nullptr;        // [B + 1] units before row b
};

// Element strides (row, head) of a pool of `layout`.
void PoolStrides(KvLayout layout, const SnapshotDims& d, int64_t* row,
                 int64_t* head);

// The widest asynchronous copy (16, 8, 4; else 1) that every row start of
// K and V allows: rows of D elements at multiples of their size from a
// 256-byte aligned base.
int CopyWidth(int64_t k_row_bytes, int64_t v_row_bytes);

// The launch parameters every pass over this snapshot shares (inputs,
// dims, the variant); the caller sets the work, runs and outputs.
PassParams BaseParams(const PreparedAttention& p, const PassInputs& in);

// Units before each row ([B + 1]): a row's unit states start at
// unit_base[b].
std::vector<int64_t> UnitBase(const PreparedAttention& p);

// The runs (one per logical block's page) and units of every row.
struct PoolRuns {
  std::vector<PassRun> runs;
  std::vector<PassUnit> units;
  std::vector<int32_t> row_runs;  // [B + 1]
};
PoolRuns PlanPoolRuns(const PreparedAttention& p);

// Units of every row together.
int64_t TotalUnits(const PreparedAttention& p);

// The unit tree's first phase: blocks of `block` units, `blocks` a query
// (kmath::TreeBlockUnits of the most units a row has).
struct TreeShape {
  int64_t block = 1;
  int64_t blocks = 1;
};
TreeShape TreeShapeOf(const PreparedAttention& p);

// The shared-memory sections for the params' shape, stage and query chunk
// (attention_device.inc uses them); total -1 when past 2^31 bytes.
PassLayout MakePassLayout(const PassParams& params);

// Shared memory one thread block needs for these parameters (their
// queries_per_block and runs_per_stage); -1 when it never fits.
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

// The fused pass's grid: (rows x splits, KV heads, query chunks x head
// tiles).
KernelGrid FusedPassGrid(const PassParams& params);

// Split-KV when one block per (row, KV head, query chunk) would leave the
// device's multiprocessors idle: R is stored per split (the second step
// combines it). Not when those states would take more than half of
// `free_bytes`: the one-block pass gives the same P, and a snapshot that
// fits it must not fall back to the CPU for the split's sake. max_splits
// > 0 caps the splits.
void PlanSplits(const PoolRuns& plan, int multiprocessors, int64_t max_splits,
                int64_t free_bytes, PassParams* params);

// What one pass must produce, whatever shape the launch takes.
struct PassWants {
  bool reference = false;
  bool replay = false;
};

// The device a whole-pool pass is planned for, and the backend's caps.
struct PassDevice {
  int64_t max_shared = 0;  // opt-in shared memory per block
  int multiprocessors = 0;
  int64_t free_bytes = 0;  // of the pool, for the split-KV states
  int64_t max_splits = 0;  // CudaBackendOptions's
  int64_t max_stage_runs = 0;
  bool specialized = true;
};

// The fused pass over the whole pool (CudaBackend::ComputeAttention):
// *params from BaseParams with what `passes` and the unit states asked
// for (`unit_states`, with R's when `r_states`) need computed, fitted to
// the device's shared memory, split for its multiprocessors; *wants what
// the pass produces. The runs, units and outputs are the caller's to
// place. False when one page does not fit a block (the caller reports
// Unimplemented).
bool PlanPoolPass(const PreparedAttention& p, const PassInputs& in,
                  const PoolRuns& plan, AttentionPasses passes,
                  bool unit_states, bool r_states, const PassDevice& device,
                  PassParams* params, PassWants* wants);

// Element counts of a pass's buffers for the params' choices (zero where
// the pass does not write that buffer).
struct PassOutputCounts {
  int64_t queries = 0;     // r_acc / p_out rows (x D), r_m, r_l, p_lse
  int64_t states = 0;      // unit states (x D) and their lse and flags
  int64_t tree_roots = 0;  // the unit tree's first-phase roots (x D)
  int64_t r_parts = 0;     // R's per-split states (x D)
};
PassOutputCounts CountPassOutputs(const PreparedAttention& p,
                                  const PassParams& params);

// A pass's output buffers.
struct PassOutputs {
  double* r_acc = nullptr;
  double* r_m = nullptr;
  double* r_l = nullptr;
  float* p_out = nullptr;
  float* p_lse = nullptr;
  float* p_state_out = nullptr;
  float* p_state_lse = nullptr;
  double* r_state_out = nullptr;
  double* r_state_lse = nullptr;
  int* kv_non_finite = nullptr;
  unsigned char* p_state_present = nullptr;
  // P's unit tree: the first phase's roots.
  float* tree_out = nullptr;
  float* tree_lse = nullptr;
  // Split-KV only: R's per-split states.
  double* r_part_acc = nullptr;
  double* r_part_m = nullptr;
  double* r_part_l = nullptr;
};

// Points the kernel's output arguments at `out` (a split-KV pass writes R
// per split).
void BindOutputs(const PassOutputs& out, PassParams* params);

// The second step's parameters: P's unit tree into p_out / p_lse when the
// replay is wanted, R's split combine when split.
SplitMergeParams MergeParamsOf(const PreparedAttention& p,
                               const PassParams& params, const PassWants& wants,
                               const PassOutputs& out);

// R and P finished on the host with the core's final-write functions from
// the unfinished outputs (host copies; null where not wanted; p_out is
// finished in place), into res (sized by the caller).
void FinishPassOutputs(const PreparedAttention& p, const PassWants& wants,
                       const double* r_acc, const double* r_m,
                       const double* r_l, float* p_out, const float* p_lse,
                       AttentionResults* res);

}  // namespace cuda_internal
}  // namespace attnaudit

#endif  // ATTNAUDIT_KERNELS_PASS_PLAN_H_
