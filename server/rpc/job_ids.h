// Job ids and bearer-token checks for the RPC layer.
//
// Ids are spool file names (server/spool ValidateJobId: [A-Za-z0-9_.-]):
//   NewJobId('s') -> "s0190a3c4e2f1000001a1b2c3d4"  (kind, ms, counter, random)
// unique across restarts (time + process-random) and sortable by creation.
// An idempotent Submit's id is derived from its key, so a retry after a
// crash maps onto the same job without any extra state:
//   IdempotentJobId("k1") -> "k" + 32 hex digits of SHA-256("k1")
// Thread-safe.
#ifndef ATTNAUDIT_SERVER_RPC_JOB_IDS_H_
#define ATTNAUDIT_SERVER_RPC_JOB_IDS_H_

#include <grpcpp/grpcpp.h>

#include <string>

#include "absl/strings/string_view.h"

namespace attnaudit::server {

// `kind`: 'a' Audit/AuditStream, 's' Submit.
std::string NewJobId(char kind);
std::string IdempotentJobId(absl::string_view key);

// Checks the "authorization: Bearer <token>" metadata of a call in
// constant time. An empty token disables the check. The token is never
// logged or echoed in errors.
class TokenAuth {
 public:
  explicit TokenAuth(std::string token) : token_(std::move(token)) {}
  // OK, or UNAUTHENTICATED.
  grpc::Status Check(const grpc::CallbackServerContext& context) const;

 private:
  std::string token_;
};

}  // namespace attnaudit::server

#endif  // ATTNAUDIT_SERVER_RPC_JOB_IDS_H_
