// Synthesize: options -> a realistic decode snapshot whose engine outputs
// come from the simulated flash-decoding kernel (with an optional fault).
// The snapshot always carries the TRUE data; only engine.* reflects a fault.
#include "sim/simulator.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/common/status_macros.h"
#include "core/fingerprint/fingerprint.h"
#include "core/validate/validate.h"
#include "sim/flash_decode.h"
#include "sim/random.h"
#include "sim/synth_internal.h"

namespace attnaudit {
namespace {

using sim_internal::DeriveSeed;
using sim_internal::NormalSource;

absl::Status Range(const char* field, int64_t value, int64_t lo, int64_t hi) {
  if (value < lo || value > hi) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": must be in [", lo, ", ", hi, "], got ", value));
  }
  return absl::OkStatus();
}

// Peaked attention: shares in [0, 1), an offset >= 0, and rotary pairs to
// spare (the two it reserves besides the heavy direction's).
absl::Status CheckPeaked(const SynthOptions& o, const ModelPreset& preset) {
  if (!(o.sink_share_min >= 0 && o.sink_share_min <= o.sink_share_max &&
        o.sink_share_max < 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("sink_share: need 0 <= min <= max < 1, got [",
                     o.sink_share_min, ", ", o.sink_share_max, "]"));
  }
  if (!(o.logit_offset >= 0 && o.logit_offset <= 1e4)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "logit_offset: must be in [0, 1e4], got ", o.logit_offset));
  }
  const int64_t rot =
      preset.rope.rotary_dim > 0 ? preset.rope.rotary_dim : preset.head_dim;
  if ((o.sink_share_max > 0 || o.logit_offset > 0) && rot / 2 < 4) {
    return absl::InvalidArgumentError(
        "sink_share: peaked attention needs at least 4 rotary pairs");
  }
  return absl::OkStatus();
}

