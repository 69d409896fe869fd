#include "server/jobs/admission.h"

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

namespace attnaudit::server {
namespace {

// The smallest job memory of the GPUs that can run jobs (0: not bounded).
int64_t SmallestGpuPool(const std::vector<DeviceInfo>& devices) {
  int64_t smallest = 0;
  for (const DeviceInfo& d : devices) {
    if (d.kind != "cuda" || d.failed || d.job_memory_bytes <= 0) continue;
    if (smallest == 0 || d.job_memory_bytes < smallest) {
      smallest = d.job_memory_bytes;
    }
  }
  return smallest;
}

}  // namespace

int64_t RingDeviceBytes(int64_t snapshot_bytes) {
  // Pages up to twice over, a quarter for the unit states, a slot pair.
  return snapshot_bytes / 4 * 13;
}

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
  const std::vector<DeviceInfo> devices = scheduler_->Devices();
  int64_t cpus = 0;
  int64_t gpus = 0;
  for (const DeviceInfo& d : devices) {
    cpus += d.kind == "cpu";
    gpus += d.kind == "cuda";
  }
  // GPU workers when the pool has them (one rank per GPU, or several in
  // turns), else CPU workers; a GPU gang only where ranks exchange data
  // and one GPU is not enough (or the operator asks for it).
  if (gpus > 0) {
    job->device_kind = "cuda";
    job->gang_size = 1;
    if (job->options.cp_strategy != CpStrategy::kRing) return;
    const int64_t most = std::min(world, gpus);
    if (options_.ring_gang == RingGang::kAlways) {
      job->gang_size = static_cast<int>(most);
      return;
    }
    const int64_t pool = SmallestGpuPool(devices);
    const int64_t need = RingDeviceBytes(job->bytes);
    if (pool > 0 && need > pool && most > 1) {
      job->gang_size = static_cast<int>(
          std::clamp<int64_t>((need + pool - 1) / pool, 2, most));
    }
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
