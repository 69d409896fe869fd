// Drift statistics: ComputeDrift and WorstHeads. The log-prob functions of
// drift.h live in logprobs.cc. Definitions: docs/NUMERICS.md.
#include "core/drift/drift.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/drift/pair_terms_internal.h"
#include "core/tensor/dtype_traits.h"

namespace attnaudit {
namespace {

constexpr int kMaxRank = 4;  // [B, Sq, Hq, D]
// Pairs per FiniteRange call: its ULP scratch lives on the stack.
constexpr int64_t kTermBlock = 256;

// How one (candidate, baseline) pair enters the statistics.
enum class PairKind { kValue, kAgreeingNonFinite, kNonFiniteMismatch };

// Classifies the pair and, for kValue, sets *abs_diff. Equal values
// (including equal infinities) are a value with diff 0; both NaN agree but
// carry no value; any other pair with a NaN/Inf side is a mismatch.
inline PairKind Classify(double c, double r, double* abs_diff) {
  if (c == r) {
    *abs_diff = 0;
    return PairKind::kValue;
  }
  if (!std::isfinite(c) || !std::isfinite(r)) {
    return std::isnan(c) && std::isnan(r) ? PairKind::kAgreeingNonFinite
                                          : PairKind::kNonFiniteMismatch;
  }
  const double d = std::fabs(c - r);
  // Two finite f64 values can differ by more than DBL_MAX; clamp so that the
  // pair still counts as a (huge) value rather than vanishing.
  *abs_diff = d <= std::numeric_limits<double>::max()
                  ? d
                  : std::numeric_limits<double>::max();
  return PairKind::kValue;
}

// ULP distance functors. The f32/bf16/f64 ones inline exactly the steps of
// UlpDistance (same casts, same rounding, same ordering of sign-magnitude
// codes), which keeps the hot loop free of an out-of-line call per element;
// drift_test checks them against UlpDistance. Callers pass finite values.
inline int64_t Ordered(uint64_t code, int sign_bit) {
  const uint64_t sign = uint64_t{1} << sign_bit;
  const int64_t magnitude = static_cast<int64_t>(code & (sign - 1));
  return (code & sign) ? -magnitude : magnitude;
}
// In uint64: opposite-sign f64 values are up to 2^64 - 2 steps apart, which
// overflows a signed difference.
inline double OrderedDistance(int64_t a, int64_t b) {
  const uint64_t ua = static_cast<uint64_t>(a);
  const uint64_t ub = static_cast<uint64_t>(b);
  return static_cast<double>(a > b ? ua - ub : ub - ua);
}
struct UlpF32 {
  double operator()(double a, double b) const {
    return OrderedDistance(Ordered(FloatToBits(static_cast<float>(a)), 31),
                           Ordered(FloatToBits(static_cast<float>(b)), 31));
  }
};
struct UlpBf16 {
  double operator()(double a, double b) const {
    return OrderedDistance(Ordered(FloatToBf16(static_cast<float>(a)), 15),
                           Ordered(FloatToBf16(static_cast<float>(b)), 15));
  }
};
struct UlpF64 {
  double operator()(double a, double b) const {
    uint64_t ba, bb;
    std::memcpy(&ba, &a, 8);
    std::memcpy(&bb, &b, 8);
    return OrderedDistance(Ordered(ba, 63), Ordered(bb, 63));
  }
};
struct UlpAny {  // f16 and fp8: the general (slower) encoder
  DType dtype;
  double operator()(double a, double b) const {
    return static_cast<double>(UlpDistance(a, b, dtype));
  }
};

// Calls f with the ULP functor of `dtype`.
template <typename F>
auto WithUlp(DType dtype, F&& f) {
  switch (dtype) {
    case DType::kF32:
      return f(UlpF32{});
    case DType::kBF16:
      return f(UlpBf16{});
    case DType::kF64:
      return f(UlpF64{});
    case DType::kInvalid:
    case DType::kF16:
    case DType::kF8E4M3:
    case DType::kF8E5M2:
    case DType::kI32:
    case DType::kI64:
    case DType::kBool:
      break;
  }
  return f(UlpAny{dtype});
}

// Decodes a row-major flat index into (b, s, h, d); trailing fields stay -1
// for lower ranks.
Location Decode(int64_t index, const std::vector<int64_t>& shape) {
  int64_t coords[kMaxRank] = {-1, -1, -1, -1};
  for (int i = static_cast<int>(shape.size()) - 1; i >= 0; --i) {
    coords[i] = index % shape[i];
    index /= shape[i];
  }
  Location loc;
  loc.batch = coords[0];
  loc.query = coords[1];
  loc.head = coords[2];
  loc.dim = coords[3];
  return loc;
}

std::string ShapeString(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ","), "]");
}

