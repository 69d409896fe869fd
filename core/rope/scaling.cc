#include "core/rope/scaling.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "absl/strings/str_cat.h"

namespace attnaudit {
namespace rope_internal {
namespace {

absl::Status CheckLength(const char* field, int64_t value, const char* scaling,
                         int64_t minimum = 1) {
  if (value >= minimum) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("rope.scaling.", field, ": ", scaling,
                   " scaling needs a value >= ", minimum, ", got ", value));
}

// LongRoPE's divisors: rotary_dim / 2 positive finite numbers.
absl::Status CheckFactors(const char* field, const std::vector<double>& f,
                          int64_t half) {
  if (static_cast<int64_t>(f.size()) != half) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rope.scaling.", field, ": longrope needs rotary_dim / 2 = ", half,
        " entries, got ", f.size()));
  }
  for (size_t i = 0; i < f.size(); ++i) {
    if (!(std::isfinite(f[i]) && f[i] > 0)) {
      return absl::InvalidArgumentError(
          absl::StrCat("rope.scaling.", field, "[", i,
                       "]: must be a positive finite number, got ", f[i]));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckLongRope(const RopeScaling& s, int64_t rotary_dim) {
  const int64_t half = rotary_dim / 2;
  if (absl::Status st = CheckFactors("short_factor", s.short_factor, half);
      !st.ok()) {
    return st;
  }
  if (absl::Status st = CheckFactors("long_factor", s.long_factor, half);
      !st.ok()) {
    return st;
  }
  // At least 2: the default attention factor divides by its logarithm.
  if (absl::Status st = CheckLength("original_max_position",
                                    s.original_max_position, "longrope", 2);
      !st.ok()) {
    return st;
  }
  if (absl::Status st =
          CheckLength("sequence_length", s.sequence_length, "longrope");
      !st.ok()) {
    return st;
  }
  if (!(std::isfinite(s.factor) && s.factor > 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rope.scaling.factor: longrope needs a positive finite factor, got ",
        s.factor));
  }
  if (s.attention_factor != 0 &&
      !(std::isfinite(s.attention_factor) && s.attention_factor > 0 &&
        s.attention_factor < 1e6)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rope.scaling.attention_factor: must be 0 (the default sqrt(1 + "
        "ln(factor) / ln(original_max_position))) or a positive finite "
        "number below 1e6, got ",
        s.attention_factor));
  }
  return absl::OkStatus();
}

absl::Status CheckDynamic(const RopeScaling& s, int64_t rotary_dim) {
  if (!(std::isfinite(s.factor) && s.factor >= 1.0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rope.scaling.factor: dynamic scaling needs a finite factor >= 1, "
        "got ",
        s.factor));
  }
  if (absl::Status st = CheckLength("original_max_position",
                                    s.original_max_position, "dynamic");
      !st.ok()) {
    return st;
  }
  if (absl::Status st =
          CheckLength("sequence_length", s.sequence_length, "dynamic");
      !st.ok()) {
    return st;
  }
  if (rotary_dim < 4) {  // the exponent r / (r - 2)
    return absl::InvalidArgumentError(absl::StrCat(
        "rope.rotary_dim: dynamic scaling needs at least 4 rotated dims, got ",
        rotary_dim));
  }
  return absl::OkStatus();
}

// The base frequencies' exponents 2i / r, as the engines form them:
// arange(0, r, 2) / r in T.
template <typename T>
T Exponent(int64_t i, int64_t rotary_dim) {
  return static_cast<T>(2 * i) / static_cast<T>(rotary_dim);
}

}  // namespace

