// AuditOptions: what one audit computes and within which limits. A plain
// value type with no behaviour, kept apart from the pipeline (audit.h) so
// that code which only carries options (the codec, the scheduler's jobs and
// devices) depends on this small target instead of the whole pipeline.
#ifndef ATTNAUDIT_CORE_AUDIT_OPTIONS_H_
#define ATTNAUDIT_CORE_AUDIT_OPTIONS_H_

#include <atomic>
#include <functional>

#include "core/validate/validate.h"
#include "core/verdict/verdict.h"

namespace attnaudit {

// How a context-parallel snapshot is replayed across workers
// (docs/DESIGN.md §3). Carried from the wire
// (AuditOptions.cp_strategy); the CPU backend replays every strategy the
// same way until the ring workers exist.
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
  // The statistical detector on out (docs/NUMERICS.md, "Statistical
  // detector"), part of every comparison's verdict.
  bool statistical_test = true;
  // The diagnosis (docs/DIAGNOSIS.md): on DRIFT, which known bug explains
  // the engine's output, within this many seconds (<= 0: no limit).
  bool diagnose = true;
  double diagnosis_max_seconds = 10.0;
  // Polled between stages and work items; a true value aborts the audit
  // with Cancelled. May be null.
  const std::atomic<bool>* cancelled = nullptr;
  // Called when a stage finishes (name, seconds), e.g. for metrics. May be
  // empty. Called from the auditing thread.
  std::function<void(const char* stage, double seconds)> on_stage;
};

}  // namespace attnaudit

#endif  // ATTNAUDIT_CORE_AUDIT_OPTIONS_H_
