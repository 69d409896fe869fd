#include "core/rope_check/rope_check.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/rope/rope.h"
#include "core/rope/scaling.h"
#include "core/tensor/dtype_traits.h"

namespace attnaudit {
namespace {

constexpr double kTwoPi = 6.283185307179586476925;

// Ulps an engine's fp32 inverse frequency may be from the exact one (its
// pow; with scaling, the order of the scaling arithmetic too): the same
// allowance RopeTable::AngleUncertainty makes, plus the exact value's own
// rounding.
double InvFreqUlps(const RopeConfig& config) {
  return rope_internal::InvFreqUlps(config.scaling) + 2.0;
}

// The vectors of one rolling check: each row a head vector before RoPE,
// the engine's rotated values (dequantised) and the RoPE position.
struct CheckRows {
  std::string what;  // "q" or "k"
  int64_t dim = 0;
  std::vector<float> pre;         // [rows, dim] widened
  std::vector<double> engine;     // [rows, dim]
  std::vector<int64_t> position;  // [rows]
  std::vector<Location> where;    // [rows]: b, s, head
  DType rotation_dtype = DType::kF32;
  // fp8 caches: the stored dtype and each row's scale (the engine rotates,
  // then quantises value / scale).
  DType stored_dtype = DType::kF32;
  std::vector<float> scale;  // [rows]; empty unless fp8
  int64_t rows() const { return static_cast<int64_t>(position.size()); }
};

// What the engine would hold for one row under a hypothesis.
using Rotation =
    std::function<void(const float* x, int64_t position, float* out)>;

// A check's comparison of the engine's values with one rotation.
struct Fit {
  int64_t count = 0, mismatches = 0;
  double max_abs = 0, max_ulp = 0, tolerance = 0, angle = 0;
  double excess = 0;  // sum over elements of max(0, |diff| / tol - 1)^2
  double worst_ratio = -1;
  Location worst;
};

// ULPs of `dtype` between a and b, at b's binade (at least the smallest
// normal's).
double UlpsApart(double a, double b, DType dtype) {
  return std::fabs(a - b) / UlpAt(b, dtype);
}

int64_t PairOf(const RopeTable& t, int64_t d) {
  if (d >= t.rotary_dim()) return -1;
  const int64_t half = t.rotary_dim() / 2;
  return t.style() == RopeStyle::kNeox ? d % half : d / 2;
}

int64_t PartnerOf(const RopeTable& t, int64_t d) {
  const int64_t half = t.rotary_dim() / 2;
  if (t.style() == RopeStyle::kNeox) return d < half ? d + half : d - half;
  return d % 2 == 0 ? d + 1 : d - 1;
}

// Compares the engine's values of `rows` with `rotation`; tolerances come
// from the declared table (angles, rotary dims, pairing).
Fit Compare(const CheckRows& rows, const RopeTable& declared,
            const Rotation& rotation) {
  Fit fit;
  const int64_t D = rows.dim;
  const double eps_rot = DTypeEpsilon(rows.rotation_dtype);
  const double eps_stored =
      IsFp8(rows.stored_dtype) ? DTypeEpsilon(rows.stored_dtype) : 0.0;
  std::vector<float> ours(static_cast<size_t>(D));
  for (int64_t r = 0; r < rows.rows(); ++r) {
    const float* x = &rows.pre[r * D];
    rotation(x, rows.position[r], ours.data());
    if (!rows.scale.empty()) {
      const float ks = rows.scale[r];
      for (int64_t d = 0; d < D; ++d) {
        ours[d] = RoundToDType(ours[d] / ks, rows.stored_dtype) * ks;
      }
    }
    for (int64_t d = 0; d < D; ++d) {
      const double e = rows.engine[r * D + d];
      const double diff = std::fabs(e - ours[d]);
      const int64_t pair = PairOf(declared, d);
      double magnitude = std::fabs(x[d]);
      double angle = 0;
      if (pair >= 0) {
        const int64_t other = PartnerOf(declared, d);
        magnitude = std::hypot(static_cast<double>(x[d]),
                               static_cast<double>(x[other]));
        angle = declared.AngleUncertainty(rows.position[r], pair);
      }
      const double tol = magnitude * (angle + 2.0 * eps_rot + eps_stored) +
                         2.0 * std::numeric_limits<float>::denorm_min();
      ++fit.count;
      // A rotation or tolerance that overflowed verifies nothing: a
      // mismatch, never a pass (validation keeps inputs below it).
      const double ratio = std::isfinite(ours[d]) && std::isfinite(tol)
                               ? diff / tol
                               : std::numeric_limits<double>::infinity();
      if (ratio > 1.0) {
        ++fit.mismatches;
        fit.excess += (ratio - 1.0) * (ratio - 1.0);
      }
      fit.max_abs = std::max(fit.max_abs, diff);
      fit.max_ulp =
          std::max(fit.max_ulp, UlpsApart(e, ours[d], rows.rotation_dtype));
      if (ratio > fit.worst_ratio) {
        fit.worst_ratio = ratio;
        fit.tolerance = tol;
        fit.worst = rows.where[r];
        fit.worst.dim = d;
        if (pair >= 0) {
          const int64_t o = PartnerOf(declared, d);
          const double a = std::atan2(rows.engine[r * D + o], e);
          const double b = std::atan2(ours[o], ours[d]);
          fit.angle = std::fabs(std::remainder(a - b, kTwoPi));
        }
      }
    }
  }
  return fit;
}

Rotation RotateWithTable(const RopeTable& table, DType dtype, int64_t delta = 0,
                         int times = 1) {
  return [&table, dtype, delta, times](const float* x, int64_t position,
                                       float* out) {
    const size_t half = table.inv_freq().size();
    std::vector<float> cos_half(half), sin_half(half);
    table.Angles(position + delta, cos_half.data(), sin_half.data());
    const int64_t D = table.head_dim();
    if (times == 0) {
      for (int64_t d = 0; d < D; ++d) out[d] = RoundToDType(x[d], dtype);
      return;
    }
    table.RotateAs(x, cos_half.data(), sin_half.data(), dtype, out);
    for (int t = 1; t < times; ++t) {
      table.RotateAs(out, cos_half.data(), sin_half.data(), dtype, out);
    }
  };
}

// --- Building the rows. ---

CheckRows QueryRows(const Snapshot& s, const SnapshotDims& d) {
  CheckRows rows;
  rows.what = "q";
  rows.dim = d.head_dim;
  rows.rotation_dtype = s.rope.q_output_dtype != DType::kInvalid
                            ? s.rope.q_output_dtype
                            : s.q.dtype();
  const int64_t n = d.batch * d.queries * d.q_heads;
  rows.pre.resize(static_cast<size_t>(n * d.head_dim));
  rows.engine.resize(static_cast<size_t>(n * d.head_dim));
  for (int64_t i = 0; i < n * d.head_dim; ++i) {
    rows.pre[i] = s.pre_rope.q.FloatAt(i);
    rows.engine[i] = s.q.DoubleAt(i);
  }
  for (int64_t i = 0; i < n; ++i) {
    const int64_t bs = i / d.q_heads;
    rows.position.push_back(s.query_positions.IntAt(bs));
    rows.where.push_back({bs / d.queries, bs % d.queries, i % d.q_heads, -1});
  }
  return rows;
}

// The (page, slot) of row b's token at `position`; false when the row has
// none (validation makes every query's own token present).
bool FindSlot(const Snapshot& s, const ResolvedLayout& layout, int64_t b,
              int64_t position, int64_t* page, int64_t* slot) {
  const int64_t P = layout.dims.page_size;
  int64_t lo = 0, hi = layout.seq_lens[b] - 1;
  while (lo <= hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    const int64_t pg = layout.block_pages[b][mid / P];
    const int64_t pos = s.slot_positions.IntAt(pg * P + mid % P);
    if (pos == position) {
      *page = pg;
      *slot = mid % P;
      return true;
    }
    if (pos < position) {
      lo = mid + 1;
    } else {
      hi = mid - 1;
    }
  }
  return false;
}

absl::StatusOr<CheckRows> KeyRows(const Snapshot& s,
                                  const ResolvedLayout& layout) {
  const SnapshotDims& d = layout.dims;
  CheckRows rows;
  rows.what = "k";
  rows.dim = d.head_dim;
  const DType pages = s.k_pages.dtype();
  rows.stored_dtype = pages;
  rows.rotation_dtype = s.rope.k_output_dtype != DType::kInvalid
                            ? s.rope.k_output_dtype
                        : IsFp8(pages) ? DType::kBF16
                                       : pages;
  const int64_t D = d.head_dim, P = d.page_size;
  for (int64_t b = 0; b < d.batch; ++b) {
    for (int64_t q = 0; q < d.queries; ++q) {
      const int64_t qpos = s.query_positions.IntAt(b * d.queries + q);
      int64_t page = 0, slot = 0;
      if (!FindSlot(s, layout, b, qpos, &page, &slot)) {
        return absl::InternalError(absl::StrCat(
            "pre_rope.k: row ", b, " has no cached token at position ", qpos));
      }
      const int64_t rope_pos = s.key_rope_positions.present()
                                   ? s.key_rope_positions.IntAt(page * P + slot)
                                   : qpos;
      for (int64_t g = 0; g < d.kv_heads; ++g) {
        const int64_t src = s.kv_layout == KvLayout::kNHD
                                ? ((page * P + slot) * d.kv_heads + g) * D
                                : ((page * d.kv_heads + g) * P + slot) * D;
        const int64_t pre = ((b * d.queries + q) * d.kv_heads + g) * D;
        float scale = 1.0f;
        if (s.k_scale.present()) {
          scale = s.k_scale.num_elements() == 1 ? s.k_scale.FloatAt(0)
                                                : s.k_scale.FloatAt(g);
        }
        for (int64_t i = 0; i < D; ++i) {
          rows.pre.push_back(s.pre_rope.k.FloatAt(pre + i));
          rows.engine.push_back(static_cast<double>(LoadAsFloat(
                                    s.k_pages.raw(), pages, src + i)) *
                                scale);
        }
        if (IsFp8(pages)) rows.scale.push_back(scale);
        rows.position.push_back(rope_pos);
        rows.where.push_back({b, q, g, -1});
      }
    }
  }
  return rows;
}

// The fields every check reports, from its fit.
RopeCheckResult ResultFields(std::string what, const Fit& fit) {
  RopeCheckResult r;
  r.what = std::move(what);
  r.count = fit.count;
  r.mismatches = fit.mismatches;
  r.max_abs = fit.max_abs;
  r.max_ulp = fit.max_ulp;
  r.max_angle_error = fit.angle;
  r.tolerance = fit.tolerance;
  r.worst = fit.worst;
  r.verdict = fit.mismatches > 0 ? Verdict::kDrift : Verdict::kPass;
  return r;
}

RopeCheckResult ResultOf(const CheckRows& rows, const Fit& fit) {
  RopeCheckResult r = ResultFields(rows.what, fit);
  if (fit.mismatches > 0) {
    const char* head = rows.what == "q" ? "h" : "kv_head";
    r.reasons.push_back(absl::StrFormat(
        "rope %s: %d of %d elements of this step's %s rotated by the engine "
        "differ from the declared RoPE over tolerance (worst %.3g vs %.2g at "
        "b=%d s=%d %s=%d d=%d, %.0f ulp, a pair angle %.3g rad off)",
        rows.what, fit.mismatches, fit.count,
        rows.what == "q" ? "queries" : "keys", fit.max_abs, fit.tolerance,
        fit.worst.batch, fit.worst.query, head, fit.worst.head, fit.worst.dim,
        fit.max_ulp, fit.angle));
  }
  return r;
}

// --- The table check. ---

// A table check's fit: which value the worst element is.
struct TableFit : Fit {
  std::string worst_what;  // "inv_freq" or "cos/sin"
};

void AddTableElement(double diff, double tol, double ulp, double angle,
                     Location where, const char* what, TableFit* fit) {
  ++fit->count;
  const double ratio = diff / tol;
  if (ratio > 1.0) {
    ++fit->mismatches;
    fit->excess += (ratio - 1.0) * (ratio - 1.0);
  }
  fit->max_abs = std::max(fit->max_abs, diff);
  fit->max_ulp = std::max(fit->max_ulp, ulp);
  fit->angle = std::max(fit->angle, angle);
  if (ratio > fit->worst_ratio) {
    fit->worst_ratio = ratio;
    fit->tolerance = tol;
    fit->worst = where;
    fit->worst_what = what;
  }
}

// The engine's table against the exact values of `config` (rows at their
// position + delta). Entries past the config's rotary_dim / 2 (a full-head
// table on a partial-rotary config) are compared with the pass-through the
// config declares there, frequency 0 and angle 0 (cos 1, sin 0); entries
// the table lacks count as mismatches.
TableFit CompareTable(const Snapshot& s, const RopeConfig& config,
                      int64_t head_dim, int64_t delta) {
  TableFit fit;
  absl::StatusOr<ExactRope> exact = ExactRopeOf(config, head_dim);
  if (!exact.ok()) {
    fit.excess = std::numeric_limits<double>::infinity();
    return fit;
  }
  const EngineRopeTable& t = s.rope_table;
  const int64_t half = static_cast<int64_t>(exact->inv_freq.size());
  const int64_t width = EngineTableWidth(t);
  const double ulps = InvFreqUlps(s.rope);
  if (t.inv_freq.present()) {
    for (int64_t i = 0; i < std::max(half, width); ++i) {
      const double f = i < half ? exact->inv_freq[i] : 0.0;
      const double e = i < width ? t.inv_freq.FloatAt(i) : 0.0;
      const double scale = i < half ? f : e;
      AddTableElement(std::fabs(e - f), ulps * kEpsF32 * scale,
                      std::fabs(e - f) / (kEpsF32 * scale), 0.0,
                      {-1, -1, -1, i}, "inv_freq", &fit);
    }
  }
  if (!t.positions.present()) return fit;
  const double eps_table = std::max(DTypeEpsilon(t.cos.dtype()), kEpsF32);
  for (int64_t r = 0; r < t.positions.num_elements(); ++r) {
    const double pos = static_cast<double>(t.positions.IntAt(r) + delta);
    for (int64_t i = 0; i < std::max(half, width); ++i) {
      // Past the rotary dims: the identity (angle 0, no magnitude).
      const double theta = i < half ? pos * exact->inv_freq[i] : 0.0;
      const double mag = i < half ? exact->magnitude : 1.0;
      const double c = i < width ? t.cos.DoubleAt(r * width + i) : 0.0;
      const double sn = i < width ? t.sin.DoubleAt(r * width + i) : 0.0;
      const double diff =
          std::hypot(c - std::cos(theta) * mag, sn - std::sin(theta) * mag);
      const double tol = mag * (std::fabs(theta) * (ulps + 1.0) * kEpsF32 +
                                4.0 * kEpsF32 + eps_table);
      const double angle =
          std::fabs(std::remainder(std::atan2(sn, c) - theta, kTwoPi));
      AddTableElement(diff, tol, diff / (kEpsF32 * std::max(mag, 1e-30)), angle,
                      {-1, r, -1, i}, "cos/sin", &fit);
    }
  }
  return fit;
}

RopeCheckResult TableResult(const Snapshot& s, int64_t head_dim,
                            const TableFit& fit) {
  RopeCheckResult r = ResultFields("table", fit);
  const int64_t rotary = s.rope.rotary_dim > 0 ? s.rope.rotary_dim : head_dim;
  const int64_t width = EngineTableWidth(s.rope_table);
  if (width * 2 != rotary) {
    r.reasons.push_back(absl::StrFormat(
        "rope table: the engine's table has %d frequencies, the declared "
        "rotary_dim %d has %d: the engine rotated %d dims (attnaudit rotates "
        "with the declared config, not with this table)",
        width, rotary, rotary / 2, 2 * width));
    r.verdict = Verdict::kDrift;  // even where its values cannot show it
  }
  if (fit.mismatches > 0) {
    std::string where =
        fit.worst_what == "inv_freq"
            ? absl::StrCat("rope_table.inv_freq[", fit.worst.dim, "]")
            : absl::StrCat("rope_table row ", fit.worst.query, " (position ",
                           s.rope_table.positions.IntAt(fit.worst.query),
                           ") pair ", fit.worst.dim);
    r.reasons.push_back(absl::StrFormat(
        "rope table: %d of %d of the engine's RoPE values differ from the "
        "declared RoPE (theta, scaling, rotary_dim) over tolerance (worst %s: "
        "%.3g vs %.2g; largest angle error %.3g rad)",
        fit.mismatches, fit.count, where, fit.max_abs, fit.tolerance,
        fit.angle));
  }
  return r;
}

}  // namespace

absl::StatusOr<std::vector<RopeCheckResult>> RunRopeChecks(
    const Snapshot& s, const ResolvedLayout& layout) {
  std::vector<RopeCheckResult> results;
  const SnapshotDims& d = layout.dims;
  const bool rolling = s.pre_rope.q.present() || s.pre_rope.k.present();
  if (rolling) {
    absl::StatusOr<RopeTable> table = EngineRopeOf(s, d.head_dim);
    if (!table.ok()) return table.status();
    if (s.pre_rope.q.present()) {
      const CheckRows rows = QueryRows(s, d);
      results.push_back(ResultOf(
          rows,
          Compare(rows, *table, RotateWithTable(*table, rows.rotation_dtype))));
    }
    if (s.pre_rope.k.present()) {
      absl::StatusOr<CheckRows> rows = KeyRows(s, layout);
      if (!rows.ok()) return rows.status();
      results.push_back(ResultOf(
          *rows, Compare(*rows, *table,
                         RotateWithTable(*table, rows->rotation_dtype))));
    }
  }
  if (s.rope_table.present()) {
    results.push_back(TableResult(
        s, d.head_dim, CompareTable(s, s.rope, d.head_dim, /*delta=*/0)));
  }
  return results;
}

namespace {

// --- Diagnosis of the drifting checks. ---

struct RopeVariant {
  std::string hypothesis, detail;
  RopeConfig config;  // the engine's RoPE under the hypothesis
  int64_t delta = 0;  // position shift
  int times = 1;      // rotations applied: 0 missing, 2 twice
  int rank_bias = 0;
};

// The engine scaled for another sequence length than declared
// (CandidateScalingLengths).
void AddScalingLengthVariants(const Snapshot& s, std::vector<RopeVariant>* v) {
  int64_t max_position = 0;
  for (int64_t i = 0; i < s.query_positions.num_elements(); ++i) {
    max_position = std::max(max_position, s.query_positions.IntAt(i));
  }
  for (const ScalingLengthCandidate& c :
       CandidateScalingLengths(s.rope.scaling, max_position)) {
    RopeVariant t{"rope-scaling-length", c.detail, s.rope};
    t.config.scaling.sequence_length = c.sequence_length;
    v->push_back(t);
  }
}

std::vector<RopeVariant> Variants(const Snapshot& s, int64_t head_dim,
                                  bool rolling) {
  const RopeConfig& base = s.rope;
  const int64_t rotary = base.rotary_dim > 0 ? base.rotary_dim : head_dim;
  std::vector<RopeVariant> v;
  for (int64_t delta : {1, -1, 2, -2, 3, -3, 4, -4}) {
    v.push_back({"rope-offset", absl::StrCat(delta > 0 ? "+" : "", delta), base,
                 delta, 1, 1});
  }
  for (double theta : CandidateThetas(base.theta)) {
    RopeVariant t{"rope-theta",
                  absl::StrFormat("theta=%g (declared %g)", theta, base.theta),
                  base};
    t.config.theta = theta;
    t.rank_bias = 2;
    v.push_back(t);
  }
  if (base.scaling.type != RopeScalingType::kNone) {
    RopeVariant t{"rope-scaling-ignored", "no scaling", base};
    t.config.scaling = RopeScaling();
    v.push_back(t);
  }
  AddScalingLengthVariants(s, &v);
  if (!rolling) {
    // A table has no style or rotation count; its width says how many
    // dims the engine rotated.
    const int64_t width = EngineTableWidth(s.rope_table);
    if (width > 0 && 2 * width != rotary) {
      RopeVariant w{
          "rope-partial-rotary",
          absl::StrCat("rotary_dim ", 2 * width, " (declared ", rotary, ")"),
          base};
      w.config.rotary_dim = 2 * width;
      v.push_back(w);
    }
    return v;
  }
  RopeVariant style{"rope-style",
                    base.style == RopeStyle::kNeox ? "gptj" : "neox", base};
  style.config.style =
      base.style == RopeStyle::kNeox ? RopeStyle::kGptj : RopeStyle::kNeox;
  v.push_back(style);
  if (rotary < head_dim) {
    RopeVariant full{
        "rope-partial-rotary",
        absl::StrCat("rotary_dim ", head_dim, " (declared ", rotary, ")"),
        base};
    full.config.rotary_dim = head_dim;
    v.push_back(full);
  } else {
    for (int64_t part : {head_dim / 2, head_dim / 4}) {
      if (part < 2 || part % 2 != 0) continue;
      RopeVariant p{
          "rope-partial-rotary",
          absl::StrCat("rotary_dim ", part, " (declared ", rotary, ")"), base};
      p.config.rotary_dim = part;
      v.push_back(p);
    }
  }
  v.push_back({"rope-missing", "not rotated", base, 0, 0});
  v.push_back({"rope-twice", "rotated twice", base, 0, 2});
  return v;
}

// "q-rope-missing" / "k-rope-twice" ... for the rolling checks' rotation
// counts; the others keep their names.
std::string NameFor(const std::string& what, const std::string& hypothesis) {
  if (hypothesis == "rope-missing" || hypothesis == "rope-twice") {
    return absl::StrCat(what == "k" ? "k-" : "q-", hypothesis);
  }
  return hypothesis;
}

Diagnosis MakeDiagnosis(const std::string& what, const RopeVariant& v,
                        double score, bool explains, double before_max,
                        double after_max, const Location& worst,
                        int64_t position) {
  Diagnosis d;
  d.hypothesis = NameFor(what, v.hypothesis);
  d.detail = v.detail;
  d.score = score;
  d.explains = explains;
  d.before.out_max_abs = before_max;
  d.after.out_max_abs = after_max;
  d.location.row = worst.batch;
  d.location.query = worst.query;
  if (worst.head >= 0) d.location.heads = {worst.head};
  const std::string subject =
      what == "q"   ? "the engine rotated this step's queries"
      : what == "k" ? "the engine rotated this step's keys"
                    : "the engine's RoPE table holds values";
  d.summary = absl::StrCat(
      "rope ", what, ": ", subject, " as if ", d.hypothesis, " (", v.detail,
      ")", what == "table" ? "" : absl::StrCat(" at position ", position),
      explains ? ": that accounts for every element"
               : ": that accounts for part of the difference");
  return d;
}

void DiagnoseRolling(const CheckRows& rows, const Snapshot& s, int64_t D,
                     std::vector<std::pair<int, Diagnosis>>* out) {
  absl::StatusOr<RopeTable> declared = EngineRopeOf(s, D);
  if (!declared.ok()) return;
  const Fit before =
      Compare(rows, *declared, RotateWithTable(*declared, rows.rotation_dtype));
  if (before.mismatches == 0 || before.excess <= 0) return;
  for (const RopeVariant& v : Variants(s, D, /*rolling=*/true)) {
    // Config variants rotate with the config alone (the engine's table
    // follows the declared config); shifts and counts keep the table.
    const bool config_variant = v.delta == 0 && v.times == 1;
    absl::StatusOr<RopeTable> table =
        config_variant ? RopeTable::Create(v.config, D)
                       : RopeTable::Create(v.config, D, s.rope_table);
    if (!table.ok()) continue;
    table->SetFinalRounding(s.precision.rope_rounding);
    const Fit after =
        Compare(rows, *declared,
                RotateWithTable(*table, rows.rotation_dtype, v.delta, v.times));
    const double score = std::max(0.0, 1.0 - after.excess / before.excess);
    if (score < 0.25) continue;
    int64_t position = 0;
    for (int64_t r = 0; r < rows.rows(); ++r) {
      if (rows.where[r].batch == before.worst.batch &&
          rows.where[r].query == before.worst.query) {
        position = rows.position[r];
        break;
      }
    }
    out->emplace_back(
        v.rank_bias,
        MakeDiagnosis(rows.what, v, score, after.mismatches == 0,
                      before.max_abs, after.max_abs, before.worst, position));
  }
}

void DiagnoseTable(const Snapshot& s, int64_t D,
                   std::vector<std::pair<int, Diagnosis>>* out) {
  const TableFit before = CompareTable(s, s.rope, D, 0);
  // A table of another width drifts even where its values match (rows at
  // position 0 only): the width is the evidence then.
  const bool width_only = before.mismatches == 0 &&
                          !EngineTableFitsRotaryDim(s.rope_table, s.rope, D);
  if (!width_only && (before.mismatches == 0 || before.excess <= 0)) return;
  for (const RopeVariant& v : Variants(s, D, /*rolling=*/false)) {
    const TableFit after = CompareTable(s, v.config, D, v.delta);
    if (width_only) {
      if (v.hypothesis != "rope-partial-rotary" || after.mismatches > 0) {
        continue;
      }
      out->emplace_back(v.rank_bias, MakeDiagnosis("table", v, 1.0, true, 0, 0,
                                                   Location{}, 0));
      continue;
    }
    const double score = std::max(0.0, 1.0 - after.excess / before.excess);
    if (score < 0.25) continue;
    out->emplace_back(
        v.rank_bias,
        MakeDiagnosis("table", v, score, after.mismatches == 0, before.max_abs,
                      after.max_abs, Location{}, 0));
  }
}

}  // namespace

std::vector<Diagnosis> DiagnoseRopeChecks(
    const Snapshot& s, const ResolvedLayout& layout,
    const std::vector<RopeCheckResult>& checks) {
  const SnapshotDims& d = layout.dims;
  std::vector<std::pair<int, Diagnosis>> found;
  for (const RopeCheckResult& c : checks) {
    if (c.verdict != Verdict::kDrift) continue;
    if (c.what == "q") {
      DiagnoseRolling(QueryRows(s, d), s, d.head_dim, &found);
    } else if (c.what == "k") {
      absl::StatusOr<CheckRows> rows = KeyRows(s, layout);
      if (rows.ok()) DiagnoseRolling(*rows, s, d.head_dim, &found);
    } else {
      DiagnoseTable(s, d.head_dim, &found);
    }
  }
  // What explains first, then the score (to a hundredth), then the simpler
  // hypothesis.
  std::stable_sort(found.begin(), found.end(),
                   [](const auto& a, const auto& b) {
                     if (a.second.explains != b.second.explains)
                       return a.second.explains;
                     const double sa = std::round(a.second.score * 100.0);
                     const double sb = std::round(b.second.score * 100.0);
                     if (sa != sb) return sa > sb;
                     return a.first < b.first;
                   });
  std::vector<Diagnosis> out;
  for (auto& [bias, diagnosis] : found) {
    bool seen = false;
    for (const Diagnosis& o : out) seen |= o.hypothesis == diagnosis.hypothesis;
    if (!seen) out.push_back(std::move(diagnosis));
    if (out.size() == 5) break;
  }
  return out;
}

const std::vector<std::string>& RopeHypothesisNames() {
  static const auto* const names = new std::vector<std::string>{
      "rope-offset",         "rope-theta",   "rope-scaling-ignored",
      "rope-scaling-length", "rope-style",   "rope-partial-rotary",
      "q-rope-missing",      "q-rope-twice", "k-rope-missing",
      "k-rope-twice"};
  return *names;
}

}  // namespace attnaudit
