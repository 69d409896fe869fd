// The simulated context-parallel engine: who owns which key, the CP
// faults, the per-rank partials and the combine (docs/SIMULATOR.md,
// "Context parallelism"). The combine is written here, independently of
// attnaudit's merge routine (core/attention/merge.h), as a decode CP engine
// writes it: max LSE, fp32 weights exp(lse_k - lse), a weighted sum in rank
// order, sinks after, one cast.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "sim/random.h"
#include "sim/synth_internal.h"

namespace attnaudit {
namespace sim_internal {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr float kLog2E = 1.4426950408889634f;
// A drop-shard rank must carry at least this share of some query's
// attention, or leaving it out cannot move the result beyond rounding.
constexpr double kMinDropShare = 1e-3;

std::vector<int32_t> ExplicitRow(int64_t len, int64_t page_size, int64_t world,
                                 int64_t skip) {
  const int64_t blocks = (len + page_size - 1) / page_size;
  const int64_t ranks = skip >= 0 ? world - 1 : world;
  std::vector<int32_t> out(static_cast<size_t>(len));
  for (int64_t t = 0; t < len; ++t) {
    int64_t r = (t / page_size) * ranks / blocks;
    if (skip >= 0 && r >= skip) ++r;
    out[static_cast<size_t>(t)] = static_cast<int32_t>(r);
  }
  return out;
}

// Visible logical keys [lo, hi) of query s of row b.
void Visible(const EnginePlan& plan, int64_t b, int64_t s, int64_t* lo,
             int64_t* hi) {
  const int64_t qi = plan.query_index[b * plan.queries + s];
  *hi = std::min(qi + 1, plan.seq_lens[b]);
  *lo = plan.window > 0 ? std::max<int64_t>(0, qi - plan.window + 1) : 0;
}

// Per rank, the largest share of one query's attention it holds, and
// whether some query sees none of its keys.
struct RankReach {
  std::vector<double> max_share;
  std::vector<bool> empty_somewhere;
};

RankReach Reach(const EnginePlan& plan, int64_t world,
                const std::vector<std::vector<int32_t>>& owners,
                bool with_mass) {
  RankReach r;
  r.max_share.assign(static_cast<size_t>(world), 0.0);
  r.empty_somewhere.assign(static_cast<size_t>(world), false);
  for (int64_t b = 0; b < plan.batch; ++b) {
    std::vector<std::vector<double>> mass;
    if (with_mass) mass = KeyMass(plan, b);
    for (int64_t s = 0; s < plan.queries; ++s) {
      int64_t lo, hi;
      Visible(plan, b, s, &lo, &hi);
      std::vector<double> share(static_cast<size_t>(world), 0.0);
      std::vector<bool> seen(static_cast<size_t>(world), false);
      for (int64_t j = lo; j < hi; ++j) {
        const int32_t k = owners[b][j];
        seen[k] = true;
        if (with_mass) share[k] += mass[s][j] / plan.q_heads;
      }
      for (int64_t k = 0; k < world; ++k) {
        r.max_share[k] = std::max(r.max_share[k], share[k]);
        if (!seen[k]) r.empty_somewhere[k] = true;
      }
    }
  }
  return r;
}

// Rank 0 .. W-1 that may carry the fault.
std::vector<int32_t> Eligible(CpFault fault, const RankReach& reach) {
  std::vector<int32_t> out;
  for (size_t k = 0; k < reach.max_share.size(); ++k) {
    const bool ok =
        fault == CpFault::kEmptyRankGarbage ? reach.empty_somewhere[k]
        : fault == CpFault::kDropShard ? reach.max_share[k] >= kMinDropShare
                                       : reach.max_share[k] > 0;
    if (ok) out.push_back(static_cast<int32_t>(k));
  }
  return out;
}

// stale-rank-page: the local page (page_size consecutive keys of the rank's
// shard of one row) carrying the largest share of the rank's attention in
// that row is read with outdated content.
void PlanStaleLocalPage(const SynthLayout& layout, const ContentModel& model,
                        const RopeTable& rope, const KvPool& pool,
                        const EnginePlan& plan,
                        const std::vector<std::vector<int32_t>>& owners,
                        CpFaultPlan* f) {
  const int64_t P = plan.page_size;
  double best = -1;
  int64_t best_row = 0, best_page = 0;
  std::vector<int64_t> best_keys;
  for (int64_t b = 0; b < plan.batch; ++b) {
    const std::vector<std::vector<double>> mass = KeyMass(plan, b);
    std::vector<int64_t> keys;
    for (int64_t j = 0; j < plan.seq_lens[b]; ++j) {
      if (owners[b][j] == f->rank) keys.push_back(j);
    }
    double total = 0;
    std::vector<double> local;
    for (size_t i = 0; i < keys.size(); ++i) {
      if (i % static_cast<size_t>(P) == 0) local.push_back(0);
      for (int64_t s = 0; s < plan.queries; ++s) {
        local.back() += mass[s][keys[i]];
        total += mass[s][keys[i]];
      }
    }
    for (size_t c = 0; c < local.size(); ++c) {
      const double share = total > 0 ? local[c] / total : 0;
      if (share > best) {
        best = share;
        best_row = b;
        best_page = static_cast<int64_t>(c);
        const size_t from = c * static_cast<size_t>(P);
        best_keys.assign(keys.begin() + static_cast<ptrdiff_t>(from),
                         keys.begin() + static_cast<ptrdiff_t>(
                                            std::min(keys.size(), from + P)));
      }
    }
  }
  f->row = best_row;
  std::set<int32_t> pages;
  for (int64_t j : best_keys) pages.insert(plan.block_pages[best_row][j / P]);
  for (int32_t page : pages) {
    f->stale_pages.emplace_back();
    Tensor& k = f->stale_pages.back();
    f->stale_pages.emplace_back();
    Tensor& v = f->stale_pages.back();
    GenerateStalePage(layout, model, rope, pool, page, &k, &v);
    EnginePlan::StaleRead read{page, &k, &v,
                               std::vector<uint8_t>(static_cast<size_t>(P), 0)};
    for (int64_t j : best_keys) {
      if (plan.block_pages[best_row][j / P] == page) read.slots[j % P] = 1;
    }
    f->stale_reads.push_back(std::move(read));
  }
  f->description = absl::StrFormat(
      "stale-rank-page: rank %d reads local page %d of row %d (keys %d..%d, "
      "%d pool page(s), %.1f%% of the rank's attention in that row) with "
      "outdated K/V",
      f->rank, best_page, best_row, best_keys.front(), best_keys.back(),
      pages.size(), 100.0 * best);
}

float Bf16(float x) { return RoundToDType(x, DType::kBF16); }

// The engine's combine of one query's W partials (o[k] points at D
// floats), in fp32 or, under bf16-combine, with every step rounded to
// bf16. Returns the combined lse; writes out (before sinks).
float Combine(const std::vector<const float*>& o, std::vector<float> l,
              int64_t d, bool bf16, float* out) {
  const size_t w = l.size();
  float m = kNegInf;
  for (size_t k = 0; k < w; ++k) {
    if (std::isnan(l[k]) || l[k] == -kNegInf) l[k] = kNegInf;
    if (bf16) l[k] = Bf16(l[k]);
    m = std::max(m, l[k]);
  }
  std::fill(out, out + d, 0.0f);
  if (m == kNegInf) return kNegInf;
  float sum = 0;
  for (size_t k = 0; k < w; ++k) {
    if (l[k] == kNegInf) continue;
    const float e = bf16 ? Bf16(std::exp(Bf16(l[k] - m))) : std::exp(l[k] - m);
    sum = bf16 ? Bf16(sum + e) : sum + e;
  }
  const float lse = bf16 ? Bf16(m + Bf16(std::log(sum))) : m + std::log(sum);
  for (size_t k = 0; k < w; ++k) {
    if (l[k] == kNegInf) continue;
    const float f =
        bf16 ? Bf16(std::exp(Bf16(l[k] - lse))) : std::exp(l[k] - lse);
    for (int64_t i = 0; i < d; ++i) {
      out[i] = bf16 ? Bf16(out[i] + Bf16(f * o[k][i])) : out[i] + f * o[k][i];
    }
  }
  return lse;
}

}  // namespace

std::vector<std::vector<int32_t>> TokenOwners(const SynthOptions& o,
                                              const SynthLayout& layout) {
  const int64_t W = std::max<int64_t>(1, o.cp_world_size);
  std::vector<std::vector<int32_t>> owners(static_cast<size_t>(layout.batch));
  for (int64_t b = 0; b < layout.batch; ++b) {
    const int64_t len = layout.seq_lens[b];
    std::vector<int32_t>& row = owners[b];
    row.assign(static_cast<size_t>(len), 0);
    if (W == 1) continue;
    switch (o.cp_sharding) {
      case CpSharding::kExplicitOwners: {
        const bool skip = o.cp_fault == CpFault::kEmptyRankGarbage &&
                          b == layout.batch - 1 && o.cp_fault_rank >= 0;
        row =
            ExplicitRow(len, layout.page_size, W, skip ? o.cp_fault_rank : -1);
        break;
      }
      case CpSharding::kTokenInterleaved:
        for (int64_t t = 0; t < len; ++t) {
          const int64_t pos = layout.first_positions[b] + t;
          row[t] = static_cast<int32_t>(
              (pos / std::max<int64_t>(1, o.cp_interleave)) % W);
        }
        break;
      case CpSharding::kNone:  // page interleaving, the default
      case CpSharding::kPageInterleaved:
        for (int64_t t = 0; t < len; ++t) {
          row[t] = static_cast<int32_t>((t / layout.page_size) % W);
        }
        break;
    }
  }
  return owners;
}

void SetCpConfig(const SynthOptions& o, const SynthLayout& layout,
                 const std::vector<std::vector<int32_t>>& owners, Snapshot* s) {
  s->cp.world_size = o.cp_world_size;
  s->cp.sharding = o.cp_sharding;
  s->cp.interleave_size =
      o.cp_sharding == CpSharding::kTokenInterleaved ? o.cp_interleave : 1;
  if (o.cp_sharding != CpSharding::kExplicitOwners) return;
  s->cp.block_owners = Tensor(DType::kI32, {layout.batch, layout.max_blocks});
  int32_t* table = s->cp.block_owners.mutable_data<int32_t>();
  for (int64_t b = 0; b < layout.batch; ++b) {
    for (int64_t j = 0; j < layout.max_blocks; ++j) {
      const int64_t t = j * layout.page_size;
      table[b * layout.max_blocks + j] =
          t < layout.seq_lens[b] ? owners[b][t] : -1;
    }
  }
}

absl::Status PlanCpFault(const SynthOptions& o, const SynthLayout& layout,
                         const ContentModel& model, const RopeTable& rope,
                         const KvPool& pool, const EnginePlan& plan,
                         const std::vector<std::vector<int32_t>>& owners,
                         CpFaultPlan* f) {
  f->fault = o.cp_fault;
  if (o.cp_fault == CpFault::kNone) {
    f->description = "none";
    return absl::OkStatus();
  }
  const int64_t W = o.cp_world_size;
  if (W < 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cp_fault: ", CpFaultName(o.cp_fault), " needs cp_world_size >= 2"));
  }
  if (o.cp_fault == CpFault::kBf16Combine) {
    f->description =
        "bf16-combine: the combine's LSEs, weights and sums are rounded to "
        "bf16";
    return absl::OkStatus();
  }
  const bool mass = o.cp_fault != CpFault::kEmptyRankGarbage;
  const std::vector<int32_t> eligible =
      Eligible(o.cp_fault, Reach(plan, W, owners, mass));
  const std::string need =
      o.cp_fault == CpFault::kEmptyRankGarbage
          ? "a rank that some query sees no key of"
          : "a rank holding visible keys (drop-shard: at least 0.1% of some "
            "query's attention)";
  if (o.cp_fault_rank >= 0) {
    if (o.cp_fault_rank >= W || std::find(eligible.begin(), eligible.end(),
                                          o.cp_fault_rank) == eligible.end()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "cp_fault_rank: ", CpFaultName(o.cp_fault), " cannot show on rank ",
          o.cp_fault_rank, "; it needs ", need, " (eligible ranks: [",
          absl::StrJoin(eligible, ", "), "])"));
    }
    f->rank = static_cast<int32_t>(o.cp_fault_rank);
  } else {
    if (eligible.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("cp_fault: ", CpFaultName(o.cp_fault),
                       " cannot show on this snapshot; it needs ", need));
    }
    NormalSource ns(DeriveSeed(o.seed, {kTagCpFault}));
    f->rank = eligible[ns.Below(eligible.size())];
  }
  if (o.cp_fault == CpFault::kStaleRankPage) {
    PlanStaleLocalPage(layout, model, rope, pool, plan, owners, f);
    return absl::OkStatus();
  }
  f->description =
      o.cp_fault == CpFault::kDropShard
          ? absl::StrCat("drop-shard: the combine leaves out rank ", f->rank,
                         "'s partial")
      : o.cp_fault == CpFault::kLseBase2Rank
          ? absl::StrCat("lse-base2-rank: rank ", f->rank,
                         " returns its LSE in base 2 (declared e)")
          : absl::StrCat("empty-rank-garbage: rank ", f->rank,
                         " returns lse -3.4e38 (finite) where it holds no "
                         "visible key");
  return absl::OkStatus();
}

