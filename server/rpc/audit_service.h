// AuditServiceImpl: attnaudit.v1.AuditService on gRPC's callback API.
//
// Raw messages. Every method is registered raw (WithRawCallbackMethod_*):
// requests arrive as grpc::ByteBuffer and the service parses them itself.
// gRPC 1.51's callback handlers answer a request they cannot deserialize
// with UNIMPLEMENTED and an empty message (server_callback_handlers.h: a
// failed Deserialize leaves no reactor, and the fallback reactor is
// UnimplementedUnaryReactor / UnimplementedWriteReactor with status
// UNIMPLEMENTED ""; the same holds for a failed read of a client stream,
// which looks like its end). Parsing here answers INVALID_ARGUMENT naming
// the field and byte where decoding stopped (proto/codec/wire_check.h).
//
// Request path (no reaction ever blocks):
//   Audit        authenticate, parse, decode (moving the tensor bytes out of
//                the parsed request, so nothing is copied), bound the
//                labels -> Scheduler::Submit as INTERACTIVE with the call's
//                deadline -> the job's on_done fills the response and calls
//                Finish.
//   AuditStream  header checked against the limits and the admission
//                budget before any chunk is read; chunks appended straight
//                into the tensor buffers (proto/codec/stream.h
//                AuditStreamAssembler); then as Audit.
//   Submit       handed to the BlockingExecutor: validate, serialise, spool
//                (fsync), schedule as SAMPLED, record QUEUED, THEN answer
//                the job id. The job's result is committed to the store
//                before its spool entry is removed (exactly one result); a
//                commit that fails is retried (DurableJobs).
//   GetResult, Cancel, ListResults   on the executor (the store).
//   WatchResults a WatchHub subscription, fed by the store's result feed
//                (result_feed.h): every stored result of every replica
//                sharing the store, resumable by cursor.
//   GetCapabilities     answered in the reaction (no I/O).
//
// Tenants: every call is authenticated to a Principal (server/auth) and
// needs its permission (audit, submit, read, cancel). Jobs belong to the
// caller's tenant; GetResult, WatchResults and Cancel see only the
// tenant's jobs unless it may read (cancel) all, and another tenant's job
// is NOT_FOUND exactly as an unknown one. A missing permission is
// PERMISSION_DENIED before any job is looked up.
//
// Errors: absl codes map 1:1 to gRPC (status_util.h); bad input is
// INVALID_ARGUMENT with the field path ("snapshot.q: ..."), a full queue or
// budget RESOURCE_EXHAUSTED with a "retry-after-ms" trailer, draining or
// unusable storage UNAVAILABLE, a missing/invalid credential
// UNAUTHENTICATED. No message names a server path.
//
// Ownership: the scheduler, spool, store, metrics, executor and
// authenticator are not owned and must outlive every call (AuditServer
// orders the shutdown). Thread safety: all methods are thread-safe.
#ifndef ATTNAUDIT_SERVER_RPC_AUDIT_SERVICE_H_
#define ATTNAUDIT_SERVER_RPC_AUDIT_SERVICE_H_

#include <grpcpp/grpcpp.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "attnaudit/v1/service.grpc.pb.h"
#include "core/audit/options.h"
#include "core/validate/validate.h"
#include "server/auth/tenants.h"
#include "server/memfd/memfd_snapshots.h"
#include "server/metrics/metrics.h"
#include "server/rpc/admission.h"
#include "server/rpc/audit_result_writer.h"
#include "server/rpc/blocking_executor.h"
#include "server/rpc/durable_registry.h"
#include "server/rpc/fleet_handoff.h"
#include "server/rpc/job_ids.h"
#include "server/rpc/open_calls.h"
#include "server/rpc/result_feed.h"
#include "server/rpc/result_journal.h"
#include "server/rpc/upload_ledger.h"
#include "server/rpc/watch_hub.h"
#include "server/scheduler/scheduler.h"
#include "server/spool/spool.h"
#include "server/store/job_store.h"

