// Scheduler: admission control, per-class bounded queues with strict
// priority, per-class byte budgets with a share reserved for INTERACTIVE
// work, per-tenant quotas, deadlines on their own timer (a queued job whose
// deadline can no longer be met is dropped before it runs), cancellation,
// and a device pool with one worker thread per device (the request path of
// an inference server such as Triton: admit, queue by priority, dispatch to
// a free device, complete through a callback).
//
//   SchedulerOptions opts;
//   opts.devices = MakeCpuDevices(4, /*threads_each=*/2);  // server/cpu_device
//   ATTNAUDIT_ASSIGN_OR_RETURN(auto scheduler,
//   Scheduler::Create(std::move(opts))); auto job = std::make_unique<Job>();
//   ... job->tenant = "fleet-a"; job->on_done = ...; SubmitRejection why;
//   absl::Status s = scheduler->Submit(std::move(job), &why);
//   // !s.ok(): not admitted; on_done will never run; why.retry_after hints.
//
// Admission (Submit), in this order:
//   Unavailable        after Drain() (reason kDraining)
//   InvalidArgument    empty id, gang_size < 1, bytes < 0, a negative quota
//                      (kInvalidArgument)
//   FailedPrecondition fewer than gang_size devices of the job's kind
//                      (kInvalidArgument)
//   Unavailable        enough devices, but too few of them healthy
//                      (kDevicesFailed; the message names the failure)
//   AlreadyExists      a queued or running job has this id (kInvalidArgument)
//   DeadlineExceeded   the deadline is not in the future (kDeadline)
//   ResourceExhausted  bytes > the job's class budget (kTooLarge; retrying
//                      cannot help, retry_after is zero);
//                      the tenant already holds quota.max_jobs queued or
//                      running jobs, or quota.max_bytes would be passed
//                      (kTenantQuota);
//                      the class queue is full (kQueueFull);
//                      the class budget or the total budget would be passed
//                      (kMemoryBudget);
//                      jobs are queued ahead and the estimated wait plus run
//                      time ends after the job's deadline (kWouldExpire: it
//                      would only expire in the queue).
//                      Message e.g.
//                      "queue INTERACTIVE full (64 jobs); retry after ~120 ms"
// Every rejection is reported to SchedulerListener::OnRejected.
//
// Budgets. Queued bytes are bounded twice: all classes together by
// max_queued_bytes, and SAMPLED alone by max_queued_bytes -
// interactive_reserved_bytes. So SAMPLED traffic can never take the share
// reserved for INTERACTIVE calls, while INTERACTIVE calls may use the whole
// budget. `bytes` counts while the job is queued; it is released when the
// job is dispatched, cancelled or expires (running jobs are bounded by the
// device count instead).
//
// Tenants. Job::tenant names the job's owner (any string; "" is a tenant
// too). While a job is queued or running it counts one job and `bytes`
// against its tenant; Job::quota (zero fields: unlimited) caps both, so one
// tenant cannot occupy the queues or the devices' memory alone.
//
// Deadlines. A queued job is dropped DeadlineExceeded ("... never ran"), on
// the timer thread, once less than expiry_lead x the estimated run time is
// left before its deadline: it could not finish in time, so running it
// would only waste a device. A running job past its deadline has its
// cancelled flag set. Admission refuses (kWouldExpire) a job that would
// wait behind other queued jobs longer than its deadline allows, so under
// overload accepted jobs run instead of expiring in the queue. A job's
// wait counts the classes above its own twice over: the jobs of theirs
// already queued, and those still to come, which overtake it while it
// waits. So its class drains at the measured rate times the share of
// recent dispatches that were not of a higher class (a SAMPLED job behind
// an INTERACTIVE stream that takes half the devices' time waits twice as
// long as the queue length alone says).
//
// Retry hints (SubmitRejection::retry_after, also in the messages) come from
// the measured drain rate: dispatches per second over the last
// kDrainWindow dispatches (until there are enough, devices / run
// estimate), times the jobs that must leave the queue first.
//
// Dispatch: whenever a job is queued or a device frees up, the scheduler
// walks the queued jobs in order (the highest class first, FIFO within a
// class) and gives each that fits to idle device(s) of its kind, until no
// device is idle. A job never overtakes an earlier one that could use the
// same devices, with one exception, backfill: a gang job (gang_size > 1)
// waiting for its devices to free up lets later jobs use the idle devices
// of its kind until it has waited gang_backfill_runs run estimates; from
// then on those devices are held for it as they free up (later jobs of its
// kind wait), so it starts within about one run time more and cannot
// starve. Jobs of other kinds are never held up by it.
// Starvation: under sustained INTERACTIVE load SAMPLED jobs wait (bounded by
// their deadlines). sampled_promote_after (default infinite: strict) lets a
// SAMPLED head that has waited that long go before INTERACTIVE jobs.
//
// Device failures (Device::Health, server/scheduler/device.h): after every
// run the scheduler asks the gang's devices for their health. A device
// that reports a failure leaves the pool for good: no job is dispatched to
// it again, Devices() marks it failed with the reason, the listener hears
// OnDeviceFailed and counts it in OnDevicesChanged. The job that was on it
// runs once more on other devices when it failed (a job that succeeded
// keeps its result); a second failure is its outcome. Queued jobs that the
// remaining devices can no longer hold (a gang larger than the healthy
// devices of its kind) complete Unavailable, and Submit refuses such jobs
// with Unavailable (reason kDevicesFailed) naming the failure, so callers
// retry on another replica.
//
// Thread safety: all methods are thread-safe. on_done/on_start run without
// the internal lock held and may call back into the Scheduler, except Drain
// and the destructor (which wait for every on_done to return).
// Destruction: ~Scheduler() = Drain(ZeroDuration()) then joins its threads;
// it blocks until every device has returned from Run.
#ifndef ATTNAUDIT_SERVER_SCHEDULER_SCHEDULER_H_
#define ATTNAUDIT_SERVER_SCHEDULER_SCHEDULER_H_

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "server/scheduler/device.h"
#include "server/scheduler/job.h"

