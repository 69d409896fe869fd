#include "server/rpc/admission.h"

#include <algorithm>
#include <cstdint>
#include <utility>

namespace attnaudit::server {

absl::Status Admission::RefuseIfDraining() {
  if (!draining()) return absl::OkStatus();
  metrics_->CountRejection(RejectReason::kDraining);
  return absl::UnavailableError("server is draining; retry elsewhere");
}

absl::Status Admission::Check(const AdmissionQuery& query,
                              absl::Duration* retry_after) {
  SubmitRejection why;
  absl::Status s = scheduler_->CheckAdmission(query, &why);
  if (s.ok()) return s;
  metrics_->CountRejection(why.reason);
  *retry_after = why.retry_after;
  return s;
}

absl::Status Admission::Submit(std::unique_ptr<Job> job,
                               absl::Duration* retry_after) {
  SubmitRejection why;
  absl::Status s = scheduler_->Submit(std::move(job), &why);
  if (!s.ok()) *retry_after = why.retry_after;
  return s;
}

void Admission::Shape(Job* job) const {
  job->options.threads = options_.threads_per_job;
  job->options.limits = options_.limits;
  const int64_t world = job->snapshot.cp.world_size;
  if (world <= 1) return;
  int64_t cpus = 0;
  int64_t gpus = 0;
  for (const DeviceInfo& d : scheduler_->Devices()) {
    cpus += d.kind == "cpu";
    gpus += d.kind == "cuda";
  }
  // GPU workers when the pool has them (one rank per GPU, or several in
  // turns), else CPU workers; a GPU gang only where ranks exchange data.
  if (gpus > 0) {
    job->device_kind = "cuda";
    job->gang_size = job->options.cp_strategy == CpStrategy::kRing
                         ? static_cast<int>(std::min(world, gpus))
                         : 1;
    return;
  }
  if (cpus == 0) return;
  job->device_kind = "cpu";
  job->gang_size = static_cast<int>(std::min(world, cpus));
}

void Admission::CountRefusal(const absl::Status& status,
                             Metrics::InvalidInput where) {
  switch (status.code()) {
    case absl::StatusCode::kInvalidArgument:
      metrics_->CountInvalidInput(where);
      break;
    case absl::StatusCode::kUnavailable:
      metrics_->CountRejection(RejectReason::kDraining);
      break;
    case absl::StatusCode::kResourceExhausted:
      metrics_->CountRejection(RejectReason::kTooLarge);
      break;
    default:
      break;
  }
}

}  // namespace attnaudit::server