absl::Status CheckView(const DenseView& view, absl::string_view field,
                       int64_t* size) {
  if (view.shape.size() > kMaxRank) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": rank ", view.shape.size(), " exceeds ", kMaxRank));
  }
  if (!CheckedNumElements(view.shape, size)) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": shape ", ShapeString(view.shape),
                     " has a negative dimension or overflows"));
  }
  if (*size > 0 && view.values == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": values are null for ", *size, " elements"));
  }
  return absl::OkStatus();
}

// Running state of one ComputeDrift pass.
struct Pass {
  double* abs_diffs = nullptr;  // |diff| of counted elements, in order
  DType ulp_dtype = DType::kF32;
  double tolerance = 0;
  double tiny = 0;  // max_rel denominator floor
  double sum_abs = 0;
  double sum_sq = 0;
  double sum_ulp = 0;
  int64_t worst_index = -1;
  int64_t first_mismatch = -1;
};

// The order-dependent statistics of a pass, held in locals by a range loop
// and written back once (the compiler keeps them in registers).
struct Running {
  Running(const Pass& p, const DriftStats& s)
      : count(s.count),
        over(s.over_tolerance),
        worst(p.worst_index),
        max_abs(s.max_abs),
        max_rel(s.max_rel),
        max_ulp(s.max_ulp),
        sum_abs(p.sum_abs),
        sum_sq(p.sum_sq),
        sum_ulp(p.sum_ulp) {}

  // Value pair i (its |diff| ad and ULP distance u) in element order. An
  // equal pair has u = +0, which changes no sum or maximum.
  void Add(double ad, double u, int64_t i, double tolerance) {
    ++count;
    sum_abs += ad;
    sum_sq += ad * ad;
    if (worst < 0 || ad > max_abs) {
      max_abs = ad;
      worst = i;
    }
    over += ad > tolerance;
    max_ulp = std::max(max_ulp, u);
    sum_ulp += u;
  }

  void StoreTo(Pass* p, DriftStats* s) const {
    s->count = count;
    s->over_tolerance = over;
    s->max_abs = max_abs;
    s->max_rel = max_rel;
    s->max_ulp = max_ulp;
    p->sum_abs = sum_abs;
    p->sum_sq = sum_sq;
    p->sum_ulp = sum_ulp;
    p->worst_index = worst;
  }

  int64_t count, over, worst;
  double max_abs, max_rel, max_ulp, sum_abs, sum_sq, sum_ulp;
};

