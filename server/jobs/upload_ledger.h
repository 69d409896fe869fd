// UploadLedger: the AuditStream uploads in progress, per tenant and in
// total, held against the shared upload budget.
//
// An upload reserves the bytes its header announces (the assembler reserves
// that much for the tensors) and one call, before its first chunk is read,
// and releases them once its job is queued or the call ends. A reservation
// is refused when:
//   - the tenant's uploads alone would pass its quota (max_jobs counts
//     calls, max_bytes bytes; the scheduler adds its queued and running
//     jobs, AdmissionQuery::held_*);
//   - the tenant would hold more than `tenant_share` of the budget, so one
//     tenant can never take the room every other tenant's calls need;
//   - all uploads together would pass the budget.
// Every refusal is RESOURCE_EXHAUSTED naming the limit, with the reason for
// attnaudit_rejections_total.
//
// Thread safety: all methods are thread-safe.
#ifndef ATTNAUDIT_SERVER_JOBS_UPLOAD_LEDGER_H_
#define ATTNAUDIT_SERVER_JOBS_UPLOAD_LEDGER_H_

#include <cstdint>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "server/scheduler/job.h"

namespace attnaudit::server {

class UploadLedger {
 public:
  struct Use {
    int64_t bytes = 0;
    int64_t calls = 0;
  };

  // `budget_bytes` > 0; `tenant_share` in (0, 1].
  UploadLedger(int64_t budget_bytes, double tenant_share);

  // Reserves `bytes` and one call for `tenant` (see the file comment). On
  // refusal nothing is reserved and *reason says why (kTenantQuota,
  // kMemoryBudget or kTooLarge).
  absl::Status Reserve(const std::string& tenant, int64_t bytes,
                       const TenantQuota& quota, RejectReason* reason);
  // Returns what one Reserve took.
  void Release(const std::string& tenant, int64_t bytes);

  Use TenantUse(const std::string& tenant) const;
  int64_t total_bytes() const;
  // The most bytes one tenant may hold.
  int64_t tenant_limit() const { return tenant_limit_; }

 private:
  const int64_t budget_bytes_;
  const int64_t tenant_limit_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, Use> tenants_ ABSL_GUARDED_BY(mu_);
  int64_t total_bytes_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace attnaudit::server

#endif  // ATTNAUDIT_SERVER_JOBS_UPLOAD_LEDGER_H_
