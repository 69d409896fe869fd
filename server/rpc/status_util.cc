#include "server/rpc/status_util.h"

#include <cmath>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace attnaudit::server {

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()),
                      std::string(status.message()));
}

absl::Status PrefixStatus(absl::string_view prefix,
                          const absl::Status& status) {
  if (status.ok() || prefix.empty()) return status;
  return absl::Status(status.code(), absl::StrCat(prefix, status.message()));
}

void AddRetryAfter(grpc::CallbackServerContext* context,
                   absl::Duration retry_after) {
  if (retry_after <= absl::ZeroDuration()) {
    context->AddTrailingMetadata(kRetryPushbackMetadata, "-1");
    return;
  }
  const double ms = std::ceil(absl::ToDoubleMilliseconds(retry_after));
  const int64_t clamped =
      ms < 1 ? 1 : (ms > 3.6e6 ? 3600000 : static_cast<int64_t>(ms));
  const bool fits = absl::Now() + absl::Milliseconds(clamped) <
                    absl::FromChrono(context->deadline());
  context->AddTrailingMetadata(kRetryPushbackMetadata,
                               fits ? absl::StrCat(clamped) : "-1");
  context->AddTrailingMetadata(kRetryAfterMetadata, absl::StrCat(clamped));
}

}  // namespace attnaudit::server
