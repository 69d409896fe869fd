// Rotary position embedding, computed the way engines compute it: the
// inverse frequencies and the angles in fp32, cos/sin of those (times the
// YaRN or LongRoPE magnitude), the rotation, and the cast to the rotation
// dtype where the engine's arithmetic profile rounds (RopeCastPoint;
// docs/NUMERICS.md, "RoPE arithmetic").
//
// A RopeTable may also carry the engine's own values (Snapshot.rope_table):
// cos/sin rows for some positions and/or its inverse frequencies. Angles
// then come from the engine's row for a position, else from the engine's
// inverse frequencies, else from the config; AngleUncertainty bounds how far
// each source can be from what the engine used.
//
// RopeTable is immutable after Create (and SetFinalRounding, if called) and
// safe to share across threads.
#ifndef ATTNAUDIT_CORE_ROPE_ROPE_H_
#define ATTNAUDIT_CORE_ROPE_ROPE_H_

#include <cstdint>
#include <vector>

#include "absl/container/flat_hash_map.h"
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
  // The same, rotating with the engine's values where `engine` has them.
  // `engine` must have passed validation (shapes, distinct positions). A
  // table that is not rotary_dim / 2 wide (validation accepts a full-head
  // table on a partial-rotary config, for the table check to report) is
  // not rotated with: the table is then the config's alone.
  static absl::StatusOr<RopeTable> Create(const RopeConfig& config,
                                          int64_t head_dim,
                                          const EngineRopeTable& engine);

  int64_t head_dim() const { return head_dim_; }
  int64_t rotary_dim() const { return rotary_dim_; }
  RopeStyle style() const { return style_; }
  RopeCastPoint cast_point() const { return cast_point_; }
  // The config's fp32 inverse frequencies (not the engine's).
  const std::vector<float>& inv_freq() const { return inv_freq_; }
  // The cos/sin magnitude: YaRN's or LongRoPE's attention factor, else 1.
  float magnitude() const { return magnitude_; }

  // cos/sin (magnitude included) of the rotary_dim / 2 angles at
  // `position`, in fp32: the engine's row, else its inverse frequencies,
  // else the config's.
  void Angles(int64_t position, float* cos_out, float* sin_out) const;
  // Rotates one head vector x[head_dim] in place in fp32 with cos/sin from
  // Angles (no rounding: the kAfterRope profile before its cast). Dims past
  // rotary_dim pass through unchanged.
  void RotateWith(float* x, const float* cos_half, const float* sin_half) const;
  void Rotate(float* x, int64_t position) const;
  // The engine's rotation of x[head_dim] (values of the rotation's input,
  // widened to float) under the table's cast point, rounded to `dtype` (the
  // rotation dtype) where the profile rounds and at the end; into
  // out[head_dim] (which may alias x). The cast points' intermediate
  // roundings are to nearest (torch's); the final cast follows
  // SetFinalRounding.
  void RotateAs(const float* x, const float* cos_half, const float* sin_half,
                DType dtype, float* out) const;
  // How far an engine's RotateAs can store each element from ours, with
  // cos_half/sin_half from Angles(position): its cos/sin may be two fp32
  // ulps from ours (another libm on the same fp32 angle; with the config's
  // inverse frequencies also an angle off by AngleUncertainty; none for the
  // engine's own row) and its fp32 arithmetic may round in another order
  // or with an FMA, under the same cast point and roundings:
  // into gap[head_dim], 0 where every such engine stores our value, else
  // |the rounding of the interval's upper end - its lower end's| (one ulp
  // of `dtype` at the element: the unrounded value lies that close to a
  // midpoint, or for a truncating engine to a representable value).
  void RotationAmbiguity(const float* x, const float* cos_half,
                         const float* sin_half, DType dtype, int64_t position,
                         float* gap) const;
  // How the engine narrows the rotated values at the end: towards zero for
  // an engine that truncates (EnginePrecision::rope_rounding); to nearest
  // otherwise (the default, and for kProfile).
  void SetFinalRounding(Rounding rounding);
  bool truncates() const { return truncates_; }

  // Whether Angles uses the engine's inverse frequencies where it has no
  // row for a position.
  bool has_engine_inv_freq() const { return !engine_inv_freq_.empty(); }

  // Which values Angles uses at `position`.
  enum class Source { kConfig, kEngineInvFreq, kEngineRow };
  Source SourceAt(int64_t position) const;
  // A bound, in radians, on |this table's angle - the engine's angle| for
  // rotary pair `pair` at `position` (0 for the engine's own rows): an
  // engine computes its inverse frequencies and cos/sin with its own libm,
  // a few fp32 ulps from ours, and at long positions an ulp of an inverse
  // frequency is a large angle (docs/NUMERICS.md, "RoPE tables").
  double AngleUncertainty(int64_t position, int64_t pair) const;

 private:
  RopeTable() = default;
  int64_t head_dim_ = 0;
  int64_t rotary_dim_ = 0;
  RopeStyle style_ = RopeStyle::kNeox;
  RopeCastPoint cast_point_ = RopeCastPoint::kAfterRope;
  bool truncates_ = false;
  bool scaled_ = false;
  double inv_freq_ulps_ = 2.0;   // rope_internal::InvFreqUlps of the config
  std::vector<float> inv_freq_;  // rotary_dim / 2 entries
  float magnitude_ = 1.0f;
  // The engine's values: inverse frequencies (empty when not sent) and
  // cos/sin rows by position.
  std::vector<float> engine_inv_freq_;
  absl::flat_hash_map<int64_t, int64_t> engine_row_of_;
  std::vector<float> engine_cos_, engine_sin_;  // [rows, rotary_dim / 2]
};

// The snapshot's RoPE as its engine computed it: its config, its own table
// (when sent) and the final rounding it declared. Errors as Create.
absl::StatusOr<RopeTable> EngineRopeOf(const Snapshot& snapshot,
                                       int64_t head_dim);

// The width of the engine's table: its inverse frequencies' count, else
// its cos rows' width; -1 when it has neither.
int64_t EngineTableWidth(const EngineRopeTable& engine);
// Whether that width is the declared rotary_dim / 2 (RopeTable rotates
// with the engine's values only then).
bool EngineTableFitsRotaryDim(const EngineRopeTable& engine,
                              const RopeConfig& config, int64_t head_dim);

// The thetas a RoPE bug hypothesis tries for an engine whose rotation does
// not follow `declared`: the common model thetas and declared x 0.1, 0.5,
// 2 and 10, declared itself left out.
std::vector<double> CandidateThetas(double declared);

// The model's definition in fp64: inverse frequencies after scaling and the
// magnitude, for checking an engine's table (docs/NUMERICS.md, "RoPE
// tables"). Same errors as RopeTable::Create.
struct ExactRope {
  std::vector<double> inv_freq;  // rotary_dim / 2
  double magnitude = 1.0;        // YaRN's or LongRoPE's attention factor
};
absl::StatusOr<ExactRope> ExactRopeOf(const RopeConfig& config,
                                      int64_t head_dim);

}  // namespace attnaudit

#endif  // ATTNAUDIT_CORE_ROPE_ROPE_H_
