// FallbackBackend: one audit's backend made of a primary that may refuse a
// snapshot and a fallback that takes it instead. The device layer composes
// it (server/cuda_device: the GPU's backend, then the CPU backend), so the
// pipeline (core/audit) runs the one backend it is given and never decides
// where an audit runs.
//
// The decision is made once per audit, on the attention pass: when the
// primary's ComputeAttention returns ResourceExhausted (the snapshot does
// not fit its memory) or Unimplemented (a shape it lacks), the call is run
// on the fallback, and so is the rest of the audit (ReplayCp, ComputeDrift),
// so the CP replay's states come from the backend whose P they must
// rebuild. Every other status, and every status of the fallback, is
// returned as it is. name() and capabilities() are those of the backend in
// use, so the report's provenance.backend names the one that ran.
//
// Ownership: borrows both backends, which must outlive it. State: whether
// it fell back, so one instance serves one audit (it is cheap to build per
// job). Thread safety: calls as the backend in use allows
// (capabilities()); the switch happens only inside ComputeAttention, which
// the pipeline calls before any other call of the audit. `on_fallback`
// runs on the calling thread, once, before the fallback's call.
#ifndef ATTNAUDIT_CORE_BACKEND_FALLBACK_BACKEND_H_
#define ATTNAUDIT_CORE_BACKEND_FALLBACK_BACKEND_H_

#include <atomic>
#include <functional>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "core/backend/backend.h"

namespace attnaudit {

class FallbackBackend : public Backend {
 public:
  // Told why the primary refused (its status); for the caller's log line
  // or metric. May be empty.
  using OnFallback = std::function<void(const absl::Status& why)>;

  FallbackBackend(Backend& primary, Backend& fallback,
                  OnFallback on_fallback = nullptr)
      : primary_(primary),
        fallback_(fallback),
        on_fallback_(std::move(on_fallback)) {}

  std::string name() const override { return active().name(); }
  BackendCapabilities capabilities() const override {
    return active().capabilities();
  }
  absl::StatusOr<AttentionResults> ComputeAttention(
      const PreparedAttention& prepared,
      const AttentionRunOptions& options) override;
  absl::StatusOr<CpReplayRun> ReplayCp(const PreparedAttention& prepared,
                                       const CpSchedule& schedule,
                                       const CpReplayOptions& options) override;
  absl::StatusOr<DriftStats> ComputeDrift(const DenseView& candidate,
                                          const DenseView& baseline,
                                          const DriftOptions& options) override;

  // Whether the fallback took over.
  bool fell_back() const { return fell_back_.load(); }

 private:
  Backend& active() const { return fell_back_.load() ? fallback_ : primary_; }

  Backend& primary_;
  Backend& fallback_;
  OnFallback on_fallback_;
  std::atomic<bool> fell_back_{false};
};

}  // namespace attnaudit

#endif  // ATTNAUDIT_CORE_BACKEND_FALLBACK_BACKEND_H_