absl::Status CheckOptions(const SynthOptions& o, const ModelPreset& preset) {
  const ValidationLimits limits;
  ATTNAUDIT_RETURN_IF_ERROR(Range("batch", o.batch, 1, limits.max_batch));
  ATTNAUDIT_RETURN_IF_ERROR(Range("context", o.context, 1, limits.max_context));
  ATTNAUDIT_RETURN_IF_ERROR(Range("queries", o.queries, 1, limits.max_queries));
  ATTNAUDIT_RETURN_IF_ERROR(
      Range("page_size", o.page_size, 1, limits.max_page_size));
  ATTNAUDIT_RETURN_IF_ERROR(
      Range("split_tokens", o.split_tokens, 1, limits.max_context));
  ATTNAUDIT_RETURN_IF_ERROR(Range("vocab", o.vocab, 1, limits.max_vocab));
  ATTNAUDIT_RETURN_IF_ERROR(
      Range("layer", o.layer, 0, std::numeric_limits<int32_t>::max()));
  if (o.engine_p_dtype != DType::kF32 && o.engine_p_dtype != DType::kBF16 &&
      o.engine_p_dtype != DType::kF16) {
    return absl::InvalidArgumentError(
        absl::StrCat("engine_p_dtype: must be f32, bf16 or f16, got ",
                     DTypeName(o.engine_p_dtype)));
  }
  if (o.kv_dtype != DType::kBF16 && o.kv_dtype != DType::kF16 &&
      o.kv_dtype != DType::kF32 && o.kv_dtype != DType::kF8E4M3) {
    return absl::InvalidArgumentError(
        absl::StrCat("kv_dtype: must be bf16, f16, f32 or fp8_e4m3, got ",
                     DTypeName(o.kv_dtype)));
  }
  ATTNAUDIT_RETURN_IF_ERROR(
      Range("cp_world_size", o.cp_world_size, 1, limits.max_cp_world_size));
  ATTNAUDIT_RETURN_IF_ERROR(
      Range("cp_interleave", o.cp_interleave, 1, limits.max_context));
  ATTNAUDIT_RETURN_IF_ERROR(
      Range("cp_fault_rank", o.cp_fault_rank, -1, o.cp_world_size - 1));
  if (o.cp_sharding != CpSharding::kExplicitOwners &&
      o.cp_sharding != CpSharding::kTokenInterleaved &&
      o.cp_sharding != CpSharding::kPageInterleaved) {
    return absl::InvalidArgumentError(
        "cp_sharding: must be explicit owners, token or page interleaved");
  }
  if (o.cp_fault != CpFault::kNone && o.cp_world_size < 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cp_fault: ", CpFaultName(o.cp_fault), " needs cp_world_size >= 2"));
  }
  ATTNAUDIT_RETURN_IF_ERROR(CheckPeaked(o, preset));
  const int64_t shortest = sim_internal::RowLength(o, o.batch - 1);
  if (o.prefix < 0 || o.prefix > shortest) {
    return absl::InvalidArgumentError(
        absl::StrCat("prefix: must be in [0, ", shortest,
                     "] (the shortest row's length), got ", o.prefix));
  }
  // Size caps before anything is allocated (every factor is bounded above,
  // so the products cannot overflow int64).
  int64_t pages = 0;
  for (int64_t b = 0; b < o.batch; ++b) {
    pages += (sim_internal::RowLength(o, b) + o.page_size - 1) / o.page_size;
  }
  const int64_t kv_bytes = pages * o.page_size * preset.kv_heads *
                           preset.head_dim * DTypeSize(o.kv_dtype);
  const int64_t lm_bytes = o.vocab * preset.q_heads * preset.head_dim * 4;
  // CP partials: [W, B, Sq, Hq, D] in the output dtype (at most 4 bytes).
  const int64_t out_elems =
      o.batch * o.queries * preset.q_heads * preset.head_dim;
  const int64_t rank_bytes =
      o.cp_world_size > 1 ? o.cp_world_size * out_elems * 4 : 0;
  if (rank_bytes > limits.max_tensor_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cp_world_size: ", o.cp_world_size, " ranks' partials need ",
        rank_bytes, " bytes, over the limit of ", limits.max_tensor_bytes));
  }
  if (kv_bytes > limits.max_tensor_bytes ||
      2 * kv_bytes + lm_bytes + rank_bytes > limits.max_total_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "context: batch ", o.batch, " x context ", o.context,
        " needs KV pages of ", kv_bytes, " bytes each, over the limit of ",
        limits.max_tensor_bytes));
  }
  if (lm_bytes > limits.max_tensor_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("vocab: lm_head would take ", lm_bytes, " bytes"));
  }
  return absl::OkStatus();
}

Tensor IntTensor(std::vector<int64_t> shape, const std::vector<int64_t>& v) {
  Tensor t(DType::kI32, std::move(shape));
  int32_t* d = t.mutable_data<int32_t>();
  for (size_t i = 0; i < v.size(); ++i) d[i] = static_cast<int32_t>(v[i]);
  return t;
}

