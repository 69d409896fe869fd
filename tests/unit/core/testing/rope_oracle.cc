#include "tests/unit/core/testing/rope_oracle.h"

#include <algorithm>
#include <cmath>

namespace attnaudit {
namespace testing {
namespace {

constexpr long double kPi = 3.141592653589793238462643383279502884L;

int64_t RotaryDim(const RopeConfig& config, int64_t head_dim) {
  return config.rotary_dim > 0 ? config.rotary_dim : head_dim;
}

// HF find_correction_dim: the dimension whose wavelength completes
// `rotations` turns over the original context.
long double CorrectionDim(long double rotations, long double dim,
                          long double base, long double max_pos) {
  return dim * std::log(max_pos / (rotations * 2 * kPi)) / (2 * std::log(base));
}

}  // namespace

YarnRange OracleYarnRange(const RopeConfig& config, int64_t head_dim) {
  const RopeScaling& s = config.scaling;
  const long double dim = RotaryDim(config, head_dim);
  const long double base = config.theta;
  const long double max_pos = s.original_max_position;
  YarnRange r;
  r.low_dim = CorrectionDim(s.beta_fast, dim, base, max_pos);
  r.high_dim = CorrectionDim(s.beta_slow, dim, base, max_pos);
  // Hugging Face's truncate=false keeps the fractional bounds.
  r.low =
      std::max<long double>(s.truncate ? std::floor(r.low_dim) : r.low_dim, 0);
  r.high = std::min<long double>(
      s.truncate ? std::ceil(r.high_dim) : r.high_dim, dim - 1);
  return r;
}

std::vector<long double> OracleInvFreq(const RopeConfig& config,
                                       int64_t head_dim) {
  const int64_t dim = RotaryDim(config, head_dim);
  const long double base = config.theta;
  std::vector<long double> inv(static_cast<size_t>(dim / 2));
  for (int64_t i = 0; i < dim / 2; ++i) {
    // theta^(-2i/dim)
    inv[i] = 1.0L / std::pow(base, static_cast<long double>(2 * i) / dim);
  }
  const RopeScaling& s = config.scaling;
  const long double factor = s.factor;
  switch (s.type) {
    case RopeScalingType::kNone:
      break;
    case RopeScalingType::kLinear:
      for (long double& f : inv) f /= factor;
      break;
    case RopeScalingType::kLlama3: {
      const long double old_len = s.original_max_position;
      const long double low = s.low_freq_factor, high = s.high_freq_factor;
      const long double low_freq_wavelen = old_len / low;
      const long double high_freq_wavelen = old_len / high;
      for (long double& f : inv) {
        const long double wavelen = 2 * kPi / f;
        if (wavelen < high_freq_wavelen) continue;  // high band: unchanged
        if (wavelen > low_freq_wavelen) {           // low band: / factor
          f /= factor;
          continue;
        }
        // Medium band: interpolate between f / factor and f.
        const long double smooth = (old_len / wavelen - low) / (high - low);
        f = (1 - smooth) * f / factor + smooth * f;
      }
      break;
    }
    case RopeScalingType::kYarn: {
      const YarnRange r = OracleYarnRange(config, head_dim);
      long double low = r.low, high = r.high;
      if (low == high) high += 0.001L;
      for (int64_t i = 0; i < dim / 2; ++i) {
        const long double ramp = std::min<long double>(
            std::max<long double>((i - low) / (high - low), 0), 1);
        const long double extrapolation_factor = 1 - ramp;
        const long double extrapolation = inv[i];
        const long double interpolation = inv[i] / factor;
        inv[i] = interpolation * (1 - extrapolation_factor) +
                 extrapolation * extrapolation_factor;
      }
      break;
    }
    case RopeScalingType::kDynamic: {
      // _compute_dynamic_ntk_parameters: seq_len = max(seq_len,
      // max_position_embeddings); base * ((factor * seq_len / max_pos) -
      // (factor - 1)) ** (dim / (dim - 2)); 1 / base^(2i / dim).
      const long double L = s.original_max_position;
      const long double S =
          std::max<long double>(s.sequence_length, s.original_max_position);
      const long double scaled =
          base * std::pow(factor * S / L - (factor - 1),
                          static_cast<long double>(dim) / (dim - 2));
      for (int64_t i = 0; i < dim / 2; ++i) {
        inv[i] = 1.0L / std::pow(scaled, static_cast<long double>(2 * i) / dim);
      }
      break;
    }
    case RopeScalingType::kLongRope: {
      // _compute_longrope_parameters: long_factor when seq_len >
      // original_max_position_embeddings, else short_factor; 1 / (ext_i *
      // base^(2i / dim)).
      const std::vector<double>& ext =
          s.sequence_length > s.original_max_position ? s.long_factor
                                                      : s.short_factor;
      for (int64_t i = 0; i < dim / 2; ++i) {
        inv[i] = 1.0L / (static_cast<long double>(ext[i]) *
                         std::pow(base, static_cast<long double>(2 * i) / dim));
      }
      break;
    }
  }
  return inv;
}

long double OracleMagnitude(const RopeConfig& config) {
  const RopeScaling& s = config.scaling;
  if (s.type == RopeScalingType::kLongRope) {
    // attention_factor, else sqrt(1 + log(factor) /
    // log(original_max_position_embeddings)) for factor > 1, else 1.
    if (s.attention_factor > 0) return s.attention_factor;
    const long double factor = s.factor;
    if (factor <= 1) return 1.0L;
    return std::sqrt(1 + std::log(factor) / std::log(static_cast<long double>(
                                                s.original_max_position)));
  }
  if (s.type != RopeScalingType::kYarn) return 1.0L;
  if (s.attention_factor > 0) return s.attention_factor;
  const long double factor = s.factor;
  return factor <= 1 ? 1.0L : 0.1L * std::log(factor) + 1.0L;
}

std::vector<long double> OracleRope(const RopeConfig& config,
                                    const std::vector<long double>& x,
                                    int64_t position) {
  const int64_t head_dim = static_cast<int64_t>(x.size());
  const int64_t dim = RotaryDim(config, head_dim);
  const int64_t half = dim / 2;
  const std::vector<long double> inv = OracleInvFreq(config, head_dim);
  const long double mag = OracleMagnitude(config);
  std::vector<long double> out = x;  // dims past rotary_dim pass through
  for (int64_t i = 0; i < half; ++i) {
    const long double angle = static_cast<long double>(position) * inv[i];
    const long double c = std::cos(angle) * mag;
    const long double s = std::sin(angle) * mag;
    // NeoX rotate-half pairs (i, i + half); GPT-J pairs (2i, 2i + 1).
    const int64_t a = config.style == RopeStyle::kNeox ? i : 2 * i;
    const int64_t b = config.style == RopeStyle::kNeox ? i + half : 2 * i + 1;
    out[a] = x[a] * c - x[b] * s;
    out[b] = x[b] * c + x[a] * s;
  }
  return out;
}

}  // namespace testing
}  // namespace attnaudit
