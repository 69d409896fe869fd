// The GPU attention kernels' launch parameters: plain data with no CUDA
// type, so the host code that plans a launch (kernels/pass_plan.h) and the
// tests that run the kernels' own source on the CPU (tests/unit/kernels/
// simt.h) build them on every machine. kernels/attention_kernels.h says
// what the kernels compute with them; pointers are device pointers on a
// GPU and host pointers under the emulator.
#ifndef ATTNAUDIT_KERNELS_PASS_PARAMS_H_
#define ATTNAUDIT_KERNELS_PASS_PARAMS_H_

#include <cstdint>

#include "core/arithmetic/host_device.h"

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
// attention_device.inc), which the launch sets from the block's shape.
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
  // 1: the kernel specialised for the head dim and dtype when there is one
  // (attention_device.inc, kSpecializedPasses); 0: always the generic
  // kernel (the same bits; a benchmark's baseline).
  int specialized = 1;
};

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
  // 1: each leaf walks every level of its tree (ElementTree's
  // kEveryLevel: registers instead of local memory on a GPU, at more
  // registers a thread); the same bits.
  int tree_every_level = 0;
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

// A launch's grid of thread blocks.
struct KernelGrid {
  uint32_t x = 1;
  uint32_t y = 1;
  uint32_t z = 1;
};

// Query heads of a head tile (the last tile may have fewer).
ATTNAUDIT_HOST_DEVICE inline int64_t TileHeads(const PassParams& p) {
  const int64_t group = p.q_heads / p.kv_heads;
  return (group + p.head_tiles - 1) / p.head_tiles;
}

}  // namespace cuda_internal
}  // namespace attnaudit

#endif  // ATTNAUDIT_KERNELS_PASS_PARAMS_H_
