#include "core/rope/rope.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/rope/scaling.h"
#include "core/tensor/dtype_traits.h"

namespace attnaudit {
namespace {

constexpr double kPi = 3.14159265358979323846;
// The angle two libms' cos/sin may differ by. (The ulps two
// implementations' fp32 inverse frequencies may differ by are
// rope_internal::InvFreqUlps.)
const double kLibmAngle = 4.0 * kEpsF32;

// The scaling formulas, in the precision T (float: what engines compute;
// double: the model's definition, for checking an engine's table).
template <typename T>
absl::Status ApplyLlama3(const RopeScaling& s, std::vector<T>* inv_freq) {
  if (!(s.factor >= 1.0) || !(s.low_freq_factor > 0) ||
      !(s.high_freq_factor > s.low_freq_factor) ||
      s.original_max_position <= 0) {
    return absl::InvalidArgumentError(
        "rope.scaling: llama3 needs factor >= 1, 0 < low_freq_factor < "
        "high_freq_factor and original_max_position > 0");
  }
  const T pi = static_cast<T>(kPi);
  const T factor = static_cast<T>(s.factor);
  const T low = static_cast<T>(s.low_freq_factor);
  const T high = static_cast<T>(s.high_freq_factor);
  const T old_len = static_cast<T>(s.original_max_position);
  const T low_freq_wavelen = old_len / low;
  const T high_freq_wavelen = old_len / high;
  for (T& f : *inv_freq) {
    const T wavelen = T{2} * pi / f;
    if (wavelen < high_freq_wavelen) continue;  // high frequency: unchanged
    if (wavelen > low_freq_wavelen) {
      f = f / factor;
      continue;
    }
    const T smooth = (old_len / wavelen - low) / (high - low);
    f = (T{1} - smooth) * f / factor + smooth * f;
  }
  return absl::OkStatus();
}

template <typename T>
T YarnCorrectionDim(T num_rotations, T dim, T base, T max_pos) {
  return (dim *
          std::log(max_pos / (num_rotations * T{2} * static_cast<T>(kPi)))) /
         (T{2} * std::log(base));
}

template <typename T>
absl::Status ApplyYarn(const RopeScaling& s, T base, int64_t rotary_dim,
                       std::vector<T>* inv_freq, T* magnitude) {
  if (!(s.factor >= 1.0) || !std::isfinite(s.factor) ||
      s.original_max_position <= 0 || !std::isfinite(s.beta_fast) ||
      !std::isfinite(s.beta_slow) || !(s.beta_slow > 0) ||
      !(s.beta_fast > s.beta_slow)) {
    return absl::InvalidArgumentError(
        "rope.scaling: yarn needs a finite factor >= 1, "
        "original_max_position > 0 and finite beta_fast > beta_slow > 0");
  }
  const T dim = static_cast<T>(rotary_dim);
  const T max_pos = static_cast<T>(s.original_max_position);
  T low = YarnCorrectionDim(static_cast<T>(s.beta_fast), dim, base, max_pos);
  T high = YarnCorrectionDim(static_cast<T>(s.beta_slow), dim, base, max_pos);
  if (s.truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, T{0});
  high = std::min(high, dim - T{1});
  if (low == high) high += static_cast<T>(0.001);
  const T factor = static_cast<T>(s.factor);
  for (size_t i = 0; i < inv_freq->size(); ++i) {
    const T extrapolation = (*inv_freq)[i];
    const T interpolation = extrapolation / factor;
    T ramp = (static_cast<T>(i) - low) / (high - low);
    ramp = std::min(std::max(ramp, T{0}), T{1});
    const T extrapolation_weight = T{1} - ramp;
    (*inv_freq)[i] = interpolation * (T{1} - extrapolation_weight) +
                     extrapolation * extrapolation_weight;
  }
  if (s.attention_factor != 0 &&
      !(std::isfinite(s.attention_factor) && s.attention_factor > 0 &&
        s.attention_factor < 1e6)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rope.scaling.attention_factor: must be 0 (the default 0.1 ln(factor) "
        "+ 1) or a positive finite number below 1e6, got ",
        s.attention_factor));
  }
  if (s.attention_factor > 0) {
    *magnitude = static_cast<T>(s.attention_factor);
  } else {
    *magnitude =
        factor > T{1} ? static_cast<T>(0.1) * std::log(factor) + T{1} : T{1};
  }
  return absl::OkStatus();
}

absl::StatusOr<int64_t> CheckedRotaryDim(const RopeConfig& config,
                                         int64_t head_dim) {
  if (!std::isfinite(config.theta) || !(config.theta > 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rope.theta: must be a positive finite number, got ", config.theta));
  }
  const int64_t rotary_dim =
      config.rotary_dim > 0 ? config.rotary_dim : head_dim;
  if (config.rotary_dim < 0 || rotary_dim > head_dim || rotary_dim % 2 != 0 ||
      rotary_dim <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rope.rotary_dim: must be even and in (0, head_dim=", head_dim,
        "], got ", config.rotary_dim));
  }
  return rotary_dim;
}

// Inverse frequencies 1 / theta^(2i / r) with the config's scaling, and the
// magnitude, in precision T.
template <typename T>
absl::Status ScaledInvFreq(const RopeConfig& config, int64_t rotary_dim,
                           std::vector<T>* inv_freq, T* magnitude) {
  const int64_t half = rotary_dim / 2;
  const T base = static_cast<T>(config.theta);
  inv_freq->resize(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i) {
    const T exponent = static_cast<T>(2 * i) / static_cast<T>(rotary_dim);
    (*inv_freq)[i] = T{1} / std::pow(base, exponent);
  }
  *magnitude = T{1};
  const RopeScaling& s = config.scaling;
  switch (s.type) {
    case RopeScalingType::kNone:
      return absl::OkStatus();
    case RopeScalingType::kLinear:
      if (!(s.factor > 0) || !std::isfinite(s.factor)) {
        return absl::InvalidArgumentError(
            "rope.scaling.factor: linear scaling needs a positive factor");
      }
      for (T& f : *inv_freq) f /= static_cast<T>(s.factor);
      return absl::OkStatus();
    case RopeScalingType::kLlama3:
      return ApplyLlama3(s, inv_freq);
    case RopeScalingType::kYarn:
      return ApplyYarn(s, base, rotary_dim, inv_freq, magnitude);
    case RopeScalingType::kDynamic:
      return rope_internal::DynamicNtkInvFreq(config, rotary_dim, inv_freq);
    case RopeScalingType::kLongRope:
      return rope_internal::LongRopeInvFreq(config, rotary_dim, inv_freq,
                                            magnitude);
  }
  return absl::InvalidArgumentError("rope.scaling.type: unknown value");
}

}  // namespace

