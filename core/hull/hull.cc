// The convex-hull check; docs/NUMERICS.md ("The convex hull") derives the
// slack. Keep the two in step.
#include "core/hull/hull.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_format.h"
#include "core/common/parallel.h"
#include "core/tensor/dtype.h"
#include "core/tensor/dtype_traits.h"

namespace attnaudit {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// One (row, KV head) cell's finding.
struct CellResult {
  int64_t outside = 0;
  double worst_excess = 0;  // distance beyond the widened bound
  Location worst;
  double value = 0, low = 0, high = 0;
};

// The V rows' bounds of one (row, KV head), per dimension, V scale applied.
struct Bounds {
  std::vector<double> low, high;
};

// Whether logical position `pos` is visible to some query of row b.
bool VisibleToRow(const PreparedAttention& p, int64_t b, int64_t pos) {
  const int64_t queries = p.dims.queries;
  for (int64_t s = 0; s < queries; ++s) {
    if (KeyVisible(p, pos, p.query_positions[b * queries + s])) return true;
  }
  return false;
}

// Reads the visible V rows of (b, g) once: their least and largest value
// per dimension, then the V scale, then 0 when the heads have sinks.
Bounds CellBounds(const PreparedAttention& p, int64_t b, int64_t g) {
  const SnapshotDims& d = p.dims;
  const Snapshot& s = *p.snapshot;
  Bounds bounds{std::vector<double>(d.head_dim, kInf),
                std::vector<double>(d.head_dim, -kInf)};
  std::vector<float> row(static_cast<size_t>(d.head_dim));
  const std::vector<int32_t>& pages = p.layout->block_pages[b];
  const int64_t length = p.layout->seq_lens[b];
  const size_t element = DTypeSize(p.v_dtype);
  for (int64_t token = 0; token < length; ++token) {
    const int64_t page = pages[token / d.page_size];
    const int64_t slot = token % d.page_size;
    if (!VisibleToRow(p, b,
                      s.slot_positions.IntAt(page * d.page_size + slot))) {
      continue;
    }
    const int64_t at = KvSlotOffset(p.v_layout, d, page, slot, g);
    ConvertToFloat(static_cast<const char*>(p.v_data) + at * element, p.v_dtype,
                   d.head_dim, row.data());
    for (int64_t i = 0; i < d.head_dim; ++i) {
      bounds.low[i] = std::min<double>(bounds.low[i], row[i]);
      bounds.high[i] = std::max<double>(bounds.high[i], row[i]);
    }
  }
  const double scale = p.v_scale.empty() ? 1.0 : p.v_scale[g];
  for (int64_t i = 0; i < d.head_dim; ++i) {
    if (bounds.low[i] > bounds.high[i]) {  // no visible key: out is 0
      bounds.low[i] = bounds.high[i] = 0.0;
      continue;
    }
    double lo = bounds.low[i] * scale, hi = bounds.high[i] * scale;
    if (lo > hi) std::swap(lo, hi);
    if (!p.sinks.empty()) {
      lo = std::min(lo, 0.0);
      hi = std::max(hi, 0.0);
    }
    bounds.low[i] = lo;
    bounds.high[i] = hi;
  }
  return bounds;
}

int64_t OutIndex(const SnapshotDims& d, int64_t b, int64_t s, int64_t h,
                 int64_t i) {
  return ((b * d.queries + s) * d.q_heads + h) * d.head_dim + i;
}

// Whether some finite output of (b, g) is farther from R than the slack
// at |R| (a lower bound of the slack at the hull's magnitude): only then
// can it lie outside the hull.
bool CellMayLeave(const PreparedAttention& p, int64_t b, int64_t g,
                  const std::vector<double>& e, const std::vector<double>& r,
                  const HullSlack& slack) {
  const SnapshotDims& d = p.dims;
  const int64_t group = d.q_heads / d.kv_heads;
  for (int64_t s = 0; s < d.queries; ++s) {
    for (int64_t h = g * group; h < (g + 1) * group; ++h) {
      for (int64_t i = 0; i < d.head_dim; ++i) {
        const int64_t k = OutIndex(d, b, s, h, i);
        if (!std::isfinite(e[k])) continue;
        const double near = slack.relative * std::fabs(r[k]) + slack.absolute;
        if (std::fabs(e[k] - r[k]) > near) return true;
      }
    }
  }
  return false;
}

CellResult CheckCell(const PreparedAttention& p, int64_t b, int64_t g,
                     const std::vector<double>& e, const HullSlack& slack) {
  const SnapshotDims& d = p.dims;
  const Bounds bounds = CellBounds(p, b, g);
  const int64_t group = d.q_heads / d.kv_heads;
  CellResult cell;
  for (int64_t s = 0; s < d.queries; ++s) {
    for (int64_t h = g * group; h < (g + 1) * group; ++h) {
      for (int64_t i = 0; i < d.head_dim; ++i) {
        const double v = e[OutIndex(d, b, s, h, i)];
        if (!std::isfinite(v)) continue;
        const double lo = bounds.low[i], hi = bounds.high[i];
        const double widen =
            slack.relative * std::max(std::fabs(lo), std::fabs(hi)) +
            slack.absolute;
        const double excess = std::max(lo - widen - v, v - hi - widen);
        if (excess <= 0) continue;
        ++cell.outside;
        if (excess > cell.worst_excess) {
          cell.worst_excess = excess;
          cell.worst = {b, s, h, i};
          cell.value = v;
          cell.low = lo - widen;
          cell.high = hi + widen;
        }
      }
    }
  }
  return cell;
}

}  // namespace