// lm_head, selected ids, active mask and the engine's selected log-probs:
// fp32 logits of the engine's (rounded) out, fp32 log-softmax.
void AddLogprobs(const SynthOptions& o, DType out_dtype, Snapshot* s) {
  const SnapshotDims d = DimsOf(*s);
  const int64_t hidden = d.q_heads * d.head_dim;
  const int64_t vocab = o.vocab;
  const int64_t rows = d.batch * d.queries;
  const DType lm_dtype = out_dtype == DType::kBF16 ? DType::kBF16 : DType::kF32;
  s->lm_head = Tensor(lm_dtype, {vocab, hidden});
  std::vector<float> w(static_cast<size_t>(vocab * hidden));
  {
    // std ~ 8 / sqrt(hidden): logits spread over a few units.
    const double sigma = 8.0 / std::sqrt(static_cast<double>(hidden));
    NormalSource ns(DeriveSeed(o.seed, {sim_internal::kTagLmHead}));
    void* dst = s->lm_head.mutable_raw();
    for (int64_t i = 0; i < vocab * hidden; ++i) {
      StoreFromFloat(dst, lm_dtype, i, static_cast<float>(ns.Normal() * sigma));
      w[i] = LoadAsFloat(dst, lm_dtype, i);
    }
  }
  s->selected_token_ids = Tensor(DType::kI32, {d.batch, d.queries});
  s->active_mask = Tensor(DType::kBool, {d.batch, d.queries});
  s->engine.logprobs = Tensor(DType::kF32, {d.batch, d.queries});
  NormalSource ns(DeriveSeed(o.seed, {sim_internal::kTagTokens}));
  std::vector<float> h(static_cast<size_t>(hidden));
  std::vector<float> logits(static_cast<size_t>(vocab));
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t id = static_cast<int64_t>(ns.Below(vocab));
    s->selected_token_ids.mutable_data<int32_t>()[r] = static_cast<int32_t>(id);
    // The last query of the batch is padding when there is more than one.
    s->active_mask.mutable_data<uint8_t>()[r] =
        (rows > 1 && r == rows - 1) ? 0 : 1;
    ConvertToFloat(static_cast<const char*>(s->engine.out.raw()) +
                       r * hidden * DTypeSize(out_dtype),
                   out_dtype, hidden, h.data());
    float m = -std::numeric_limits<float>::infinity();
    for (int64_t v = 0; v < vocab; ++v) {
      logits[v] = sim_internal::DotF32(&w[v * hidden], h.data(), hidden);
      m = std::max(m, logits[v]);
    }
    float sum = 0.0f;
    for (int64_t v = 0; v < vocab; ++v) sum += std::exp(logits[v] - m);
    s->engine.logprobs.mutable_data<float>()[r] =
        logits[id] - (m + std::log(sum));
  }
}

// RoPE settings of the engine: q rotated by the engine from pre-RoPE
// values, K cached post-RoPE.
RopeConfig EngineRope(const ModelPreset& preset, DType out_dtype) {
  RopeConfig rope = preset.rope;
  rope.q_state = RopeState::kPreRope;
  rope.k_state = RopeState::kPostRope;
  rope.cast_point = RopeCastPoint::kAfterRope;
  rope.q_output_dtype = out_dtype;
  rope.k_output_dtype = DType::kInvalid;
  return rope;
}

// Scale, window, soft-cap, output dtype and (for presets with sinks) the
// per-head sinks, which are also returned for the engine's plan.
std::vector<float> SetAttentionVariant(const SynthOptions& o,
                                       const ModelPreset& preset, double scale,
                                       DType out_dtype, Snapshot* s) {
  const bool window = preset.sliding_window > 0 && o.layer % 2 == 0;
  s->softmax_scale = scale;
  s->sliding_window = window ? preset.sliding_window : 0;
  s->window_convention = SlidingWindowConvention::kHuggingFace;
  s->logit_softcap = preset.logit_softcap;
  s->engine_lse_includes_sinks = false;
  s->output_dtype = out_dtype;
  std::vector<float> sinks;
  if (preset.has_sinks) {
    NormalSource ns(DeriveSeed(o.seed, {sim_internal::kTagHeads, 1}));
    s->sinks = Tensor(DType::kF32, {preset.q_heads});
    for (int64_t h = 0; h < preset.q_heads; ++h) {
      sinks.push_back(static_cast<float>(4.0 + 4.0 * ns.Uniform()));
      s->sinks.mutable_data<float>()[h] = sinks.back();
    }
  }
  return sinks;
}