// Adds elements [begin, end) to the pass one by one. The common case (both
// sides finite) takes one branch-light path; NaN/Inf handling is off to the
// side.
template <typename Ulp>
void ScalarRange(const double* c, const double* r, int64_t begin, int64_t end,
                 Ulp ulp, Pass* pass, DriftStats* stats) {
  Running run(*pass, *stats);
  for (int64_t i = begin; i < end; ++i) {
    const double ci = c[i];
    const double ri = r[i];
    double ad;
    if (std::isfinite(ci) && std::isfinite(ri)) {
      ad = std::fabs(ci - ri);
      // Two finite f64 values can differ by more than DBL_MAX: clamp.
      if (!(ad <= std::numeric_limits<double>::max())) {
        ad = std::numeric_limits<double>::max();
      }
    } else {
      stats->candidate_nan += std::isnan(ci);
      stats->candidate_inf += std::isinf(ci);
      stats->baseline_nan += std::isnan(ri);
      stats->baseline_inf += std::isinf(ri);
      const PairKind kind = Classify(ci, ri, &ad);
      if (kind != PairKind::kValue) {
        if (kind == PairKind::kNonFiniteMismatch) {
          if (pass->first_mismatch < 0) pass->first_mismatch = i;
          ++stats->nonfinite_mismatch;
        }
        continue;
      }
    }
    pass->abs_diffs[run.count] = ad;
    double u = 0;
    if (ad > 0) {  // equal pairs (common) are 0 ULPs apart: skip the encode
      run.max_rel =
          std::max(run.max_rel, ad / std::max(std::fabs(ri), pass->tiny));
      u = ulp(ci, ri);
    }
    run.Add(ad, u, i, pass->tolerance);
  }
  run.StoreTo(pass, stats);
}

// Adds elements [begin, begin + n) when all of them are finite: their
// terms come from FinitePairTerms (SIMD, written straight into abs_diffs),
// and the order-dependent part runs here in element order, as in
// ScalarRange. Returns false, changing nothing, when some side is NaN or
// Inf.
bool FiniteRange(const double* c, const double* r, int64_t begin, int64_t n,
                 Pass* pass, DriftStats* stats) {
  double ulps[kTermBlock];
  const double* abs_diffs = pass->abs_diffs + stats->count;
  Running run(*pass, *stats);
  if (!drift_internal::FinitePairTerms(
          c + begin, r + begin, n, pass->ulp_dtype, pass->tiny,
          pass->abs_diffs + stats->count, ulps, &run.max_rel)) {
    return false;
  }
  for (int64_t j = 0; j < n; ++j) {
    run.Add(abs_diffs[j], ulps[j], begin + j, pass->tolerance);
  }
  run.StoreTo(pass, stats);
  return true;
}

// Adds elements [begin, end) to the pass, in blocks of kTermBlock: a block
// whose pairs are all finite takes FiniteRange, any other ScalarRange.
template <typename Ulp>
void AccumulateRange(const double* c, const double* r, int64_t begin,
                     int64_t end, Ulp ulp, Pass* pass, DriftStats* stats) {
  const bool vector = drift_internal::HasVectorUlp(pass->ulp_dtype);
  for (int64_t b = begin; b < end; b += kTermBlock) {
    const int64_t n = std::min(kTermBlock, end - b);
    if (!vector || !FiniteRange(c, r, b, n, pass, stats)) {
      ScalarRange(c, r, b, b + n, ulp, pass, stats);
    }
  }
}

// One head's dim elements of one row into its summary when every side is
// finite: the terms from FinitePairTerms, the sum in element order (the
// bits of WorstHeads' scalar loop). False, changing nothing, otherwise.
bool FiniteHeadRow(const double* c, const double* r, int64_t dim,
                   DType ulp_dtype, HeadSummary* head, double* sum,
                   int64_t* count) {
  double abs_diffs[kTermBlock];
  double ulps[kTermBlock];
  double unused_rel = 0;
  if (!drift_internal::FinitePairTerms(c, r, dim, ulp_dtype, 1.0, abs_diffs,
                                       ulps, &unused_rel)) {
    return false;
  }
  double s = *sum, max_abs = head->max_abs, max_ulp = head->max_ulp;
  for (int64_t i = 0; i < dim; ++i) {
    s += abs_diffs[i];
    max_abs = std::max(max_abs, abs_diffs[i]);
    max_ulp = std::max(max_ulp, ulps[i]);
  }
  *sum = s;
  *count += dim;
  head->max_abs = max_abs;
  head->max_ulp = max_ulp;
  return true;
}