absl::StatusOr<RopeTable> RopeTable::Create(const RopeConfig& config,
                                            int64_t head_dim) {
  absl::StatusOr<int64_t> rotary_dim = CheckedRotaryDim(config, head_dim);
  if (!rotary_dim.ok()) return rotary_dim.status();
  RopeTable table;
  table.head_dim_ = head_dim;
  table.rotary_dim_ = *rotary_dim;
  table.style_ = config.style;
  table.cast_point_ = config.cast_point;
  table.scaled_ = config.scaling.type != RopeScalingType::kNone;
  table.inv_freq_ulps_ = rope_internal::InvFreqUlps(config.scaling);
  absl::Status st =
      ScaledInvFreq(config, *rotary_dim, &table.inv_freq_, &table.magnitude_);
  if (!st.ok()) return st;
  // A theta or scaling factor at the edge of the double range can still
  // give fp32 inverse frequencies that are zero, subnormal or infinite;
  // say so here rather than let attention overflow later.
  for (float f : table.inv_freq_) {
    if (!std::isnormal(f)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "rope.theta, rope.scaling: theta=", config.theta,
          " with this scaling gives fp32 inverse frequencies outside the "
          "normal range (",
          f, ")"));
    }
  }
  return table;
}

absl::StatusOr<RopeTable> RopeTable::Create(const RopeConfig& config,
                                            int64_t head_dim,
                                            const EngineRopeTable& engine) {
  absl::StatusOr<RopeTable> table = Create(config, head_dim);
  if (!table.ok()) return table.status();
  // A table of another width (a full-head table on a partial-rotary
  // config) is the table check's finding; rotating with it would hide it.
  if (!EngineTableFitsRotaryDim(engine, config, head_dim)) return table;
  const int64_t half = table->rotary_dim_ / 2;
  if (engine.inv_freq.present()) {
    table->engine_inv_freq_.resize(static_cast<size_t>(half));
    for (int64_t i = 0; i < half; ++i) {
      table->engine_inv_freq_[i] = engine.inv_freq.FloatAt(i);
    }
  }
  if (engine.positions.present()) {
    const int64_t rows = engine.positions.num_elements();
    table->engine_cos_.resize(static_cast<size_t>(rows * half));
    table->engine_sin_.resize(static_cast<size_t>(rows * half));
    table->engine_row_of_.reserve(static_cast<size_t>(rows));
    for (int64_t r = 0; r < rows; ++r) {
      table->engine_row_of_[engine.positions.IntAt(r)] = r;
      for (int64_t i = 0; i < half; ++i) {
        table->engine_cos_[r * half + i] = engine.cos.FloatAt(r * half + i);
        table->engine_sin_[r * half + i] = engine.sin.FloatAt(r * half + i);
      }
    }
  }
  return table;
}