// The clean engine's plan over the pool and the snapshot's q (both must
// stay in place until the plan has run).
sim_internal::EnginePlan CleanPlan(const SynthOptions& o,
                                   const ModelPreset& preset,
                                   const sim_internal::SynthLayout& layout,
                                   const sim_internal::KvPool& pool,
                                   const RopeTable& rope, const Snapshot& s,
                                   std::vector<float> sinks) {
  sim_internal::EnginePlan plan;
  plan.batch = o.batch;
  plan.queries = o.queries;
  plan.q_heads = preset.q_heads;
  plan.kv_heads = preset.kv_heads;
  plan.head_dim = preset.head_dim;
  plan.page_size = o.page_size;
  plan.k_pages = &pool.k_pages;
  plan.v_pages = &pool.v_pages;
  plan.k_descale.assign(preset.kv_heads, 1.0f);
  plan.v_descale.assign(preset.kv_heads, 1.0f);
  if (pool.k_scale.present()) {
    for (int64_t h = 0; h < preset.kv_heads; ++h) {
      plan.k_descale[h] = pool.k_scale.data<float>()[h];
      plan.v_descale[h] = pool.v_scale.data<float>()[h];
    }
  }
  plan.block_pages = layout.block_pages;
  plan.seq_lens = layout.seq_lens;
  plan.first_positions = layout.first_positions;
  for (int64_t b = 0; b < o.batch; ++b) {
    for (int64_t q = 0; q < o.queries; ++q) {
      // Sq > 1: the queries are the last Sq tokens of the row.
      plan.query_index.push_back(layout.seq_lens[b] - o.queries + q);
    }
  }
  plan.q = &s.q;
  plan.rope = &rope;
  plan.q_rope_dtype = s.output_dtype;
  plan.scale = static_cast<float>(s.softmax_scale);
  plan.softcap = static_cast<float>(s.logit_softcap);
  plan.window = s.sliding_window;
  plan.sinks = std::move(sinks);
  plan.out_dtype = s.output_dtype;
  plan.split_tokens = o.split_tokens;
  plan.threads = o.threads;
  return plan;
}

// Moves the pool into the snapshot and writes the page table, lengths and
// query positions (the last Sq tokens of every row).
void SetPagedCache(const SynthOptions& o,
                   const sim_internal::SynthLayout& layout,
                   sim_internal::KvPool pool, Snapshot* s) {
  s->kv_layout = KvLayout::kNHD;
  s->k_pages = std::move(pool.k_pages);
  s->v_pages = std::move(pool.v_pages);
  s->k_scale = std::move(pool.k_scale);
  s->v_scale = std::move(pool.v_scale);
  s->slot_positions = std::move(pool.slot_positions);
  std::vector<int64_t> table(static_cast<size_t>(o.batch * layout.max_blocks),
                             -1);
  std::vector<int64_t> query_positions;
  for (int64_t b = 0; b < o.batch; ++b) {
    for (size_t k = 0; k < layout.block_pages[b].size(); ++k) {
      table[b * layout.max_blocks + k] = layout.block_pages[b][k];
    }
    for (int64_t q = 0; q < o.queries; ++q) {
      query_positions.push_back(layout.first_positions[b] + layout.seq_lens[b] -
                                o.queries + q);
    }
  }
  s->block_table = IntTensor({o.batch, layout.max_blocks}, table);
  s->kv_seq_lens = IntTensor({o.batch}, layout.seq_lens);
  s->query_positions = IntTensor({o.batch, o.queries}, query_positions);
}

// Declares the first o.prefix tokens a shared prefix and fingerprints them.
absl::Status AddPrefix(const SynthOptions& o, const ModelPreset& preset,
                       const sim_internal::SynthLayout& layout, Snapshot* s) {
  ResolvedLayout resolved;
  resolved.dims = DimsOf(*s);
  resolved.seq_lens = layout.seq_lens;
  resolved.block_pages = layout.block_pages;
  for (const auto& row : layout.block_pages) {
    resolved.block_owners.emplace_back(row.size(), 0);
  }
  s->prefix.enabled = true;
  s->prefix.key =
      absl::StrCat("sim:", preset.name, ":seed", o.seed, ":prefix", o.prefix);
  s->prefix.length = o.prefix;
  s->prefix.scheme = PrefixCache::Scheme::kAttnauditV1;
  ATTNAUDIT_ASSIGN_OR_RETURN(s->prefix.fingerprint,
                             PrefixFingerprint(*s, resolved, o.prefix));
  return absl::OkStatus();
}

