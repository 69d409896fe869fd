// A unit of work for the scheduler: one snapshot to audit, its priority
// class, deadline, memory charge and completion callback; and the outcome
// the scheduler hands back exactly once.
//
// Ownership: the RPC layer builds a Job (moving the decoded Snapshot in),
// hands it to Scheduler::Submit as a unique_ptr and keeps only the job id.
// The scheduler owns the Job until on_done has returned; the Snapshot is
// freed right after on_done returns (so a cancelled or expired queued job
// frees its memory at once).
//
// Thread safety: a Job is not shared by callers after Submit. `cancelled`
// is the only field written concurrently (by Cancel, the deadline timer and
// Drain) while a device reads it through AuditOptions::cancelled.
#ifndef ATTNAUDIT_SERVER_SCHEDULER_JOB_H_
#define ATTNAUDIT_SERVER_SCHEDULER_JOB_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "core/audit/options.h"
#include "core/report/report.h"
#include "core/snapshot/snapshot.h"

namespace attnaudit::server {

// Strict priority: every queued kInteractive job is dispatched before any
// kSampled job (unless SchedulerOptions::sampled_promote_after ages one).
// Values are stable (they are persisted in the spool and the store).
enum class PriorityClass : int { kInteractive = 0, kSampled = 1 };
constexpr int kNumPriorityClasses = 2;

// "INTERACTIVE" / "SAMPLED" (log and error messages). Spelled here, not
// taken from attnaudit.v1.Priority's generated names: the scheduler knows no
// wire types (proto depends on nothing of the server).
absl::string_view PriorityClassName(PriorityClass c);
// "interactive" / "sampled": metric label values, a contract of their own
// with dashboards and alerts (lower case by Prometheus convention).
absl::string_view PriorityClassLabel(PriorityClass c);

// Why a job was not admitted (or, for kDeadline/kCancelled, why it ended
// early). Label values for attnaudit_rejections_total{reason=...}.
enum class RejectReason : int {
  kQueueFull = 0,         // the class queue holds max_queued jobs
  kMemoryBudget = 1,      // queued bytes would exceed the budget
  kInvalidArgument = 2,   // bad job (counted by the RPC layer's validation)
  kDeadline = 3,          // the deadline had passed at Submit
  kCancelled = 4,         // cancelled before admission (RPC layer)
  kDraining = 5,          // Drain() was called
  kTooLarge = 6,          // bytes exceed the class budget: can never fit
  kTenantQuota = 7,       // the tenant's job or byte quota is used up
  kWouldExpire = 8,       // the queue ahead outlasts the job's deadline
  kPermissionDenied = 9,  // the caller may not do this (RPC layer)
  kDevicesFailed = 10,    // too few healthy devices left for the job
};
constexpr int kNumRejectReasons = 11;
// "queue_full", "memory_budget", "invalid_argument", "deadline",
// "cancelled", "draining", "too_large", "tenant_quota", "would_expire",
// "permission_denied", "devices_failed".
absl::string_view RejectReasonLabel(RejectReason r);

// What one tenant may hold in the scheduler at once (queued + running).
// Zero means unlimited.
struct TenantQuota {
  int64_t max_jobs = 0;
  int64_t max_bytes = 0;
};

// Labels a job carries for metrics and the store. Bounded in length and
// charset by the RPC layer before they get here (server/jobs/label_bounds.h);
// server/metrics also caps the number of distinct model/layer values.
struct JobLabels {
  std::string model;
  int64_t layer = -1;
  std::string engine;
  // Not used by the scheduler or metrics (unbounded values): carried to
  // the result store, which queries filter on.
  std::string backend;
  int64_t step = -1;
  std::string run;
};

struct JobTimings {
  absl::Duration queue_wait = absl::ZeroDuration();  // Submit -> dispatch
  absl::Duration run = absl::ZeroDuration();         // device Run
};

struct JobOutcome {
  std::string job_id;
  PriorityClass priority = PriorityClass::kSampled;
  // OK: `report` holds the audit (its verdict may be INVALID: CpuDevice uses
  // RunAudit). Otherwise one of:
  //   Cancelled         Scheduler::Cancel (queued or running job)
  //   DeadlineExceeded  the deadline could no longer be met while queued
  //                     (never ran; see scheduler.h, Deadlines) or passed
  //                     while running (the device was asked to stop)
  //   Unavailable       the scheduler drained or was destroyed before the
  //                     job finished. NOT a result: a spooled job that ends
  //                     Unavailable must be resumed on the next start, so
  //                     the RPC layer must not store a terminal result.
  //   anything else     the device's error (e.g. Internal).
  absl::Status status;
  AuditReport report;  // meaningful only when status.ok()
  JobTimings timings;
  bool ran = false;         // a device started it
  std::string device_kind;  // "cpu", "cuda"; empty when it never ran
  std::string device_name;  // "cpu:0"; the gang leader for gang jobs
  JobLabels labels;         // copied from the Job
  std::string tenant;       // copied from the Job
  // The job's snapshot, valid only while on_done and the listener's
  // OnFinished run (the job is freed after them).
  const Snapshot* snapshot = nullptr;
};

struct Job {
  // Unique among queued and running jobs; Submit fails AlreadyExists on a
  // duplicate. Opaque to the scheduler.
  std::string id;
  PriorityClass priority = PriorityClass::kSampled;
  // Absolute. InfiniteFuture() means none. A job still queued at its
  // deadline completes DeadlineExceeded at once, from the timer thread,
  // without running; a running job past it has `cancelled` set and
  // completes DeadlineExceeded.
  absl::Time deadline = absl::InfiniteFuture();
  Snapshot snapshot;
  // The scheduler overwrites options.cancelled with &cancelled. Everything
  // else (threads, tolerances, on_stage) is passed to the device as is.
  AuditOptions options;
  // Bytes charged against SchedulerOptions::max_queued_bytes while the job
  // is queued (typically the received message size). Must be >= 0.
  int64_t bytes = 0;
  // Device kind required ("cpu", "cuda"); empty: any device.
  std::string device_kind;
  // Owner of the job (the caller's tenant; "" is a tenant like any other).
  // Counts against `quota` while queued or running.
  std::string tenant;
  TenantQuota quota;
  // What the tenant holds outside this scheduler (a fleet's other
  // replicas, as the store counted them when it admitted the job): added
  // to its jobs here when Submit checks `quota`, and only then.
  int64_t held_jobs_elsewhere = 0;
  int64_t held_bytes_elsewhere = 0;
  // Devices held together for this job (a ring job across P ranks). 1 for
  // ordinary jobs. Submit fails FailedPrecondition when the pool has fewer
  // devices of the kind.
  int gang_size = 1;
  JobLabels labels;
  // Called exactly once for every job Submit accepted (never for a
  // rejected one), from a scheduler thread or from the thread calling
  // Cancel/Drain/~Scheduler, never with the scheduler's lock held. It may
  // call into the Scheduler. It should return quickly: it runs on a worker
  // or the timer thread.
  std::function<void(const JobOutcome&)> on_done;
  // Optional: called when a device takes the job (e.g. to record RUNNING in
  // the store), on the worker thread, without the scheduler's lock held,
  // before Device::Run; again, with the new device, when the job runs once
  // more after its device failed.
  std::function<void(const Job&, absl::string_view device_name)> on_start;

  // Set by Cancel, the deadline timer or Drain; polled by the device.
  std::atomic<bool> cancelled{false};

  Job() = default;
  Job(const Job&) = delete;
  Job& operator=(const Job&) = delete;
};

}  // namespace attnaudit::server

#endif  // ATTNAUDIT_SERVER_SCHEDULER_JOB_H_
