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
#include "core/sim/random.h"
#include "core/sim/synth_internal.h"

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
                      std::string* description) {
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
  *description = absl::StrFormat(
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

// stale-page / drop-block: the fault hits row 0's logical block with the
// largest share of the attention mass, so that it is always visible.
absl::Status PlanHeaviestBlockFault(Fault fault, const SynthLayout& layout,
                                    const ContentModel& model,
                                    const RopeTable& rope, const KvPool& pool,
                                    EnginePlan* plan, Tensor* stale_k,
                                    Tensor* stale_v, std::string* description) {
  const EnginePlan clean = *plan;
  const auto mass = KeyMass(clean, 0);
  const std::vector<double> blocks = BlockMass(clean, 0, mass);
  const int64_t block =
      std::max_element(blocks.begin(), blocks.end()) - blocks.begin();
  const int32_t page = clean.block_pages[0][block];
  const double share = 100.0 * Share(blocks[block], mass);
  if (fault == Fault::kStalePage) {
    GenerateStalePage(layout, model, rope, pool, page, stale_k, stale_v);
    plan->stale_reads.push_back({page, stale_k, stale_v, {}});
    *description = absl::StrFormat(
        "stale-page: pool page %d (row 0, logical block %d, %.1f%% of the "
        "row's attention mass) read with outdated K/V",
        page, block, share);
  } else {
    plan->dropped_block.assign(static_cast<size_t>(plan->batch), -1);
    plan->dropped_block[0] = block;
    *description = absl::StrFormat(
        "drop-block: the split loop of row 0 skips logical block %d (page "
        "%d, %.1f%% of the row's attention mass)",
        block, page, share);
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

absl::Status PlanFp8Scale(const KvPool& pool, EnginePlan* plan,
                          std::string* description) {
  if (!pool.k_scale.present()) {
    return absl::InvalidArgumentError(
        "fault: fp8-scale needs an fp8 KV cache (kv_dtype fp8_e4m3)");
  }
  bool differs = false;
  for (int64_t h = 0; h < plan->kv_heads; ++h) {
    const float k_descale = plan->k_descale[h];
    plan->k_descale[h] = pool.v_scale.data<float>()[h];
    differs |= plan->k_descale[h] != k_descale;
  }
  if (!differs) {
    return absl::InvalidArgumentError(
        "fault: fp8-scale is invisible: k_scale equals v_scale");
  }
  *description = "fp8-scale: K dequantised with v_scale";
  return absl::OkStatus();
}

}  // namespace

absl::Status PlanFault(Fault fault, const SynthLayout& layout,
                       const ContentModel& model, const RopeTable& rope,
                       const KvPool& pool, double model_scale, EnginePlan* plan,
                       Tensor* stale_k, Tensor* stale_v,
                       std::string* description) {
  switch (fault) {
    case Fault::kNone:
      *description = "none";
      return absl::OkStatus();
    case Fault::kStalePage:
    case Fault::kDropBlock:
      return PlanHeaviestBlockFault(fault, layout, model, rope, pool, plan,
                                    stale_k, stale_v, description);
    case Fault::kSwappedPages: {
      const EnginePlan clean = *plan;
      return PlanSwap(clean, plan, description);
    }
    case Fault::kRopeOffset:
      plan->q_position_delta = 1;
      *description = "rope-offset: q rotated at position + 1";
      return absl::OkStatus();
    case Fault::kKRopeTwice:
      plan->rotate_k_again = true;
      *description = "k-rope-twice: the post-RoPE cached K is rotated again";
      return absl::OkStatus();
    case Fault::kLseBase2:
      plan->lse_base2 = true;
      *description = "lse-base2: LSE returned as log2 while declared base e";
      return absl::OkStatus();
    case Fault::kWrongScale:
      return PlanWrongScale(model_scale, plan, description);
    case Fault::kGqaMapping:
      return PlanGqaMapping(plan, description);
    case Fault::kFp8Scale:
      return PlanFp8Scale(pool, plan, description);
  }
  return absl::InvalidArgumentError("fault: unknown value");
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
  if (o->fault == Fault::kFp8Scale && o->kv_dtype != DType::kF8E4M3) {
    notes.push_back(
        absl::StrCat("fp8-scale needs an fp8 KV cache: kv-dtype switched from ",
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
