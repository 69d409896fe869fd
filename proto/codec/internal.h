// Internal to the codec: the mapping of every wire enum onto its core enum,
// and the Labels mapping that snapshots and reports share.
//
// Decoding takes the raw int (proto3 enums are open, so a message can carry
// any value) and fails with "<field>: unknown value N" for values the
// contract does not define. *_UNSPECIFIED decodes to the core default that
// the .proto documents. Encoding is total; it writes *_UNSPECIFIED only
// where that value has its own meaning (DType::kInvalid as "the default
// dtype", CpStrategy::kAuto as "the server chooses").
// Pure functions; thread-safe.
#ifndef ATTNAUDIT_PROTO_CODEC_INTERNAL_H_
#define ATTNAUDIT_PROTO_CODEC_INTERNAL_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "attnaudit/v1/report.pb.h"
#include "attnaudit/v1/snapshot.pb.h"
#include "attnaudit/v1/tensor.pb.h"
#include "core/audit/options.h"
#include "core/report/report.h"
#include "core/snapshot/snapshot.h"

namespace attnaudit {
namespace codec_internal {

// "<field>: unknown value <value>"
absl::Status UnknownEnumValue(absl::string_view field, int value);

// DTYPE_UNSPECIFIED decodes to DType::kInvalid (callers decide whether that
// is allowed).
absl::StatusOr<DType> DecodeDType(int value, absl::string_view field);
absl::StatusOr<KvLayout> DecodeKvLayout(int value, absl::string_view field);
absl::StatusOr<RopeState> DecodeRopeState(int value, absl::string_view field);
absl::StatusOr<RopeStyle> DecodeRopeStyle(int value, absl::string_view field);
absl::StatusOr<RopeScalingType> DecodeRopeScalingType(int value,
                                                      absl::string_view field);
absl::StatusOr<RopeCastPoint> DecodeRopeCastPoint(int value,
                                                  absl::string_view field);
absl::StatusOr<EngineProfile> DecodeEngineProfile(int value,
                                                  absl::string_view field);
absl::StatusOr<CpSharding> DecodeCpSharding(int value, absl::string_view field);
absl::StatusOr<Rounding> DecodeRounding(int value, absl::string_view field);
absl::StatusOr<PrecisionSource> DecodePrecisionSource(int value,
                                                      absl::string_view field);
absl::StatusOr<LseBase> DecodeLseBase(int value, absl::string_view field);
absl::StatusOr<SnapshotRole> DecodeSnapshotRole(int value,
                                                absl::string_view field);
absl::StatusOr<SlidingWindowConvention> DecodeWindowConvention(
    int value, absl::string_view field);
absl::StatusOr<PrefixCache::Scheme> DecodeFingerprintScheme(
    int value, absl::string_view field);
absl::StatusOr<Verdict> DecodeVerdict(int value, absl::string_view field);
// COMPARISON_UNSPECIFIED is an error ("<field>: unspecified").
absl::StatusOr<Comparison> DecodeComparison(int value, absl::string_view field);
absl::StatusOr<CpStrategy> DecodeCpStrategy(int value, absl::string_view field);

v1::DType EncodeDType(DType dtype);
v1::SnapshotRole EncodeSnapshotRole(SnapshotRole role);
v1::KvLayout EncodeKvLayout(KvLayout layout);
v1::RopeState EncodeRopeState(RopeState state);
v1::RopeStyle EncodeRopeStyle(RopeStyle style);
v1::RopeScalingType EncodeRopeScalingType(RopeScalingType type);
v1::RopeCastPoint EncodeRopeCastPoint(RopeCastPoint point);
v1::EngineProfile EncodeEngineProfile(EngineProfile profile);
v1::CpSharding EncodeCpSharding(CpSharding sharding);
v1::Rounding EncodeRounding(Rounding rounding);
v1::PrecisionSource EncodePrecisionSource(PrecisionSource source);
v1::LseBase EncodeLseBase(LseBase base);
v1::SlidingWindowConvention EncodeWindowConvention(
    SlidingWindowConvention convention);
v1::FingerprintScheme EncodeFingerprintScheme(PrefixCache::Scheme scheme);
v1::Verdict EncodeVerdict(Verdict verdict);
v1::Comparison EncodeComparison(Comparison comparison);
v1::CpStrategy EncodeCpStrategy(CpStrategy strategy);

// Labels: an unset layer/step is -1 in the core.
void EncodeLabels(const Labels& labels, v1::Labels* msg);
absl::Status DecodeLabels(const v1::Labels& msg, Labels* labels);

// Every non-tensor field of a snapshot (tensors are the caller's).
void EncodeScalars(const Snapshot& snapshot, v1::Snapshot* msg);

}  // namespace codec_internal
}  // namespace attnaudit

#endif  // ATTNAUDIT_PROTO_CODEC_INTERNAL_H_
