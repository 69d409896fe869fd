// The audit pipeline: validate -> prepare (RoPE, fp8 dequant) -> reference R
// and replay P (one fused pass over the KV) -> drift per comparison ->
// verdict. This is what `attnaudit check` and the service's workers run.
//
// RunAudit never fails for bad input: an invalid snapshot yields a report
// with verdict INVALID and invalid_reason naming the field; its Status is
// non-OK only for internal errors. AuditSnapshot is the Status-returning
// form used where INVALID must become an RPC error. Thread-safe: concurrent
// calls share nothing; each call uses up to options.threads threads.
#ifndef ATTNAUDIT_CORE_AUDIT_AUDIT_H_
#define ATTNAUDIT_CORE_AUDIT_AUDIT_H_

#include <atomic>
#include <functional>

#include "absl/status/statusor.h"
#include "core/report/report.h"
#include "core/snapshot/snapshot.h"
#include "core/validate/validate.h"
#include "core/verdict/verdict.h"

namespace attnaudit {

// How a context-parallel snapshot is replayed across workers (DESIGN §3).
// Carried from the wire (AuditOptions.cp_strategy); the CPU backend replays
// every strategy the same way until the ring workers exist.
enum class CpStrategy : int {
  kAuto = 0,      // the server chooses
  kRing = 1,      // KV shards rotate rank -> rank + 1
  kPartials = 2,  // per-rank partials gathered and merged (vLLM DCP)
};

struct AuditOptions {
  bool engine_vs_reference = true;
  bool replay_vs_reference = true;
  bool engine_vs_replay = true;
  ToleranceOverrides tolerances;
  ValidationLimits limits;
  int threads = 0;  // 0: hardware concurrency
  bool include_merge_orders = true;
  bool compute_kv_fingerprint = false;  // costs one SHA-256 pass over the KV
  int worst_heads = 4;
  CpStrategy cp_strategy = CpStrategy::kAuto;
  // Polled between stages and work items; a true value aborts the audit
  // with Cancelled. May be null.
  const std::atomic<bool>* cancelled = nullptr;
  // Called when a stage finishes (name, seconds), e.g. for metrics. May be
  // empty. Called from the auditing thread.
  std::function<void(const char* stage, double seconds)> on_stage;
};

// InvalidArgument for a bad snapshot, Cancelled when options.cancelled.
absl::StatusOr<AuditReport> AuditSnapshot(const Snapshot& snapshot,
                                          const AuditOptions& options);

// As AuditSnapshot, but InvalidArgument becomes a report with verdict
// INVALID.
absl::StatusOr<AuditReport> RunAudit(const Snapshot& snapshot,
                                     const AuditOptions& options);

}  // namespace attnaudit

#endif  // ATTNAUDIT_CORE_AUDIT_AUDIT_H_
