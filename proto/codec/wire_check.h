// Where a protobuf encoding breaks. protobuf's parser only says that a
// message failed to parse; this walks the wire format again, guided by the
// message's descriptor, and names the field and the byte where it breaks,
// so an undecodable request can be answered INVALID_ARGUMENT with a useful
// message:
//
//   DescribeParseFailure(*v1::AuditRequest::descriptor(), bytes)
//   -> InvalidArgument("snapshot.q.data: cannot decode: the field declares
//      1048576 bytes but 512 remain (byte 120 of the attnaudit.v1
//      .AuditRequest)")
//
// It checks what makes protobuf refuse an encoding: tags (longer than 5
// bytes, field number 0, wire types 6 and 7; like protobuf it keeps a
// tag's low 32 bits), varints cut off or longer than 10
// bytes, fixed-size and length-delimited fields longer than what remains,
// unbalanced groups, nesting deeper than protobuf's limit of 100, and the
// UTF-8 of proto3 string fields. Unknown fields are skipped by their wire
// type, as protobuf does; a field whose wire type does not match its
// declaration is unknown to protobuf too, so it is skipped, not flagged.
//
// Paths are the fields' proto names joined by "." with the occurrence of a
// repeated message field in brackets ("manifest[2].field_path"); a field
// the descriptor does not know is named by number ("snapshot.<17>").
//
// Thread safety: a pure function. Cost: one pass over the bytes (call it on
// the failure path only).
#ifndef ATTNAUDIT_PROTO_CODEC_WIRE_CHECK_H_
#define ATTNAUDIT_PROTO_CODEC_WIRE_CHECK_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/optional.h"
#include "absl/types/span.h"
#include "google/protobuf/descriptor.h"

namespace attnaudit {

// InvalidArgument naming the first problem found, or, when the walk finds
// none (protobuf refused for another reason, e.g. a size over 2 GiB),
// InvalidArgument "<root>: cannot decode: not a valid <type> ...". Problems
// of top-level fields are named from `root` ("request: cannot decode: ...").
// Never OK: call it only after a parse failed.
absl::Status DescribeParseFailure(const google::protobuf::Descriptor& type,
                                  absl::string_view bytes,
                                  absl::string_view root = "message");

// The walk alone: OK when it finds nothing wrong (then protobuf accepts
// the bytes, unless they are over its size limit), else the same error.
absl::Status CheckWireFormat(const google::protobuf::Descriptor& type,
                             absl::string_view bytes,
                             absl::string_view root = "message");

// The value of top-level varint field `number` (its last occurrence, as
// protobuf keeps) in an encoding split into `chunks` (e.g. the slices of a
// received gRPC message), read without copying: length-delimited fields
// are skipped by their length. nullopt when the field is absent or the
// encoding breaks first. For a cheap look at a small field (a request's
// priority) before paying for a full parse.
absl::optional<uint64_t> PeekVarintField(
    absl::Span<const absl::string_view> chunks, int number);

// Whether `text` is well-formed UTF-8 (no overlong forms, no surrogates,
// nothing above U+10FFFF), as protobuf requires of proto3 strings.
bool IsValidUtf8(absl::string_view text);

}  // namespace attnaudit

#endif  // ATTNAUDIT_PROTO_CODEC_WIRE_CHECK_H_