void SetLabels(const SynthOptions& o, const ModelPreset& preset,
               const sim_internal::SynthLayout& layout, Snapshot* s) {
  s->labels.model = preset.name;
  s->labels.layer = o.layer;
  s->labels.engine = "attnaudit-sim";
  s->labels.backend = "flash-decoding";
  s->labels.step = layout.seq_lens[0];
  for (int64_t b = 0; b < o.batch; ++b) {
    s->labels.request_ids.push_back(absl::StrCat("sim-", o.seed, "-", b));
  }
}

// Context parallelism: the engine runs sharded (per-rank partials, then
// the combine), with the CP fault; fills engine.*, cp.* and adds the CP
// fault to the description.
absl::Status RunShardedEngine(const SynthOptions& o,
                              const sim_internal::SynthLayout& layout,
                              const sim_internal::ContentModel& model,
                              const RopeTable& rope,
                              const sim_internal::KvPool& pool,
                              const sim_internal::EnginePlan& plan, Snapshot* s,
                              SynthDetails* site) {
  const std::vector<std::vector<int32_t>> owners =
      sim_internal::TokenOwners(o, layout);
  sim_internal::CpFaultPlan fault;
  ATTNAUDIT_RETURN_IF_ERROR(sim_internal::PlanCpFault(
      o, layout, model, rope, pool, plan, owners, &fault));
  sim_internal::CpEngineResult engine =
      sim_internal::RunCpEngine(plan, o.cp_world_size, owners, fault);
  s->engine.out = std::move(engine.out);
  s->engine.lse = std::move(engine.lse);
  s->cp.rank_out = std::move(engine.rank_out);
  s->cp.rank_lse = std::move(engine.rank_lse);
  sim_internal::SetCpConfig(o, layout, owners, s);
  site->cp_fault_rank = fault.rank;
  if (fault.row >= 0) site->fault_row = fault.row;
  if (fault.fault != CpFault::kNone) {
    site->fault = site->fault == "none"
                      ? fault.description
                      : absl::StrCat(site->fault, "; ", fault.description);
  }
  return absl::OkStatus();
}

// The preset with the options' head shape overrides applied.
absl::StatusOr<ModelPreset> ShapedPreset(const SynthOptions& o) {
  absl::StatusOr<ModelPreset> found = FindPreset(o.preset);
  if (!found.ok()) return absl::InvalidArgumentError(found.status().message());
  ModelPreset p = *std::move(found);
  const ValidationLimits limits;
  if (o.q_heads != 0) {
    ATTNAUDIT_RETURN_IF_ERROR(Range("q_heads", o.q_heads, 1, limits.max_heads));
    p.q_heads = o.q_heads;
  }
  if (o.kv_heads != 0) {
    ATTNAUDIT_RETURN_IF_ERROR(Range("kv_heads", o.kv_heads, 1, p.q_heads));
    p.kv_heads = o.kv_heads;
  }
  if (p.q_heads % p.kv_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "kv_heads: ", p.kv_heads, " must divide q_heads ", p.q_heads));
  }
  if (o.head_dim != 0) {
    ATTNAUDIT_RETURN_IF_ERROR(
        Range("head_dim", o.head_dim, 2, limits.max_head_dim));
    if (o.head_dim % 2 != 0) {
      return absl::InvalidArgumentError("head_dim: must be even");
    }
    // A partial rotary dim keeps its share of the head, rounded down to
    // an even count (at least 2).
    const int64_t rot = p.rope.rotary_dim == 0 ? p.head_dim : p.rope.rotary_dim;
    p.rope.rotary_dim =
        std::max<int64_t>(2, (rot * o.head_dim / p.head_dim) & ~1);
    p.head_dim = o.head_dim;
  }
  return p;
}

}  // namespace

