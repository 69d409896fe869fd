// The call plumbing every reactor shares (call_auth.cc): raw request bytes
// in and out (parse, peek, take, serialise), authentication and
// permissions (Authorize, CredentialsOf). Internal to server/rpc.
#ifndef ATTNAUDIT_SERVER_RPC_CALL_AUTH_H_
#define ATTNAUDIT_SERVER_RPC_CALL_AUTH_H_

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/optional.h"
#include "google/protobuf/message.h"
#include "server/auth/tenants.h"
#include "server/rpc/audit_service.h"

namespace attnaudit::server::rpc_internal {

// Parses a raw request into *msg and releases the request's bytes (the
// buffer belongs to this call; it is emptied so that a large request is
// not held twice while its audit runs). InvalidArgument naming the field
// and byte where decoding stopped when the bytes are not a valid message.
absl::Status ParseRequest(const grpc::ByteBuffer* request,
                          google::protobuf::Message* msg);
// Top-level varint field `number` of a raw request, read without parsing
// or copying it (proto/codec/wire_check.h PeekVarintField).
absl::optional<uint64_t> PeekRequestField(const grpc::ByteBuffer& request,
                                          int number);

// The request's bytes in one piece, releasing the buffer (Submit spools
// exactly what it received), and their parse.
std::string TakeRequestBytes(const grpc::ByteBuffer* request);
absl::Status ParseRequestBytes(absl::string_view bytes,
                               google::protobuf::Message* msg);
// Serialises a response message into the call's response buffer.
grpc::Status SerializeResponse(const google::protobuf::Message& msg,
                               grpc::ByteBuffer* response);

// Authenticates the call (bearer token, mTLS identity) and checks that the
// principal holds `needed` (0: any valid identity). UNAUTHENTICATED, or
// PERMISSION_DENIED naming the permission ("Submit needs the submit
// permission"), counted as a rejection.
absl::StatusOr<Principal> Authorize(AuditServiceImpl* svc,
                                    const grpc::CallbackServerContext& context,
                                    uint32_t needed, const char* method);

// How the call identified itself: its authorization metadata and the
// identities of its verified client certificate (kept by open calls to
// re-check them when the token file is reloaded).
Credentials CredentialsOf(const grpc::CallbackServerContext& context);

}  // namespace attnaudit::server::rpc_internal

#endif  // ATTNAUDIT_SERVER_RPC_CALL_AUTH_H_
