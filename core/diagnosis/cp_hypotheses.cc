// Context-parallel hypotheses from one row's per-unit R states grouped by
// the rank that holds each unit (core/attention/units.h): a rank's shard
// missing from the combine or counted twice, one rank's partial LSE in the
// other base, and a combine done in bf16. They need no per-rank replay:
// the rank partials are merges of unit states.
#include <algorithm>
#include <cmath>
#include <iterator>
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

// A combine in bf16 moves E by a few of its roundings at most: on a row
// that does not drift (a DRIFT from a rank's partial or the log-probs
// alone) its recomputation, as near R as E is, would "remove" noise.
// The row must drift: a cell beyond the tolerance, or out's noise above
// twice a correct engine's.
bool RowDrifts(const Context& ctx, const Row& row) {
  double z2 = 0;
  for (int64_t c = 0; c < ctx.Cells(); ++c) {
    if ((row.has_out && !(row.before_max[c] <= ctx.tol.out_abs)) ||
        (row.has_lse && !(row.before_lse[c] <= ctx.tol.lse_abs))) {
      return true;
    }
    if (row.has_out) z2 += row.before_z2[c];
  }
  return row.has_out &&
         z2 > 2.0 * ctx.noise.mean_square *
                  static_cast<double>(ctx.Cells() * ctx.d.head_dim);
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

}  // namespace

absl::Status CpHypotheses(const Context& ctx, const Row& row,
                          const RowStates& rs, std::vector<Candidate>* out) {
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
    out->push_back(CpCandidate(Name(t.kind), Detail(t.kind, t.rank), &t.scorer,
                               rs.b, t.rank, /*rank_bias=*/1));
  }
  if (!RowDrifts(ctx, row)) return absl::OkStatus();
  for (size_t v = 0; v < bf16_scorers.size(); ++v) {
    out->push_back(CpCandidate(kCpBf16Combine, kBf16Variants[v].detail,
                               &bf16_scorers[v], rs.b, /*cp_rank=*/-1,
                               /*rank_bias=*/2));
  }
  return absl::OkStatus();
}

}  // namespace diagnosis_internal
}  // namespace attnaudit