namespace attnaudit::server {

// Receives scheduler events, e.g. to update Prometheus metrics
// (server/metrics provides one). Not owned by the scheduler; must outlive
// it. Default implementations do nothing.
class SchedulerListener {
 public:
  virtual ~SchedulerListener() = default;

  // --- Called WITH the scheduler's lock held (so gauge updates arrive in
  // order): must be fast, must not block and must not call the Scheduler.
  // Queue `c` now holds `depth` jobs; `queued_bytes` is over all classes.
  virtual void OnQueueChanged(PriorityClass c, int64_t depth,
                              int64_t queued_bytes) {}
  // Jobs currently running (gang jobs count once); devices of `kind` busy
  // (running or reserved for a gang) out of `total`.
  virtual void OnInFlightChanged(int64_t in_flight) {}
  // `failed` of the `total` are out of the pool; `busy` of the rest run.
  virtual void OnDevicesChanged(absl::string_view kind, int busy, int failed,
                                int total) {}
  // Device `name` of `kind` left the pool: Health() said `why`.
  virtual void OnDeviceFailed(absl::string_view name, absl::string_view kind,
                              const absl::Status& why) {}
  // Submit refused a job.
  virtual void OnRejected(RejectReason reason) {}

  // --- Called WITHOUT the lock, on the thread that completes the job.
  // A device took the job after `queue_wait`: once per job (a job run
  // once more after a device failed is not reported again).
  virtual void OnStarted(const Job& job, absl::string_view device_kind,
                         absl::Duration queue_wait) {}
  // Called once per accepted job, just before Job::on_done. Also for jobs
  // that never ran (outcome.ran == false).
  virtual void OnFinished(const JobOutcome& outcome) {}
};

struct SchedulerOptions {
  // The pool. At least one device. Owned by the scheduler.
  std::vector<std::unique_ptr<Device>> devices;
  // Bounded queue per class, indexed by PriorityClass. >= 1 each.
  std::array<int64_t, kNumPriorityClasses> max_queued = {64, 1024};
  // Budget for the bytes of all queued jobs (all classes). >= 1.
  int64_t max_queued_bytes = int64_t{4} << 30;  // 4 GiB
  // Part of max_queued_bytes that SAMPLED jobs may not use (see Budgets in
  // the file comment). In [0, max_queued_bytes). attnaudit-server
  // reserves a quarter by default (--interactive-reserve).
  int64_t interactive_reserved_bytes = 0;
  // See the file comment; InfiniteDuration() keeps strict priority.
  absl::Duration sampled_promote_after = absl::InfiniteDuration();
  // First guess of one job's run time, for retry hints and deadline
  // checks until real runs have been measured (an exponential moving
  // average after that).
  absl::Duration initial_run_estimate = absl::Milliseconds(100);
  // A queued job is dropped once less than expiry_lead x the run estimate
  // is left before its deadline. In [0, 1]; 0 drops only at the deadline.
  double expiry_lead = 0.5;
  // Admission (kWouldExpire) assumes the queue ahead drains this much
  // slower than measured, so that what it admits does not expire. >= 1.
  // 2: on a shared 2-vCPU VM whose speed moves by tens of percent within
  // a minute, 1.5 still let one accepted job in ~100 expire under the
  // overload test (docs/PERF.md, "Overload at twice the capacity").
  double wait_safety = 2.0;
  // Backfill (see Dispatch in the file comment): a waiting gang job lets
  // later jobs use the idle devices of its kind until it has waited this
  // many run estimates. >= 0; 0 holds the devices for it at once (strict
  // FIFO).
  double gang_backfill_runs = 2.0;
  // May be null. Not owned.
  SchedulerListener* listener = nullptr;
};

// What CheckAdmission asks about: the admission-relevant fields of a Job.
struct AdmissionQuery {
  PriorityClass priority = PriorityClass::kSampled;
  int64_t bytes = 0;
  std::string tenant;
  TenantQuota quota;
  absl::Time deadline = absl::InfiniteFuture();
  // What the tenant holds outside the scheduler (uploads in progress):
  // counted with its queued and running jobs against `quota`.
  int64_t held_jobs = 0;
  int64_t held_bytes = 0;
};

// Filled by Submit when it refuses a job.
struct SubmitRejection {
  RejectReason reason = RejectReason::kQueueFull;
  // Suggested wait before retrying (zero when retrying cannot help).
  // Derived from the queue ahead and the measured run time per device.
  absl::Duration retry_after = absl::ZeroDuration();
};

// Dispatches over which the drain rate is measured for retry hints.
inline constexpr int kDrainWindow = 32;

struct DeviceInfo {
  std::string name;
  std::string kind;
  bool busy = false;
  // Out of the pool for good (Device::Health); `failure` says why.
  bool failed = false;
  std::string failure;
  // DeviceDescription::job_memory_bytes (0: not bounded).
  int64_t job_memory_bytes = 0;
};

struct SchedulerStats {
  std::array<int64_t, kNumPriorityClasses> queued = {0, 0};
  std::array<int64_t, kNumPriorityClasses> max_queued = {0, 0};
  // Queued bytes per class and in total, and the budgets.
  std::array<int64_t, kNumPriorityClasses> class_queued_bytes = {0, 0};
  int64_t queued_bytes = 0;
  int64_t max_queued_bytes = 0;
  int64_t interactive_reserved_bytes = 0;
  int64_t in_flight = 0;  // running jobs
  // Queued jobs dropped because their deadline could no longer be met
  // (since Create).
  int64_t expired_in_queue = 0;
  // Dispatches per second over the last kDrainWindow dispatches; 0 until
  // three gaps between saturated dispatches have been seen.
  double drain_rate = 0;
  int devices_total = 0;
  int devices_busy = 0;
  int devices_failed = 0;
  bool draining = false;
};

class Scheduler {
 public:
  // InvalidArgument when options are out of range (no devices, a null
  // device, duplicate device names, a max_queued < 1, ...). Starts one
  // worker thread per device and the deadline timer thread.
  static absl::StatusOr<std::unique_ptr<Scheduler>> Create(
      SchedulerOptions options);

