// Internal pieces of the engine simulator (sim/): the page layout, the
// synthetic content model, and the fault planner. Not part of the public API
// (simulator.h); tests may use it. All functions are deterministic in their
// inputs; none keeps state.
#ifndef ATTNAUDIT_SIM_SYNTH_INTERNAL_H_
#define ATTNAUDIT_SIM_SYNTH_INTERNAL_H_

#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "core/rope/rope.h"
#include "core/tensor/tensor.h"
#include "sim/flash_decode.h"
#include "sim/simulator.h"

namespace attnaudit::sim_internal {

// Row b holds max(context - 7 b, Sq, 1) tokens (rows differ a little, as in
// a real batch) at contiguous positions from first_positions[b].
int64_t RowLength(const SynthOptions& options, int64_t row);

// Which pool page holds each logical block, and what each pool page holds.
struct SynthLayout {
  int64_t batch = 0;
  int64_t queries = 0;
  int64_t page_size = 0;
  int64_t max_blocks = 0;
  int64_t num_pages = 0;
  int64_t shared_blocks = 0;      // full prefix blocks shared by every row
  std::vector<int64_t> seq_lens;  // [B]
  std::vector<int64_t> first_positions;           // [B]
  std::vector<std::vector<int32_t>> block_pages;  // [B][ceil(L_b / P)]
  // Per pool page: the row and logical block whose tokens it holds (row 0
  // for shared prefix pages).
  std::vector<int32_t> page_row;
  std::vector<int32_t> page_block;
};

// Options must have been checked. Shared prefix blocks are allocated once;
// with options.permute_pages the allocation order is scattered over the
// pool by a seeded permutation, otherwise page = allocation index.
SynthLayout BuildLayout(const SynthOptions& options);

// What makes the synthetic attention look like a model's: each KV head has a
// unit "heavy" direction u on its lowest-frequency RoPE pairs and on the
// non-rotary dims (which RoPE barely moves, so the alignment survives any
// distance); queries carry strength * u, and about 1 key in 32 (plus token 0,
// an attention sink) carries c * u, adding ~5 (sink ~9) to its scaled score.
struct ContentModel {
  uint64_t seed = 1;
  int64_t q_heads = 0;
  int64_t kv_heads = 0;
  int64_t head_dim = 0;
  int64_t prefix = 0;             // tokens [0, prefix) are shared by all rows
  std::vector<float> direction;   // [Hkv, D]
  std::vector<float> q_strength;  // [Hq]
  float heavy_strength = 0;
  float sink_strength = 0;
  // Peaked attention (SynthOptions::sink_share_*, logit_offset): the two
  // dims of each reserved rotary pair ({-1, -1}: off), the sink key's value
  // on its pair's first dim, every key's value on the offset pair's first
  // dim and q's there. Every other key holds 0 on the sink pair.
  int64_t sink_dims[2] = {-1, -1};
  int64_t offset_dims[2] = {-1, -1};
  float sink_key = 0;
  float offset_key = 0;
  float offset_query = 0;
};

ContentModel MakeContentModel(const SynthOptions& options,
                              const ModelPreset& preset, const RopeTable& rope,
                              double scale);

// Pre-RoPE K and V [Hkv * D] of logical token `index` of `row`
// (row-independent inside the shared prefix). `stale` selects the content an
// outdated page still holds instead.
void TokenContent(const ContentModel& model, int64_t row, int64_t index,
                  bool stale, float* k, float* v);

struct KvPool {
  Tensor k_pages;         // [N, P, Hkv, D] kv dtype, K post-RoPE
  Tensor v_pages;         // [N, P, Hkv, D]
  Tensor slot_positions;  // [N, P] i32, -1 for unused slots
  Tensor k_scale;         // f32 [Hkv], fp8 only
  Tensor v_scale;
};

// Builds the pool. fp8: K/V are rotated in fp32, rounded to bf16 (the model
// dtype), divided by the per-head scale amax / 448 and cast to e4m3.
// Inactive slots hold the previous occupant's (random) content.
KvPool GeneratePool(const SynthLayout& layout, const ContentModel& model,
                    const RopeTable& rope, DType kv_dtype, int threads);

// The outdated content of pool page `page` ([P, Hkv, D], the pool's dtype
// and scales) for the stale-page fault.
void GenerateStalePage(const SynthLayout& layout, const ContentModel& model,
                       const RopeTable& rope, const KvPool& pool, int64_t page,
                       Tensor* k, Tensor* v);

// q [B, Sq, Hq, D] pre-RoPE in `dtype`.
Tensor GenerateQueries(const SynthLayout& layout, const ContentModel& model,
                       DType dtype);

// Peaked attention: sets q's value on the sink pair of every (row, query,
// head) that sees token 0 so that the sink takes its drawn share of the
// key weight (scores in fp64 from the pool as stored, q rotated in fp32;
// `window` in the HF convention, 0: none). A no-op when the model has no
// sink pair.
void SetSinkShares(const SynthOptions& options, const SynthLayout& layout,
                   const ContentModel& model, const RopeTable& rope,
                   const KvPool& pool, double scale, int64_t window, Tensor* q);

// Softmax weight of every key of `row`, summed over query heads: [Sq][L]
// (fp32 scores of the plan's q and K, masks as the plan's; sinks ignored).
std::vector<std::vector<double>> KeyMass(const EnginePlan& plan, int64_t row);

// What a faulty plan points at (owned by the caller, kept until the plan
// has run): the stale page's content and rope-style's q table.
struct FaultStorage {
  Tensor stale_k, stale_v;
  std::vector<RopeTable> q_rope;  // empty, or the one table
};

// Turns the clean plan into the faulty engine's plan (one-place faults hit
// where options.fault_row / fault_block / fault_block_rank say). *details
// gets what was injected where, in words (details->fault) and as a site.
// InvalidArgument ("fault: ...") when the fault cannot change anything for
// these options.
absl::Status PlanFault(const SynthOptions& options, const SynthLayout& layout,
                       const ContentModel& model, const RopeConfig& rope_config,
                       const RopeTable& rope, const KvPool& pool,
                       double model_scale, EnginePlan* plan,
                       FaultStorage* storage, SynthDetails* details);

// ---- Context parallelism (cp_engine.cc) ----------------------------------

// The CP rank owning every logical token, [B][L_b], under the options'
// sharding (token interleaving goes by global position, as validation's
// TokenOwner does). Explicit owners: contiguous, balanced block ranges per
// row; with the empty-rank-garbage fault the last row skips the faulted
// rank.
std::vector<std::vector<int32_t>> TokenOwners(const SynthOptions& options,
                                              const SynthLayout& layout);

// Sets snapshot->cp (world size, sharding, interleave, block owners).
void SetCpConfig(const SynthOptions& options, const SynthLayout& layout,
                 const std::vector<std::vector<int32_t>>& owners,
                 Snapshot* snapshot);

// Where a CP fault hits: the rank, and for stale-rank-page the stale reads
// (their content is owned here; the plan points at it).
struct CpFaultPlan {
  CpFault fault = CpFault::kNone;
  int32_t rank = -1;
  int64_t row = -1;  // stale-rank-page: the row of the stale local page
  std::vector<EnginePlan::StaleRead> stale_reads;
  std::deque<Tensor> stale_pages;  // stable addresses
  std::string description;
};

// Chooses the faulted rank (options.cp_fault_rank, or one picked from the
// seed among the ranks the fault can show on) and the stale local page.
// InvalidArgument ("cp_fault_rank: ...") when the fault cannot show.
absl::Status PlanCpFault(const SynthOptions& options, const SynthLayout& layout,
                         const ContentModel& model, const RopeTable& rope,
                         const KvPool& pool, const EnginePlan& plan,
                         const std::vector<std::vector<int32_t>>& owners,
                         CpFaultPlan* fault);

struct CpEngineResult {
  Tensor rank_out;  // [W, B, Sq, Hq, D] out dtype
  Tensor rank_lse;  // [W, B, Sq, Hq] f32, natural log (or the fault's)
  Tensor out;       // [B, Sq, Hq, D] the engine's combined output
  Tensor lse;       // [B, Sq, Hq] f32
};

// The sharded engine: one partial per rank by the plan's kernel restricted
// to the rank's keys, then the combine (fp32 LSE weights; sinks after the
// combine; one cast of out), with the CP fault applied.
CpEngineResult RunCpEngine(const EnginePlan& plan, int64_t world,
                           const std::vector<std::vector<int32_t>>& owners,
                           const CpFaultPlan& fault);

}  // namespace attnaudit::sim_internal

#endif  // ATTNAUDIT_SIM_SYNTH_INTERNAL_H_
