// What a context-parallel engine's own partials say about one row
// (diagnosis_internal.h, RankEvidence): which ranks' partials drift from
// the reference partials over their shards.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/diagnosis/diagnosis_internal.h"

namespace attnaudit {
namespace diagnosis_internal {
namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

// The reference partial of rank k for cell c: R's unit states of the
// rank's units, merged in fp64 (stored V units).
void RankState(const Context& ctx, const RowStates& rs, int64_t s, int64_t h,
               int32_t k, Acc* a) {
  const int64_t D = ctx.d.head_dim;
  a->Clear();
  for (size_t u = 0; u < rs.units.size(); ++u) {
    if (rs.units[u].rank != k) continue;
    const int64_t i = rs.states.Index(rs.b, static_cast<int64_t>(u), s, h);
    a->Add(&rs.states.r_out[i * D], rs.states.r_lse[i]);
  }
}

// Energy of the engine's partial of rank k, cell c, against the reference
// partial `ref` (noise units, as CellEnergy), and whether some element is
// beyond the E-R tolerance.
double PartialEnergy(const Context& ctx, const Row& row, const Acc& ref,
                     int32_t k, int64_t c, bool* over) {
  const Snapshot& snap = *ctx.in->snapshot;
  const Tensor& out = snap.cp.rank_out;
  const Tensor& lse = snap.cp.rank_lse;
  const int64_t D = ctx.d.head_dim;
  const int64_t cells = ctx.d.batch * ctx.Cells();
  const int64_t q = k * cells + row.b * ctx.Cells() + c;
  const double ref_lse = ref.Lse();
  double e_lse = lse.DoubleAt(q);
  if (snap.engine.lse_base == LseBase::k2) e_lse *= std::log(2.0);
  if (ref_lse == kNegInf) {
    // No visible key: only an lse of -inf is right (the out is ignored).
    *over |= e_lse != kNegInf;
    return e_lse == kNegInf ? 0.0 : 1e30;
  }
  const double vs = ctx.p->v_scale[(c % ctx.d.q_heads) / ctx.d.group()];
  std::vector<double> r(static_cast<size_t>(D));
  ref.Out(r.data(), vs);
  double ss = 0;
  for (double x : r) ss += x * x;
  const double rms = std::sqrt(ss / static_cast<double>(D));
  double z2 = 0;
  for (int64_t i = 0; i < D; ++i) {
    const double diff = std::fabs(out.DoubleAt(q * D + i) - r[i]);
    const double z =
        diff / NoiseUnit(r[i], rms, ctx.noise.epsilon, out.dtype());
    z2 += std::isfinite(z) ? z * z : 1e30;
    *over |= !(diff <= ctx.tol.out_abs);
  }
  const double dl = std::fabs(e_lse - ref_lse);
  *over |= !(dl <= ctx.tol.lse_abs);
  const double zl = dl / ctx.lse_unit;
  return z2 / static_cast<double>(D) + (std::isfinite(zl) ? zl * zl : 1e30);
}

}  // namespace

bool RankEvidence::Any() const {
  return std::find(drifts.begin(), drifts.end(), 1) != drifts.end();
}

RankEvidence RankDrift(const Context& ctx, const Row& row,
                       const RowStates& rs) {
  RankEvidence ev;
  const Snapshot& snap = *ctx.in->snapshot;
  const int64_t world = snap.cp.world_size;
  if (world <= 1 || !snap.cp.rank_out.present() ||
      !snap.cp.rank_lse.present()) {
    return ev;
  }
  ev.known = true;
  ev.drifts.assign(static_cast<size_t>(world), 0);
  std::vector<double> excess(static_cast<size_t>(world), 0.0);
  std::vector<uint8_t> over(static_cast<size_t>(world), 0);
  const double clean = ctx.noise.mean_square + 1.0 / 16.0;
  Acc ref(ctx.d.head_dim);
  for (int64_t c = 0; c < ctx.Cells(); ++c) {
    const int64_t s = c / ctx.d.q_heads, h = c % ctx.d.q_heads;
    for (int32_t k = 0; k < world; ++k) {
      RankState(ctx, rs, s, h, k, &ref);
      bool o = false;
      const double e = PartialEnergy(ctx, row, ref, k, c, &o);
      excess[k] += std::max(0.0, e - clean);
      over[k] |= o;
    }
  }
  // A rank drifts when an element is beyond the tolerance or its excess
  // stands well above the noise (4 clean cells' worth per cell).
  const double significant = 4.0 * clean * static_cast<double>(ctx.Cells());
  for (int64_t k = 0; k < world; ++k) {
    ev.drifts[k] = over[k] || excess[k] > significant;
  }
  return ev;
}

std::vector<uint8_t> RanksOf(const Context& ctx, const RowStates& rs,
                             const std::vector<int64_t>& blocks) {
  std::vector<uint8_t> ranks(static_cast<size_t>(std::max<int64_t>(
                                 1, ctx.in->snapshot->cp.world_size)),
                             0);
  for (const KvUnit& u : rs.units) {
    if (std::find(blocks.begin(), blocks.end(), u.block) != blocks.end()) {
      ranks[u.rank] = 1;
    }
  }
  return ranks;
}

bool AgreesWithRanks(const RankEvidence& ev,
                     const std::vector<uint8_t>& ranks) {
  if (!ev.known) return true;
  if (!ev.Any()) return false;  // the partials are right: not a rank's fault
  for (size_t k = 0; k < ev.drifts.size(); ++k) {
    if (ev.drifts[k] && !(k < ranks.size() && ranks[k])) return false;
  }
  return true;
}

}  // namespace diagnosis_internal
}  // namespace attnaudit
