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

// Trailing metadata keys carrying the retry hint of RESOURCE_EXHAUSTED
// (and some UNAVAILABLE) answers, in whole milliseconds: gRPC's standard
// one, which gRPC's retry policy in clients waits for (a negative value:
// do not retry), and attnaudit's own, which clients from before the
// retry policy read (docs/OPERATIONS.md documents it).
inline constexpr char kRetryPushbackMetadata[] = "grpc-retry-pushback-ms";
inline constexpr char kRetryAfterMetadata[] = "retry-after-ms";

grpc::Status ToGrpcStatus(const absl::Status& status);

// `status` with `prefix` put in front of its message (same code); OK stays
// OK. Used to make core field paths absolute ("snapshot." + "q: ...").
absl::Status PrefixStatus(absl::string_view prefix, const absl::Status& status);

// Adds the retry hint trailers (rounded up; at least 1 ms) when
// `retry_after` is positive. grpc-retry-pushback-ms is -1 (gRPC's retry
// policy does not resend) when `retry_after` is not positive (retrying
// cannot help: too large for any budget) or would end past the call's
// deadline: a resend would then only turn an immediate RESOURCE_EXHAUSTED
// into a DEADLINE_EXCEEDED at the deadline. Must be called before the
// reactor's Finish.
void AddRetryAfter(grpc::CallbackServerContext* context,
                   absl::Duration retry_after);

}  // namespace attnaudit::server

#endif  // ATTNAUDIT_SERVER_RPC_STATUS_UTIL_H_
