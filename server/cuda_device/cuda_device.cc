#include "server/cuda_device/cuda_device.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/audit/audit.h"
#include "core/backend/backend.h"
#include "core/backend/fallback_backend.h"
#include "server/log/log.h"

namespace attnaudit::server {
namespace {

constexpr size_t kMaxCachedGangs = 4;

bool Cancelled(const AuditOptions& options) {
  return options.cancelled != nullptr && options.cancelled->load();
}

// The job's backend: the GPU's, or the CPU's for a snapshot the GPU
// refuses (the log line is what an operator sees of it besides the
// report's provenance.backend).
FallbackBackend JobBackend(CudaBackend& gpu) {
  return FallbackBackend(gpu, CpuBackendInstance(),
                         [name = gpu.name()](const absl::Status& why) {
                           ATTNAUDIT_LOG(info, "gpu fallback")
                               .Kv("device", name)
                               .Kv("to", "cpu")
                               .Kv("why", why.message());
                         });
}

}  // namespace

absl::StatusOr<std::unique_ptr<CudaDevice>> CudaDevice::Create(
    int ordinal, int64_t pool_bytes, int host_threads) {
  CudaBackendOptions o;
  o.device = ordinal;
  o.pool_bytes = pool_bytes;
  // The job's host threads are idle while its snapshot is uploaded.
  o.host_copy_threads = std::max(1, host_threads);
  absl::StatusOr<std::unique_ptr<CudaBackend>> backend = CudaBackend::Create(o);
  if (!backend.ok()) return backend.status();
  return std::unique_ptr<CudaDevice>(
      new CudaDevice(*std::move(backend), std::max(1, host_threads)));
}

absl::StatusOr<AuditReport> CudaDevice::Run(const Snapshot& snapshot,
                                            const AuditOptions& options) {
  if (Cancelled(options)) {
    return absl::CancelledError("cancelled before the audit started");
  }
  FallbackBackend backend = JobBackend(*backend_);
  AuditOptions own = options;
  own.backend = &backend;
  if (own.threads == 0) own.threads = host_threads_;
  return RunAudit(snapshot, own);
}

absl::StatusOr<CudaGang*> CudaDevice::GangFor(absl::Span<Device* const> gang) {
  std::vector<std::string> names;
  std::vector<CudaBackend*> members;
  for (Device* d : gang) {
    auto* gpu = dynamic_cast<CudaDevice*>(d);
    if (gpu == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("gang: device ", d->name(), " is not a GPU"));
    }
    names.push_back(gpu->name());
    members.push_back(gpu->backend_.get());
  }
  auto it = gangs_.find(names);
  if (it != gangs_.end()) {
    // A gang whose collectives were aborted is never reused.
    if (!it->second->broken()) return it->second.get();
    gangs_.erase(it);
  }
  if (gangs_.size() >= kMaxCachedGangs) gangs_.clear();
  absl::StatusOr<std::unique_ptr<CudaGang>> made =
      CudaGang::Create(std::move(members));
  if (!made.ok()) return made.status();
  CudaGang* out = made->get();
  if (out->size() > 1) {
    // NCCL's buffers live outside the pools: an operator sizing
    // --gpu-memory-pool-bytes needs to see them.
    std::string held;
    for (int i = 0; i < out->size(); ++i) {
      absl::StrAppend(&held, i == 0 ? "" : ",", out->member(i)->name(), "=",
                      out->comm_bytes(i));
    }
    ATTNAUDIT_LOG(info, "gang communicators made")
        .Kv("devices", out->Names())
        .Kv("nccl_bytes", held);
  }
  gangs_[names] = *std::move(made);
  return out;
}

absl::StatusOr<AuditReport> CudaDevice::RunGang(absl::Span<Device* const> gang,
                                                const Snapshot& snapshot,
                                                const AuditOptions& options) {
  if (gang.size() <= 1) return Run(snapshot, options);
  if (Cancelled(options)) {
    return absl::CancelledError("cancelled before the audit started");
  }
  absl::StatusOr<CudaGang*> ring = GangFor(gang);
  if (!ring.ok()) return ring.status();
  FallbackBackend backend = JobBackend(*backend_);
  AuditOptions own = options;
  own.backend = &backend;
  if (own.threads == 0) own.threads = host_threads_;
  own.cp_workers = static_cast<int>(gang.size());
  backend_->SetGang(*ring);
  absl::StatusOr<AuditReport> report = RunAudit(snapshot, own);
  backend_->SetGang(nullptr);
  return report;
}

DeviceDescription CudaDevice::Describe() const {
  const CudaDeviceInfo& info = backend_->info();
  DeviceDescription d;
  d.name = name();
  d.kind = kind();
  d.model = info.name;
  d.memory_bytes = info.memory_bytes;
  d.job_memory_bytes = backend_->pool_capacity();
  d.compute_capability =
      absl::StrCat(info.compute_major, ".", info.compute_minor);
  return d;
}

}  // namespace attnaudit::server
