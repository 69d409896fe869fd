// Fault injection for the engine simulator: which real bug, where, and how
// it changes the simulated kernel's plan. docs/SIMULATOR.md describes each
// fault and when it is invisible.
//
// Faults that hit one place (stale-page, drop-block, swapped-pages) pick the
// place that carries the most attention mass, measured with the clean
// engine's own scores (KeyMass), so that a synthesized fault is always well
// above the verdict's tolerances. A real bug hits wherever it hits; one that
// lands on a page of negligible mass is genuinely (and correctly) invisible.
#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/common/status_macros.h"
#include "sim/fault_registry.h"
#include "sim/random.h"
#include "sim/synth_internal.h"

namespace attnaudit {
namespace sim_internal {
namespace {

// Visible logical range [lo, hi) of query s of `row` under the plan's masks.
void VisibleRange(const EnginePlan& plan, int64_t row, int64_t s, int64_t* lo,
                  int64_t* hi) {
  const int64_t qi = plan.query_index[row * plan.queries + s];
  *hi = std::min(qi + 1, plan.seq_lens[row]);
  *lo = plan.window > 0 ? std::max<int64_t>(0, qi - plan.window + 1) : 0;
}

bool WindowActive(const SynthOptions& o, const ModelPreset& preset) {
  return preset.sliding_window > 0 && o.layer % 2 == 0;
}

std::vector<double> BlockMass(const EnginePlan& plan, int64_t row,
                              const std::vector<std::vector<double>>& mass) {
  const int64_t ps = plan.page_size;
  std::vector<double> out(plan.block_pages[row].size(), 0.0);
  for (const auto& per_query : mass) {
    for (size_t i = 0; i < per_query.size(); ++i) out[i / ps] += per_query[i];
  }
  return out;
}

// Fraction of the row's total attention mass.
double Share(double part, const std::vector<std::vector<double>>& mass) {
  double total = 0;
  for (const auto& q : mass) {
    for (double m : q) total += m;
  }
  return total > 0 ? part / total : 0.0;
}

absl::Status PlanSwap(const EnginePlan& clean, EnginePlan* plan,
                      SynthDetails* details) {
  const int64_t ps = plan->page_size;
  double best = 0, best_share = 0;
  int64_t best_row = -1, best_a = -1, best_b = -1;
  for (int64_t row = 0; row < plan->batch; ++row) {
    const int64_t len = plan->seq_lens[row];
    const int64_t nb = static_cast<int64_t>(plan->block_pages[row].size());
    if (nb < 2) continue;
    std::vector<int64_t> lo(plan->queries), hi(plan->queries);
    for (int64_t s = 0; s < plan->queries; ++s) {
      VisibleRange(*plan, row, s, &lo[s], &hi[s]);
    }
    auto visible = [&](int64_t s, int64_t i) {
      return i < len && i >= lo[s] && i < hi[s];
    };
    // One side of the swap: the last block (partial, or partly visible when
    // Sq > 1) or a block at a sliding-window edge.
    std::vector<int64_t> candidates = {nb - 1};
    for (int64_t s = 0; s < plan->queries; ++s) {
      if (lo[s] > 0) {
        candidates.push_back(lo[s] / ps);
        candidates.push_back((lo[s] - 1) / ps);
      }
    }
    const std::vector<std::vector<double>> mass = KeyMass(clean, row);
    const double total = Share(1.0, mass) > 0 ? 1.0 / Share(1.0, mass) : 0.0;
    for (int64_t a : candidates) {
      for (int64_t b = 0; b < nb; ++b) {
        if (b == a) continue;
        double lost = 0;  // mass of keys the swapped engine no longer reads
        for (int64_t s = 0; s < plan->queries; ++s) {
          for (int64_t j = 0; j < ps; ++j) {
            const bool va = visible(s, a * ps + j);
            const bool vb = visible(s, b * ps + j);
            if (vb && !va) lost += mass[s][b * ps + j];
            if (va && !vb) lost += mass[s][a * ps + j];
          }
        }
        // Rows are compared by the share of their own attention lost.
        const double share = total > 0 ? lost / total : 0.0;
        if (lost > 0 && share > best_share) {
          best = lost;
          best_share = share;
          best_row = row;
          best_a = a;
          best_b = b;
        }
      }
    }
  }
  if (best_row < 0 || !(best > 0)) {
    return absl::InvalidArgumentError(
        "fault: swapped-pages cannot change this snapshot: no row has two "
        "blocks whose swap changes the set of visible keys (a single block, "
        "or page_size 1 with Sq 1 and no window edge), and decode attention "
        "is a function of that set");
  }
  std::swap(plan->block_pages[best_row][best_a],
            plan->block_pages[best_row][best_b]);
  details->fault_row = best_row;
  details->fault_block = best_a;
  details->fault_page = clean.block_pages[best_row][best_a];
  details->fault_other_block = best_b;
  details->fault_other_page = clean.block_pages[best_row][best_b];
  details->fault = absl::StrFormat(
      "swapped-pages: row %d, logical blocks %d and %d (pages %d and %d) "
      "swapped in the engine's block table; %.1f%% of the row's attention "
      "mass is no longer read",
      best_row, best_a, best_b, clean.block_pages[best_row][best_a],
      clean.block_pages[best_row][best_b], 100.0 * best_share);
  return absl::OkStatus();
}

}  // namespace

std::vector<std::vector<double>> KeyMass(const EnginePlan& plan, int64_t row) {
  const int64_t d = plan.head_dim;
  const int64_t len = plan.seq_lens[row];
  const int64_t ps = plan.page_size;
  const RopeTable& rope = *plan.rope;
  const DType kv = plan.k_pages->dtype();
  const int elt = DTypeSize(kv);
  const char* kbase = static_cast<const char*>(plan.k_pages->raw());
  std::vector<std::vector<double>> mass(plan.queries,
                                        std::vector<double>(len, 0.0));
  std::vector<float> q(d), k(d), c(rope.inv_freq().size()),
      sn(rope.inv_freq().size());
  std::vector<float> scores(len);
  for (int64_t s = 0; s < plan.queries; ++s) {
    int64_t lo, hi;
    VisibleRange(plan, row, s, &lo, &hi);
    const int64_t qi = plan.query_index[row * plan.queries + s];
    rope.Angles(plan.first_positions[row] + qi, c.data(), sn.data());
    for (int64_t h = 0; h < plan.q_heads; ++h) {
      const int64_t kvh = KvHeadOf(plan, h);
      const int64_t qoff = ((row * plan.queries + s) * plan.q_heads + h) * d;
      ConvertToFloat(static_cast<const char*>(plan.q->raw()) +
                         qoff * DTypeSize(plan.q->dtype()),
                     plan.q->dtype(), d, q.data());
      rope.RotateWith(q.data(), c.data(), sn.data());
      float m = -std::numeric_limits<float>::infinity();
      for (int64_t i = lo; i < hi; ++i) {
        const int64_t page = plan.block_pages[row][i / ps];
        const int64_t off = ((page * ps + i % ps) * plan.kv_heads + kvh) * d;
        ConvertToFloat(kbase + off * elt, kv, d, k.data());
        float x = 0;
        for (int64_t j = 0; j < d; ++j) x += q[j] * k[j];
        x *= plan.k_descale[kvh] * plan.scale;
        if (plan.softcap > 0) x = plan.softcap * std::tanh(x / plan.softcap);
        scores[i] = x;
        m = std::max(m, x);
      }
      double sum = 0;
      for (int64_t i = lo; i < hi; ++i) sum += std::exp(double{scores[i]} - m);
      for (int64_t i = lo; i < hi; ++i) {
        mass[s][i] += std::exp(double{scores[i]} - m) / sum;
      }
    }
  }
  return mass;
}

namespace {

// The logical block a one-place fault hits: options.fault_block, or the
// fault_block_rank-th heaviest block of the row (by the clean engine's
// attention mass, so that rank 0 is always visible).
absl::StatusOr<int64_t> PickBlock(const SynthOptions& o,
                                  const EnginePlan& clean, double* share) {
  const int64_t row = o.fault_row;
  if (row < 0 || row >= clean.batch) {
    return absl::InvalidArgumentError(absl::StrCat(
        "fault_row: must be in [0, ", clean.batch, "), got ", row));
  }
  const auto mass = KeyMass(clean, row);
  const std::vector<double> blocks = BlockMass(clean, row, mass);
  const int64_t nb = static_cast<int64_t>(blocks.size());
  int64_t block = o.fault_block;
  if (block < 0) {
    if (o.fault_block_rank < 0 || o.fault_block_rank >= nb) {
      return absl::InvalidArgumentError(
          absl::StrCat("fault_block_rank: must be in [0, ", nb, "), got ",
                       o.fault_block_rank));
    }
    std::vector<int64_t> order(static_cast<size_t>(nb));
    for (int64_t i = 0; i < nb; ++i) order[i] = i;
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
      return blocks[a] > blocks[b];
    });
    block = order[o.fault_block_rank];
  } else if (block >= nb) {
    return absl::InvalidArgumentError(absl::StrCat(
        "fault_block: row ", row, " has ", nb, " blocks, got ", block));
  }
  *share = 100.0 * Share(blocks[block], mass);
  return block;
}

// stale-page / drop-block / duplicate-page at the picked block.
absl::Status PlanBlockFault(const SynthOptions& o, const SynthLayout& layout,
                            const ContentModel& model, const RopeTable& rope,
                            const KvPool& pool, EnginePlan* plan,
                            FaultStorage* storage, SynthDetails* details) {
  const EnginePlan clean = *plan;
  double share = 0;
  ATTNAUDIT_ASSIGN_OR_RETURN(const int64_t block, PickBlock(o, clean, &share));
  const int64_t row = o.fault_row;
  const int32_t page = clean.block_pages[row][block];
  details->fault_row = row;
  details->fault_block = block;
  details->fault_page = page;
  if (o.fault == Fault::kStalePage) {
    GenerateStalePage(layout, model, rope, pool, page, &storage->stale_k,
                      &storage->stale_v);
    plan->stale_reads.push_back(
        {page, &storage->stale_k, &storage->stale_v, {}});
    details->fault = absl::StrFormat(
        "stale-page: pool page %d (row %d, logical block %d, %.1f%% of the "
        "row's attention mass) read with outdated K/V",
        page, row, block, share);
  } else if (o.fault == Fault::kDropBlock) {
    plan->dropped_block.assign(static_cast<size_t>(plan->batch), -1);
    plan->dropped_block[row] = block;
    details->fault = absl::StrFormat(
        "drop-block: the split loop of row %d skips logical block %d (page "
        "%d, %.1f%% of the row's attention mass)",
        row, block, page, share);
  } else {
    // An off-by-one in the block table: the entry names the previous
    // block's page (the next one for block 0).
    const int64_t nb = static_cast<int64_t>(clean.block_pages[row].size());
    if (nb < 2) {
      return absl::InvalidArgumentError(
          "fault: duplicate-page needs a row with two blocks");
    }
    const int64_t other = block > 0 ? block - 1 : 1;
    const int32_t other_page = clean.block_pages[row][other];
    plan->block_pages[row][block] = other_page;
    details->fault_other_block = other;
    details->fault_other_page = other_page;
    details->fault = absl::StrFormat(
        "duplicate-page: row %d, logical block %d (page %d, %.1f%% of the "
        "row's attention mass) reads page %d of logical block %d",
        row, block, page, share, other_page, other);
  }
  return absl::OkStatus();
}

// A model-specific scale forgotten (the kernel's default 1/sqrt(D)), or,
// when the model uses 1/sqrt(D), the scale applied twice (q pre-scaled by
// the model and scaled again by the kernel).
absl::Status PlanWrongScale(double model_scale, EnginePlan* plan,
                            std::string* description) {
  const double default_scale = 1.0 / std::sqrt(double(plan->head_dim));
  const bool differs =
      std::fabs(model_scale - default_scale) > 1e-9 * default_scale;
  const double wrong = differs ? default_scale : model_scale * default_scale;
  plan->scale = static_cast<float>(wrong);
  *description = absl::StrFormat(
      "wrong-scale: softmax scale %.6g instead of %.6g (%s)", wrong,
      model_scale,
      differs ? "the model's scale ignored" : "scale applied twice");
  return absl::OkStatus();
}

absl::Status PlanGqaMapping(EnginePlan* plan, std::string* description) {
  if (plan->kv_heads == 1 || plan->q_heads == plan->kv_heads) {
    return absl::InvalidArgumentError(
        "fault: gqa-mapping is invisible with one KV head or Hq == Hkv");
  }
  plan->gqa_modulo = true;
  *description = "gqa-mapping: query head h reads KV head h % Hkv";
  return absl::OkStatus();
}

// fp8-scale (K dequantised with v_scale), fp8-scale-twice (K and V with
// scale^2) and fp8-scale-missing (K and V used as raw fp8 codes).
absl::Status PlanFp8Scale(Fault fault, const KvPool& pool, EnginePlan* plan,
                          std::string* description) {
  if (!pool.k_scale.present()) {
    return absl::InvalidArgumentError(
        absl::StrCat("fault: ", FaultName(fault),
                     " needs an fp8 KV cache (kv_dtype fp8_e4m3)"));
  }
  bool differs = false;
  for (int64_t h = 0; h < plan->kv_heads; ++h) {
    const float k = plan->k_descale[h], v = plan->v_descale[h];
    if (fault == Fault::kFp8Scale) {
      plan->k_descale[h] = pool.v_scale.data<float>()[h];
    } else if (fault == Fault::kFp8ScaleTwice) {
      plan->k_descale[h] = k * k;
      plan->v_descale[h] = v * v;
    } else if (fault == Fault::kFp8KScaleMissing) {
      plan->k_descale[h] = 1.0f;
    } else {
      plan->k_descale[h] = plan->v_descale[h] = 1.0f;
    }
    differs |= plan->k_descale[h] != k || plan->v_descale[h] != v;
  }
  if (!differs) {
    return absl::InvalidArgumentError(absl::StrCat(
        "fault: ", FaultName(fault), " is invisible with these scales"));
  }
  *description =
      fault == Fault::kFp8Scale ? "fp8-scale: K dequantised with v_scale"
      : fault == Fault::kFp8ScaleTwice
          ? "fp8-scale-twice: K and V dequantised with their scale squared"
      : fault == Fault::kFp8KScaleMissing
          ? "fp8-k-scale-missing: K used without its scale"
          : "fp8-scale-missing: K and V used without their scales";
  return absl::OkStatus();
}

// Faults that need an attention variant the preset has (soft-cap, window,
// sinks) and otherwise cannot show.
absl::Status PlanSoftcapMissing(EnginePlan* plan, std::string* description) {
  if (plan->softcap <= 0.0f) {
    return absl::InvalidArgumentError(
        "fault: softcap-missing needs a soft-capped preset (gemma2-9b)");
  }
  plan->softcap = 0.0f;
  *description = "softcap-missing: the logit soft-cap is not applied";
  return absl::OkStatus();
}

// The extra key sits at distance `window` from a query: a row of at most
// `window` keys has none, and the fault would write a clean snapshot.
absl::Status PlanWindowOffByOne(const SynthLayout& layout, EnginePlan* plan,
                                std::string* description) {
  if (plan->window <= 0) {
    return absl::InvalidArgumentError(
        "fault: window-off-by-one needs a sliding window (gemma2-9b or "
        "gpt-oss-20b on an even layer)");
  }
  const int64_t longest =
      *std::max_element(layout.seq_lens.begin(), layout.seq_lens.end());
  if (longest <= plan->window) {
    return absl::InvalidArgumentError(
        absl::StrCat("fault: window-off-by-one cannot show: the window of ",
                     plan->window, " keys covers every row (the longest has ",
                     longest, "); use --context above ", plan->window));
  }
  ++plan->window;
  *description =
      "window-off-by-one: the sliding window admits one key too many";
  return absl::OkStatus();
}

absl::Status PlanSinksMissing(EnginePlan* plan, std::string* description) {
  if (plan->sinks.empty()) {
    return absl::InvalidArgumentError(
        "fault: sinks-missing needs a preset with sinks (gpt-oss-20b)");
  }
  plan->sinks.clear();
  *description = "sinks-missing: the sinks are left out of the softmax";
  return absl::OkStatus();
}

absl::Status PlanRopeOffset(int64_t magnitude, EnginePlan* plan,
                            std::string* description) {
  if (magnitude == 0) {
    return absl::InvalidArgumentError(
        "fault_magnitude: rope-offset needs a nonzero shift");
  }
  plan->q_position_delta = magnitude;
  *description =
      absl::StrFormat("rope-offset: q rotated at position %+d", magnitude);
  return absl::OkStatus();
}

// rope-style: q rotated with the other pairing (NeoX <-> GPT-J) while the
// cache holds correctly rotated keys.
absl::Status PlanRopeStyle(const RopeConfig& config, int64_t head_dim,
                           EnginePlan* plan, FaultStorage* storage,
                           std::string* description) {
  RopeConfig other = config;
  other.style =
      config.style == RopeStyle::kNeox ? RopeStyle::kGptj : RopeStyle::kNeox;
  ATTNAUDIT_ASSIGN_OR_RETURN(RopeTable table,
                             RopeTable::Create(other, head_dim));
  storage->q_rope.clear();
  storage->q_rope.push_back(std::move(table));
  plan->q_rope = &storage->q_rope[0];
  *description =
      absl::StrCat("rope-style: q rotated with ",
                   other.style == RopeStyle::kNeox ? "NeoX" : "GPT-J",
                   " pairing instead of ",
                   config.style == RopeStyle::kNeox ? "NeoX" : "GPT-J");
  return absl::OkStatus();
}

}  // namespace

