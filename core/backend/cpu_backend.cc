#include <memory>
#include <utility>

#include "core/backend/backend.h"

namespace attnaudit {

absl::StatusOr<std::unique_ptr<CpuBackend>> CpuBackend::Create(
    const CpuBackendOptions& options) {
  if (options.threads < 0) {
    return absl::InvalidArgumentError("cpu backend: threads must be >= 0");
  }
  return std::unique_ptr<CpuBackend>(new CpuBackend(options));
}

absl::StatusOr<AttentionResults> CpuBackend::ComputeAttention(
    const PreparedAttention& prepared, const AttentionRunOptions& options) {
  AttentionRunOptions own = options;
  if (own.threads == 0) own.threads = options_.threads;
  return ::attnaudit::ComputeAttention(prepared, own);
}

absl::StatusOr<CpReplayRun> CpuBackend::ReplayCp(
    const PreparedAttention& prepared, const CpSchedule& schedule,
    const CpReplayOptions& options) {
  CpReplayOptions own = options;
  if (own.threads == 0) own.threads = options_.threads;
  return RunCpReplay(prepared, schedule, own);
}

absl::StatusOr<DriftStats> CpuBackend::ComputeDrift(
    const DenseView& candidate, const DenseView& baseline,
    const DriftOptions& options) {
  return ::attnaudit::ComputeDrift(candidate, baseline, options);
}

Backend& CpuBackendInstance() {
  // Leaked on purpose: audits may run on detached threads at exit.
  static Backend* const instance =
      std::move(*CpuBackend::Create(CpuBackendOptions{})).release();
  return *instance;
}

}  // namespace attnaudit
