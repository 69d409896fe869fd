#include "server/scheduler/job.h"

namespace attnaudit::server {

absl::string_view PriorityClassName(PriorityClass c) {
  return c == PriorityClass::kInteractive ? "INTERACTIVE" : "SAMPLED";
}

absl::string_view PriorityClassLabel(PriorityClass c) {
  return c == PriorityClass::kInteractive ? "interactive" : "sampled";
}

absl::string_view RejectReasonLabel(RejectReason r) {
  switch (r) {
    case RejectReason::kQueueFull:
      return "queue_full";
    case RejectReason::kMemoryBudget:
      return "memory_budget";
    case RejectReason::kInvalidArgument:
      return "invalid_argument";
    case RejectReason::kDeadline:
      return "deadline";
    case RejectReason::kCancelled:
      return "cancelled";
    case RejectReason::kDraining:
      return "draining";
    case RejectReason::kTooLarge:
      return "too_large";
    case RejectReason::kTenantQuota:
      return "tenant_quota";
    case RejectReason::kWouldExpire:
      return "would_expire";
    case RejectReason::kPermissionDenied:
      return "permission_denied";
    case RejectReason::kDevicesFailed:
      return "devices_failed";
  }
  return "unknown";
}

}  // namespace attnaudit::server
