// The RPC methods of attnaudit.v1.AuditService (the generated gRPC
// service, kRpcServiceName) and the permission each needs
// (server/auth/tenants.h): the one table the reactors read when they
// authorize a call (`PermissionOf("Submit")`), and that rpc_methods_test
// checks against the proto's service descriptor, so a method added to
// service.proto without a row here fails a test instead of shipping with
// no permission check.
//
// A name missing from the table gets kNoPermissionEntry, a bit no
// principal holds: such a call is PERMISSION_DENIED for everyone (fail
// closed). Thread safety: constant data.
#ifndef ATTNAUDIT_SERVER_RPC_RPC_METHODS_H_
#define ATTNAUDIT_SERVER_RPC_RPC_METHODS_H_

#include <cstdint>

#include "absl/strings/string_view.h"
#include "attnaudit/v1/service.grpc.pb.h"
#include "server/auth/tenants.h"

namespace attnaudit::server {

// The gRPC service these methods belong to ("attnaudit.v1.AuditService"):
// the name its health status is reported under.
inline constexpr absl::string_view kRpcServiceName =
    v1::AuditService::service_full_name();

struct RpcMethod {
  const char* name;     // as in service.proto
  uint32_t permission;  // Permission bits the caller needs; 0: any identity
};

inline constexpr RpcMethod kRpcMethods[] = {
    {"Audit", kPermAudit},       {"AuditStream", kPermAudit},
    {"Submit", kPermSubmit},     {"GetResult", kPermRead},
    {"WatchResults", kPermRead}, {"Cancel", kPermCancel},
    {"GetCapabilities", 0},      {"ListResults", kPermRead},
    {"ListPairs", kPermRead},
};

// No principal holds it (kAllPermissions has the six defined bits).
inline constexpr uint32_t kNoPermissionEntry = 1u << 31;

// The permission `method` needs (kNoPermissionEntry when it has no row).
constexpr uint32_t PermissionOf(absl::string_view method) {
  for (const RpcMethod& m : kRpcMethods) {
    if (method == m.name) return m.permission;
  }
  return kNoPermissionEntry;
}

}  // namespace attnaudit::server

#endif  // ATTNAUDIT_SERVER_RPC_RPC_METHODS_H_