absl::Status PlanFault(const SynthOptions& o, const SynthLayout& layout,
                       const ContentModel& model, const RopeConfig& rope_config,
                       const RopeTable& rope, const KvPool& pool,
                       double model_scale, EnginePlan* plan,
                       FaultStorage* storage, SynthDetails* details) {
  std::string* description = &details->fault;
  // Every fault is listed (no default), so a new one fails -Wswitch here
  // until it is planned.
  switch (o.fault) {
    case Fault::kNone:
      *description = "none";
      return absl::OkStatus();
    case Fault::kStalePage:
    case Fault::kDropBlock:
    case Fault::kDuplicatePage:
      return PlanBlockFault(o, layout, model, rope, pool, plan, storage,
                            details);
    case Fault::kSwappedPages: {
      const EnginePlan clean = *plan;
      return PlanSwap(clean, plan, details);
    }
    case Fault::kRopeOffset:
      return PlanRopeOffset(o.fault_magnitude, plan, description);
    case Fault::kKRopeTwice:
      plan->rotate_k_again = true;
      *description = "k-rope-twice: the post-RoPE cached K is rotated again";
      return absl::OkStatus();
    case Fault::kKRopeMissing:
      plan->unrotate_k = true;
      *description = "k-rope-missing: the kernel reads K without its rotation";
      return absl::OkStatus();
    case Fault::kRopeStyle:
      return PlanRopeStyle(rope_config, plan->head_dim, plan, storage,
                           description);
    case Fault::kLseBase2:
      plan->lse_base2 = true;
      *description = "lse-base2: LSE returned as log2 while declared base e";
      return absl::OkStatus();
    case Fault::kBf16RunningOut:
      plan->running_out_dtype = DType::kBF16;
      *description =
          "bf16-running-out: the split combine keeps its running output in "
          "bf16";
      return absl::OkStatus();
    case Fault::kWrongScale:
      return PlanWrongScale(model_scale, plan, description);
    case Fault::kGqaMapping:
      return PlanGqaMapping(plan, description);
    case Fault::kFp8Scale:
    case Fault::kFp8ScaleTwice:
    case Fault::kFp8ScaleMissing:
    case Fault::kFp8KScaleMissing:
      return PlanFp8Scale(o.fault, pool, plan, description);
    case Fault::kSoftcapMissing:
      return PlanSoftcapMissing(plan, description);
    case Fault::kWindowOffByOne:
      return PlanWindowOffByOne(layout, plan, description);
    case Fault::kSinksMissing:
      return PlanSinksMissing(plan, description);
  }
  // Only a value outside the enum gets here (SynthOptions is set in code).
  return absl::InvalidArgumentError(absl::StrCat(
      "fault: ", static_cast<int>(o.fault), " is not a known fault"));
}

