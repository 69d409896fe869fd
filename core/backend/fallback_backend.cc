#include "core/backend/fallback_backend.h"

namespace attnaudit {

absl::StatusOr<AttentionResults> FallbackBackend::ComputeAttention(
    const PreparedAttention& prepared, const AttentionRunOptions& options) {
  if (fell_back_.load()) return fallback_.ComputeAttention(prepared, options);
  absl::StatusOr<AttentionResults> results =
      primary_.ComputeAttention(prepared, options);
  const absl::StatusCode code = results.status().code();
  if (code != absl::StatusCode::kResourceExhausted &&
      code != absl::StatusCode::kUnimplemented) {
    return results;
  }
  fell_back_.store(true);
  if (on_fallback_) on_fallback_(results.status());
  return fallback_.ComputeAttention(prepared, options);
}

absl::StatusOr<CpReplayRun> FallbackBackend::ReplayCp(
    const PreparedAttention& prepared, const CpSchedule& schedule,
    const CpReplayOptions& options) {
  return active().ReplayCp(prepared, schedule, options);
}

absl::StatusOr<DriftStats> FallbackBackend::ComputeDrift(
    const DenseView& candidate, const DenseView& baseline,
    const DriftOptions& options) {
  return active().ComputeDrift(candidate, baseline, options);
}

}  // namespace attnaudit