HullSlack EngineHullSlack(const EngineArithmetic& engine, DType output_dtype,
                          DType kv_dtype, double depth) {
  const double eps_out =
      IsFloating(output_dtype) ? DTypeEpsilon(output_dtype) : kEpsF32;
  const double eps_probability = std::max(engine.probability_epsilon, kEpsF32);
  HullSlack slack;
  slack.relative =
      2.0 * (eps_out + eps_probability + 2.0 * std::max(1.0, depth) * kEpsF32 +
             (IsFp8(kv_dtype) ? kEpsBf16 / 2.0 : 0.0));
  slack.absolute = 2.0 * DTypeDenormMin(output_dtype);
  return slack;
}

HullCheck CheckEngineHull(const PreparedAttention& prepared,
                          const std::vector<double>& engine_out,
                          const std::vector<double>& reference_out,
                          const HullSlack& slack, int threads) {
  const SnapshotDims& d = prepared.dims;
  HullCheck check;
  check.present = true;
  for (double v : engine_out) check.checked += std::isfinite(v) ? 1 : 0;
  const int64_t cells = d.batch * d.kv_heads;
  std::vector<CellResult> results(static_cast<size_t>(cells));
  ParallelFor(cells, threads, [&](int64_t c) {
    const int64_t b = c / d.kv_heads, g = c % d.kv_heads;
    if (CellMayLeave(prepared, b, g, engine_out, reference_out, slack)) {
      results[c] = CheckCell(prepared, b, g, engine_out, slack);
    }
  });
  double worst = 0;
  for (const CellResult& cell : results) {
    check.outside += cell.outside;
    if (cell.outside > 0 && cell.worst_excess > worst) {
      worst = cell.worst_excess;
      check.worst = cell.worst;
      check.worst_value = cell.value;
      check.worst_low = cell.low;
      check.worst_high = cell.high;
    }
  }
  return check;
}

std::string HullReason(const HullCheck& check) {
  const Location& w = check.worst;
  return absl::StrFormat(
      "out: %d of %d elements outside the convex hull of the visible V rows "
      "(worst %.4g at b=%d s=%d h=%d d=%d, hull with rounding [%.4g, %.4g]): "
      "no attention produces them",
      check.outside, check.checked, check.worst_value, w.batch, w.query, w.head,
      w.dim, check.worst_low, check.worst_high);
}

}  // namespace attnaudit