  virtual ~Scheduler() = default;
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Admits `job` or refuses it (see the file comment). On OK the scheduler
  // owns the job and will call job->on_done exactly once. On error the job
  // is destroyed, on_done is never called, and `rejection` (may be null) is
  // filled.
  virtual absl::Status Submit(std::unique_ptr<Job> job,
                              SubmitRejection* rejection = nullptr) = 0;

  // As Submit, but while the refusal is kQueueFull, kMemoryBudget or
  // kTenantQuota it waits (until `wait_until`) for room instead of failing,
  // and it never refuses kWouldExpire (the job was accepted before; its
  // deadline is left to the timer). For resuming a spool at start-up from a
  // background thread. Fails as Submit does for the other reasons and with
  // ResourceExhausted at `wait_until`.
  virtual absl::Status SubmitWhenAdmitted(std::unique_ptr<Job> job,
                                          absl::Time wait_until) = 0;

  // A cheap, advisory pre-check of Submit's admission rules for a job of
  // this class, size, tenant, quota and deadline (e.g. before spooling a
  // large upload). OK does not reserve room.
  virtual absl::Status CheckAdmission(
      const AdmissionQuery& query,
      SubmitRejection* rejection = nullptr) const = 0;

  // Cancels a queued or running job.
  //   queued:  removed, its memory released, on_done(Cancelled) runs on the
  //            calling thread before Cancel returns.
  //   running: its cancelled flag is set; it completes Cancelled when the
  //            device returns (whatever the device returned).
  // NotFound when no queued or running job has this id (unknown or already
  // finished).
  virtual absl::Status Cancel(absl::string_view job_id) = 0;
  // As Cancel, but only a job of `tenant`: another tenant's job is NotFound
  // with the same message as an unknown id (callers must not learn that it
  // exists).
  virtual absl::Status CancelOwned(absl::string_view job_id,
                                   absl::string_view tenant) = 0;
  // The tenant of a queued or running job; NotFound otherwise.
  virtual absl::StatusOr<std::string> OwnerOf(
      absl::string_view job_id) const = 0;

  // Shutdown: stops admitting (Submit -> Unavailable "draining") at once,
  // keeps dispatching queued jobs and waits for all jobs to finish until
  // `timeout`. At the timeout, jobs still queued complete Unavailable and
  // running ones have their cancelled flag set and complete Unavailable
  // when their device returns; Drain then waits for that and returns
  // DeadlineExceeded. OK when every job finished within the timeout.
  // Idempotent; the scheduler never admits again.
  virtual absl::Status Drain(absl::Duration timeout) = 0;

  virtual SchedulerStats Stats() const = 0;
  virtual std::vector<DeviceInfo> Devices() const = 0;

 protected:
  Scheduler() = default;
};

}  // namespace attnaudit::server

#endif  // ATTNAUDIT_SERVER_SCHEDULER_SCHEDULER_H_
