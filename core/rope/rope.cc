#include "core/rope/rope.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"

namespace attnaudit {
namespace {

constexpr float kPi = 3.14159265358979323846f;

absl::Status ApplyLlama3(const RopeScaling& s, std::vector<float>* inv_freq) {
  if (!(s.factor >= 1.0) || !(s.low_freq_factor > 0) ||
      !(s.high_freq_factor > s.low_freq_factor) ||
      s.original_max_position <= 0) {
    return absl::InvalidArgumentError(
        "rope.scaling: llama3 needs factor >= 1, 0 < low_freq_factor < "
        "high_freq_factor and original_max_position > 0");
  }
  const float factor = static_cast<float>(s.factor);
  const float low = static_cast<float>(s.low_freq_factor);
  const float high = static_cast<float>(s.high_freq_factor);
  const float old_len = static_cast<float>(s.original_max_position);
  const float low_freq_wavelen = old_len / low;
  const float high_freq_wavelen = old_len / high;
  for (float& f : *inv_freq) {
    const float wavelen = 2.0f * kPi / f;
    if (wavelen < high_freq_wavelen) continue;  // high frequency: unchanged
    if (wavelen > low_freq_wavelen) {
      f = f / factor;
      continue;
    }
    const float smooth = (old_len / wavelen - low) / (high - low);
    f = (1.0f - smooth) * f / factor + smooth * f;
  }
  return absl::OkStatus();
}

float YarnCorrectionDim(float num_rotations, float dim, float base,
                        float max_pos) {
  return (dim * std::log(max_pos / (num_rotations * 2.0f * kPi))) /
         (2.0f * std::log(base));
}

absl::Status ApplyYarn(const RopeScaling& s, float base, int64_t rotary_dim,
                       std::vector<float>* inv_freq, float* magnitude) {
  if (!(s.factor >= 1.0) || !std::isfinite(s.factor) ||
      s.original_max_position <= 0 || !std::isfinite(s.beta_fast) ||
      !std::isfinite(s.beta_slow) || !(s.beta_slow > 0) ||
      !(s.beta_fast > s.beta_slow)) {
    return absl::InvalidArgumentError(
        "rope.scaling: yarn needs a finite factor >= 1, "
        "original_max_position > 0 and finite beta_fast > beta_slow > 0");
  }
  const float dim = static_cast<float>(rotary_dim);
  const float max_pos = static_cast<float>(s.original_max_position);
  float low = std::floor(
      YarnCorrectionDim(static_cast<float>(s.beta_fast), dim, base, max_pos));
  float high = std::ceil(
      YarnCorrectionDim(static_cast<float>(s.beta_slow), dim, base, max_pos));
  low = std::max(low, 0.0f);
  high = std::min(high, dim - 1.0f);
  if (low == high) high += 0.001f;
  const float factor = static_cast<float>(s.factor);
  for (size_t i = 0; i < inv_freq->size(); ++i) {
    const float extrapolation = (*inv_freq)[i];
    const float interpolation = extrapolation / factor;
    float ramp = (static_cast<float>(i) - low) / (high - low);
    ramp = std::min(std::max(ramp, 0.0f), 1.0f);
    const float extrapolation_weight = 1.0f - ramp;
    (*inv_freq)[i] = interpolation * (1.0f - extrapolation_weight) +
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
    *magnitude = static_cast<float>(s.attention_factor);
  } else {
    *magnitude = factor > 1.0f ? 0.1f * std::log(factor) + 1.0f : 1.0f;
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<RopeTable> RopeTable::Create(const RopeConfig& config,
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
  RopeTable table;
  table.head_dim_ = head_dim;
  table.rotary_dim_ = rotary_dim;
  table.style_ = config.style;
  const int64_t half = rotary_dim / 2;
  const float base = static_cast<float>(config.theta);
  table.inv_freq_.resize(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i) {
    const float exponent =
        static_cast<float>(2 * i) / static_cast<float>(rotary_dim);
    table.inv_freq_[i] = 1.0f / std::pow(base, exponent);
  }
  const RopeScaling& s = config.scaling;
  switch (s.type) {
    case RopeScalingType::kNone:
      break;
    case RopeScalingType::kLinear:
      if (!(s.factor > 0) || !std::isfinite(s.factor)) {
        return absl::InvalidArgumentError(
            "rope.scaling.factor: linear scaling needs a positive factor");
      }
      for (float& f : table.inv_freq_) f /= static_cast<float>(s.factor);
      break;
    case RopeScalingType::kLlama3: {
      absl::Status st = ApplyLlama3(s, &table.inv_freq_);
      if (!st.ok()) return st;
      break;
    }
    case RopeScalingType::kYarn: {
      absl::Status st =
          ApplyYarn(s, base, rotary_dim, &table.inv_freq_, &table.magnitude_);
      if (!st.ok()) return st;
      break;
    }
    default:
      return absl::InvalidArgumentError("rope.scaling.type: unknown value");
  }
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

void RopeTable::Angles(int64_t position, float* cos_out, float* sin_out) const {
  const float pos = static_cast<float>(position);
  for (size_t i = 0; i < inv_freq_.size(); ++i) {
    const float angle = pos * inv_freq_[i];
    cos_out[i] = std::cos(angle) * magnitude_;
    sin_out[i] = std::sin(angle) * magnitude_;
  }
}

void RopeTable::RotateWith(float* x, const float* cos_half,
                           const float* sin_half) const {
  const int64_t half = rotary_dim_ / 2;
  if (style_ == RopeStyle::kNeox) {
    for (int64_t i = 0; i < half; ++i) {
      const float x1 = x[i];
      const float x2 = x[i + half];
      x[i] = x1 * cos_half[i] - x2 * sin_half[i];
      x[i + half] = x2 * cos_half[i] + x1 * sin_half[i];
    }
  } else {
    for (int64_t i = 0; i < half; ++i) {
      const float x1 = x[2 * i];
      const float x2 = x[2 * i + 1];
      x[2 * i] = x1 * cos_half[i] - x2 * sin_half[i];
      x[2 * i + 1] = x2 * cos_half[i] + x1 * sin_half[i];
    }
  }
}

void RopeTable::Rotate(float* x, int64_t position) const {
  std::vector<float> cos_half(inv_freq_.size());
  std::vector<float> sin_half(inv_freq_.size());
  Angles(position, cos_half.data(), sin_half.data());
  RotateWith(x, cos_half.data(), sin_half.data());
}

}  // namespace attnaudit
