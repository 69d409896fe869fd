// The engine simulator: builds realistic decode snapshots for `attnaudit
// synth`, tests and benchmarks, and computes the "engine" output the way a
// real decode kernel does — tiled flash-decoding with split-KV, an online
// softmax in fp32 per split, an fp32 combine of the splits, and one cast to
// the output dtype — so that a clean snapshot shows realistic, nonzero drift
// against the fp64 reference. Faults inject real engine bugs.
// Deterministic for a given SynthOptions (seeded PRNG). Thread-compatible.
#ifndef ATTNAUDIT_SIM_SIMULATOR_H_
#define ATTNAUDIT_SIM_SIMULATOR_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/snapshot/snapshot.h"

namespace attnaudit {

// Real model attention shapes (docs/SIMULATOR.md, "Presets").
struct ModelPreset {
  std::string name;  // "llama3-8b", ...
  int64_t q_heads = 0;
  int64_t kv_heads = 0;
  int64_t head_dim = 0;
  double softmax_scale = 0;  // 0: 1/sqrt(head_dim)
  RopeConfig rope;           // theta, style, rotary_dim, scaling
  int64_t sliding_window = 0;
  double logit_softcap = 0;
  bool has_sinks = false;
};

// Known presets: llama3-8b, qwen3-8b, gemma2-9b, gpt-oss-20b, glm4-9b,
// phi4-mini. NotFound (listing the names) otherwise.
absl::StatusOr<ModelPreset> FindPreset(const std::string& name);
std::vector<std::string> PresetNames();

// The fault classes. Each has a row in the fault registry
// (sim/fault_registry.h): its name, the diagnosis it should get, where it
// shows; docs/EXTENDING.md, "A fault class", lists every step of adding one.
enum class Fault {
  kNone,
  kStalePage,     // one visible page read with outdated content
  kSwappedPages,  // two block-table entries swapped, one the partial last page
  kRopeOffset,    // q rotated at position + 1
  kKRopeTwice,    // post-RoPE cached K rotated again
  kLseBase2,      // LSE returned in base 2, declared base e
  kWrongScale,    // softmax scale 1/sqrt(D) vs the model's (or 1/D if equal)
  kGqaMapping,    // query head h reads KV head h % Hkv, not h / group
  kDropBlock,     // one visible logical block skipped by the split-KV loop
  kFp8Scale,      // fp8 K dequantised with v_scale (scales swapped)
  // Added for the diagnosis (issue 9):
  kBf16RunningOut,    // the split combine keeps its running output in bf16
  kKRopeMissing,      // the kernel reads K without its rotation
  kRopeStyle,         // q rotated with the other pairing (NeoX <-> GPT-J)
  kSoftcapMissing,    // the logit soft-cap is not applied
  kWindowOffByOne,    // the sliding window admits one key too many
  kSinksMissing,      // the per-head sinks are left out of the softmax
  kFp8ScaleTwice,     // fp8 K and V dequantised with scale^2
  kFp8ScaleMissing,   // fp8 K and V used without their scales
  kDuplicatePage,     // one block-table entry names another block's page
  kFp8KScaleMissing,  // fp8 K used without its scale (V's applied)
};
// Names from the fault registry ("none" for kNone).
absl::StatusOr<Fault> ParseFault(const std::string& name);  // "stale-page"
std::string FaultName(Fault fault);
std::vector<std::string> FaultNames();

// Bugs of a context-parallel engine (docs/SIMULATOR.md, "Context
// parallelism"). Per-rank faults hit one rank (SynthOptions::cp_fault_rank,
// or one the simulator picks from the seed among the ranks the fault can
// show on); combine faults hit the step that merges the partials. Each has
// a row in the fault registry, as Fault does.
enum class CpFault {
  kNone,
  kDropShard,         // one rank's partial left out of the combine
  kBf16Combine,       // the combine (LSEs, weights, sums) done in bf16
  kLseBase2Rank,      // one rank returns its LSE in base 2 (declared e)
  kEmptyRankGarbage,  // a rank without visible keys returns a finite lse
  kStaleRankPage,     // one local page of one rank's shard read stale
};
absl::StatusOr<CpFault> ParseCpFault(const std::string& name);  // "drop-shard"
std::string CpFaultName(CpFault fault);
std::vector<std::string> CpFaultNames();

struct SynthOptions {
  std::string preset = "llama3-8b";
  int64_t batch = 1;
  int64_t context = 1024;  // kv_seq_len of row 0; later rows vary a little
  int64_t queries = 1;     // Sq
  int64_t page_size = 16;
  DType kv_dtype = DType::kBF16;  // bf16, f16, f32, fp8_e4m3
  bool permute_pages = false;     // scatter logical blocks over the pool
  // Send the engine's inverse frequencies (rope_table.inv_freq), as a hook
  // that declares its RoPE does; false: attnaudit computes them itself.
  bool send_rope_table = true;
  int64_t prefix = 0;  // shared-prefix tokens (enables the cache)
  uint64_t seed = 1;
  Fault fault = Fault::kNone;
  int64_t split_tokens = 256;  // the simulated kernel's split-KV size
  int64_t vocab = 256;         // lm_head rows for the log-prob path
  // Added by the simulator's owner:
  int64_t layer = 0;  // labels.layer; gemma2/gpt-oss slide on even layers
  int threads = 0;    // worker threads; 0: hardware concurrency
  // Context parallelism: with cp_world_size > 1 the engine runs sharded --
  // every rank attends its own keys (its partial in the output dtype and
  // an fp32 LSE, written to cp.rank_out / cp.rank_lse), then an fp32
  // LSE-weighted combine merges the partials (vLLM's decode CP).
  int64_t cp_world_size = 1;
  // kExplicitOwners (contiguous, balanced block ranges per row),
  // kTokenInterleaved (cp_interleave tokens per rank) or kPageInterleaved.
  CpSharding cp_sharding = CpSharding::kPageInterleaved;
  int64_t cp_interleave = 1;
  CpFault cp_fault = CpFault::kNone;
  int64_t cp_fault_rank = -1;  // -1: picked from the seed
  // > 0: row B-1 holds this many tokens instead of L - 7 (B - 1)
  // (AdjustForFault shortens it so that a rank holds none of it).
  int64_t last_row_context = 0;
  // Added for the diagnosis (issue 9; docs/SIMULATOR.md, "Engine kinds"):
  // the dtype P is rounded to before P.V (bf16/f16 as tensor cores do;
  // f32: not rounded) and, for fp8 caches, whether the kernel rounds the
  // dequantised K and V to bf16 before using them (a Triton-style path).
  DType engine_p_dtype = DType::kF32;
  bool dequant_to_bf16 = false;
  // Head shape overrides (0: the preset's), for small, fast snapshots;
  // q_heads must be a multiple of kv_heads, head_dim even. A partial rotary
  // dim is scaled with head_dim.
  int64_t q_heads = 0;
  int64_t kv_heads = 0;
  int64_t head_dim = 0;
  // Where a one-place fault (stale-page, drop-block, duplicate-page) hits:
  // logical block fault_block of row fault_row, or, when fault_block is -1,
  // the fault_block_rank-th heaviest block of that row (0: the heaviest).
  int64_t fault_row = 0;
  int64_t fault_block = -1;
  int64_t fault_block_rank = 0;
  // rope-offset: the positions' shift (nonzero; default +1).
  int64_t fault_magnitude = 1;
  // Realistic peaked attention (docs/SIMULATOR.md, "Peaked attention"),
  // off with the defaults. sink_share_max > 0: token 0 of every row (the
  // attention sink) carries a share of each query head's key weight drawn
  // uniformly from [sink_share_min, sink_share_max], through a massive
  // activation on one rotary pair that no other key has. logit_offset > 0
  // adds about that many scaled-logit units to every key's score (a large
  // K component every token shares, on another pair), so that a row's
  // logits reach the offset plus the row's own spread.
  double sink_share_min = 0;
  double sink_share_max = 0;
  double logit_offset = 0;
};

// Makes `options` able to show the requested fault, and returns one
// human-readable note per change (the CLI prints them on stderr):
// fp8-scale switches a non-fp8 KV cache to fp8_e4m3; swapped-pages shortens
// the context by half a page when Sq == 1 and no row has a partial last page
// or a sliding-window edge (swapping two fully visible pages is harmless in
// decode).
// empty-rank-garbage picks its rank (when cp_fault_rank is -1) and, unless
// some row already leaves that rank without keys, shortens the last row
// (last_row_context) so that it does.
// Synthesize applies it too (silently). Idempotent.
std::vector<std::string> AdjustForFault(SynthOptions* options);

// Builds a snapshot: pre-RoPE q, post-RoPE K pages (what engines cache),
// engine out/lse/log-probs from the simulated kernel (with the fault),
// labels, and the prefix fingerprint when options.prefix > 0.
// InvalidArgument naming the option ("batch: ...") for bad options or a
// fault that cannot be made visible; docs/SIMULATOR.md has the details.
absl::StatusOr<Snapshot> Synthesize(const SynthOptions& options);

// What Synthesize did beyond the options, for the CLI's stderr (added by the
// simulator's owner).
struct SynthDetails {
  std::vector<std::string> notes;  // AdjustForFault's changes
  std::string fault;               // what was injected where ("none")
  int64_t cp_fault_rank = -1;      // the rank a per-rank CP fault hit
  // The same, machine-readable (-1: does not apply): the row, logical block
  // and pool page a one-place fault hit, and the other block / page of a
  // swap or duplicate (the page that is read in the block's place); for
  // stale-rank-page the row only (its local page spans pool pages).
  int64_t fault_row = -1;
  int64_t fault_block = -1;
  int64_t fault_page = -1;
  int64_t fault_other_block = -1;
  int64_t fault_other_page = -1;
};
absl::StatusOr<Snapshot> Synthesize(const SynthOptions& options,
                                    SynthDetails* details);

}  // namespace attnaudit

#endif  // ATTNAUDIT_SIM_SIMULATOR_H_
