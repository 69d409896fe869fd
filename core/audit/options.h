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

class Backend;  // core/backend/backend.h

// How a context-parallel snapshot (cp.world_size > 1) is replayed across
// ranks (docs/NUMERICS.md, "Context parallelism"; core/cp). Carried from
// the wire (AuditOptions.cp_strategy).
enum class CpStrategy : int {
  kAuto = 0,      // the pipeline chooses: partials, the decode engines' own
  kRing = 1,      // KV shards rotate rank -> rank + 1
  kPartials = 2,  // per-rank partials gathered and merged (vLLM DCP)
};

struct AuditOptions {
  bool engine_vs_reference = true;
  bool replay_vs_reference = true;
  bool engine_vs_replay = true;
  // E vs the emulated engine (core/emulate), where the engine's declared
  // arithmetic allows one (a 16-bit-score engine of declared rounding).
  bool engine_vs_emulation = true;
  ToleranceOverrides tolerances;
  ValidationLimits limits;
  int threads = 0;  // 0: hardware concurrency
  bool include_merge_orders = true;
  bool compute_kv_fingerprint = false;  // costs one SHA-256 pass over the KV
  int worst_heads = 4;
  CpStrategy cp_strategy = CpStrategy::kAuto;
  // Ranks of the CP replay that may run at once: the workers of a gang job
  // (server/scheduler); 0 means `threads`. Fewer than W run in turns.
  int cp_workers = 0;
  // The CP replay keeps every unit's state (and, with cp.rank_out, R's
  // unit states of the single pass); above this many bytes the CP section
  // reports the replay as skipped instead of allocating them.
  int64_t max_cp_state_bytes = int64_t{4} << 30;
  // The statistical detector on out (docs/NUMERICS.md, "Statistical
  // detector"), part of every comparison's verdict.
  bool statistical_test = true;
  // The diagnosis (docs/DIAGNOSIS.md): on DRIFT, which known bug explains
  // the engine's output, within this many seconds (<= 0: no limit).
  bool diagnose = true;
  double diagnosis_max_seconds = 10.0;
  // Where R, P, the CP replay and the drift statistics run (not owned; it
  // must outlive the audit). Null: the process's CPU backend. The audit
  // runs this backend and no other: a ResourceExhausted or Unimplemented
  // from it ends the audit with that status, unless the caller composed a
  // FallbackBackend (core/backend/fallback_backend.h). The report names the
  // backend that ran (provenance.backend, the backend's name() at the end).
  Backend* backend = nullptr;
  // Polled between stages and work items; a true value aborts the audit
  // with Cancelled. May be null.
  const std::atomic<bool>* cancelled = nullptr;
  // Called when a stage finishes (name, seconds), e.g. for metrics. May be
  // empty. Called from the auditing thread.
  std::function<void(const char* stage, double seconds)> on_stage;
};

}  // namespace attnaudit

#endif  // ATTNAUDIT_CORE_AUDIT_OPTIONS_H_
