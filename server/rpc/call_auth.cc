// Per-call plumbing shared by every RPC: authentication and permissions,
// raw request parsing (see audit_service.h, "Raw messages") and the
// client-facing form of storage errors.
#include "server/rpc/call_auth.h"

#include <grpcpp/impl/codegen/proto_utils.h>
#include <grpcpp/support/proto_buffer_reader.h>

#include <climits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "google/protobuf/io/coded_stream.h"
#include "proto/codec/wire_check.h"

namespace attnaudit::server::rpc_internal {
namespace {

// The request's bytes in one piece (only on the failure path).
std::string Flatten(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  std::string bytes;
  if (!buffer.Valid() || !buffer.Dump(&slices).ok()) return bytes;
  bytes.reserve(buffer.Length());
  for (const grpc::Slice& s : slices) {
    bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  }
  return bytes;
}

}  // namespace

Credentials CredentialsOf(const grpc::CallbackServerContext& context) {
  Credentials c;
  const auto& md = context.client_metadata();
  if (auto it = md.find("authorization"); it != md.end()) {
    c.authorization = std::string(it->second.data(), it->second.size());
  }
  if (std::shared_ptr<const grpc::AuthContext> auth = context.auth_context();
      auth != nullptr && auth->IsPeerAuthenticated()) {
    for (const grpc::string_ref& id : auth->GetPeerIdentity()) {
      c.certificate_identities.emplace_back(id.data(), id.size());
    }
  }
  return c;
}

absl::Status ParseRequest(const grpc::ByteBuffer* request,
                          google::protobuf::Message* msg) {
  // The buffer is this call's own (gRPC's per-call message holder, not
  // const storage), so emptying it once parsed is well defined.
  auto* buffer = const_cast<grpc::ByteBuffer*>(request);
  bool ok = true;
  if (buffer->Valid()) {
    grpc::ProtoBufferReader reader(buffer);
    google::protobuf::io::CodedInputStream decoder(&reader);
    decoder.SetTotalBytesLimit(INT_MAX);
    ok = reader.status().ok() && msg->ParseFromCodedStream(&decoder) &&
         decoder.ConsumedEntireMessage();
  } else {
    msg->Clear();  // an empty message
  }
  absl::Status status;
  if (!ok) {
    status = DescribeParseFailure(*msg->GetDescriptor(), Flatten(*buffer),
                                  "request");
  }
  buffer->Clear();
  return status;
}

absl::optional<uint64_t> PeekRequestField(const grpc::ByteBuffer& request,
                                          int number) {
  std::vector<grpc::Slice> slices;
  if (!request.Valid() || !request.Dump(&slices).ok()) return absl::nullopt;
  std::vector<absl::string_view> chunks;
  chunks.reserve(slices.size());
  for (const grpc::Slice& s : slices) {
    chunks.emplace_back(reinterpret_cast<const char*>(s.begin()), s.size());
  }
  return PeekVarintField(chunks, number);
}

std::string TakeRequestBytes(const grpc::ByteBuffer* request) {
  std::string bytes = Flatten(*request);
  const_cast<grpc::ByteBuffer*>(request)->Clear();  // see ParseRequest
  return bytes;
}

absl::Status ParseRequestBytes(absl::string_view bytes,
                               google::protobuf::Message* msg) {
  if (msg->ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
    return absl::OkStatus();
  }
  return DescribeParseFailure(*msg->GetDescriptor(), bytes, "request");
}

grpc::Status SerializeResponse(const google::protobuf::Message& msg,
                               grpc::ByteBuffer* response) {
  bool own = false;
  return grpc::SerializationTraits<google::protobuf::Message>::Serialize(
      msg, response, &own);
}

absl::StatusOr<Principal> Authorize(AuditServiceImpl* svc,
                                    const grpc::CallbackServerContext& context,
                                    uint32_t needed, const char* method) {
  absl::StatusOr<Principal> principal =
      svc->auth().Authenticate(CredentialsOf(context));
  if (!principal.ok()) return principal.status();
  if ((needed & ~kAllPermissions) != 0) {
    // A method without a row in rpc_methods.h: nobody may call it.
    svc->metrics()->CountRejection(RejectReason::kPermissionDenied);
    return absl::PermissionDeniedError(
        absl::StrCat(method, " has no permission entry"));
  }
  for (uint32_t bit = 1; bit <= kPermAdmin; bit <<= 1) {
    if ((needed & bit) == 0) continue;
    const Permission p = static_cast<Permission>(bit);
    if (!principal->Has(p)) {
      svc->metrics()->CountRejection(RejectReason::kPermissionDenied);
      return absl::PermissionDeniedError(
          absl::StrCat(method, " needs the ", PermissionName(p),
                       " permission, which tenant ", principal->tenant,
                       "'s credential "
                       "lacks"));
    }
  }
  return principal;
}

}  // namespace attnaudit::server::rpc_internal
