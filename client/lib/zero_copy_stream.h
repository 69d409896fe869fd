// The AuditStream call without copying tensor bytes into messages: each
// chunk message goes out as a grpc::ByteBuffer of two kinds of slices -- a
// few bytes of protobuf framing built here, and slices that point straight
// at the snapshot's tensor bytes (for a snapshot read by ReadSnapshotFile,
// the file's mapping). The header message is serialised as usual (it holds
// no bulk bytes). On the wire the messages are exactly what the typed stub
// would send, so the server cannot tell the difference.
//
// Used by Client::AuditStream (client.h). The snapshot's tensors must stay
// alive and unchanged until the call returns. Blocking; thread-safe
// (one call per invocation, no shared state).
#ifndef ATTNAUDIT_CLIENT_LIB_ZERO_COPY_STREAM_H_
#define ATTNAUDIT_CLIENT_LIB_ZERO_COPY_STREAM_H_

#include <memory>
#include <vector>

#include "absl/strings/string_view.h"
#include "attnaudit/v1/service.pb.h"
#include "core/snapshot/snapshot.h"
#include "grpcpp/client_context.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/status.h"
#include "proto/codec/stream.h"

namespace attnaudit::client {
namespace client_internal {

// Sends `header` then every chunk of `chunker` on a new AuditStream call on
// `stub` and waits for the response. The gRPC status is the call's.
// AuditStreamMessage { chunk { data: the pieces, concatenated } } as a
// ByteBuffer: a slice of framing, then static slices over the pieces
// (gRPC neither copies nor frees them; they must outlive the write).
grpc::ByteBuffer ChunkMessage(const std::vector<absl::string_view>& pieces);

grpc::Status ZeroCopyAuditStream(grpc::GenericStub* stub,
                                 grpc::ClientContext* context,
                                 const v1::AuditStreamMessage& header,
                                 AuditStreamChunker* chunker,
                                 v1::AuditResponse* response);

}  // namespace client_internal
}  // namespace attnaudit::client

#endif  // ATTNAUDIT_CLIENT_LIB_ZERO_COPY_STREAM_H_