namespace attnaudit::server {

struct ServiceOptions {
  // The gRPC receive limit (also reported in Capabilities).
  int64_t max_message_bytes = int64_t{256} << 20;
  // Bytes of one AuditStream snapshot (header + chunks).
  int64_t max_stream_bytes = int64_t{4} << 30;
  // Advertised in Capabilities, capped to fit under max_message_bytes.
  int64_t recommended_chunk_bytes = int64_t{4} << 20;
  // Bytes of AuditStream uploads in progress (all calls together); an
  // upload that would pass it is refused RESOURCE_EXHAUSTED before its
  // chunks are read. The scheduler's queued-bytes budget takes over once
  // the job is queued.
  int64_t upload_budget_bytes = int64_t{4} << 30;
  // The part of upload_budget_bytes one tenant may hold (upload_ledger.h).
  double upload_tenant_share = 0.5;
  // An AuditStream that delivers less than upload_min_rate bytes a second
  // over upload_idle_timeout is ended DEADLINE_EXCEEDED and its
  // reservation freed (upload_progress.h).
  absl::Duration upload_idle_timeout = absl::Seconds(30);
  int64_t upload_min_rate = int64_t{1} << 20;
  // Sizes checked by validation (Submit) and reported in Capabilities.
  ValidationLimits limits;
  // AuditOptions::threads of every job (0: the device's default).
  int threads_per_job = 0;
  // How CP ring jobs on GPUs get gangs (admission.h).
  Admission::RingGang ring_gang = Admission::RingGang::kWhenNeeded;
  // Capacities reported in Capabilities (the scheduler enforces them).
  std::array<int64_t, kNumPriorityClasses> queue_capacity = {64, 1024};
  int64_t queued_bytes_budget = int64_t{4} << 30;
  // Results buffered per WatchResults call before it is dropped.
  size_t watcher_buffer = 256;
  // A Submit without a timeout gets this one (InfiniteDuration: none).
  absl::Duration default_submit_timeout = absl::InfiniteDuration();
  // Capabilities.backends: CUDA built in and usable.
  bool cuda_built = false;
  // Capabilities.devices: what each device of the pool is (by name; the
  // busy/idle state comes from the scheduler), and why the pool is not
  // what --devices asked for, when it is not (server/device_pool).
  std::vector<DeviceDescription> device_descriptions;
  std::string devices_note;
  std::string version = "unknown";
  // This replica's name (AuditServerOptions::replica_id, resolved): the
  // owner stored with the jobs it accepts.
  std::string replica_id;
  // Audit/AuditStream results are stored like Submit's (GetResult,
  // ListResults, resumable watches); false: only published to watchers.
  bool store_audit_results = true;
  // How often the result feed looks for other replicas' results.
  absl::Duration feed_poll_interval = absl::Milliseconds(200);
  // A fleet (shared store): a replica silent this long is gone, and its
  // unfinished jobs are taken over (fleet_handoff.h).
  absl::Duration fleet_lease = absl::Seconds(15);
  // Payload bytes one claim round takes over (fleet_handoff.h).
  int64_t fleet_claim_bytes = int64_t{256} << 20;
  // Audit results the store cannot take are kept here until it can
  // (result_journal.h; not owned, outlives the service); null: not kept.
  ResultJournal* result_journal = nullptr;
  // Audit reads AuditRequest.snapshot_memfd through these (server/memfd;
  // not owned, outlives the service): null unless --accept-memfd-snapshots.
  MemfdSnapshots* memfd_snapshots = nullptr;
};

// The generated service with every method raw (see the file comment).
using RawAuditService = v1::AuditService::WithRawCallbackMethod_Audit<
    v1::AuditService::WithRawCallbackMethod_AuditStream<
        v1::AuditService::WithRawCallbackMethod_Submit<
            v1::AuditService::WithRawCallbackMethod_GetResult<
                v1::AuditService::WithRawCallbackMethod_WatchResults<
                    v1::AuditService::WithRawCallbackMethod_Cancel<
                        v1::AuditService::WithRawCallbackMethod_GetCapabilities<
                            v1::AuditService::WithRawCallbackMethod_ListResults<
                                v1::AuditService::Service>>>>>>>>;

class AuditServiceImpl final : public RawAuditService {
 public:
  AuditServiceImpl(ServiceOptions options, Scheduler* scheduler, Spool* spool,
                   JobStore* store, Metrics* metrics,
                   BlockingExecutor* executor, const Authenticator* auth,
                   JobIdKey job_id_key);
  ~AuditServiceImpl() override;