template <typename T>
absl::Status DynamicNtkInvFreq(const RopeConfig& config, int64_t rotary_dim,
                               std::vector<T>* inv_freq) {
  const RopeScaling& s = config.scaling;
  if (absl::Status st = CheckDynamic(s, rotary_dim); !st.ok()) return st;
  // In Hugging Face's order: seq_len = max(seq_len, max_position_embeddings);
  // base * ((factor * seq_len / max_pos) - (factor - 1)) ** (dim / (dim - 2)).
  const double L = static_cast<double>(s.original_max_position);
  const double S = std::max(static_cast<double>(s.sequence_length), L);
  const double r = static_cast<double>(rotary_dim);
  const double base =
      config.theta *
      std::pow((s.factor * S / L) - (s.factor - 1.0), r / (r - 2.0));
  if (!std::isfinite(base) || !(base > 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rope.scaling.sequence_length: dynamic scaling at ", s.sequence_length,
        " gives a base outside the double range (", base, ")"));
  }
  const T b = static_cast<T>(base);
  inv_freq->resize(static_cast<size_t>(rotary_dim / 2));
  for (int64_t i = 0; i < rotary_dim / 2; ++i) {
    (*inv_freq)[i] = T{1} / std::pow(b, Exponent<T>(i, rotary_dim));
  }
  return absl::OkStatus();
}

template <typename T>
absl::Status LongRopeInvFreq(const RopeConfig& config, int64_t rotary_dim,
                             std::vector<T>* inv_freq, T* magnitude) {
  const RopeScaling& s = config.scaling;
  if (absl::Status st = CheckLongRope(s, rotary_dim); !st.ok()) return st;
  const std::vector<double>& ext =
      UsesLongFactors(s) ? s.long_factor : s.short_factor;
  const T base = static_cast<T>(config.theta);
  // 1.0 / (ext_factors * base ** inv_freq_shape), each a T tensor.
  inv_freq->resize(static_cast<size_t>(rotary_dim / 2));
  for (int64_t i = 0; i < rotary_dim / 2; ++i) {
    const T shape = std::pow(base, Exponent<T>(i, rotary_dim));
    (*inv_freq)[i] = T{1} / (static_cast<T>(ext[i]) * shape);
  }
  // Computed in double (a Python float) and applied as a T scalar.
  *magnitude = static_cast<T>(LongRopeMagnitude(s));
  return absl::OkStatus();
}

template absl::Status DynamicNtkInvFreq<float>(const RopeConfig&, int64_t,
                                               std::vector<float>*);
template absl::Status DynamicNtkInvFreq<double>(const RopeConfig&, int64_t,
                                                std::vector<double>*);
template absl::Status LongRopeInvFreq<float>(const RopeConfig&, int64_t,
                                             std::vector<float>*, float*);
template absl::Status LongRopeInvFreq<double>(const RopeConfig&, int64_t,
                                              std::vector<double>*, double*);

bool UsesLongFactors(const RopeScaling& s) {
  return s.sequence_length > s.original_max_position;
}

double LongRopeMagnitude(const RopeScaling& s) {
  if (s.attention_factor > 0) return s.attention_factor;
  if (s.factor <= 1.0) return 1.0;
  return std::sqrt(1.0 + std::log(s.factor) / std::log(static_cast<double>(
                                                  s.original_max_position)));
}

double InvFreqUlps(const RopeScaling& s) {
  return s.type == RopeScalingType::kNone ? 2.0 : 8.0;
}

}  // namespace rope_internal

std::vector<ScalingLengthCandidate> CandidateScalingLengths(
    const RopeScaling& sc, int64_t max_query_position) {
  std::vector<ScalingLengthCandidate> out;
  if (sc.type == RopeScalingType::kLongRope) {
    const bool is_long = rope_internal::UsesLongFactors(sc);
    out.push_back(
        {is_long ? sc.original_max_position : sc.original_max_position + 1,
         absl::StrCat(is_long ? "short" : "long", " factors (declared ",
                      is_long ? "long" : "short", ": sequence_length ",
                      sc.sequence_length, ", original_max_position ",
                      sc.original_max_position, ")")});
    return out;
  }
  if (sc.type != RopeScalingType::kDynamic) return out;
  const double full =
      std::min(sc.factor * static_cast<double>(sc.original_max_position), 9e18);
  for (int64_t length : {max_query_position + 1, static_cast<int64_t>(full),
                         sc.sequence_length * 2, sc.sequence_length / 2}) {
    bool seen =
        length <= sc.original_max_position || length == sc.sequence_length;
    for (const ScalingLengthCandidate& c : out) {
      seen |= c.sequence_length == length;
    }
    if (seen) continue;
    out.push_back(
        {length, absl::StrCat("sequence_length ", length, " (declared ",
                              sc.sequence_length, ")")});
  }
  return out;
}

}  // namespace attnaudit
