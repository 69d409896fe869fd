// Where the data of an AuditStream chunk message lies in its serialized
// bytes, without parsing (copying) it: the server appends those bytes
// straight from gRPC's receive buffers to the tensor being assembled
// (stream.h), instead of letting protobuf copy them into a string first.
// Only the plain shape a client sends is recognised: an
// attnaudit.v1.AuditStreamMessage holding exactly one `chunk` with exactly
// one `data` field and nothing else; anything else (a header, unknown or
// repeated fields, a malformed prefix) is left to protobuf's parser, which
// keeps its semantics and its error messages.
//
// Thread-safe (pure function of its arguments).
#ifndef ATTNAUDIT_PROTO_CODEC_CHUNK_VIEW_H_
#define ATTNAUDIT_PROTO_CODEC_CHUNK_VIEW_H_

#include <vector>

#include "absl/strings/string_view.h"

namespace attnaudit {

// `pieces` are the message's bytes, in order, split anywhere (gRPC's
// slices). On the plain shape, fills *data with the chunk's data as
// sub-ranges of the pieces (in order; empty pieces skipped) and returns
// true; otherwise returns false and leaves *data empty.
bool FindChunkData(const std::vector<absl::string_view>& pieces,
                   std::vector<absl::string_view>* data);

}  // namespace attnaudit

#endif  // ATTNAUDIT_PROTO_CODEC_CHUNK_VIEW_H_