namespace {

// Row b's tokens before rank r's first key, so that a row of at most that
// length leaves r without keys (page and token interleaving).
int64_t TokensBeforeRank(const SynthOptions& o, int64_t b, int64_t r) {
  const int64_t w = o.cp_world_size;
  if (o.cp_sharding == CpSharding::kPageInterleaved) return r * o.page_size;
  const int64_t i = std::max<int64_t>(1, o.cp_interleave);
  const int64_t p0 = o.prefix == 0 && b % 2 == 1 ? 1000 * b + 3 : 0;
  for (int64_t t = 0; t < w * i; ++t) {
    if ((p0 + t) / i % w == r) return t;
  }
  return 0;
}

// empty-rank-garbage needs a rank that some row leaves without keys: picks
// the rank (from the seed, when not given) and, unless a row already
// leaves it empty, shortens the last row.
void AdjustForEmptyRank(SynthOptions* o, std::vector<std::string>* notes) {
  if (o->cp_fault != CpFault::kEmptyRankGarbage || o->cp_world_size < 2 ||
      o->cp_world_size > 1024 || o->batch < 1 || o->batch > 4096 ||
      o->page_size < 1 || o->cp_fault_rank >= o->cp_world_size) {
    return;
  }
  const int64_t w = o->cp_world_size;
  const int64_t last = o->batch - 1;
  const int64_t shortest = std::max<int64_t>(o->queries, 1);
  const bool owners = o->cp_sharding == CpSharding::kExplicitOwners;
  auto empty_in = [&](int64_t b, int64_t r) {
    return RowLength(*o, b) <= TokensBeforeRank(*o, b, r);
  };
  std::vector<int64_t> candidates;
  for (int64_t r = 0; r < w; ++r) {
    bool ok = owners || TokensBeforeRank(*o, last, r) >= shortest;
    for (int64_t b = 0; b < o->batch && !ok; ++b) ok = empty_in(b, r);
    if (ok) candidates.push_back(r);
  }
  if (o->cp_fault_rank < 0) {
    if (candidates.empty()) return;  // PlanCpFault says why
    NormalSource ns(DeriveSeed(o->seed, {kTagCpFault}));
    o->cp_fault_rank = candidates[ns.Below(candidates.size())];
    notes->push_back(absl::StrCat("empty-rank-garbage hits rank ",
                                  o->cp_fault_rank, " (picked from the seed)"));
  }
  const int64_t r = o->cp_fault_rank;
  if (owners) return;  // the last row's owners skip the rank
  for (int64_t b = 0; b < o->batch; ++b) {
    if (empty_in(b, r)) return;
  }
  const int64_t len = TokensBeforeRank(*o, last, r);
  if (len < shortest) return;  // PlanCpFault says why
  notes->push_back(
      absl::StrCat("empty-rank-garbage needs a row without keys on rank ", r,
                   ": row ", last, " shortened to ", len, " tokens"));
  o->last_row_context = len;
}

}  // namespace
}  // namespace sim_internal

