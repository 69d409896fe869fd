// Backend: where the heavy numerics of one audit run. The audit pipeline
// (core/audit) validates, prepares (RoPE, scales, the unit plan), derives
// tolerances, computes log-probs and writes the report on the host; it asks
// its backend for the three things that read the KV cache or every output
// element:
//
//   ComputeAttention  R and P of a prepared snapshot in one pass over the KV
//                     pages (core/attention/attention.h defines both), and
//                     every unit's partial state when asked (unit_states.h).
//   ReplayCp          the context-parallel replay of the ranks
//                     (core/cp/replay/replay.h): every unit's P state as the
//                     ranks computed it, with per-rank timings.
//   ComputeDrift      the drift statistics of one comparison
//                     (core/drift/drift.h).
//
// AuditOptions::backend picks the backend of an audit (null: the process's
// CPU backend, CpuBackendInstance()). CpuBackend wraps the CPU code of
// core/attention, core/cp and core/drift; the CUDA backend (kernels/, built
// with ATTNAUDIT_ENABLE_CUDA) implements the same interface on one GPU, or
// on a gang of GPUs for ReplayCp.
//
// Contract, for every backend:
//   - Results are exactly what the CPU functions named above define, with
//     one latitude: P is bitwise reproducible WITHIN a backend (the same
//     snapshot gives the same bits run after run, for every thread count,
//     stream or world size), and two backends' P agree within the
//     documented tolerance, not bit for bit (docs/NUMERICS.md, "CPU and
//     GPU"). ReplayCp's states are the bits of the same backend's
//     ComputeAttention unit states, so its deterministic combine rebuilds
//     that backend's P bit for bit. ComputeDrift's counts, maxima, worst
//     location and exact p99 are those of drift.h; its sums (mean, RMS,
//     mean ULP) may differ in the last bits (summation order).
//   - A non-finite K/V value is reported in AttentionResults::kv_non_finite,
//     not as an error (the pipeline names the value).
// Ownership: the caller owns every input and output; inputs must stay valid
// until the call returns. Results are plain host values.
// Capabilities: what the pipeline may ask of a backend beyond the calls
// (BackendCapabilities below); the pipeline reads them, never the backend's
// identity, so a new backend states what it can do in one place.
// Thread safety: name() and capabilities() from any thread. A backend whose
// capabilities say concurrent_calls serves any number of concurrent calls
// (CpuBackend); others serve one call at a time (the server gives each
// device its own backend and one job at a time).
// Errors: Cancelled when the options' `cancelled` flag is set (polled
// between work items); InvalidArgument for malformed inputs a backend
// checks (shapes); ResourceExhausted when the snapshot does not fit the
// backend's memory and Unimplemented for a shape it does not support (the
// pipeline returns them as they are; a caller that wants another backend
// to take over composes one with FallbackBackend, fallback_backend.h);
// Internal for device errors, with the failing call in the message. No
// backend exits or aborts the process.
#ifndef ATTNAUDIT_CORE_BACKEND_BACKEND_H_
#define ATTNAUDIT_CORE_BACKEND_BACKEND_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "core/attention/attention.h"
#include "core/cp/replay/replay.h"
#include "core/cp/schedule/schedule.h"
#include "core/drift/drift.h"

namespace attnaudit {

// What a backend can do, beyond the calls every backend serves.
struct BackendCapabilities {
  // Any number of calls at once (the pipeline then runs the comparisons'
  // drift statistics in parallel); false: one call at a time.
  bool concurrent_calls = false;
};

class Backend {
 public:
  virtual ~Backend() = default;

  // "cpu", or the device, e.g. "cuda:0" (the report's provenance.backend).
  virtual std::string name() const = 0;

  virtual BackendCapabilities capabilities() const = 0;

  virtual absl::StatusOr<AttentionResults> ComputeAttention(
      const PreparedAttention& prepared,
      const AttentionRunOptions& options) = 0;

  virtual absl::StatusOr<CpReplayRun> ReplayCp(
      const PreparedAttention& prepared, const CpSchedule& schedule,
      const CpReplayOptions& options) = 0;

  virtual absl::StatusOr<DriftStats> ComputeDrift(
      const DenseView& candidate, const DenseView& baseline,
      const DriftOptions& options) = 0;
};

struct CpuBackendOptions {
  // Threads of a call whose own options say 0; 0: every hardware thread.
  int threads = 0;
};

// The CPU backend: the fused pass on oneTBB's persistent pool with the
// SIMD target chosen at run time (core/simd), the CP replay on threads over
// the in-process transport, the drift statistics on the calling thread.
// Stateless apart from its options: any number of concurrent calls.
class CpuBackend : public Backend {
 public:
  // InvalidArgument for threads < 0.
  static absl::StatusOr<std::unique_ptr<CpuBackend>> Create(
      const CpuBackendOptions& options);

  std::string name() const override { return "cpu"; }
  BackendCapabilities capabilities() const override {
    BackendCapabilities c;
    c.concurrent_calls = true;
    return c;
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

 private:
  explicit CpuBackend(const CpuBackendOptions& options) : options_(options) {}
  CpuBackendOptions options_;
};

// The process's CPU backend with default options (every call passes its
// own thread count): what an audit uses when AuditOptions::backend is null.
// Never destroyed; thread-safe.
Backend& CpuBackendInstance();

}  // namespace attnaudit

#endif  // ATTNAUDIT_CORE_BACKEND_BACKEND_H_