namespace {

// Every rank's partial, [W, B, Sq, Hq, D] and [W, B, Sq, Hq], with the
// per-rank faults applied to what the ranks return.
void RunRanks(const EnginePlan& plan, int64_t world,
              const std::vector<std::vector<int32_t>>& owners,
              const CpFaultPlan& f, CpEngineResult* r) {
  const int64_t queries = plan.batch * plan.queries * plan.q_heads;
  const int64_t out_bytes = queries * plan.head_dim * DTypeSize(plan.out_dtype);
  r->rank_out = Tensor(plan.out_dtype, {world, plan.batch, plan.queries,
                                        plan.q_heads, plan.head_dim});
  r->rank_lse =
      Tensor(DType::kF32, {world, plan.batch, plan.queries, plan.q_heads});
  for (int64_t k = 0; k < world; ++k) {
    EnginePlan rp = plan;
    rp.rank = static_cast<int32_t>(k);
    rp.token_owner = &owners;
    rp.sinks.clear();  // sinks join after the combine
    rp.lse_base2 = false;
    if (f.fault == CpFault::kStaleRankPage && f.rank == k) {
      rp.stale_reads.insert(rp.stale_reads.end(), f.stale_reads.begin(),
                            f.stale_reads.end());
    }
    const EngineResult part = RunFlashDecode(rp);
    std::memcpy(static_cast<char*>(r->rank_out.mutable_raw()) + k * out_bytes,
                part.out.raw(), static_cast<size_t>(out_bytes));
    float* lse = r->rank_lse.mutable_data<float>() + k * queries;
    std::memcpy(lse, part.lse.raw(), static_cast<size_t>(queries) * 4);
    if (f.rank != k) continue;
    for (int64_t q = 0; q < queries; ++q) {
      if (f.fault == CpFault::kLseBase2Rank && lse[q] != kNegInf) {
        lse[q] *= kLog2E;
      }
      if (f.fault == CpFault::kEmptyRankGarbage && lse[q] == kNegInf) {
        // A masked-score kernel's signature: finfo.min + ln(count).
        lse[q] = -std::numeric_limits<float>::max();
      }
    }
  }
}

}  // namespace

