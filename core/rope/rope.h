// Rotary position embedding, computed the way engines compute it: the
// inverse frequencies, the angles, cos/sin and the rotation all in fp32,
// then one cast to the output dtype (RopeCastPoint::kAfterRope).
//
// RopeTable precomputes the inverse frequencies and the YaRN magnitude for a
// RopeConfig; it is immutable after Create and safe to share across threads.
#ifndef ATTNAUDIT_CORE_ROPE_ROPE_H_
#define ATTNAUDIT_CORE_ROPE_ROPE_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "core/snapshot/snapshot.h"

namespace attnaudit {

class RopeTable {
 public:
  // Errors (InvalidArgument, naming the rope field) for a non-positive or
  // non-finite theta, an odd or too large rotary_dim, or bad scaling
  // parameters.
  static absl::StatusOr<RopeTable> Create(const RopeConfig& config,
                                          int64_t head_dim);

  int64_t head_dim() const { return head_dim_; }
  int64_t rotary_dim() const { return rotary_dim_; }
  const std::vector<float>& inv_freq() const { return inv_freq_; }
  float magnitude() const { return magnitude_; }  // YaRN attention factor

  // Rotates one head vector x[head_dim] in place in fp32 for `position`.
  // Dims past rotary_dim pass through unchanged.
  void Rotate(float* x, int64_t position) const;
  // The same with a caller-provided scratch of rotary_dim floats for cos and
  // sin each (avoids recomputing the angles for several heads at one
  // position): Angles fills cos/sin, RotateWith applies them.
  void Angles(int64_t position, float* cos_out, float* sin_out) const;
  void RotateWith(float* x, const float* cos_half, const float* sin_half) const;

 private:
  RopeTable() = default;
  int64_t head_dim_ = 0;
  int64_t rotary_dim_ = 0;
  RopeStyle style_ = RopeStyle::kNeox;
  std::vector<float> inv_freq_;  // rotary_dim / 2 entries
  float magnitude_ = 1.0f;
};

}  // namespace attnaudit

#endif  // ATTNAUDIT_CORE_ROPE_ROPE_H_
