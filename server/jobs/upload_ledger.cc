#include "server/jobs/upload_ledger.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"

namespace attnaudit::server {
namespace {

std::string Mib(int64_t bytes) {
  return absl::StrCat(std::llround(static_cast<double>(bytes) / (1 << 20)),
                      " MiB");
}

}  // namespace

UploadLedger::UploadLedger(int64_t budget_bytes, double tenant_share)
    : budget_bytes_(budget_bytes),
      tenant_limit_(std::max<int64_t>(
          1, static_cast<int64_t>(static_cast<double>(budget_bytes) *
                                  std::clamp(tenant_share, 0.0, 1.0)))) {}

absl::Status UploadLedger::Reserve(const std::string& tenant, int64_t bytes,
                                   const TenantQuota& quota,
                                   RejectReason* reason) {
  absl::MutexLock lock(&mu_);
  auto it = tenants_.find(tenant);
  const Use held = it == tenants_.end() ? Use{} : it->second;
  if (bytes > tenant_limit_) {
    *reason = RejectReason::kTooLarge;
    return absl::ResourceExhaustedError(
        absl::StrCat("upload budget: ", Mib(bytes),
                     " is more than one tenant may upload "
                     "at once (",
                     Mib(tenant_limit_), "); send a smaller snapshot"));
  }
  if (quota.max_jobs > 0 && held.calls >= quota.max_jobs) {
    *reason = RejectReason::kTenantQuota;
    return absl::ResourceExhaustedError(
        absl::StrCat("tenant quota: ", held.calls, " of ", quota.max_jobs,
                     " jobs are uploads in progress"));
  }
  if (quota.max_bytes > 0 && held.bytes + bytes > quota.max_bytes) {
    *reason = RejectReason::kTenantQuota;
    return absl::ResourceExhaustedError(
        absl::StrCat("tenant quota: ", Mib(held.bytes), " of ",
                     Mib(quota.max_bytes), " held by uploads in progress"));
  }
  if (held.bytes + bytes > tenant_limit_) {
    *reason = RejectReason::kTenantQuota;
    return absl::ResourceExhaustedError(absl::StrCat(
        "upload budget: this tenant's uploads in progress hold ",
        Mib(held.bytes), " of the ", Mib(tenant_limit_), " one tenant may"));
  }
  if (total_bytes_ + bytes > budget_bytes_) {
    *reason = RejectReason::kMemoryBudget;
    return absl::ResourceExhaustedError(
        absl::StrCat("upload budget: ", bytes, " more bytes would exceed the ",
                     budget_bytes_, " bytes of uploads in progress"));
  }
  Use& use = tenants_[tenant];
  use.bytes += bytes;
  use.calls += 1;
  total_bytes_ += bytes;
  return absl::OkStatus();
}

void UploadLedger::Release(const std::string& tenant, int64_t bytes) {
  absl::MutexLock lock(&mu_);
  auto it = tenants_.find(tenant);
  if (it == tenants_.end()) return;
  it->second.bytes -= bytes;
  it->second.calls -= 1;
  total_bytes_ -= bytes;
  if (it->second.calls <= 0) tenants_.erase(it);
}

UploadLedger::Use UploadLedger::TenantUse(const std::string& tenant) const {
  absl::MutexLock lock(&mu_);
  auto it = tenants_.find(tenant);
  return it == tenants_.end() ? Use{} : it->second;
}

int64_t UploadLedger::total_bytes() const {
  absl::MutexLock lock(&mu_);
  return total_bytes_;
}

}  // namespace attnaudit::server