RopeTable::Source RopeTable::SourceAt(int64_t position) const {
  if (engine_row_of_.contains(position)) return Source::kEngineRow;
  if (!engine_inv_freq_.empty()) return Source::kEngineInvFreq;
  return Source::kConfig;
}

void RopeTable::Angles(int64_t position, float* cos_out, float* sin_out) const {
  const size_t half = inv_freq_.size();
  const auto row = engine_row_of_.find(position);
  if (row != engine_row_of_.end()) {
    const size_t first = static_cast<size_t>(row->second) * half;
    std::copy_n(&engine_cos_[first], half, cos_out);
    std::copy_n(&engine_sin_[first], half, sin_out);
    return;
  }
  const std::vector<float>& freq =
      engine_inv_freq_.empty() ? inv_freq_ : engine_inv_freq_;
  const float pos = static_cast<float>(position);
  for (size_t i = 0; i < half; ++i) {
    const float angle = pos * freq[i];
    cos_out[i] = std::cos(angle) * magnitude_;
    sin_out[i] = std::sin(angle) * magnitude_;
  }
}

double RopeTable::AngleUncertainty(int64_t position, int64_t pair) const {
  switch (SourceAt(position)) {
    case Source::kEngineRow:
      return 0.0;
    case Source::kEngineInvFreq:
      // The same angles; cos and sin from another libm, a few ulps apart.
      return kLibmAngle;
    case Source::kConfig:
      break;
  }
  // theta^0 is 1 in every implementation: pair 0's angle is the position
  // itself, exact below 2^24, whatever the engine's pow.
  if (inv_freq_[pair] == 1.0f && !scaled_) return kLibmAngle;
  // An engine's inverse frequency may be an ulp or two from ours (its pow;
  // with scaling, its order of the scaling arithmetic, a few more); the
  // angle pos * f inherits that relative error and rounds once more.
  const double ulps = inv_freq_ulps_;
  const double angle = std::fabs(static_cast<double>(position)) *
                       static_cast<double>(inv_freq_[pair]);
  return angle * (ulps + 1.0) * kEpsF32 + kLibmAngle;
}

void RopeTable::RotateWith(float* x, const float* cos_half,
                           const float* sin_half) const {
  const int64_t half = rotary_dim_ / 2;
  const bool neox = style_ == RopeStyle::kNeox;
  for (int64_t i = 0; i < half; ++i) {
    const int64_t a = neox ? i : 2 * i;
    const int64_t b = neox ? i + half : 2 * i + 1;
    const float x1 = x[a];
    const float x2 = x[b];
    x[a] = x1 * cos_half[i] - x2 * sin_half[i];
    x[b] = x2 * cos_half[i] + x1 * sin_half[i];
  }
}

void RopeTable::Rotate(float* x, int64_t position) const {
  std::vector<float> cos_half(inv_freq_.size());
  std::vector<float> sin_half(inv_freq_.size());
  Angles(position, cos_half.data(), sin_half.data());
  RotateWith(x, cos_half.data(), sin_half.data());
}

