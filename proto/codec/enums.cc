#include "absl/strings/str_cat.h"
#include "proto/codec/internal.h"

namespace attnaudit {
namespace codec_internal {

// The contract promises these numberings equal the core's, so that DType and
// Verdict decode by a range check and a cast.
static_assert(v1::DTYPE_UNSPECIFIED == static_cast<int>(DType::kInvalid));
static_assert(v1::DTYPE_F32 == static_cast<int>(DType::kF32));
static_assert(v1::DTYPE_F16 == static_cast<int>(DType::kF16));
static_assert(v1::DTYPE_BF16 == static_cast<int>(DType::kBF16));
static_assert(v1::DTYPE_FP8_E4M3 == static_cast<int>(DType::kF8E4M3));
static_assert(v1::DTYPE_FP8_E5M2 == static_cast<int>(DType::kF8E5M2));
static_assert(v1::DTYPE_F64 == static_cast<int>(DType::kF64));
static_assert(v1::DTYPE_I32 == static_cast<int>(DType::kI32));
static_assert(v1::DTYPE_I64 == static_cast<int>(DType::kI64));
static_assert(v1::DTYPE_BOOL == static_cast<int>(DType::kBool));
static_assert(v1::VERDICT_UNSPECIFIED ==
              static_cast<int>(Verdict::kUnspecified));
static_assert(v1::VERDICT_PASS == static_cast<int>(Verdict::kPass));
static_assert(v1::VERDICT_DRIFT == static_cast<int>(Verdict::kDrift));
static_assert(v1::VERDICT_INVALID == static_cast<int>(Verdict::kInvalid));
static_assert(v1::VERDICT_INCONCLUSIVE ==
              static_cast<int>(Verdict::kInconclusive));
static_assert(v1::ROUNDING_UNSPECIFIED == static_cast<int>(Rounding::kProfile));
static_assert(v1::ROUNDING_NEAREST_EVEN ==
              static_cast<int>(Rounding::kNearestEven));
static_assert(v1::ROUNDING_TOWARD_ZERO ==
              static_cast<int>(Rounding::kTowardZero));
static_assert(v1::PRECISION_SOURCE_UNSPECIFIED ==
              static_cast<int>(PrecisionSource::kUnspecified));
static_assert(v1::PRECISION_SOURCE_PRESET ==
              static_cast<int>(PrecisionSource::kPreset));
static_assert(v1::PRECISION_SOURCE_MEASURED ==
              static_cast<int>(PrecisionSource::kMeasured));

absl::Status UnknownEnumValue(absl::string_view field, int value) {
  return absl::InvalidArgumentError(
      absl::StrCat(field, ": unknown value ", value));
}

absl::StatusOr<DType> DecodeDType(int value, absl::string_view field) {
  if (value < v1::DType_MIN || value > v1::DType_MAX) {
    return UnknownEnumValue(field, value);
  }
  return static_cast<DType>(value);
}

absl::StatusOr<KvLayout> DecodeKvLayout(int value, absl::string_view field) {
  switch (value) {
    case v1::KV_LAYOUT_UNSPECIFIED:
    case v1::KV_LAYOUT_NHD:
      return KvLayout::kNHD;
    case v1::KV_LAYOUT_HND:
      return KvLayout::kHND;
  }
  return UnknownEnumValue(field, value);
}

absl::StatusOr<RopeState> DecodeRopeState(int value, absl::string_view field) {
  switch (value) {
    case v1::ROPE_STATE_UNSPECIFIED:
    case v1::ROPE_STATE_POST_ROPE:
      return RopeState::kPostRope;
    case v1::ROPE_STATE_PRE_ROPE:
      return RopeState::kPreRope;
  }
  return UnknownEnumValue(field, value);
}

absl::StatusOr<RopeStyle> DecodeRopeStyle(int value, absl::string_view field) {
  switch (value) {
    case v1::ROPE_STYLE_UNSPECIFIED:
    case v1::ROPE_STYLE_NEOX:
      return RopeStyle::kNeox;
    case v1::ROPE_STYLE_GPTJ:
      return RopeStyle::kGptj;
  }
  return UnknownEnumValue(field, value);
}

absl::StatusOr<RopeScalingType> DecodeRopeScalingType(int value,
                                                      absl::string_view field) {
  switch (value) {
    case v1::ROPE_SCALING_TYPE_NONE:
      return RopeScalingType::kNone;
    case v1::ROPE_SCALING_TYPE_LINEAR:
      return RopeScalingType::kLinear;
    case v1::ROPE_SCALING_TYPE_LLAMA3:
      return RopeScalingType::kLlama3;
    case v1::ROPE_SCALING_TYPE_YARN:
      return RopeScalingType::kYarn;
    case v1::ROPE_SCALING_TYPE_DYNAMIC:
      return RopeScalingType::kDynamic;
    case v1::ROPE_SCALING_TYPE_LONGROPE:
      return RopeScalingType::kLongRope;
  }
  return UnknownEnumValue(field, value);
}

absl::StatusOr<RopeCastPoint> DecodeRopeCastPoint(int value,
                                                  absl::string_view field) {
  switch (value) {
    case v1::ROPE_CAST_POINT_UNSPECIFIED:
    case v1::ROPE_CAST_POINT_AFTER_ROPE:
      return RopeCastPoint::kAfterRope;
    case v1::ROPE_CAST_POINT_COS_SIN:
      return RopeCastPoint::kCosSin;
    case v1::ROPE_CAST_POINT_EACH_OP:
      return RopeCastPoint::kEachOp;
  }
  return UnknownEnumValue(field, value);
}

absl::StatusOr<EngineProfile> DecodeEngineProfile(int value,
                                                  absl::string_view field) {
  switch (value) {
    case v1::ENGINE_PROFILE_UNSPECIFIED:
      return EngineProfile::kUnspecified;
    case v1::ENGINE_PROFILE_CUSTOM:
      return EngineProfile::kCustom;
    case v1::ENGINE_PROFILE_FLASH_DECODING:
      return EngineProfile::kFlashDecoding;
    case v1::ENGINE_PROFILE_VLLM_CPU:
      return EngineProfile::kVllmCpu;
    case v1::ENGINE_PROFILE_HF_EAGER:
      return EngineProfile::kHfEager;
    case v1::ENGINE_PROFILE_TORCH_FLASH_CPU:
      return EngineProfile::kTorchFlashCpu;
  }
  return UnknownEnumValue(field, value);
}

absl::StatusOr<Rounding> DecodeRounding(int value, absl::string_view field) {
  if (value < v1::Rounding_MIN || value > v1::Rounding_MAX) {
    return UnknownEnumValue(field, value);
  }
  return static_cast<Rounding>(value);
}

absl::StatusOr<PrecisionSource> DecodePrecisionSource(int value,
                                                      absl::string_view field) {
  if (value < v1::PrecisionSource_MIN || value > v1::PrecisionSource_MAX) {
    return UnknownEnumValue(field, value);
  }
  return static_cast<PrecisionSource>(value);
}

absl::StatusOr<CpSharding> DecodeCpSharding(int value,
                                            absl::string_view field) {
  switch (value) {
    case v1::CP_SHARDING_UNSPECIFIED:
    case v1::CP_SHARDING_NONE:
      return CpSharding::kNone;
    case v1::CP_SHARDING_EXPLICIT_OWNERS:
      return CpSharding::kExplicitOwners;
    case v1::CP_SHARDING_TOKEN_INTERLEAVED:
      return CpSharding::kTokenInterleaved;
    case v1::CP_SHARDING_PAGE_INTERLEAVED:
      return CpSharding::kPageInterleaved;
  }
  return UnknownEnumValue(field, value);
}

absl::StatusOr<LseBase> DecodeLseBase(int value, absl::string_view field) {
  switch (value) {
    case v1::LSE_BASE_UNSPECIFIED:
    case v1::LSE_BASE_E:
      return LseBase::kE;
    case v1::LSE_BASE_2:
      return LseBase::k2;
  }
  return UnknownEnumValue(field, value);
}

absl::StatusOr<SnapshotRole> DecodeSnapshotRole(int value,
                                                absl::string_view field) {
  switch (value) {
    case v1::SNAPSHOT_ROLE_UNSPECIFIED:
      return SnapshotRole::kNone;
    case v1::SNAPSHOT_ROLE_ROLLOUT:
      return SnapshotRole::kRollout;
    case v1::SNAPSHOT_ROLE_TRAINER:
      return SnapshotRole::kTrainer;
  }
  return UnknownEnumValue(field, value);
}

v1::SnapshotRole EncodeSnapshotRole(SnapshotRole role) {
  switch (role) {
    case SnapshotRole::kRollout:
      return v1::SNAPSHOT_ROLE_ROLLOUT;
    case SnapshotRole::kTrainer:
      return v1::SNAPSHOT_ROLE_TRAINER;
    case SnapshotRole::kNone:
      break;
  }
  return v1::SNAPSHOT_ROLE_UNSPECIFIED;
}

absl::StatusOr<SlidingWindowConvention> DecodeWindowConvention(
    int value, absl::string_view field) {
  switch (value) {
    case v1::SLIDING_WINDOW_CONVENTION_UNSPECIFIED:
    case v1::SLIDING_WINDOW_CONVENTION_HUGGING_FACE:
      return SlidingWindowConvention::kHuggingFace;
    case v1::SLIDING_WINDOW_CONVENTION_FLASH_LEFT:
      return SlidingWindowConvention::kFlashLeft;
  }
  return UnknownEnumValue(field, value);
}

absl::StatusOr<PrefixCache::Scheme> DecodeFingerprintScheme(
    int value, absl::string_view field) {
  switch (value) {
    case v1::FINGERPRINT_SCHEME_UNSPECIFIED:
    case v1::FINGERPRINT_SCHEME_ATTNAUDIT_V1:
      return PrefixCache::Scheme::kAttnauditV1;
    case v1::FINGERPRINT_SCHEME_RL_KERNEL_COMPAT:
      return PrefixCache::Scheme::kRlKernelCompat;
  }
  return UnknownEnumValue(field, value);
}

absl::StatusOr<Verdict> DecodeVerdict(int value, absl::string_view field) {
  if (value < v1::Verdict_MIN || value > v1::Verdict_MAX) {
    return UnknownEnumValue(field, value);
  }
  return static_cast<Verdict>(value);
}

absl::StatusOr<Comparison> DecodeComparison(int value,
                                            absl::string_view field) {
  switch (value) {
    case v1::COMPARISON_UNSPECIFIED:
      return absl::InvalidArgumentError(absl::StrCat(field, ": unspecified"));
    case v1::COMPARISON_ENGINE_VS_REFERENCE:
      return Comparison::kEngineVsReference;
    case v1::COMPARISON_REPLAY_VS_REFERENCE:
      return Comparison::kReplayVsReference;
    case v1::COMPARISON_ENGINE_VS_REPLAY:
      return Comparison::kEngineVsReplay;
    case v1::COMPARISON_ENGINE_VS_EMULATION:
      return Comparison::kEngineVsEmulation;
  }
  return UnknownEnumValue(field, value);
}

absl::StatusOr<CpStrategy> DecodeCpStrategy(int value,
                                            absl::string_view field) {
  switch (value) {
    case v1::CP_STRATEGY_UNSPECIFIED:
      return CpStrategy::kAuto;
    case v1::CP_STRATEGY_RING:
      return CpStrategy::kRing;
    case v1::CP_STRATEGY_PARTIALS:
      return CpStrategy::kPartials;
  }
  return UnknownEnumValue(field, value);
}

v1::DType EncodeDType(DType dtype) {
  const int value = static_cast<int>(dtype);
  return v1::DType_IsValid(value) ? static_cast<v1::DType>(value)
                                  : v1::DTYPE_UNSPECIFIED;
}

v1::KvLayout EncodeKvLayout(KvLayout layout) {
  return layout == KvLayout::kHND ? v1::KV_LAYOUT_HND : v1::KV_LAYOUT_NHD;
}

v1::RopeState EncodeRopeState(RopeState state) {
  return state == RopeState::kPreRope ? v1::ROPE_STATE_PRE_ROPE
                                      : v1::ROPE_STATE_POST_ROPE;
}

v1::RopeStyle EncodeRopeStyle(RopeStyle style) {
  return style == RopeStyle::kGptj ? v1::ROPE_STYLE_GPTJ : v1::ROPE_STYLE_NEOX;
}

v1::RopeScalingType EncodeRopeScalingType(RopeScalingType type) {
  switch (type) {
    case RopeScalingType::kLinear:
      return v1::ROPE_SCALING_TYPE_LINEAR;
    case RopeScalingType::kLlama3:
      return v1::ROPE_SCALING_TYPE_LLAMA3;
    case RopeScalingType::kYarn:
      return v1::ROPE_SCALING_TYPE_YARN;
    case RopeScalingType::kDynamic:
      return v1::ROPE_SCALING_TYPE_DYNAMIC;
    case RopeScalingType::kLongRope:
      return v1::ROPE_SCALING_TYPE_LONGROPE;
    case RopeScalingType::kNone:
      break;
  }
  return v1::ROPE_SCALING_TYPE_NONE;
}

v1::RopeCastPoint EncodeRopeCastPoint(RopeCastPoint point) {
  switch (point) {
    case RopeCastPoint::kCosSin:
      return v1::ROPE_CAST_POINT_COS_SIN;
    case RopeCastPoint::kEachOp:
      return v1::ROPE_CAST_POINT_EACH_OP;
    case RopeCastPoint::kAfterRope:
      break;
  }
  return v1::ROPE_CAST_POINT_AFTER_ROPE;
}

v1::EngineProfile EncodeEngineProfile(EngineProfile profile) {
  switch (profile) {
    case EngineProfile::kCustom:
      return v1::ENGINE_PROFILE_CUSTOM;
    case EngineProfile::kFlashDecoding:
      return v1::ENGINE_PROFILE_FLASH_DECODING;
    case EngineProfile::kVllmCpu:
      return v1::ENGINE_PROFILE_VLLM_CPU;
    case EngineProfile::kHfEager:
      return v1::ENGINE_PROFILE_HF_EAGER;
    case EngineProfile::kTorchFlashCpu:
      return v1::ENGINE_PROFILE_TORCH_FLASH_CPU;
    case EngineProfile::kUnspecified:
      break;
  }
  return v1::ENGINE_PROFILE_UNSPECIFIED;
}

v1::Rounding EncodeRounding(Rounding rounding) {
  return static_cast<v1::Rounding>(rounding);
}

v1::PrecisionSource EncodePrecisionSource(PrecisionSource source) {
  return static_cast<v1::PrecisionSource>(source);
}

v1::CpSharding EncodeCpSharding(CpSharding sharding) {
  switch (sharding) {
    case CpSharding::kExplicitOwners:
      return v1::CP_SHARDING_EXPLICIT_OWNERS;
    case CpSharding::kTokenInterleaved:
      return v1::CP_SHARDING_TOKEN_INTERLEAVED;
    case CpSharding::kPageInterleaved:
      return v1::CP_SHARDING_PAGE_INTERLEAVED;
    case CpSharding::kNone:
      break;
  }
  return v1::CP_SHARDING_NONE;
}

v1::LseBase EncodeLseBase(LseBase base) {
  return base == LseBase::k2 ? v1::LSE_BASE_2 : v1::LSE_BASE_E;
}

v1::SlidingWindowConvention EncodeWindowConvention(
    SlidingWindowConvention convention) {
  return convention == SlidingWindowConvention::kFlashLeft
             ? v1::SLIDING_WINDOW_CONVENTION_FLASH_LEFT
             : v1::SLIDING_WINDOW_CONVENTION_HUGGING_FACE;
}

v1::FingerprintScheme EncodeFingerprintScheme(PrefixCache::Scheme scheme) {
  return scheme == PrefixCache::Scheme::kRlKernelCompat
             ? v1::FINGERPRINT_SCHEME_RL_KERNEL_COMPAT
             : v1::FINGERPRINT_SCHEME_ATTNAUDIT_V1;
}

v1::Verdict EncodeVerdict(Verdict verdict) {
  const int value = static_cast<int>(verdict);
  return v1::Verdict_IsValid(value) ? static_cast<v1::Verdict>(value)
                                    : v1::VERDICT_UNSPECIFIED;
}

v1::Comparison EncodeComparison(Comparison comparison) {
  switch (comparison) {
    case Comparison::kEngineVsReference:
      return v1::COMPARISON_ENGINE_VS_REFERENCE;
    case Comparison::kReplayVsReference:
      return v1::COMPARISON_REPLAY_VS_REFERENCE;
    case Comparison::kEngineVsReplay:
      return v1::COMPARISON_ENGINE_VS_REPLAY;
    case Comparison::kEngineVsEmulation:
      return v1::COMPARISON_ENGINE_VS_EMULATION;
  }
  return v1::COMPARISON_UNSPECIFIED;
}

v1::CpStrategy EncodeCpStrategy(CpStrategy strategy) {
  switch (strategy) {
    case CpStrategy::kRing:
      return v1::CP_STRATEGY_RING;
    case CpStrategy::kPartials:
      return v1::CP_STRATEGY_PARTIALS;
    case CpStrategy::kAuto:
      break;
  }
  return v1::CP_STRATEGY_UNSPECIFIED;
}

}  // namespace codec_internal
}  // namespace attnaudit