absl::StatusOr<Snapshot> Synthesize(const SynthOptions& options) {
  return Synthesize(options, nullptr);
}

absl::StatusOr<Snapshot> Synthesize(const SynthOptions& options,
                                    SynthDetails* details) {
  SynthOptions o = options;
  std::vector<std::string> notes = AdjustForFault(&o);
  ATTNAUDIT_ASSIGN_OR_RETURN(const ModelPreset preset, ShapedPreset(o));
  ATTNAUDIT_RETURN_IF_ERROR(CheckOptions(o, preset));

  const double scale =
      preset.softmax_scale > 0
          ? preset.softmax_scale
          : 1.0 / std::sqrt(static_cast<double>(preset.head_dim));
  // Output (and q) dtype: the KV dtype, except bf16 for fp8 caches.
  const DType out_dtype =
      o.kv_dtype == DType::kF8E4M3 ? DType::kBF16 : o.kv_dtype;
  Snapshot s;
  s.rope = EngineRope(preset, out_dtype);
  ATTNAUDIT_ASSIGN_OR_RETURN(RopeTable rope,
                             RopeTable::Create(s.rope, preset.head_dim));
  // The simulated engine is a flash-decoding kernel; like a real hook it
  // declares that, and sends the inverse frequencies it rotated with.
  s.precision.profile = EngineProfile::kFlashDecoding;
  s.precision.split_keys = o.split_tokens;
  if (o.send_rope_table) {
    s.rope_table.inv_freq =
        Tensor(DType::kF32, {static_cast<int64_t>(rope.inv_freq().size())});
    std::copy(rope.inv_freq().begin(), rope.inv_freq().end(),
              s.rope_table.inv_freq.mutable_data<float>());
  }

  const sim_internal::SynthLayout layout = sim_internal::BuildLayout(o);
  const sim_internal::ContentModel model =
      sim_internal::MakeContentModel(o, preset, rope, scale);
  sim_internal::KvPool pool =
      sim_internal::GeneratePool(layout, model, rope, o.kv_dtype, o.threads);
  s.q = sim_internal::GenerateQueries(layout, model, out_dtype);
  std::vector<float> sinks =
      SetAttentionVariant(o, preset, scale, out_dtype, &s);
  sim_internal::SetSinkShares(o, layout, model, rope, pool, scale,
                              s.sliding_window, &s.q);

  sim_internal::EnginePlan plan =
      CleanPlan(o, preset, layout, pool, rope, s, std::move(sinks));
  plan.p_dtype = o.engine_p_dtype;
  plan.dequant_bf16 = o.dequant_to_bf16 && pool.k_scale.present();
  sim_internal::FaultStorage storage;
  SynthDetails site;
  ATTNAUDIT_RETURN_IF_ERROR(sim_internal::PlanFault(
      o, layout, model, s.rope, rope, pool, scale, &plan, &storage, &site));
  if (o.cp_world_size > 1) {
    ATTNAUDIT_RETURN_IF_ERROR(
        RunShardedEngine(o, layout, model, rope, pool, plan, &s, &site));
  } else {
    sim_internal::EngineResult engine = sim_internal::RunFlashDecode(plan);
    s.engine.out = std::move(engine.out);
    s.engine.lse = std::move(engine.lse);
  }
  s.engine.lse_base = LseBase::kE;  // as declared, even under lse-base2

  SetPagedCache(o, layout, std::move(pool), &s);
  AddLogprobs(o, out_dtype, &s);
  if (o.prefix > 0) ATTNAUDIT_RETURN_IF_ERROR(AddPrefix(o, preset, layout, &s));
  SetLabels(o, preset, layout, &s);
  if (details != nullptr) {
    *details = std::move(site);
    details->notes = std::move(notes);
  }
  return s;
}

}  // namespace attnaudit
