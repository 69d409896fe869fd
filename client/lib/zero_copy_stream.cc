#include "client/lib/zero_copy_stream.h"

#include <string>
#include <vector>

#include "grpcpp/completion_queue.h"
#include "grpcpp/support/byte_buffer.h"
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

// The response message's bytes, parsed.
grpc::Status ParseResponse(const grpc::ByteBuffer& in,
                           v1::AuditResponse* response) {
  std::vector<grpc::Slice> slices;
  if (!in.Dump(&slices).ok()) {
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
  return grpc::Status::OK;
}

// The tag of every operation: one is outstanding at a time.
void* const kOp = reinterpret_cast<void*>(1);

// One operation at a time on the call's own completion queue, polled by
// the calling thread: whether it succeeded.
bool Await(grpc::CompletionQueue* cq) {
  void* tag = nullptr;
  bool ok = false;
  return cq->Next(&tag, &ok) && ok;
}

// Header, then one chunk after another (gRPC allows one outstanding write),
// WritesDone, the one response, the status. A write that fails means the
// server ended the call; Finish says why.
grpc::Status RunStream(grpc::GenericClientAsyncReaderWriter* call,
                       grpc::CompletionQueue* cq,
                       const v1::AuditStreamMessage& header,
                       AuditStreamChunker* chunker,
                       v1::AuditResponse* response) {
  bool ok = (call->StartCall(kOp), Await(cq));
  if (ok) {
    grpc::Slice slice(header.SerializeAsString());
    call->Write(grpc::ByteBuffer(&slice, 1), kOp);
    ok = Await(cq);
  }
  std::vector<absl::string_view> pieces;
  while (ok && chunker->NextPieces(&pieces)) {
    call->Write(ChunkMessage(pieces), kOp);
    ok = Await(cq);
  }
  if (ok) ok = (call->WritesDone(kOp), Await(cq));
  grpc::ByteBuffer in;
  const bool read = ok && (call->Read(&in, kOp), Await(cq));
  grpc::Status status;
  call->Finish(&status, kOp);
  Await(cq);  // Finish always completes
  if (!status.ok()) return status;
  if (!read) {
    return grpc::Status(grpc::StatusCode::INTERNAL,
                        "AuditStream: no response message");
  }
  return ParseResponse(in, response);
}

}  // namespace

// The call runs on its own completion queue, driven by this thread, not on
// gRPC's callback API: gRPC 1.51's callback threads sleep 100 ms after a
// second without events, which held the first stream after a quiet second
// back by up to 100 ms (docs/PERF.md, "Idle wake-ups").
grpc::Status ZeroCopyAuditStream(grpc::GenericStub* stub,
                                 grpc::ClientContext* context,
                                 const v1::AuditStreamMessage& header,
                                 AuditStreamChunker* chunker,
                                 v1::AuditResponse* response) {
  grpc::CompletionQueue cq;
  std::unique_ptr<grpc::GenericClientAsyncReaderWriter> call =
      stub->PrepareCall(context, kMethod, &cq);
  const grpc::Status status =
      RunStream(call.get(), &cq, header, chunker, response);
  call.reset();
  cq.Shutdown();
  void* tag = nullptr;
  bool ok = false;
  while (cq.Next(&tag, &ok)) {
  }
  return status;
}

}  // namespace client_internal
}  // namespace attnaudit::client
