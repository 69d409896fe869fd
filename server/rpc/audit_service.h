// AuditServiceImpl: attnaudit.v1.AuditService on gRPC's callback API.
//
// Request path (no reaction ever blocks):
//   Audit        decode (moving the tensor bytes out of the request, which
//                this service allocates itself, so nothing is copied) ->
//                Scheduler::Submit as INTERACTIVE with the call's deadline ->
//                the job's on_done fills the response and calls Finish.
//   AuditStream  header checked against the limits and the admission
//                budget before any chunk is read; chunks appended straight
//                into the tensor buffers (proto/codec/stream.h
//                AuditStreamAssembler); then as Audit.
//   Submit       handed to the BlockingExecutor: validate, serialise, spool
//                (fsync), schedule as SAMPLED, record QUEUED, THEN answer
//                the job id. The job's result is committed to the store
//                before its spool entry is removed (exactly one result).
//   GetResult, Cancel   on the executor (SQLite).
//   WatchResults a WatchHub subscription.
//   GetCapabilities     answered in the reaction (no I/O).
//
// Errors: absl codes map 1:1 to gRPC (status_util.h); bad input is
// INVALID_ARGUMENT with the field path ("snapshot.q: ..."), a full queue or
// budget RESOURCE_EXHAUSTED with a "retry-after-ms" trailer, draining
// UNAVAILABLE, a missing/invalid bearer token UNAUTHENTICATED.
//
// Ownership: the scheduler, spool, store, metrics and executor are not
// owned and must outlive every call (AuditServer orders the shutdown).
// Thread safety: all methods are thread-safe.
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
#include "server/metrics/metrics.h"
#include "server/rpc/blocking_executor.h"
#include "server/rpc/job_ids.h"
#include "server/rpc/watch_hub.h"
#include "server/scheduler/scheduler.h"
#include "server/spool/spool.h"
#include "server/store/result_store.h"

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
  // Sizes checked by validation (Submit) and reported in Capabilities.
  ValidationLimits limits;
  // AuditOptions::threads of every job (0: the device's default).
  int threads_per_job = 0;
  // Capacities reported in Capabilities (the scheduler enforces them).
  std::array<int64_t, kNumPriorityClasses> queue_capacity = {64, 1024};
  int64_t queued_bytes_budget = int64_t{4} << 30;
  // Empty: no authentication.
  std::string auth_token;
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
};

class AuditServiceImpl final : public v1::AuditService::CallbackService {
 public:
  AuditServiceImpl(ServiceOptions options, Scheduler* scheduler, Spool* spool,
                   ResultStore* store, Metrics* metrics,
                   BlockingExecutor* executor);
  ~AuditServiceImpl() override;

  // --- RPCs (see service.proto).
  grpc::ServerUnaryReactor* Audit(grpc::CallbackServerContext* context,
                                  const v1::AuditRequest* request,
                                  v1::AuditResponse* response) override;
  grpc::ServerReadReactor<v1::AuditStreamMessage>* AuditStream(
      grpc::CallbackServerContext* context,
      v1::AuditResponse* response) override;
  grpc::ServerUnaryReactor* Submit(grpc::CallbackServerContext* context,
                                   const v1::SubmitRequest* request,
                                   v1::SubmitResponse* response) override;
  grpc::ServerUnaryReactor* GetResult(grpc::CallbackServerContext* context,
                                      const v1::GetResultRequest* request,
                                      v1::JobResult* response) override;
  grpc::ServerWriteReactor<v1::JobResult>* WatchResults(
      grpc::CallbackServerContext* context,
      const v1::WatchResultsRequest* request) override;
  grpc::ServerUnaryReactor* Cancel(grpc::CallbackServerContext* context,
                                   const v1::CancelRequest* request,
                                   v1::CancelResponse* response) override;
  grpc::ServerUnaryReactor* GetCapabilities(
      grpc::CallbackServerContext* context,
      const v1::GetCapabilitiesRequest* request,
      v1::Capabilities* response) override;

  // --- Lifecycle.
  // From now on, calls that would admit work answer UNAVAILABLE.
  void StartDraining();
  bool draining() const { return draining_.load(); }
  // Ends every WatchResults call (UNAVAILABLE) and refuses new ones.
  void CloseWatchers();
  // Re-enqueues every spooled job without a terminal result (start-up;
  // blocking: run it on a background thread). Stops early when `stop` is
  // set or the scheduler drains. Returns the number of jobs resumed.
  int64_t ResumeSpool(const std::atomic<bool>& stop);

  // --- Used by the reactors and job callbacks (audit_service.cc,
  // durable_jobs.cc); not for other callers.
  const ServiceOptions& options() const { return options_; }
  Scheduler* scheduler() const { return scheduler_; }
  Spool* spool() const { return spool_; }
  ResultStore* store() const { return store_; }
  Metrics* metrics() const { return metrics_; }
  BlockingExecutor* executor() const { return executor_; }
  const TokenAuth& auth() const { return auth_; }
  WatchHub* watch_hub() { return &hub_; }
  // Reserves `bytes` of the upload budget; false when it would overflow.
  bool ReserveUpload(int64_t bytes);
  void ReleaseUpload(int64_t bytes);
  // Marks an idempotent job id as being submitted; false when another
  // Submit holds it.
  bool BeginIdempotentSubmit(const std::string& job_id);
  void EndIdempotentSubmit(const std::string& job_id);

 private:
  ServiceOptions options_;
  Scheduler* const scheduler_;
  Spool* const spool_;
  ResultStore* const store_;
  Metrics* const metrics_;
  BlockingExecutor* const executor_;
  TokenAuth auth_;
  WatchHub hub_;
  std::atomic<bool> draining_{false};
  std::atomic<int64_t> uploading_bytes_{0};

  // Idempotency ids whose Submit is between "not found" and "spooled", so
  // a concurrent retry answers ABORTED instead of racing.
  absl::Mutex submit_mu_;
  absl::flat_hash_set<std::string> submitting_ ABSL_GUARDED_BY(submit_mu_);

  // Request/response holders this service allocates for the unary calls
  // whose request bytes it moves out (see audit_service.cc).
  struct Allocators;
  std::unique_ptr<Allocators> allocators_;
};

}  // namespace attnaudit::server

#endif  // ATTNAUDIT_SERVER_RPC_AUDIT_SERVICE_H_
