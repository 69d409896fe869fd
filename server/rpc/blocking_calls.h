// Unary calls whose work blocks (disk, SQLite), run on the
// BlockingExecutor instead of gRPC's threads (blocking_calls.cc:
// PostBlocking and the bodies of Submit, GetResult and Cancel). Internal
// to server/rpc.
#ifndef ATTNAUDIT_SERVER_RPC_BLOCKING_CALLS_H_
#define ATTNAUDIT_SERVER_RPC_BLOCKING_CALLS_H_

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <functional>
#include <memory>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "google/protobuf/message.h"
#include "server/auth/tenants.h"
#include "server/rpc/audit_service.h"
#include "server/rpc/logged_reactor.h"

namespace attnaudit::server::rpc_internal {

// The blocking body of a call for an authorized caller: fills the response
// on OK; sets *retry_after for a RESOURCE_EXHAUSTED answer when retrying
// can help.
using BlockingWork = std::function<absl::Status(
    const Principal& caller, CallLog* log, absl::Duration* retry_after)>;
// Cheap checks run in the reaction once the caller is authorized (a job
// id's syntax, draining); an error answers the call at once.
using Precheck =
    std::function<absl::Status(const Principal& caller, CallLog* log)>;

// Starts a unary call whose work blocks (disk, SQLite): authorizes the
// caller for `needed`, then `precheck`, then runs `work` on the
// BlockingExecutor and finishes the call with its status (and the retry
// hint). On OK `response` is serialised into `response_buffer`. A full
// executor queue answers RESOURCE_EXHAUSTED "server busy" with a 100 ms
// hint.
grpc::ServerUnaryReactor* PostBlocking(
    AuditServiceImpl* svc, const char* method,
    grpc::CallbackServerContext* context, uint32_t needed,
    const Precheck& precheck, BlockingWork work,
    std::shared_ptr<google::protobuf::Message> response,
    grpc::ByteBuffer* response_buffer);

}  // namespace attnaudit::server::rpc_internal

#endif  // ATTNAUDIT_SERVER_RPC_BLOCKING_CALLS_H_