void RopeTable::RotateAs(const float* x, const float* cos_half,
                         const float* sin_half, DType dtype, float* out) const {
  const int64_t half = rotary_dim_ / 2;
  const bool neox = style_ == RopeStyle::kNeox;
  const bool round_cos_sin = cast_point_ != RopeCastPoint::kAfterRope;
  const bool each_op = cast_point_ == RopeCastPoint::kEachOp;
  auto r = [dtype](float v) { return RoundToDType(v, dtype); };
  auto final = [dtype, this](float v) {
    return truncates_ ? RoundTowardZeroToDType(v, dtype)
                      : RoundToDType(v, dtype);
  };
  // The pass-through dims first: out may alias x, and the rotated pairs
  // read x before they write.
  for (int64_t i = rotary_dim_; i < head_dim_; ++i) out[i] = final(x[i]);
  for (int64_t i = 0; i < half; ++i) {
    const int64_t a = neox ? i : 2 * i;
    const int64_t b = neox ? i + half : 2 * i + 1;
    const float c = round_cos_sin ? r(cos_half[i]) : cos_half[i];
    const float s = round_cos_sin ? r(sin_half[i]) : sin_half[i];
    const float x1 = x[a];
    const float x2 = x[b];
    if (each_op) {
      out[a] = final(r(x1 * c) - r(x2 * s));
      out[b] = final(r(x2 * c) + r(x1 * s));
    } else {
      out[a] = final(x1 * c - x2 * s);
      out[b] = final(x2 * c + x1 * s);
    }
  }
}

void RopeTable::RotationAmbiguity(const float* x, const float* cos_half,
                                  const float* sin_half, DType dtype,
                                  int64_t position, float* gap) const {
  const int64_t half = rotary_dim_ / 2;
  const bool neox = style_ == RopeStyle::kNeox;
  const bool round_cos_sin = cast_point_ != RopeCastPoint::kAfterRope;
  const bool each_op = cast_point_ == RopeCastPoint::kEachOp;
  // fp32's unit roundoff: every fp32 operation of the engine's rotation
  // (a product, the sum) is within it, relative, of the exact value.
  constexpr double kUnit = 0x1p-24;
  auto r = [dtype](double v) {
    return static_cast<double>(RoundToDType(static_cast<float>(v), dtype));
  };
  auto final = [dtype, this](double v) {
    const float f = static_cast<float>(v);
    return static_cast<double>(truncates_ ? RoundTowardZeroToDType(f, dtype)
                                          : RoundToDType(f, dtype));
  };
  // The pass-through dims are only narrowed: the same in every engine. A
  // rotation kept in fp32 (or wider) is not narrowed at all: its fp32
  // differences are inside the tolerances' fp32 terms.
  const bool narrowed = dtype != DType::kF32 && dtype != DType::kF64;
  for (int64_t i = narrowed ? rotary_dim_ : 0; i < head_dim_; ++i) {
    gap[i] = 0.0f;
  }
  if (!narrowed) return;
  // Every rounding is monotone, so the engine's value lies between the
  // roundings of its interval's ends.
  struct Range {
    double lo, hi;
  };
  // x * c for c in [c.lo, c.hi], as the engine's fp32 (and, for kEachOp,
  // its dtype) product may give it.
  auto product = [&](double xv, Range c) {
    double a = xv * c.lo, b = xv * c.hi;
    if (a > b) std::swap(a, b);
    a -= kUnit * std::fabs(a);
    b += kUnit * std::fabs(b);
    if (each_op) return Range{r(a), r(b)};
    return Range{a, b};
  };
  // p - q (p + q with q negated by the caller), its fp32 rounding included.
  auto sum = [&](Range p, Range q) {
    const double lo = p.lo + q.lo, hi = p.hi + q.hi;
    const double m = kUnit * std::max(std::fabs(lo), std::fabs(hi));
    return Range{lo - m, hi + m};
  };
  // A value past the dtype's range is the engine's overflow, reported
  // elsewhere; no gap to bound there.
  auto gap_of = [&](Range y) {
    const double g = std::fabs(final(y.hi) - final(y.lo));
    return std::isfinite(g) ? static_cast<float>(g) : 0.0f;
  };
  const Source source = SourceAt(position);
  const double swing = std::max(1.0, static_cast<double>(magnitude_));
  // Two libms' fp32 cos (sin) of the same fp32 angle, each within an ulp of
  // the true value, then scaled by the magnitude: at most two ulps of the
  // value apart (measured: torch's and ours differ by one ulp in ~5 % of
  // entries). An fp32 ulp, not kLibmAngle's absolute 4 eps: a small cos is
  // known to its own ulp, and elements whose value cancels (|x1 c| ~ |x2 s|)
  // would otherwise nearly all look ambiguous.
  auto libm = [](float v) {
    const float a = std::fabs(v);
    return 2.0 * static_cast<double>(
                     std::nextafter(a, std::numeric_limits<float>::infinity()) -
                     a);
  };
  for (int64_t i = 0; i < half; ++i) {
    const int64_t a = neox ? i : 2 * i;
    const int64_t b = neox ? i + half : 2 * i + 1;
    // The engine's own row: its cos/sin exactly. The config's inverse
    // frequencies: also an angle off by AngleUncertainty's first term,
    // which moves cos and sin by at most |magnitude| times it.
    double dt = 0, dc = 0, ds = 0;
    if (source != Source::kEngineRow) {
      if (source == Source::kConfig) {
        dt = swing * std::max(0.0, AngleUncertainty(position, i) - kLibmAngle);
      }
      dc = dt + libm(cos_half[i]);
      ds = dt + libm(sin_half[i]);
    }
    Range c{cos_half[i] - dc, cos_half[i] + dc};
    Range s{sin_half[i] - ds, sin_half[i] + ds};
    if (round_cos_sin) {
      c = {r(c.lo), r(c.hi)};
      s = {r(s.lo), r(s.hi)};
    }
    const double x1 = x[a];
    const double x2 = x[b];
    const Range x1c = product(x1, c), x2s = product(x2, s);
    const Range x2c = product(x2, c), x1s = product(x1, s);
    gap[a] = gap_of(sum(x1c, Range{-x2s.hi, -x2s.lo}));
    gap[b] = gap_of(sum(x2c, x1s));
  }
}

