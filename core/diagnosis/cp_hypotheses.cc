// Context-parallel hypotheses from one row's per-unit R states grouped by
// the rank that holds each unit (core/attention/units.h): a rank's shard
// missing from the combine or counted twice, one rank's partial LSE in the
// other base, and a combine done in bf16. They need no per-rank replay:
// the rank partials are merges of unit states.
#include <algorithm>
#include <cmath>
#include <iterator>
#include <string>
#include <string_view>
#include <vector>

#include "absl/strings/str_format.h"
#include "core/diagnosis/diagnosis_internal.h"

namespace attnaudit {
namespace diagnosis_internal {
namespace {

constexpr double kLog2E = 1.4426950408889634074;
constexpr double kLn2 = 0.69314718055994530942;

enum class CpKind { kMissing, kDoubled, kBase2, kBaseE };

struct CpTrial {
  CpKind kind;
  int32_t rank;
  Scorer scorer;
};

const char* Name(CpKind k) {
  switch (k) {
    case CpKind::kMissing:
      return kCpMissingShard;
    case CpKind::kDoubled:
      return kCpDoubledShard;
    case CpKind::kBase2:
    case CpKind::kBaseE:
      break;
  }
  return kCpLseBase;
}

std::string Detail(CpKind k, int32_t rank) {
  switch (k) {
    case CpKind::kMissing:
      return absl::StrFormat("rank %d's partial left out of the combine", rank);
    case CpKind::kDoubled:
      return absl::StrFormat("rank %d's partial combined twice", rank);
    case CpKind::kBase2:
      return absl::StrFormat("rank %d's partial LSE in base 2, read as base e",
                             rank);
    case CpKind::kBaseE:
      break;
  }
  return absl::StrFormat("rank %d's partial LSE in base e, read as base 2",
                         rank);
}

// A combine done in bf16, as far as the rank partials show it. Each
// variant rounds a different set of the combine's steps to bf16; the
// partial outputs are always in the engine's output dtype (what the ranks
// return). The steps follow docs/NUMERICS.md, "Context parallelism":
// M = max lse_k, lse = M + ln sum exp(lse_k - M), out = sum exp(lse_k -
// lse) o_k in rank order.
struct Bf16Variant {
  bool lse_in;    // the partial LSEs (packed with the bf16 outputs)
  bool lse_math;  // differences, exponentials, their sum, log, final LSE
  bool sums;      // the weights, rescaled partials and their running sum
  const char* detail;
};
constexpr Bf16Variant kBf16Variants[] = {
    {true, true, true,
     "the partial LSEs, weights and sums rounded to bf16 (the LSEs packed "
     "with the bf16 outputs, the combine computed in bf16)"},
    {true, false, false,
     "the partial LSEs rounded to bf16 (packed with the bf16 outputs), the "
     "combine computed in fp32"},
    {false, false, true,
     "the rescaled partials rounded to bf16 and summed in bf16, the LSEs in "
     "fp32"},
};

// One query's combine under variant v of the W partials o[k] (D values
// each, value space, already in the output dtype) and lse[k] (-inf: the
// rank holds none of the query's keys). Writes out (before sinks) and
// returns the combined LSE.
double Bf16Combine(const Bf16Variant& v, const std::vector<float>& o,
                   std::vector<float> l, int64_t D, double* out) {
  const auto r = [](bool on, float x) {
    return on ? RoundToDType(x, DType::kBF16) : x;
  };
  const float kNegInf = -1.0f / 0.0f;
  float m = kNegInf;
  for (float& x : l) {
    x = r(v.lse_in, x);
    m = std::max(m, x);
  }
  std::fill(out, out + D, 0.0);
  if (m == kNegInf) return -1.0 / 0.0;
  float sum = 0;
  for (float x : l) {
    if (x == kNegInf) continue;
    sum = r(v.lse_math, sum + r(v.lse_math, std::exp(r(v.lse_math, x - m))));
  }
  const float lse = r(v.lse_math, m + r(v.lse_math, std::log(sum)));
  std::vector<float> acc(static_cast<size_t>(D), 0.0f);
  for (size_t k = 0; k < l.size(); ++k) {
    if (l[k] == kNegInf) continue;
    const float f =
        r(v.sums, r(v.lse_math, std::exp(r(v.lse_math, l[k] - lse))));
    for (int64_t i = 0; i < D; ++i) {
      acc[i] = r(v.sums, acc[i] + r(v.sums, f * o[k * D + i]));
    }
  }
  for (int64_t i = 0; i < D; ++i) out[i] = acc[i];
  return lse;
}

// Four trials per rank that holds any of the row's units.
std::vector<CpTrial> RankTrials(const Context& ctx, const RowStates& rs,
                                int64_t world) {
  std::vector<uint8_t> has(static_cast<size_t>(world), 0);
  for (const KvUnit& u : rs.units) has[u.rank] = 1;
  std::vector<CpTrial> trials;
  for (int32_t r = 0; r < world; ++r) {
    if (!has[r]) continue;
    for (CpKind k :
         {CpKind::kMissing, CpKind::kDoubled, CpKind::kBase2, CpKind::kBaseE}) {
      trials.push_back({k, r, Scorer(ctx)});
    }
  }
  return trials;
}

// Scores cell c (query head h) of trial t: the rank partials combined with
// t's fault applied to its rank. o is D values of scratch.
void ScoreRankTrial(const Context& ctx, const Row& row, int64_t c, int64_t h,
                    const std::vector<Acc>& ranks, CpTrial* t, double* o) {
  const int64_t D = ctx.d.head_dim;
  Acc a(D);
  for (int32_t r = 0; r < static_cast<int32_t>(ranks.size()); ++r) {
    if (r != t->rank || t->kind == CpKind::kDoubled) a.Merge(ranks[r]);
  }
  const Acc& mine = ranks[t->rank];
  if (t->kind == CpKind::kDoubled) a.Merge(mine);
  if (t->kind == CpKind::kBase2 || t->kind == CpKind::kBaseE) {
    mine.Out(o, 1.0);
    a.Add(o, mine.Lse() * (t->kind == CpKind::kBase2 ? kLog2E : kLn2));
  }
  double lse = a.Lse();
  a.Out(o, 1.0);
  FinishState(ctx, nullptr, h, o, &lse);
  t->scorer.AddCell(row, c, o, lse);
}

// What the ranks return for one query head: each rank's partial in value
// space (V scale of KV head g applied) cast to part_dtype, and its LSE
// (-inf for a rank that holds none of the query's keys).
void RankPartials(const Context& ctx, const std::vector<Acc>& ranks, int64_t g,
                  DType part_dtype, std::vector<float>* parts,
                  std::vector<float>* part_lse, double* o) {
  const int64_t D = ctx.d.head_dim;
  for (size_t r = 0; r < ranks.size(); ++r) {
    const Acc& a = ranks[r];
    (*part_lse)[r] = -1.0f / 0.0f;
    if (a.l <= 0) continue;
    (*part_lse)[r] = static_cast<float>(a.Lse());
    a.Out(o, ctx.p->v_scale[g]);
    for (int64_t i = 0; i < D; ++i) {
      (*parts)[r * D + i] = RoundToDType(static_cast<float>(o[i]), part_dtype);
    }
  }
}

Candidate CpCandidate(const char* hypothesis, std::string detail,
                      Scorer* scorer, int64_t row, int32_t cp_rank,
                      int rank_bias) {
  Candidate c;
  c.hypothesis = hypothesis;
  c.detail = std::move(detail);
  c.eval = scorer->Finish();
  c.location.row = row;
  c.location.query = c.eval.query;
  c.location.heads = c.eval.heads;
  c.location.cp_rank = cp_rank;
  c.rank_bias = rank_bias;
  return c;
}

// Whether the engine's partials allow a CP hypothesis: a fault of the
// combine (a partial left out or doubled, a bf16 combine) leaves every
// rank's partial right; rank r's LSE in the other base makes r, and only
// r, drift. True without the partials.
bool AllowedByRanks(const RankEvidence& ranks, const char* hypothesis,
                    int32_t rank) {
  if (!ranks.known) return true;
  if (std::string_view(hypothesis) != kCpLseBase) return !ranks.Any();
  for (size_t k = 0; k < ranks.drifts.size(); ++k) {
    if (ranks.drifts[k] != (static_cast<int32_t>(k) == rank)) return false;
  }
  return true;
}

// Rank r's local pages of the row: its units in order, cut every
// page_size tokens (a unit goes with its first token). Under token
// interleaving a local page spans several of the engine's pages.
std::vector<std::vector<int32_t>> LocalPages(const Context& ctx,
                                             const RowStates& rs, int32_t r) {
  std::vector<std::vector<int32_t>> pages;
  int64_t tokens = 0;
  for (size_t u = 0; u < rs.units.size(); ++u) {
    if (rs.units[u].rank != r) continue;
    const size_t k = static_cast<size_t>(tokens / ctx.d.page_size);
    while (pages.size() <= k) pages.emplace_back();
    pages[k].push_back(static_cast<int32_t>(u));
    tokens += rs.units[u].count;
  }
  pages.erase(std::remove_if(pages.begin(), pages.end(),
                             [](const auto& p) { return p.empty(); }),
              pages.end());
  return pages;
}

// Whether some logical block of the row holds units of two ranks (token
// interleaving finer than a page): only then is a rank's local page not
// one of the engine's pages.
bool PagesSpanRanks(const RowStates& rs) {
  for (size_t u = 1; u < rs.units.size(); ++u) {
    if (rs.units[u].block == rs.units[u - 1].block &&
        rs.units[u].rank != rs.units[u - 1].rank) {
      return true;
    }
  }
  return false;
}

// The located stale local page's evidence: the group left out, its mass
// kept at the engine's LSE (values of zero, their expectation).
Evaluation StaleGroupEvaluation(const Context& ctx, const Row& row,
                                const RowStates& rs,
                                const std::vector<std::vector<int32_t>>& groups,
                                int64_t g) {
  const int64_t D = ctx.d.head_dim;
  CellBlocks cb(ctx, rs, groups);
  Scorer scorer(ctx);
  std::vector<double> o(static_cast<size_t>(D)), zero(o.size(), 0.0);
  for (int64_t c = 0; c < ctx.Cells(); ++c) {
    const int64_t s = c / ctx.d.q_heads, h = c % ctx.d.q_heads;
    cb.Load(s, h);
    Acc a = cb.Without(g);
    if (row.has_lse) {
      const double ek = EngineKeysLse(ctx, row, c), rest = a.Lse();
      if (ek > rest) a.Add(zero.data(), ek + std::log(-std::expm1(rest - ek)));
    }
    double lse = 0;
    Final(ctx, a, h, o.data(), &lse);
    scorer.AddCell(row, c, o.data(), lse);
  }
  return scorer.Finish();
}

// One local page of one rank read stale (its keys spread over several of
// the engine's pages): the stale fit over every rank's local pages, the
// ranks the partials rule out excluded.
void RankPageHypothesis(const Context& ctx, const Row& row, const RowStates& rs,
                        const RankEvidence& ranks,
                        std::vector<Candidate>* out) {
  const int64_t world = ctx.in->snapshot->cp.world_size;
  if (!PagesSpanRanks(rs)) return;
  std::vector<std::vector<int32_t>> groups;
  std::vector<int32_t> group_rank;
  std::vector<int64_t> local_index;
  for (int32_t r = 0; r < world; ++r) {
    const std::vector<std::vector<int32_t>> pages = LocalPages(ctx, rs, r);
    for (size_t k = 0; k < pages.size(); ++k) {
      groups.push_back(pages[k]);
      group_rank.push_back(r);
      local_index.push_back(static_cast<int64_t>(k));
    }
  }
  std::vector<uint8_t> allowed(groups.size(), 1);
  for (size_t g = 0; g < groups.size() && ranks.known; ++g) {
    std::vector<uint8_t> one(static_cast<size_t>(world), 0);
    one[group_rank[g]] = 1;
    allowed[g] = AgreesWithRanks(ranks, one);
  }
  const StaleFit fit =
      FitStalePages(ctx, row, rs, RowValueStats(ctx, row.b), &groups, &allowed);
  ctx.evaluated += static_cast<int64_t>(groups.size());
  if (!fit.Structured()) return;
  const std::vector<int32_t>& units = groups[fit.best];
  Candidate c;
  c.hypothesis = kStalePage;
  c.eval = StaleGroupEvaluation(ctx, row, rs, groups, fit.best);
  const int64_t first = rs.units[units.front()].block;
  const int64_t last = rs.units[units.back()].block;
  c.location.row = rs.b;
  c.location.heads = c.eval.heads;
  c.location.logical_block = first;
  c.location.page = EnginePageId(ctx, rs.pages[first]);
  c.location.cp_rank = group_rank[fit.best];
  c.detail = absl::StrFormat(
      "local page %d of rank %d's shard (its keys in logical blocks %d to "
      "%d)",
      local_index[fit.best], group_rank[fit.best], first, last);
  c.rank_bias = 2;
  const std::string other = fit.runner_up < 0
                                ? ""
                                : absl::StrFormat("local page %d of rank %d",
                                                  local_index[fit.runner_up],
                                                  group_rank[fit.runner_up]);
  LocateStaleFit(fit, other, &c);
  out->push_back(std::move(c));
}

}  // namespace

absl::Status CpHypotheses(const Context& ctx, const Row& row,
                          const RowStates& rs, const RankEvidence& evidence,
                          std::vector<Candidate>* out) {
  const int64_t world = ctx.in->snapshot->cp.world_size;
  if (world <= 1) return absl::OkStatus();
  const int64_t D = ctx.d.head_dim;
  std::vector<CpTrial> trials = RankTrials(ctx, rs, world);
  std::vector<Acc> ranks(static_cast<size_t>(world), Acc(D));
  std::vector<double> o(static_cast<size_t>(D));
  // The bf16 combine works on what the ranks return: partials in value
  // space (V scale applied) cast to the output dtype, so the final write
  // applies the sinks only.
  const Tensor& e_out = ctx.in->snapshot->engine.out;
  const DType part_dtype = e_out.present() && IsFloating(e_out.dtype())
                               ? e_out.dtype()
                               : DType::kF32;
  AltSpec value_space;
  value_space.v_scale.assign(static_cast<size_t>(ctx.d.kv_heads), 1.0);
  std::vector<Scorer> bf16_scorers;
  for (size_t v = 0; v < std::size(kBf16Variants); ++v) {
    bf16_scorers.emplace_back(ctx);
  }
  std::vector<float> parts(static_cast<size_t>(world * D));
  std::vector<float> part_lse(static_cast<size_t>(world));
  for (int64_t c = 0; c < ctx.Cells(); ++c) {
    const int64_t s = c / ctx.d.q_heads, h = c % ctx.d.q_heads;
    for (Acc& a : ranks) a.Clear();
    for (size_t u = 0; u < rs.units.size(); ++u) {
      const int64_t i = rs.states.Index(rs.b, static_cast<int64_t>(u), s, h);
      ranks[rs.units[u].rank].Add(&rs.states.r_out[i * D], rs.states.r_lse[i]);
    }
    for (CpTrial& t : trials)
      ScoreRankTrial(ctx, row, c, h, ranks, &t, o.data());
    RankPartials(ctx, ranks, h / ctx.d.group(), part_dtype, &parts, &part_lse,
                 o.data());
    for (size_t v = 0; v < std::size(kBf16Variants); ++v) {
      double lse = Bf16Combine(kBf16Variants[v], parts, part_lse, D, o.data());
      FinishState(ctx, &value_space, h, o.data(), &lse);
      bf16_scorers[v].AddCell(row, c, o.data(), lse);
    }
  }
  ctx.evaluated += static_cast<int64_t>(trials.size() + bf16_scorers.size());
  for (CpTrial& t : trials) {
    if (!AllowedByRanks(evidence, Name(t.kind), t.rank)) continue;
    out->push_back(CpCandidate(Name(t.kind), Detail(t.kind, t.rank), &t.scorer,
                               rs.b, t.rank, /*rank_bias=*/1));
  }
  RankPageHypothesis(ctx, row, rs, evidence, out);
  if (!RowDrifts(ctx, row) || !AllowedByRanks(evidence, kCpBf16Combine, -1)) {
    return absl::OkStatus();
  }
  for (size_t v = 0; v < bf16_scorers.size(); ++v) {
    out->push_back(CpCandidate(kCpBf16Combine, kBf16Variants[v].detail,
                               &bf16_scorers[v], rs.b, /*cp_rank=*/-1,
                               /*rank_bias=*/2));
  }
  return absl::OkStatus();
}

}  // namespace diagnosis_internal
}  // namespace attnaudit