CpEngineResult RunCpEngine(const EnginePlan& plan, int64_t world,
                           const std::vector<std::vector<int32_t>>& owners,
                           const CpFaultPlan& f) {
  CpEngineResult r;
  RunRanks(plan, world, owners, f, &r);
  const int64_t d = plan.head_dim;
  const int64_t queries = plan.batch * plan.queries * plan.q_heads;
  r.out = Tensor(plan.out_dtype,
                 {plan.batch, plan.queries, plan.q_heads, plan.head_dim});
  r.lse = Tensor(DType::kF32, {plan.batch, plan.queries, plan.q_heads});
  std::vector<float> parts(static_cast<size_t>(world * d));
  std::vector<const float*> o(static_cast<size_t>(world));
  std::vector<float> l(static_cast<size_t>(world));
  std::vector<float> out(static_cast<size_t>(d));
  const float* rank_lse = r.rank_lse.data<float>();
  for (int64_t q = 0; q < queries; ++q) {
    for (int64_t k = 0; k < world; ++k) {
      for (int64_t i = 0; i < d; ++i) {
        parts[k * d + i] = LoadAsFloat(r.rank_out.raw(), plan.out_dtype,
                                       (k * queries + q) * d + i);
      }
      o[k] = &parts[k * d];
      l[k] = f.fault == CpFault::kDropShard && f.rank == k
                 ? kNegInf
                 : rank_lse[k * queries + q];
    }
    const float lse =
        Combine(o, l, d, f.fault == CpFault::kBf16Combine, out.data());
    const int64_t h = q % plan.q_heads;
    if (!plan.sinks.empty() && lse != kNegInf) {
      const float keep = 1.0f / (1.0f + std::exp(plan.sinks[h] - lse));
      for (int64_t i = 0; i < d; ++i) out[i] *= keep;
    }
    for (int64_t i = 0; i < d; ++i) {
      StoreFromFloat(r.out.mutable_raw(), plan.out_dtype, q * d + i, out[i]);
    }
    r.lse.mutable_data<float>()[q] = plan.lse_base2 ? lse * kLog2E : lse;
  }
  return r;
}

}  // namespace sim_internal
}  // namespace attnaudit
