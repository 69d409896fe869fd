// Scoring a recomputed attention against E, in the statistical detector's
// noise units (docs/DIAGNOSIS.md, "Scores").
#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#include "core/diagnosis/diagnosis_internal.h"

namespace attnaudit {
namespace diagnosis_internal {

bool Context::TimeUp() const {
  if (opt->max_seconds <= 0) return false;
  return std::chrono::duration<double>(Clock::now() - start).count() >
         opt->max_seconds;
}

bool Context::Cancelled() const {
  return opt->cancelled != nullptr && opt->cancelled->load();
}

void RowResult::Reset(const SnapshotDims& d) {
  const size_t cells = static_cast<size_t>(d.queries * d.q_heads);
  out.assign(cells * static_cast<size_t>(d.head_dim), 0.0);
  lse.assign(cells, 0.0);
  have.assign(cells, 0);
}

double CellEnergy(const Context& ctx, const Row& row, const double* a_out,
                  double a_lse, int64_t c) {
  const int64_t D = ctx.d.head_dim;
  double e = 0;
  if (row.has_out) {
    double z2 = 0;
    for (int64_t i = 0; i < D; ++i) {
      const int64_t k = c * D + i;
      const double z = Diff(row.e_out[k], a_out[i]) / row.unit[k];
      z2 += std::isfinite(z) ? z * z : 1e30;
    }
    e += z2 / static_cast<double>(D);
  }
  return e + LseZ2(ctx, row, a_lse, c);
}

double LseZ2(const Context& ctx, const Row& row, double a_lse, int64_t c) {
  if (!row.has_lse) return 0;
  const double z =
      Diff(row.e_lse[c], a_lse) / (ctx.lse_unit * ctx.LseScale(a_lse));
  return std::isfinite(z) ? z * z : 1e30;
}

void Scorer::AddCell(const Row& row, int64_t c, const double* a_out,
                     double a_lse) {
  const int64_t D = ctx_.d.head_dim;
  if (head_explained_.empty()) {
    head_explained_.assign(static_cast<size_t>(ctx_.d.q_heads), 0);
    head_drifting_.assign(static_cast<size_t>(ctx_.d.q_heads), 0);
    query_explained_.assign(static_cast<size_t>(ctx_.d.queries), 0);
  }
  // One pass over the cell: energy, evidence and the tolerance check.
  double z2 = 0, lz2 = 0;
  if (row.has_out) {
    const double* e = &row.e_out[c * D];
    const double* u = &row.unit[c * D];
    for (int64_t i = 0; i < D; ++i) {
      const double diff = std::fabs(Diff(e[i], a_out[i]));
      const double z = diff / u[i];
      z2 += std::isfinite(z) ? z * z : 1e30;
      ev_after_.out_max_abs = std::max(ev_after_.out_max_abs, diff);
      if (!(diff <= ctx_.tol.out_abs)) ++over_after_;
    }
    ev_before_.out_max_abs =
        std::max(ev_before_.out_max_abs, row.before_max[c]);
    z2_before_ += row.before_z2[c];
    z2_after_ += z2;
    elements_ += D;
  }
  if (row.has_lse) {
    const double diff = std::fabs(Diff(row.e_lse[c], a_lse));
    const double scale = ctx_.LseScale(a_lse);
    const double z = diff / (ctx_.lse_unit * scale);
    lz2 = std::isfinite(z) ? z * z : 1e30;
    ev_after_.lse_max_abs = std::max(ev_after_.lse_max_abs, diff);
    ev_before_.lse_max_abs =
        std::max(ev_before_.lse_max_abs, row.before_lse[c]);
    if (!(diff <= ctx_.tol.lse_abs * scale)) ++over_after_;
  }
  const double eb = row.before[c];
  const double ea = z2 / static_cast<double>(D) + lz2;
  const double xb = std::max(0.0, eb - ctx_.clean_cell);
  const double xa = std::max(0.0, ea - ctx_.clean_cell);
  before_ += xb;
  after_ += xa;
  ++cells_;
  if (row.has_lse) {
    const double z = Diff(row.e_lse[c], row.r_lse[c]) / ctx_.lse_unit;
    const double lb = std::isfinite(z) ? z * z : 1e30;
    lse_before_ += std::max(0.0, lb - 1.0);
    lse_after_ += std::max(0.0, lz2 - 1.0);
    out_before_ += std::max(0.0, eb - lb - ctx_.noise.mean_square);
    out_after_ += std::max(0.0, ea - lz2 - ctx_.noise.mean_square);
  } else {
    out_before_ += xb;
    out_after_ += xa;
  }
  const int64_t h = c % ctx_.d.q_heads;
  // A drifting cell is explained when what is left is a small part of it
  // and near a clean cell's energy.
  if (xb > 4.0 * ctx_.clean_cell) {
    ++head_drifting_[h];
    if (xa <= 0.1 * xb + 2.0 * ctx_.clean_cell) {
      ++head_explained_[h];
      ++query_explained_[c / ctx_.d.q_heads];
    }
  }
}

bool BeyondTolerance(const Context& ctx, const Row& row) {
  for (int64_t c = 0; c < ctx.Cells(); ++c) {
    if ((row.has_out && !(row.before_max[c] <= ctx.tol.out_abs)) ||
        (row.has_lse && !(row.before_lse[c] <= ctx.tol.lse_abs))) {
      return true;
    }
  }
  return false;
}

bool RowDrifts(const Context& ctx, const Row& row) {
  if (BeyondTolerance(ctx, row)) return true;
  double z2 = 0;
  for (int64_t c = 0; c < ctx.Cells(); ++c) {
    if (row.has_out) z2 += row.before_z2[c];
  }
  return row.has_out &&
         z2 > 2.0 * ctx.noise.mean_square *
                  static_cast<double>(ctx.Cells() * ctx.d.head_dim);
}

void Scorer::Add(const Row& row, const RowResult& result) {
  const int64_t D = ctx_.d.head_dim;
  for (int64_t c = 0; c < ctx_.Cells(); ++c) {
    if (!result.have[c]) continue;
    AddCell(row, c, &result.out[c * D], result.lse[c]);
  }
}

Evaluation Scorer::Finish() const {
  Evaluation e;
  e.excess_before = before_;
  e.excess_after = after_;
  // Each quantity that carries a real part of the drift must be explained:
  // the score is the worse of out's and the LSE's.
  // A quantity drifts when its excess stands well above the noise of the
  // cells (4 clean cells' worth each).
  e.score = before_ > 0 ? std::clamp(1.0 - after_ / before_, 0.0, 1.0) : 0.0;
  const double significant =
      4.0 * ctx_.clean_cell * static_cast<double>(std::max<int64_t>(1, cells_));
  for (const auto& [b, a] :
       {std::pair<double, double>{out_before_, out_after_},
        std::pair<double, double>{lse_before_, lse_after_}}) {
    if (b > significant) {
      e.score = std::min(e.score, std::clamp(1.0 - a / b, 0.0, 1.0));
    } else if (a > significant) {
      e.score = 0;  // it breaks what was right
    }
  }
  e.before = ev_before_;
  e.after = ev_after_;
  if (elements_ > 0) {
    const double n = static_cast<double>(elements_);
    e.before.out_rms_noise = std::sqrt(z2_before_ / n);
    e.after.out_rms_noise = std::sqrt(z2_after_ / n);
  }
  // Explains: nothing left over the tolerance, and the rest near the noise
  // level of a correct engine over the elements examined (a recomputation
  // does not round the way the engine did, so twice its rms is allowed).
  const double limit =
      elements_ > 0
          ? BernsteinLimit(4.0 * ctx_.noise.mean_square, ctx_.noise.sd_square,
                           ctx_.noise.bound, elements_ / 16 + 1, 1e-9)
          : 0.0;
  const bool at_noise =
      elements_ == 0 || z2_after_ / static_cast<double>(elements_) <= limit;
  e.within_tolerance = over_after_ == 0;
  e.explains = before_ > 0 && over_after_ == 0 && at_noise && e.score > 0.5;
  int64_t queries_with = 0, last_query = -1;
  for (size_t h = 0; h < head_explained_.size(); ++h) {
    if (head_explained_[h] > 0 && 2 * head_explained_[h] >= head_drifting_[h]) {
      e.heads.push_back(static_cast<int64_t>(h));
    }
  }
  for (size_t s = 0; s < query_explained_.size(); ++s) {
    if (query_explained_[s] > 0) {
      ++queries_with;
      last_query = static_cast<int64_t>(s);
    }
  }
  if (ctx_.d.queries > 1 && queries_with == 1) e.query = last_query;
  return e;
}

void Acc::Clear() {
  m = -std::numeric_limits<double>::infinity();
  l = 0;
  std::fill(acc.begin(), acc.end(), 0.0);
}

void Acc::Add(const double* out, double lse, double weight) {
  if (!(lse > -std::numeric_limits<double>::infinity()) || weight == 0) return;
  const int64_t D = static_cast<int64_t>(acc.size());
  if (lse > m) {
    const double a = std::exp(m - lse);
    l *= a;
    for (int64_t i = 0; i < D; ++i) acc[i] *= a;
    m = lse;
  }
  const double w = weight * std::exp(lse - m);
  l += w;
  for (int64_t i = 0; i < D; ++i) acc[i] += w * out[i];
}

void Acc::Add(const float* out, double lse) {
  if (!(lse > -std::numeric_limits<double>::infinity())) return;
  const int64_t D = static_cast<int64_t>(acc.size());
  if (lse > m) {
    const double a = std::exp(m - lse);
    l *= a;
    for (int64_t i = 0; i < D; ++i) acc[i] *= a;
    m = lse;
  }
  const double w = std::exp(lse - m);
  l += w;
  for (int64_t i = 0; i < D; ++i) acc[i] += w * static_cast<double>(out[i]);
}

void Acc::Merge(const Acc& o) {
  if (o.l <= 0) return;
  const int64_t D = static_cast<int64_t>(acc.size());
  if (o.m > m) {
    const double a = std::exp(m - o.m);
    l *= a;
    for (int64_t i = 0; i < D; ++i) acc[i] *= a;
    m = o.m;
  }
  const double w = std::exp(o.m - m);
  l += w * o.l;
  for (int64_t i = 0; i < D; ++i) acc[i] += w * o.acc[i];
}

double Acc::Lse() const {
  return l > 0 ? m + std::log(l) : -std::numeric_limits<double>::infinity();
}

void Acc::Out(double* dst, double scale) const {
  const int64_t D = static_cast<int64_t>(acc.size());
  for (int64_t i = 0; i < D; ++i) dst[i] = l > 0 ? acc[i] / l * scale : 0.0;
}

CellBlocks::CellBlocks(const Context& ctx, const RowStates& rs)
    : ctx_(ctx), rs_(rs), nb_(static_cast<int64_t>(rs.pages.size())) {
  begin_.assign(rs.block_begin.begin(), rs.block_begin.end());
  units_.resize(rs.units.size());
  for (size_t u = 0; u < units_.size(); ++u) {
    units_[u] = static_cast<int32_t>(u);
  }
  const int64_t D = ctx.d.head_dim;
  blocks_.assign(static_cast<size_t>(nb_), Acc(D));
  prefix_.assign(static_cast<size_t>(nb_ + 1), Acc(D));
  suffix_.assign(static_cast<size_t>(nb_ + 1), Acc(D));
}

CellBlocks::CellBlocks(const Context& ctx, const RowStates& rs,
                       const std::vector<std::vector<int32_t>>& groups)
    : ctx_(ctx), rs_(rs), nb_(static_cast<int64_t>(groups.size())) {
  begin_.push_back(0);
  for (const std::vector<int32_t>& g : groups) {
    units_.insert(units_.end(), g.begin(), g.end());
    begin_.push_back(static_cast<int32_t>(units_.size()));
  }
  const int64_t D = ctx.d.head_dim;
  blocks_.assign(static_cast<size_t>(nb_), Acc(D));
  prefix_.assign(static_cast<size_t>(nb_ + 1), Acc(D));
  suffix_.assign(static_cast<size_t>(nb_ + 1), Acc(D));
}

void CellBlocks::Load(int64_t s, int64_t h) {
  const UnitStates& st = rs_.states;
  const int64_t D = ctx_.d.head_dim;
  for (int64_t j = 0; j < nb_; ++j) {
    Acc& a = blocks_[j];
    a.Clear();
    for (int32_t k = begin_[j]; k < begin_[j + 1]; ++k) {
      const int64_t i = st.Index(rs_.b, units_[k], s, h);
      a.Add(&st.r_out[i * D], st.r_lse[i]);
    }
  }
  prefix_[0].Clear();
  for (int64_t j = 0; j < nb_; ++j) {
    prefix_[j + 1] = prefix_[j];
    prefix_[j + 1].Merge(blocks_[j]);
  }
  suffix_[nb_].Clear();
  for (int64_t j = nb_ - 1; j >= 0; --j) {
    suffix_[j] = suffix_[j + 1];
    suffix_[j].Merge(blocks_[j]);
  }
}

Acc CellBlocks::Without(int64_t j) const {
  Acc a = prefix_[j];
  a.Merge(suffix_[j + 1]);
  return a;
}

void Final(const Context& ctx, const Acc& a, int64_t h, double* out,
           double* lse) {
  *lse = a.Lse();
  a.Out(out, 1.0);
  FinishState(ctx, nullptr, h, out, lse);
}

double EngineKeysLse(const Context& ctx, const Row& row, int64_t c) {
  const double e = row.e_lse[c];
  const PreparedAttention& p = *ctx.p;
  if (!p.lse_includes_sinks || p.sinks.empty()) return e;
  const double sink = p.sinks[c % ctx.d.q_heads];
  return sink < e ? e + std::log(-std::expm1(sink - e))
                  : -std::numeric_limits<double>::infinity();
}

void FinishState(const Context& ctx, const AltSpec* spec, int64_t h,
                 double* out, double* lse) {
  const PreparedAttention& p = *ctx.p;
  const int64_t D = ctx.d.head_dim;
  const double keys = *lse;
  double with = keys;
  if (!p.sinks.empty() && !(spec != nullptr && spec->drop_sinks) &&
      std::isfinite(keys)) {
    const double x = p.sinks[h] - keys;  // the sink's logit against the keys
    const double keep = 1.0 / (1.0 + std::exp(x));
    for (int64_t i = 0; i < D; ++i) out[i] *= keep;
    with = keys + std::log1p(std::exp(x));
  }
  const int64_t g = spec != nullptr && !spec->kv_of.empty() ? spec->kv_of[h]
                                                            : h / ctx.d.group();
  const std::vector<double>& vs =
      spec != nullptr && !spec->v_scale.empty() ? spec->v_scale : p.v_scale;
  for (int64_t i = 0; i < D; ++i) out[i] *= vs[g];
  *lse = p.lse_includes_sinks ? with : keys;
}

int64_t EnginePageId(const Context& ctx, int64_t page) {
  const Tensor& ids = ctx.in->snapshot->page_ids;
  if (page < 0) return -1;
  return ids.present() ? ids.IntAt(page) : page;
}

}  // namespace diagnosis_internal
}  // namespace attnaudit