// The k-th smallest (0-based) of the n values at v, which are all +0 or
// positive (|diff|s): as such, their bit patterns order as the values do.
// Two histogram passes over 12-bit digits of the pattern (sign and
// exponent, then the top of the mantissa) keep only the values that share
// both digits with the answer, and one nth_element among those settles
// it: the result of nth_element over all n, in a fraction of its time
// when the p99 lies in one binade among a few thousand values, as audits'
// |diff|s do. Up to kDirectSelect values nth_element alone is cheaper
// than zeroing the histograms (2 x 32 KiB; an audit selects 9 times, on as
// few as one log-prob). Overwrites v.
double NthSmallestMagnitude(double* v, int64_t n, int64_t k) {
  constexpr int64_t kDirectSelect = 1024;
  if (n <= kDirectSelect) {
    std::nth_element(v, v + k, v + n);
    return v[k];
  }
  constexpr int kDigitBits = 12;
  constexpr uint64_t kDigitMask = (uint64_t{1} << kDigitBits) - 1;
  int64_t m = n;  // the candidates: v[0, m)
  for (int shift : {52, 40}) {
    auto digit = [shift](double x) {
      uint64_t bits;
      std::memcpy(&bits, &x, sizeof bits);
      return static_cast<size_t>((bits >> shift) & kDigitMask);
    };
    int64_t counts[kDigitMask + 1] = {};  // 32 KiB: no allocation per audit
    for (int64_t i = 0; i < m; ++i) ++counts[digit(v[i])];
    size_t bucket = 0;
    while (k >= counts[bucket]) k -= counts[bucket++];
    int64_t kept = 0;
    for (int64_t i = 0; i < m; ++i) {
      if (digit(v[i]) == bucket) v[kept++] = v[i];
    }
    m = kept;
  }
  std::nth_element(v, v + k, v + m);
  return v[k];
}

}  // namespace

int64_t DenseView::size() const {
  int64_t n = 0;
  return CheckedNumElements(shape, &n) ? n : 0;
}

absl::StatusOr<DriftStats> ComputeDrift(const DenseView& candidate,
                                        const DenseView& baseline,
                                        const DriftOptions& options) {
  int64_t n = 0;
  int64_t baseline_n = 0;
  absl::Status status = CheckView(candidate, "candidate", &n);
  if (status.ok()) status = CheckView(baseline, "baseline", &baseline_n);
  if (!status.ok()) return status;
  if (candidate.shape != baseline.shape) {
    return absl::InvalidArgumentError(absl::StrCat(
        "candidate: shape ", ShapeString(candidate.shape),
        " does not match baseline shape ", ShapeString(baseline.shape)));
  }
  if (!IsFloating(options.ulp_dtype)) {
    return absl::InvalidArgumentError(
        absl::StrCat("ulp_dtype: ", DTypeName(options.ulp_dtype),
                     " is not a floating dtype"));
  }

  // The mask selects whole (b, s) groups of `inner` contiguous elements.
  const std::vector<int64_t>& shape = candidate.shape;
  int64_t groups = 1;
  int64_t inner = n;
  if (options.active_mask != nullptr && !shape.empty()) {
    groups = shape[0] * (shape.size() >= 2 ? shape[1] : 1);
    inner = groups > 0 ? n / groups : 0;
  }

  DriftStats stats;
  stats.ulp_dtype = options.ulp_dtype;
  stats.tolerance = options.tolerance;
  const double* c = candidate.values;
  const double* r = baseline.values;

  // The only O(n) scratch: |diff| of the counted elements, for the exact p99.
  // Uninitialised on purpose: the pass writes every slot it later reads.
  std::unique_ptr<double[]> abs_diffs(new double[static_cast<size_t>(n)]);
  Pass pass;
  pass.abs_diffs = abs_diffs.get();
  pass.ulp_dtype = options.ulp_dtype;
  pass.tolerance = options.tolerance;
  // The floor of the max_rel denominator, so that a zero baseline gives a
  // large but finite relative error instead of inf.
  pass.tiny = DTypeSmallestNormal(options.ulp_dtype);
  WithUlp(options.ulp_dtype, [&](auto ulp) {
    for (int64_t g = 0; g < groups; ++g) {
      if (options.active_mask != nullptr && options.active_mask[g] == 0) {
        continue;
      }
      AccumulateRange(c, r, g * inner, (g + 1) * inner, ulp, &pass, &stats);
    }
    return 0;
  });
  const int64_t worst_index = pass.worst_index;
  const int64_t first_mismatch = pass.first_mismatch;
  const double sum_abs = pass.sum_abs;
  const double sum_sq = pass.sum_sq;
  const double sum_ulp = pass.sum_ulp;

  if (first_mismatch >= 0) {
    stats.first_nonfinite_mismatch = Decode(first_mismatch, shape);
  }
  if (stats.count == 0) return stats;
  const double count = static_cast<double>(stats.count);
  stats.mean_abs = sum_abs / count;
  stats.rms = std::sqrt(sum_sq / count);
  stats.mean_ulp = sum_ulp / count;
  stats.worst = Decode(worst_index, shape);
  stats.worst_candidate = c[worst_index];
  stats.worst_baseline = r[worst_index];
  // Nearest rank: the ceil(0.99 * count)-th smallest |diff| (1-based).
  const int64_t rank = (99 * stats.count + 99) / 100;
  stats.p99_abs = NthSmallestMagnitude(abs_diffs.get(), stats.count, rank - 1);
  return stats;
}

