// CudaDevice: a scheduler Device on one GPU (built with
// ATTNAUDIT_ENABLE_CUDA). It runs the core audit pipeline with its
// CudaBackend (kernels/cuda_backend.h) as the audit's backend: the fused
// R + P pass, the CP replay and the drift statistics on the GPU, the rest
// of the pipeline on `host_threads` CPU threads. A snapshot the GPU cannot
// take (bigger than --gpu-memory-pool-bytes, a page too large for a thread
// block) runs on the CPU backend instead: each job's backend is a
// FallbackBackend (core/backend/fallback_backend.h) of the GPU's and the
// CPU's, this device decides so, the server logs `msg="gpu fallback"` with
// the device and why, and the report says so (provenance.backend "cpu").
//
// Gang jobs (CP snapshots, docs/ARCHITECTURE.md "CP replay"): RunGang runs
// the CP replay with rank k on GPU k mod G of the gang (a gang smaller than
// the world size runs several ranks per GPU), over NCCL. The gang's
// communicators are created on its first job and cached by the leader for
// the next job on the same GPUs (a few gangs per device at most). Every
// device of a gang must be a CudaDevice.
//
// Bad input is a report with verdict INVALID, as on CpuDevice. Thread
// safety: kind()/name()/Describe()/memory_in_use_bytes()/Health() from any
// thread (Health waits for the GPU's stream: the scheduler asks it between
// jobs);
// Run and RunGang from the device's worker only (the scheduler's rule).
#ifndef ATTNAUDIT_SERVER_CUDA_DEVICE_CUDA_DEVICE_H_
#define ATTNAUDIT_SERVER_CUDA_DEVICE_CUDA_DEVICE_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/cuda_backend.h"
#include "kernels/cuda_gang.h"
#include "server/scheduler/device.h"

namespace attnaudit::server {

class CudaDevice : public Device {
 public:
  // Unavailable when the GPU does not exist; ResourceExhausted when its
  // memory pool cannot be allocated (pool_bytes 0: 3/4 of its free memory).
  static absl::StatusOr<std::unique_ptr<CudaDevice>> Create(int ordinal,
                                                            int64_t pool_bytes,
                                                            int host_threads);

  std::string kind() const override { return "cuda"; }
  std::string name() const override { return backend_->name(); }
  absl::StatusOr<AuditReport> Run(const Snapshot& snapshot,
                                  const AuditOptions& options) override;
  absl::StatusOr<AuditReport> RunGang(absl::Span<Device* const> gang,
                                      const Snapshot& snapshot,
                                      const AuditOptions& options) override;
  DeviceDescription Describe() const override;
  int64_t memory_in_use_bytes() const override {
    return backend_->memory_in_use();
  }
  // The context's sticky error once a job left it unusable (the scheduler
  // then takes this GPU out of the pool).
  absl::Status Health() const override { return backend_->ContextHealth(); }

 private:
  CudaDevice(std::unique_ptr<CudaBackend> backend, int host_threads)
      : backend_(std::move(backend)), host_threads_(host_threads) {}
  absl::StatusOr<CudaGang*> GangFor(absl::Span<Device* const> gang);

  std::unique_ptr<CudaBackend> backend_;
  int host_threads_;
  // Cached gangs this device led, by their members' names.
  std::map<std::vector<std::string>, std::unique_ptr<CudaGang>> gangs_;
};

}  // namespace attnaudit::server

#endif  // ATTNAUDIT_SERVER_CUDA_DEVICE_CUDA_DEVICE_H_
