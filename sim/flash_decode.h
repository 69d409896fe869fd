// The simulated engine kernel (internal to sim/): a split-KV
// flash-decoding attention in fp32, written independently of attnaudit's
// reference and replay (core/attention) so that it can stand in for a real
// engine.
//
// What it does, per (row, KV head), the way a GPU decode kernel does:
//  - q: RoPE in fp32 at the query's position, one cast to the q RoPE output
//    dtype, back to fp32; the query heads of one GQA group share each K/V
//    tile load;
//  - the keys [0, L) of the row are cut into splits of `split_tokens`
//    logical tokens (at most kMaxSplits; longer rows get longer splits); each
//    split runs an online softmax over tiles of at most kTileTokens keys that
//    never cross a page (tile max, rescale of the running sum and accumulator
//    by exp(m_old - m_new)), masking by logical index (causal and the HF
//    sliding window) and producing a partial (out normalised within the split,
//    lse);
//  - a combine step merges the splits in fp32 weighted by exp(lse_i - max);
//  - sinks join the denominator after the combine (the returned LSE does
//    not include them); out is cast once to the output dtype.
// The plan's fault knobs reproduce real bugs (see docs/SIMULATOR.md).
// RunFlashDecode is deterministic (work items write disjoint outputs) and
// thread-safe for concurrent calls with distinct plans.
#ifndef ATTNAUDIT_SIM_FLASH_DECODE_H_
#define ATTNAUDIT_SIM_FLASH_DECODE_H_

#include <cstdint>
#include <vector>

#include "core/rope/rope.h"
#include "core/tensor/tensor.h"

namespace attnaudit::sim_internal {

inline constexpr int64_t kTileTokens = 64;
// At most this many splits per row (longer rows get longer splits).
inline constexpr int64_t kMaxSplits = 128;

struct EnginePlan {
  int64_t batch = 0;
  int64_t queries = 0;  // Sq
  int64_t q_heads = 0;
  int64_t kv_heads = 0;
  int64_t head_dim = 0;
  int64_t page_size = 0;

  // The KV pool, NHD [N, P, Hkv, D] (borrowed), and the per-KV-head factors
  // the kernel dequantises K and V with (1 for non-fp8 caches).
  const Tensor* k_pages = nullptr;
  const Tensor* v_pages = nullptr;
  std::vector<float> k_descale;
  std::vector<float> v_descale;

  // Per row: the engine's block table (pool page of each logical block),
  // the KV length and the RoPE position of logical token 0 (positions are
  // contiguous in the simulator).
  std::vector<std::vector<int32_t>> block_pages;
  std::vector<int64_t> seq_lens;
  std::vector<int64_t> first_positions;
  // Per query [B * Sq]: the logical index of the query's own token.
  std::vector<int64_t> query_index;

  const Tensor* q = nullptr;  // pre-RoPE [B, Sq, Hq, D] (borrowed)
  const RopeTable* rope = nullptr;
  DType q_rope_dtype = DType::kBF16;

  float scale = 1.0f;
  float softcap = 0.0f;      // 0: none
  int64_t window = 0;        // HF convention; 0: none
  std::vector<float> sinks;  // [Hq] or empty
  DType out_dtype = DType::kBF16;
  int64_t split_tokens = 256;
  int threads = 0;
  // Engine kind: P rounded to p_dtype before P.V (the row sum stays fp32,
  // as tensor-core kernels keep it), and for fp8 caches the dequantised K
  // and V rounded to bf16 before use.
  DType p_dtype = DType::kF32;
  bool dequant_bf16 = false;

  // Fault knobs (all off by default).
  int64_t q_position_delta = 0;        // rope-offset: q rotated at position + 1
  bool rotate_k_again = false;         // k-rope-twice
  bool gqa_modulo = false;             // gqa-mapping: KV head h % Hkv
  std::vector<int64_t> dropped_block;  // [B], -1: none (drop-block)
  // stale-page / stale-rank-page: pool pages (all slots, or the flagged
  // ones) read with outdated content ([P, Hkv, D] in the KV dtype).
  struct StaleRead {
    int32_t page = -1;
    const Tensor* k = nullptr;
    const Tensor* v = nullptr;
    std::vector<uint8_t> slots;  // [P] flags; empty: every slot
  };
  std::vector<StaleRead> stale_reads;
  bool lse_base2 = false;  // lse-base2: lse * log2(e), declared base e
  const RopeTable* q_rope = nullptr;  // rope-style: q's table (null: rope)
  bool unrotate_k = false;            // k-rope-missing: K rotated back
  // bf16-running-out: the combine folds the splits one by one and rounds
  // its running output to this dtype after each (f32: the plain combine).
  DType running_out_dtype = DType::kF32;

  // Context parallelism: when rank >= 0 the kernel attends only the keys
  // whose owner (token_owner[b][logical index]) is `rank`, and returns
  // that rank's partial: out normalised over its keys (no sinks), lse over
  // them (-inf and out 0 for a query that sees none).
  int32_t rank = -1;
  const std::vector<std::vector<int32_t>>* token_owner = nullptr;
};

struct EngineResult {
  Tensor out;  // [B, Sq, Hq, D] out_dtype
  Tensor lse;  // [B, Sq, Hq] f32
};

EngineResult RunFlashDecode(const EnginePlan& plan);

// The kernel's fp32 dot product: eight lanes and a fixed reduction tree,
// like a warp-level reduction. Deterministic; vectorisable as written.
float DotF32(const float* a, const float* b, int64_t n);

// KV head read by query head h (honours the gqa-mapping fault).
inline int64_t KvHeadOf(const EnginePlan& plan, int64_t h) {
  const int64_t group = plan.q_heads / plan.kv_heads;
  return plan.gqa_modulo ? h % plan.kv_heads : h / group;
}

}  // namespace attnaudit::sim_internal

#endif  // ATTNAUDIT_SIM_FLASH_DECODE_H_
