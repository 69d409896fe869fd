#include "client/lib/zero_copy_stream.h"

#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/client_callback.h"
#include "grpcpp/support/slice.h"

namespace attnaudit::client {
namespace client_internal {
namespace {

constexpr char kMethod[] = "/attnaudit.v1.AuditService/AuditStream";

void AppendVarint(uint64_t value, std::string* out) {
  while (value >= 0x80) {
    out->push_back(static_cast<char>((value & 0x7f) | 0x80));
    value >>= 7;
  }
  out->push_back(static_cast<char>(value));
}

}  // namespace

grpc::ByteBuffer ChunkMessage(const std::vector<absl::string_view>& pieces) {
  size_t n = 0;
  for (absl::string_view piece : pieces) n += piece.size();
  std::string inner_prefix;
  inner_prefix.push_back('\x0a');  // AuditStreamChunk.data, length-delimited
  AppendVarint(n, &inner_prefix);
  std::string prefix;
  prefix.push_back('\x12');  // AuditStreamMessage.chunk, length-delimited
  AppendVarint(inner_prefix.size() + n, &prefix);
  prefix += inner_prefix;
  std::vector<grpc::Slice> slices;
  slices.reserve(pieces.size() + 1);
  slices.emplace_back(prefix);
  for (absl::string_view piece : pieces) {
    slices.emplace_back(piece.data(), piece.size(), grpc::Slice::STATIC_SLICE);
  }
  return grpc::ByteBuffer(slices.data(), slices.size());
}

namespace {

// Writes the header, then one chunk after another (each write waits for
// the previous: gRPC allows one outstanding write), then WritesDone; reads
// the one response.
class Writer
    : public grpc::ClientBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  Writer(AuditStreamChunker* chunker) : chunker_(chunker) {}

  void Start(grpc::GenericStub* stub, grpc::ClientContext* context,
             const v1::AuditStreamMessage& header) {
    stub->PrepareBidiStreamingCall(context, kMethod, {}, this);
    std::string bytes = header.SerializeAsString();
    grpc::Slice slice(bytes);
    out_ = grpc::ByteBuffer(&slice, 1);
    StartWrite(&out_);
    StartRead(&in_);
    StartCall();
  }

  void OnWriteDone(bool ok) override {
    if (!ok) return;  // the server ended the call; OnDone says why
    std::vector<absl::string_view> pieces;
    if (chunker_->NextPieces(&pieces)) {
      out_ = ChunkMessage(pieces);
      StartWrite(&out_);
    } else {
      StartWritesDone();
    }
  }

  void OnReadDone(bool ok) override { read_ok_ = ok; }

  void OnDone(const grpc::Status& status) override {
    absl::MutexLock lock(&mu_);
    status_ = status;
    done_ = true;
  }

  grpc::Status Wait(v1::AuditResponse* response) {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(&done_));
    if (!status_.ok()) return status_;
    grpc::Slice whole;
    std::vector<grpc::Slice> slices;
    if (!read_ok_ || !in_.Dump(&slices).ok()) {
      return grpc::Status(grpc::StatusCode::INTERNAL,
                          "AuditStream: no response message");
    }
    std::string bytes;
    for (const grpc::Slice& s : slices) {
      bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
    }
    if (!response->ParseFromString(bytes)) {
      return grpc::Status(grpc::StatusCode::INTERNAL,
                          "AuditStream: the response does not parse");
    }
    return status_;
  }

 private:
  AuditStreamChunker* chunker_;
  grpc::ByteBuffer out_;
  grpc::ByteBuffer in_;
  bool read_ok_ = false;
  absl::Mutex mu_;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  grpc::Status status_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

grpc::Status ZeroCopyAuditStream(grpc::GenericStub* stub,
                                 grpc::ClientContext* context,
                                 const v1::AuditStreamMessage& header,
                                 AuditStreamChunker* chunker,
                                 v1::AuditResponse* response) {
  Writer writer(chunker);
  writer.Start(stub, context, header);
  return writer.Wait(response);
}

}  // namespace client_internal
}  // namespace attnaudit::client