  // --- RPCs (see service.proto); messages in and out are the serialised
  // request and response of each.
  grpc::ServerUnaryReactor* Audit(grpc::CallbackServerContext* context,
                                  const grpc::ByteBuffer* request,
                                  grpc::ByteBuffer* response) override;
  grpc::ServerReadReactor<grpc::ByteBuffer>* AuditStream(
      grpc::CallbackServerContext* context,
      grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* Submit(grpc::CallbackServerContext* context,
                                   const grpc::ByteBuffer* request,
                                   grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* GetResult(grpc::CallbackServerContext* context,
                                      const grpc::ByteBuffer* request,
                                      grpc::ByteBuffer* response) override;
  grpc::ServerWriteReactor<grpc::ByteBuffer>* WatchResults(
      grpc::CallbackServerContext* context,
      const grpc::ByteBuffer* request) override;
  grpc::ServerUnaryReactor* Cancel(grpc::CallbackServerContext* context,
                                   const grpc::ByteBuffer* request,
                                   grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* GetCapabilities(
      grpc::CallbackServerContext* context, const grpc::ByteBuffer* request,
      grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* ListResults(grpc::CallbackServerContext* context,
                                        const grpc::ByteBuffer* request,
                                        grpc::ByteBuffer* response) override;

  // --- Lifecycle.
  // From now on, calls that would admit work answer UNAVAILABLE.
  void StartDraining();
  bool draining() const { return admission_.draining(); }
  // Ends every WatchResults call (UNAVAILABLE) and refuses new ones.
  void CloseWatchers();
  // Re-enqueues every spooled job without a terminal result that was
  // accepted before `accepted_before` (this server's start: what it
  // accepted itself is scheduled already). Start-up; blocking: run it on a
  // background thread. Stops early when `stop` is set or the scheduler
  // drains. Returns the number of jobs resumed.
  int64_t ResumeSpool(const std::atomic<bool>& stop,
                      absl::Time accepted_before);
  // Stops retrying results the store refused (shutdown); their jobs stay
  // spooled and run again on the next start.
  void StopRetries() { durable_.Shutdown(); }
  // Starts following the store's result feed (start-up; the store's
  // error when it cannot be read), and stops it (shutdown, before the
  // store goes).
  absl::Status StartFeed();
  void StopFeed() { feed_.Stop(); }
  // In a fleet, starts the hand-off (fleet_handoff.h): FailedPrecondition
  // naming --replica-id when a live replica uses this one's id, the
  // store's error when the first heartbeat cannot be written. Start-up.
  absl::Status StartHandoff();
  // Stops claiming other replicas' jobs; with `retire`, this replica's
  // unfinished jobs may be claimed at once (after the drain).
  void StopHandoff(bool retire) {
    if (handoff_ != nullptr) handoff_->Stop(retire);
  }
  // Runs a job another replica accepted (claimed from the store, or this
  // replica's own whose local spool entry is gone): spools it here and
  // schedules it as the resume does.
  void AdoptStoredJob(StoredJob job);
  // The token file was reloaded: every open call re-checks its
  // credentials (open_calls.h).
  void RecheckOpenCalls();
  // Requests received so far (the memory reclaimer watches it for
  // activity), and bytes of stream uploads in progress.
  int64_t requests_received() const { return requests_.load(); }
  int64_t uploading_bytes() const { return uploads_.total_bytes(); }

  // --- Used by the reactors and job callbacks (audit_service.cc,
  // durable_jobs.cc); not for other callers.
  const ServiceOptions& options() const { return options_; }
  Scheduler* scheduler() const { return scheduler_; }
  Spool* spool() const { return spool_; }
  JobStore* store() const { return store_; }
  Metrics* metrics() const { return metrics_; }
  // Null unless the server accepts memfd snapshots.
  MemfdSnapshots* memfd_snapshots() const { return options_.memfd_snapshots; }
  BlockingExecutor* executor() const { return executor_; }
  const Authenticator& auth() const { return *auth_; }
  const JobIdKey& job_id_key() const { return job_id_key_; }
  Admission* admission() { return &admission_; }
  WatchHub* watch_hub() { return &hub_; }
  ResultFeed* feed() { return &feed_; }
  AuditResultWriter* audit_results() { return &audit_results_; }
  // An interactive job's result that is not stored: to the watchers of
  // the moment.
  void PublishUnstored(const ResultRecord& record);
  // Null unless results the store refuses are journalled (result_journal.h).
  ResultJournal* result_journal() const { return options_.result_journal; }
  DurableJobs* durable() { return &durable_; }
  void CountRequest() { requests_.fetch_add(1, std::memory_order_relaxed); }
  UploadLedger* uploads() { return &uploads_; }
  OpenCalls* open_calls() { return &open_calls_; }
  // Marks an idempotent job id as being submitted; false when another
  // Submit holds it.
  bool BeginIdempotentSubmit(const std::string& job_id);
  void EndIdempotentSubmit(const std::string& job_id);

 private:
  // The result writer's work: stores Audit results (one transaction).
  absl::Status StoreAuditResults(const std::vector<ResultRecord>& records);
  // One result from the feed: to the watchers, and in a fleet, the end of
  // this replica's copy of a job that another replica finished or
  // cancelled.
  void OnStoredResult(const ResultRecord& record);
  // The stored results of a watch resumed after cursor `after` (in the
  // caller's numbering: the feed's when it reads all, else its tenant's),
  // up to the feed's `until`, on the executor.
  void LoadBacklog(WatchReactor* watcher, const Principal& caller,
                   int64_t after, int64_t until);

  ServiceOptions options_;
  Scheduler* const scheduler_;
  Spool* const spool_;
  JobStore* const store_;
  Metrics* const metrics_;
  BlockingExecutor* const executor_;
  const Authenticator* const auth_;
  const JobIdKey job_id_key_;
  Admission admission_;
  WatchHub hub_;
  DurableJobs durable_;
  ResultFeed feed_;
  std::unique_ptr<FleetHandoff> handoff_;  // fleet only
  UploadLedger uploads_;
  // After feed_ and hub_, which it uses: stores what it holds before they
  // go.
  AuditResultWriter audit_results_;
  std::atomic<int64_t> requests_{0};

  // Serialises resuming and adopting jobs, so one job is scheduled once.
  absl::Mutex resume_mu_;
  // Idempotency ids whose Submit is between "not found" and "spooled", so
  // a concurrent retry answers ABORTED instead of racing.
  absl::Mutex submit_mu_;
  absl::flat_hash_set<std::string> submitting_ ABSL_GUARDED_BY(submit_mu_);
  // Last: its sweeper thread is joined before anything it reaches goes.
  OpenCalls open_calls_;
};

}  // namespace attnaudit::server

#endif  // ATTNAUDIT_SERVER_RPC_AUDIT_SERVICE_H_
