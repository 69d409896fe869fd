// Both ends of the AuditStream protocol (service.proto, AuditStreamMessage):
// a header carrying the snapshot without its bulk bytes plus a manifest of
// (tensor path, byte length), then chunks whose concatenation is those
// tensors' bytes in manifest order.
//
//   client:  BuildAuditStreamHeader -> send header
//            AuditStreamChunker::Next -> send chunk, until it returns false
//   server:  AuditStreamAssembler::Begin(header) -> Append(chunk)...
//            -> Finish() -> SnapshotFromProto(assembler.mutable_snapshot())
//
// The assembler checks the whole manifest before it reserves anything, and
// reserves exactly the announced bytes (bounded by max_stream_bytes), so a
// hostile header cannot make it allocate more; each chunk is copied once,
// straight into the final tensor buffer. Errors are InvalidArgument naming
// the field ("header.manifest[2].byte_length: ...") or the stream position.
// Neither class is thread-safe; one instance serves one call.
#ifndef ATTNAUDIT_PROTO_CODEC_STREAM_H_
#define ATTNAUDIT_PROTO_CODEC_STREAM_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "attnaudit/v1/service.pb.h"
#include "core/snapshot/snapshot.h"

namespace attnaudit {

// Default chunk size: inside the 1-4 MiB that gRPC streams well.
inline constexpr int64_t kDefaultStreamChunkBytes = int64_t{2} << 20;

// Fills header->snapshot from `snapshot` (overwriting it), leaving the data of
// every present tensor of at least `min_streamed_bytes` bytes empty and
// listing it in header->manifest in SnapshotTensorPaths() order; smaller
// tensors are copied inline. Leaves header->options and priority alone.
// Returns the streamed tensors in manifest order: pointers into `snapshot`,
// which must outlive the chunker that reads them.
std::vector<const Tensor*> BuildAuditStreamHeader(
    const Snapshot& snapshot, int64_t min_streamed_bytes,
    v1::AuditStreamHeader* header);

// Cuts the bytes of `tensors` (concatenated, in order) into chunks of
// `chunk_bytes` (the last may be shorter; chunks span tensor boundaries).
class AuditStreamChunker {
 public:
  AuditStreamChunker(std::vector<const Tensor*> tensors,
                     int64_t chunk_bytes = kDefaultStreamChunkBytes);

  // Replaces *chunk with the next chunk; false (and *chunk empty) when every
  // byte has been handed out.
  bool Next(std::string* chunk);

  // The same chunks without copying: *pieces gets views of the tensors'
  // bytes (several when a chunk spans tensors) that together make the next
  // chunk. Valid while the tensors live. Do not mix with Next on one
  // chunker.
  bool NextPieces(std::vector<absl::string_view>* pieces);

  int64_t total_bytes() const { return total_bytes_; }

 private:
  std::vector<const Tensor*> tensors_;
  int64_t chunk_bytes_;
  int64_t total_bytes_ = 0;
  size_t tensor_ = 0;  // current tensor
  size_t offset_ = 0;  // next byte within it
};

class AuditStreamAssembler {
 public:
  // `max_stream_bytes` bounds the sum of the manifest's byte lengths.
  explicit AuditStreamAssembler(int64_t max_stream_bytes);

  // Checks `header` (see service.proto) and takes its snapshot (swapped out
  // of the header, no copy). Fails if called twice.
  absl::Status Begin(v1::AuditStreamHeader* header);
  // Appends the next bytes; fails before Begin or past the announced total.
  absl::Status Append(absl::string_view chunk);
  // OK once every announced byte arrived; otherwise "stream ended after X of
  // Y bytes".
  absl::Status Finish() const;

  // The assembled snapshot message (complete after Finish() is OK); hand it
  // to SnapshotFromProto.
  v1::Snapshot* mutable_snapshot() { return &snapshot_; }

  bool begun() const { return begun_; }
  int64_t bytes_expected() const { return bytes_expected_; }

 private:
  int64_t max_stream_bytes_;
  bool begun_ = false;
  v1::Snapshot snapshot_;
  // Destination buffers in manifest order and their announced sizes.
  std::vector<std::string*> targets_;
  std::vector<int64_t> lengths_;
  size_t target_ = 0;
  int64_t bytes_expected_ = 0;
  int64_t bytes_received_ = 0;
};

}  // namespace attnaudit

#endif  // ATTNAUDIT_PROTO_CODEC_STREAM_H_
