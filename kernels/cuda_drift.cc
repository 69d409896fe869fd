// CudaBackend::ComputeDrift: the statistics reduced on the device
// (drift_kernels.h); only the totals come back.
#include <cmath>
#include <vector>

#include "core/common/status_macros.h"
#include "kernels/cuda_backend.h"
#include "kernels/cuda_check.h"
#include "kernels/device_memory.h"
#include "kernels/device_snapshot.h"
#include "kernels/drift_kernels.h"

namespace attnaudit {
namespace {

// Row-major flat index -> (b, s, h, d); trailing fields stay -1 for lower
// ranks (drift.h's Location).
Location DecodeIndex(int64_t index, const std::vector<int64_t>& shape) {
  int64_t coords[4] = {-1, -1, -1, -1};
  for (int i = static_cast<int>(shape.size()) - 1; i >= 0; --i) {
    coords[i] = index % shape[i];
    index /= shape[i];
  }
  Location loc;
  loc.batch = coords[0];
  loc.query = coords[1];
  loc.head = coords[2];
  loc.dim = coords[3];
  return loc;
}

bool Simple(const DenseView& c, const DenseView& b, const DriftOptions& o) {
  if (c.shape != b.shape || c.shape.size() > 4 || !IsFloating(o.ulp_dtype)) {
    return false;
  }
  for (int64_t dim : c.shape) {
    if (dim < 0) return false;
  }
  return c.size() > 0 && c.values != nullptr && b.values != nullptr;
}

DriftStats ToStats(const cuda_internal::DriftTotals& t, const DenseView& c,
                   const DenseView& b, const DriftOptions& o) {
  DriftStats s;
  s.ulp_dtype = o.ulp_dtype;
  s.tolerance = o.tolerance;
  s.count = t.count;
  s.over_tolerance = t.over;
  s.max_abs = t.max_abs;
  s.max_rel = t.max_rel;
  s.max_ulp = t.max_ulp;
  s.candidate_nan = t.candidate_nan;
  s.candidate_inf = t.candidate_inf;
  s.baseline_nan = t.baseline_nan;
  s.baseline_inf = t.baseline_inf;
  s.nonfinite_mismatch = t.mismatch;
  if (t.first_mismatch >= 0) {
    s.first_nonfinite_mismatch = DecodeIndex(t.first_mismatch, c.shape);
  }
  if (t.count == 0) return s;
  const double count = static_cast<double>(t.count);
  s.mean_abs = t.sum_abs / count;
  s.rms = std::sqrt(t.sum_sq / count);
  s.mean_ulp = t.sum_ulp / count;
  s.worst = DecodeIndex(t.worst, c.shape);
  s.worst_candidate = c.values[t.worst];
  s.worst_baseline = b.values[t.worst];
  s.p99_abs = t.p99_abs;
  return s;
}

}  // namespace

absl::StatusOr<DriftStats> CudaBackend::ComputeDrift(
    const DenseView& candidate, const DenseView& baseline,
    const DriftOptions& options) {
  // Malformed or empty views: the CPU function's checks and messages.
  if (!Simple(candidate, baseline, options)) {
    return ::attnaudit::ComputeDrift(candidate, baseline, options);
  }
  const int64_t n = candidate.size();
  const std::vector<int64_t>& shape = candidate.shape;
  ATTNAUDIT_CUDA_RETURN_IF_ERROR(cudaSetDevice(info_.ordinal));
  arena_->Reset();
  cuda_internal::DriftArgs args;
  args.n = n;
  args.tolerance = options.tolerance;
  args.ulp_dtype = static_cast<int>(options.ulp_dtype);
  ATTNAUDIT_ASSIGN_OR_RETURN(double* c,
                             arena_->AllocateArray<double>(n, "drift input"));
  ATTNAUDIT_ASSIGN_OR_RETURN(double* r,
                             arena_->AllocateArray<double>(n, "drift input"));
  ATTNAUDIT_RETURN_IF_ERROR(
      staging_->Upload(c, candidate.values, n * 8, stream_));
  ATTNAUDIT_RETURN_IF_ERROR(
      staging_->Upload(r, baseline.values, n * 8, stream_));
  args.candidate = c;
  args.baseline = r;
  if (options.active_mask != nullptr && !shape.empty()) {
    const int64_t groups = shape[0] * (shape.size() >= 2 ? shape[1] : 1);
    args.inner = groups > 0 ? n / groups : 1;
    ATTNAUDIT_ASSIGN_OR_RETURN(
        uint8_t * mask, arena_->AllocateArray<uint8_t>(groups, "drift mask"));
    ATTNAUDIT_RETURN_IF_ERROR(
        staging_->Upload(mask, options.active_mask, groups, stream_));
    args.mask = mask;
  }
  ATTNAUDIT_ASSIGN_OR_RETURN(
      char* scratch,
      arena_->Allocate(cuda_internal::DriftScratchBytes(n), "drift scratch"));
  ATTNAUDIT_ASSIGN_OR_RETURN(
      cuda_internal::DriftTotals * totals,
      arena_->AllocateArray<cuda_internal::DriftTotals>(1, "drift totals"));
  ATTNAUDIT_RETURN_IF_ERROR(
      cuda_internal::LaunchDrift(args, scratch, totals, stream_));
  cuda_internal::DriftTotals host;
  const absl::Status fetched =
      staging_->Download(&host, totals, sizeof(host), stream_);
  arena_->Reset();
  ATTNAUDIT_RETURN_IF_ERROR(fetched);
  return ToStats(host, candidate, baseline, options);
}

}  // namespace attnaudit
