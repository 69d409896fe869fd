// The one place absl::Status becomes grpc::Status. Both enumerate the same
// google.rpc codes (absl/status/status.h documents the gRPC name of each),
// so the code converts with a static_cast and the message is kept as is.
// Thread-safe (pure functions).
#ifndef ATTNAUDIT_SERVER_RPC_STATUS_UTIL_H_
#define ATTNAUDIT_SERVER_RPC_STATUS_UTIL_H_

#include <grpcpp/grpcpp.h>

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace attnaudit::server {

// Trailing metadata key carrying the retry hint of RESOURCE_EXHAUSTED
// answers, in whole milliseconds.
inline constexpr char kRetryAfterMetadata[] = "retry-after-ms";

grpc::Status ToGrpcStatus(const absl::Status& status);

// `status` with `prefix` put in front of its message (same code); OK stays
// OK. Used to make core field paths absolute ("snapshot." + "q: ...").
absl::Status PrefixStatus(absl::string_view prefix, const absl::Status& status);

// Adds the retry-after-ms trailer (rounded up; at least 1 ms) when
// `retry_after` is positive. Must be called before the reactor's Finish.
void AddRetryAfter(grpc::CallbackServerContext* context,
                   absl::Duration retry_after);

}  // namespace attnaudit::server

#endif  // ATTNAUDIT_SERVER_RPC_STATUS_UTIL_H_