void RopeTable::SetFinalRounding(Rounding rounding) {
  truncates_ = rounding == Rounding::kTowardZero;
}

absl::StatusOr<RopeTable> EngineRopeOf(const Snapshot& snapshot,
                                       int64_t head_dim) {
  absl::StatusOr<RopeTable> table =
      RopeTable::Create(snapshot.rope, head_dim, snapshot.rope_table);
  if (table.ok()) table->SetFinalRounding(snapshot.precision.rope_rounding);
  return table;
}

int64_t EngineTableWidth(const EngineRopeTable& engine) {
  if (engine.inv_freq.present()) return engine.inv_freq.num_elements();
  if (engine.cos.present() && engine.cos.rank() == 2) return engine.cos.dim(1);
  return -1;
}

bool EngineTableFitsRotaryDim(const EngineRopeTable& engine,
                              const RopeConfig& config, int64_t head_dim) {
  const int64_t rotary = config.rotary_dim > 0 ? config.rotary_dim : head_dim;
  return EngineTableWidth(engine) == rotary / 2;
}

std::vector<double> CandidateThetas(double declared) {
  std::vector<double> thetas = {1e4, 1e5, 5e5, 1e6, 1e7};
  for (double m : {0.1, 0.5, 2.0, 10.0}) thetas.push_back(declared * m);
  std::vector<double> out;
  for (double t : thetas) {
    if (std::fabs(t - declared) > 1e-9 * declared) out.push_back(t);
  }
  return out;
}

absl::StatusOr<ExactRope> ExactRopeOf(const RopeConfig& config,
                                      int64_t head_dim) {
  absl::StatusOr<int64_t> rotary_dim = CheckedRotaryDim(config, head_dim);
  if (!rotary_dim.ok()) return rotary_dim.status();
  ExactRope exact;
  absl::Status st =
      ScaledInvFreq(config, *rotary_dim, &exact.inv_freq, &exact.magnitude);
  if (!st.ok()) return st;
  return exact;
}

}  // namespace attnaudit