std::vector<HeadSummary> WorstHeads(const DenseView& candidate,
                                    const DenseView& baseline, DType ulp_dtype,
                                    int top_n) {
  std::vector<HeadSummary> heads;
  int64_t n = 0;
  int64_t baseline_n = 0;
  if (top_n <= 0 || candidate.shape.size() != 4 ||
      candidate.shape != baseline.shape ||
      !CheckView(candidate, "candidate", &n).ok() ||
      !CheckView(baseline, "baseline", &baseline_n).ok() || n == 0 ||
      !IsFloating(ulp_dtype)) {
    return heads;
  }
  const int64_t rows = candidate.shape[0] * candidate.shape[1];
  const int64_t num_heads = candidate.shape[2];
  const int64_t dim = candidate.shape[3];
  heads.resize(static_cast<size_t>(num_heads));
  std::vector<double> sums(static_cast<size_t>(num_heads), 0.0);
  std::vector<int64_t> counts(static_cast<size_t>(num_heads), 0);
  for (int64_t h = 0; h < num_heads; ++h) heads[h].head = h;

  const bool vector =
      drift_internal::HasVectorUlp(ulp_dtype) && dim <= kTermBlock;
  WithUlp(ulp_dtype, [&](auto ulp) {
    for (int64_t row = 0; row < rows; ++row) {
      for (int64_t h = 0; h < num_heads; ++h) {
        const int64_t base = (row * num_heads + h) * dim;
        HeadSummary& head = heads[h];
        if (vector &&
            FiniteHeadRow(candidate.values + base, baseline.values + base, dim,
                          ulp_dtype, &head, &sums[h], &counts[h])) {
          continue;
        }
        for (int64_t i = base; i < base + dim; ++i) {
          const double ci = candidate.values[i];
          const double ri = baseline.values[i];
          double ad = 0;
          if (Classify(ci, ri, &ad) != PairKind::kValue) continue;
          ++counts[h];
          sums[h] += ad;
          head.max_abs = std::max(head.max_abs, ad);
          if (ad > 0) head.max_ulp = std::max(head.max_ulp, ulp(ci, ri));
        }
      }
    }
    return 0;
  });
  for (int64_t h = 0; h < num_heads; ++h) {
    if (counts[h] > 0) heads[h].mean_abs = sums[h] / counts[h];
  }
  std::stable_sort(heads.begin(), heads.end(),
                   [](const HeadSummary& a, const HeadSummary& b) {
                     return a.max_abs > b.max_abs;
                   });
  if (static_cast<int64_t>(heads.size()) > top_n) heads.resize(top_n);
  return heads;
}

}  // namespace attnaudit
