// Context-parallel hypotheses from one row's per-unit R states grouped by
// the rank that holds each unit (core/attention/units.h): a rank's shard
// missing from the combine or counted twice, one rank's partial LSE in the
// other base, and a combine done in bf16. They need no per-rank replay:
// the rank partials are merges of unit states.
#include <cmath>
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

// A bf16 combine: each rank's rescaled partial rounded to bf16 and summed
// in bf16, in rank order.
void Bf16Combine(const std::vector<Acc>& ranks, double* out, double* lse) {
  const size_t D = ranks.empty() ? 0 : ranks[0].acc.size();
  double m = -1.0 / 0.0;
  for (const Acc& r : ranks) {
    if (r.l > 0) m = std::max(m, r.Lse());
  }
  std::vector<double> acc(D, 0.0), o(D);
  double wsum = 0;
  for (const Acc& r : ranks) {
    if (r.l <= 0) continue;
    const double w = std::exp(r.Lse() - m);
    wsum += w;
    r.Out(o.data(), 1.0);
    for (size_t i = 0; i < D; ++i) {
      const float part =
          RoundToDType(static_cast<float>(w * o[i]), DType::kBF16);
      acc[i] = RoundToDType(static_cast<float>(acc[i] + part), DType::kBF16);
    }
  }
  for (size_t i = 0; i < D; ++i) out[i] = wsum > 0 ? acc[i] / wsum : 0.0;
  *lse = wsum > 0 ? m + std::log(wsum) : -1.0 / 0.0;
}

}  // namespace

absl::Status CpHypotheses(const Context& ctx, const Row& row,
                          const RowStates& rs, std::vector<Candidate>* out) {
  const int64_t world = ctx.in->snapshot->cp.world_size;
  if (world <= 1) return absl::OkStatus();
  const int64_t D = ctx.d.head_dim;
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
  std::vector<Acc> ranks(static_cast<size_t>(world), Acc(D));
  std::vector<double> o(static_cast<size_t>(D));
  double z2_engine = 0, z2_bf16 = 0;
  int64_t elements = 0;
  for (int64_t c = 0; c < ctx.Cells(); ++c) {
    const int64_t s = c / ctx.d.q_heads, h = c % ctx.d.q_heads;
    for (Acc& a : ranks) a.Clear();
    for (size_t u = 0; u < rs.units.size(); ++u) {
      const int64_t i = rs.states.Index(rs.b, static_cast<int64_t>(u), s, h);
      ranks[rs.units[u].rank].Add(&rs.states.r_out[i * D], rs.states.r_lse[i]);
    }
    for (CpTrial& t : trials) {
      Acc a(D);
      for (int32_t r = 0; r < world; ++r) {
        if (r != t.rank || t.kind == CpKind::kDoubled) a.Merge(ranks[r]);
      }
      const Acc& mine = ranks[t.rank];
      if (t.kind == CpKind::kDoubled) a.Merge(mine);
      if (t.kind == CpKind::kBase2 || t.kind == CpKind::kBaseE) {
        mine.Out(o.data(), 1.0);
        a.Add(o.data(),
              mine.Lse() * (t.kind == CpKind::kBase2 ? kLog2E : kLn2));
      }
      double lse = a.Lse();
      a.Out(o.data(), 1.0);
      FinishState(ctx, nullptr, h, o.data(), &lse);
      t.scorer.AddCell(row, c, o.data(), lse);
    }
    if (row.has_out) {
      double lse = 0;
      Bf16Combine(ranks, o.data(), &lse);
      FinishState(ctx, nullptr, h, o.data(), &lse);
      for (int64_t i = 0; i < D; ++i) {
        const int64_t k = c * D + i;
        const double ze = (row.e_out[k] - row.r_out[k]) / row.unit[k];
        const double zb = (o[i] - row.r_out[k]) / row.unit[k];
        z2_engine += ze * ze;
        z2_bf16 += zb * zb;
      }
      elements += D;
    }
  }
  ctx.evaluated += static_cast<int64_t>(trials.size()) + 1;
  for (CpTrial& t : trials) {
    Candidate c;
    c.hypothesis = Name(t.kind);
    c.detail = Detail(t.kind, t.rank);
    c.eval = t.scorer.Finish();
    c.location.row = rs.b;
    c.location.query = c.eval.query;
    c.location.heads = c.eval.heads;
    c.location.cp_rank = t.rank;
    c.rank_bias = 1;
    out->push_back(std::move(c));
  }
  // A bf16 combine does not reproduce the engine's own rounding sequence:
  // it is judged by the size of the noise it predicts.
  if (elements > 0) {
    const double n = static_cast<double>(elements);
    const double observed = z2_engine / n, predicted = z2_bf16 / n;
    const double clean = ctx.noise.mean_square;
    if (observed > 2.0 * clean && predicted > 2.0 * clean &&
        observed < 3.0 * predicted && predicted < 3.0 * observed) {
      Candidate c;
      c.hypothesis = kCpBf16Combine;
      c.detail = absl::StrFormat(
          "noise rms %.2f, a bf16 combine of the %d ranks predicts %.2f",
          std::sqrt(observed), world, std::sqrt(predicted));
      c.eval.score = 0.65;
      c.eval.before.out_rms_noise = std::sqrt(observed);
      c.location.row = rs.b;
      c.rank_bias = 2;
      out->push_back(std::move(c));
    }
  }
  return absl::OkStatus();
}

}  // namespace diagnosis_internal
}  // namespace attnaudit