std::vector<std::string> AdjustForFault(SynthOptions* o) {
  std::vector<std::string> notes;
  sim_internal::AdjustForEmptyRank(o, &notes);
  const FaultInfo* row = FindFault(o->fault);
  const bool needs_fp8 = row != nullptr && row->needs_fp8_cache;
  if (needs_fp8 && o->kv_dtype != DType::kF8E4M3) {
    notes.push_back(absl::StrCat(FaultName(o->fault),
                                 " needs an fp8 KV cache: kv-dtype switched "
                                 "from ",
                                 DTypeName(o->kv_dtype), " to fp8_e4m3"));
    o->kv_dtype = DType::kF8E4M3;
  }
  if (o->fault == Fault::kSwappedPages && o->queries == 1 && o->page_size > 1 &&
      o->context > 1 && o->batch >= 1 && o->batch <= 4096) {
    absl::StatusOr<ModelPreset> preset = FindPreset(o->preset);
    if (!preset.ok()) return notes;
    const int64_t window =
        sim_internal::WindowActive(*o, *preset) ? preset->sliding_window : 0;
    bool visible = false;
    for (int64_t b = 0; b < o->batch && !visible; ++b) {
      const int64_t len = sim_internal::RowLength(*o, b);
      visible = len % o->page_size != 0 || (window > 0 && len > window);
    }
    if (!visible) {
      // Leave the last page of row 0 half full, so that the swap hides
      // several keys rather than one.
      const int64_t shorter =
          o->context - std::max<int64_t>(1, o->page_size / 2);
      notes.push_back(absl::StrCat(
          "swapped-pages needs a partial last page (swapping two fully "
          "visible pages is harmless in decode): context ",
          o->context, " -> ", shorter));
      o->context = shorter;
    }
  }
  return notes;
}

}  // namespace attnaudit
