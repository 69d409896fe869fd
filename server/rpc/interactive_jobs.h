// Interactive (Audit, AuditStream) jobs once their request is decoded
// (audit_service.cc): admitted through Admission, answered from the job's
// completion, their result stored or published. Internal to server/rpc.
#ifndef ATTNAUDIT_SERVER_RPC_INTERACTIVE_JOBS_H_
#define ATTNAUDIT_SERVER_RPC_INTERACTIVE_JOBS_H_

#include <grpcpp/grpcpp.h>

#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "attnaudit/v1/service.pb.h"
#include "server/auth/tenants.h"
#include "server/rpc/audit_service.h"
#include "server/rpc/conversions.h"
#include "server/scheduler/job.h"

namespace attnaudit::server::rpc_internal {

// Completion of an interactive (Audit/AuditStream) job: the response is
// filled when the status is OK; called exactly once.
using Finisher = std::function<void(const grpc::Status&)>;

// Schedules an interactive audit owned by `principal`. On an admission
// error returns it (with *retry_after set when retrying can help) and
// `finish` is never called; otherwise `finish` runs once: from the job's
// completion, or for a report once its result is kept, from the result
// writer's thread (audit_result_writer.h).
absl::Status AdmitInteractive(AuditServiceImpl* svc, const Principal& principal,
                              const std::string& job_id, DecodedAudit audit,
                              PriorityClass priority, int64_t bytes,
                              absl::Time deadline, v1::AuditResponse* response,
                              Finisher finish, absl::Duration* retry_after);

}  // namespace attnaudit::server::rpc_internal

#endif  // ATTNAUDIT_SERVER_RPC_INTERACTIVE_JOBS_H_
