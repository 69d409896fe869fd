// Admission: whether the RPC layer takes a request's work, and the shape of
// the job that work becomes. Every call that admits work asks it: Audit and
// AuditStream (before parsing or reading chunks, and again at Submit),
// Submit (after validation) and the spool resume (through Shape).
//
//   Check      the scheduler's advisory pre-check (queue size, per-class
//              byte budgets, per-tenant quotas, jobs that could only
//              expire), the refusal counted under its reason, with the
//              retry hint the scheduler measured;
//   Submit     the scheduler's Submit, with the same hint on a refusal;
//   Shape      the server's settings on a job (threads per job, the
//              validation limits) and its gang. A CP snapshot runs on
//              GPUs when the pool has them. The ring strategy runs on
//              one GPU (its ranks in turns; the bits are the same for
//              every gang) unless the job would not fit one GPU's pool
//              (RingDeviceBytes against DeviceInfo::job_memory_bytes):
//              then on a gang of as many GPUs as it needs, at most
//              min(W, GPU workers), each holding only its ranks' pages
//              (K/V shards travel GPU to GPU); RingGang::kAlways gives
//              every ring that whole gang (what an operator asks for to
//              spread one job's compute). Partials, and auto, which
//              resolves to partials, run on one GPU. Without GPUs a CP
//              snapshot runs on a gang of min(W, CPU workers) CPU
//              workers, whose threads run the ranks. A gang never
//              exceeds the pool, so it is always admitted;
//   draining   after StartDraining, work is refused UNAVAILABLE
//              (RefuseIfDraining, counted as draining);
//   CountRefusal  the accounting of requests the RPC layer refuses itself.
//
// What it does not decide: stream uploads in progress are held against the
// tenant's quota by UploadLedger (upload_ledger.h), and a fleet's quota
// adds the other replicas' usage from the store (JobService's Submit,
// submit.cc) before Check.
//
// Ownership: the scheduler and metrics are not owned and outlive it.
// Thread safety: every method from any thread.
#ifndef ATTNAUDIT_SERVER_JOBS_ADMISSION_H_
#define ATTNAUDIT_SERVER_JOBS_ADMISSION_H_

#include <atomic>
#include <memory>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "core/validate/validate.h"
#include "server/metrics/metrics.h"
#include "server/scheduler/job.h"
#include "server/scheduler/scheduler.h"

namespace attnaudit::server {

// Device bytes a CP ring replay of a snapshot of `snapshot_bytes` takes on
// one GPU, estimated from above: the K/V pages (twice their bytes for a
// pre-RoPE cache, rotated to f32), P's unit states (about a quarter of
// the K/V bytes at a GQA group of 4) and the ring's two slots per rank.
int64_t RingDeviceBytes(int64_t snapshot_bytes);

class Admission {
 public:
  // How CP ring jobs on GPUs get gangs (Shape).
  enum class RingGang { kWhenNeeded, kAlways };

  struct Options {
    // AuditOptions::threads of every job (0: the device's default).
    int threads_per_job = 0;
    // Sizes checked by validation.
    ValidationLimits limits;
    RingGang ring_gang = RingGang::kWhenNeeded;
  };

  Admission(Scheduler* scheduler, Metrics* metrics, Options options)
      : scheduler_(scheduler), metrics_(metrics), options_(options) {}

  // From now on RefuseIfDraining refuses.
  void StartDraining() { draining_.store(true); }
  bool draining() const { return draining_.load(); }
  // UNAVAILABLE "server is draining; retry elsewhere", counted, once
  // draining; OK before.
  absl::Status RefuseIfDraining();

  // Scheduler::CheckAdmission; a refusal is counted under its reason and
  // *retry_after is the scheduler's hint (zero when retrying cannot help).
  absl::Status Check(const AdmissionQuery& query, absl::Duration* retry_after);
  // Scheduler::Submit (the scheduler counts its own refusals); on a refusal
  // *retry_after is its hint and the job is gone.
  absl::Status Submit(std::unique_ptr<Job> job, absl::Duration* retry_after);
  // The server's settings on job->options, and the job's gang.
  void Shape(Job* job) const;

  // Counts a request refused with `status` by the RPC layer itself:
  // INVALID_ARGUMENT as invalid input found `where`
  // (Metrics::CountInvalidInput: one accounting across RPCs), UNAVAILABLE
  // as draining, RESOURCE_EXHAUSTED as too_large. Other codes are not
  // refusals of the request and are not counted.
  void CountRefusal(const absl::Status& status, Metrics::InvalidInput where);

 private:
  Scheduler* const scheduler_;
  Metrics* const metrics_;
  const Options options_;
  std::atomic<bool> draining_{false};
};

}  // namespace attnaudit::server

#endif  // ATTNAUDIT_SERVER_JOBS_ADMISSION_H_
