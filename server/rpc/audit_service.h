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
// Request path (no reaction ever blocks). The job lifecycle is the
// JobService's (server/jobs/jobs.h); this layer parses, authorizes, maps
// proto <-> the lifecycle's types and absl::Status -> grpc::Status, and
// streams:
//   Audit        authenticate, advisory admission (before parsing), parse,
//                decode (moving the tensor bytes out of the parsed
//                request, so nothing is copied) -> JobService::
//                RunInteractive with the call's deadline -> its answer
//                fills the response and calls Finish.
//   AuditStream  header checked against the limits, the admission and the
//                upload budget before any chunk is read; chunks appended
//                straight into the tensor buffers (proto/codec/stream.h
//                AuditStreamAssembler); then as Audit.
//   Submit       on the BlockingExecutor: parse, decode -> JobService::
//                Submit (validated, spooled with fsync, scheduled and
//                recorded QUEUED) THEN the job id is answered.
//   GetResult, Cancel, ListResults, ListPairs
//                                    on the executor -> JobService.
//   WatchResults a WatchHub subscription; the hub is the JobService's
//                ResultSubscriber (every stored result of every replica
//                sharing the store, resumable by cursor: the backlog from
//                JobService::WatchBacklog).
//   GetCapabilities     answered in the reaction (no I/O).
//
// Tenants: every call is authenticated to a Principal (server/auth) and
// needs its permission (audit, submit, read, cancel: rpc_methods.h).
// Jobs belong to the caller's tenant; the JobService shows a caller only
// its tenant's jobs unless it may read (cancel) all, and another tenant's
// job is NOT_FOUND exactly as an unknown one. A missing permission is
// PERMISSION_DENIED before any job is looked up.
//
// Errors: absl codes map 1:1 to gRPC (status_util.h); bad input is
// INVALID_ARGUMENT with the field path ("snapshot.q: ..."), a full queue or
// budget RESOURCE_EXHAUSTED with a "retry-after-ms" trailer, draining or
// unusable storage UNAVAILABLE, a missing/invalid credential
// UNAUTHENTICATED. No message names a server path.
//
// Ownership: the job service, metrics, executor and authenticator are not
// owned and must outlive every call (AuditServer orders the shutdown).
// Thread safety: all methods are thread-safe.
#ifndef ATTNAUDIT_SERVER_RPC_AUDIT_SERVICE_H_
#define ATTNAUDIT_SERVER_RPC_AUDIT_SERVICE_H_

#include <grpcpp/grpcpp.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "attnaudit/v1/service.grpc.pb.h"
#include "core/validate/validate.h"
#include "server/auth/tenants.h"
#include "server/jobs/blocking_executor.h"
#include "server/jobs/jobs.h"
#include "server/jobs/open_calls.h"
#include "server/jobs/upload_ledger.h"
#include "server/memfd/memfd_snapshots.h"
#include "server/metrics/metrics.h"
#include "server/rpc/watch_hub.h"
#include "server/scheduler/scheduler.h"

namespace attnaudit::server {

// What the RPC layer itself needs; the lifecycle's settings are
// JobServiceOptions (server/jobs/jobs.h).
struct ServiceOptions {
  // The gRPC receive limit (also reported in Capabilities).
  int64_t max_message_bytes = int64_t{256} << 20;
  // Bytes of one AuditStream snapshot (header + chunks).
  int64_t max_stream_bytes = int64_t{4} << 30;
  // Advertised in Capabilities, capped to fit under max_message_bytes.
  int64_t recommended_chunk_bytes = int64_t{4} << 20;
  // An AuditStream that delivers less than upload_min_rate bytes a second
  // over upload_idle_timeout is ended DEADLINE_EXCEEDED and its
  // reservation freed (upload_progress.h). Its reservation is held in the
  // JobService's upload ledger (upload_ledger.h) before chunks are read.
  absl::Duration upload_idle_timeout = absl::Seconds(30);
  int64_t upload_min_rate = int64_t{1} << 20;
  // Sizes reported in Capabilities (the JobService validates with them).
  ValidationLimits limits;
  // Capacities reported in Capabilities (the scheduler enforces them).
  std::array<int64_t, kNumPriorityClasses> queue_capacity = {64, 1024};
  int64_t queued_bytes_budget = int64_t{4} << 30;
  // Results buffered per WatchResults call before it is dropped.
  size_t watcher_buffer = 256;
  // Capabilities.backends: CUDA built in and usable.
  bool cuda_built = false;
  // Capabilities.devices: what each device of the pool is (by name; the
  // busy/idle state comes from the scheduler), and why the pool is not
  // what --devices asked for, when it is not (server/device_pool).
  std::vector<DeviceDescription> device_descriptions;
  std::string devices_note;
  std::string version = "unknown";
  // Audit reads AuditRequest.snapshot_memfd through these (server/memfd;
  // not owned, outlives the service): null unless --accept-memfd-snapshots.
  MemfdSnapshots* memfd_snapshots = nullptr;
};

// The formats a server's jobs are kept in (jobs.h JobFormats): a spooled
// payload is the serialised attnaudit.v1.SubmitRequest as received, a
// stored report the serialised attnaudit.v1.AuditReport.
JobFormats WireJobFormats();
// The formats of the pair joiner's sides and pairs (server/pairs): the
// serialised attnaudit.v1 Snapshot, AuditReport and PairReport.
PairFormats WirePairFormats();

// The generated service with every method raw (see the file comment).
using RawAuditService = v1::AuditService::WithRawCallbackMethod_Audit<
    v1::AuditService::WithRawCallbackMethod_AuditStream<
        v1::AuditService::WithRawCallbackMethod_Submit<
            v1::AuditService::WithRawCallbackMethod_GetResult<
                v1::AuditService::WithRawCallbackMethod_WatchResults<
                    v1::AuditService::WithRawCallbackMethod_Cancel<
                        v1::AuditService::WithRawCallbackMethod_GetCapabilities<
                            v1::AuditService::WithRawCallbackMethod_ListResults<
                                v1::AuditService::WithRawCallbackMethod_ListPairs<
                                    v1::AuditService::Service>>>>>>>>>;

class AuditServiceImpl final : public RawAuditService {
 public:
  AuditServiceImpl(ServiceOptions options, JobService* jobs, Metrics* metrics,
                   BlockingExecutor* executor, const Authenticator* auth);
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
  grpc::ServerUnaryReactor* ListPairs(grpc::CallbackServerContext* context,
                                      const grpc::ByteBuffer* request,
                                      grpc::ByteBuffer* response) override;

  // --- Lifecycle.
  // The WatchResults fan-out, as the subscriber JobService::Start takes.
  ResultSubscriber* result_subscriber() { return &hub_; }
  // From now on, calls that would admit work answer UNAVAILABLE
  // (JobService::StartDraining).
  void StartDraining() { jobs_->StartDraining(); }
  bool draining() const { return jobs_->draining(); }
  // Ends every WatchResults call (UNAVAILABLE) and refuses new ones.
  void CloseWatchers();
  // Requests received so far (the memory reclaimer watches it for
  // activity), and bytes of stream uploads in progress.
  int64_t requests_received() const { return requests_.load(); }
  int64_t uploading_bytes() const { return jobs_->uploads()->total_bytes(); }

  // --- Used by the reactors (audit_service.cc, audit_stream.cc,
  // blocking_calls.cc, list_results.cc, call_auth.cc); not for other
  // callers.
  const ServiceOptions& options() const { return options_; }
  JobService* jobs() const { return jobs_; }
  Metrics* metrics() const { return metrics_; }
  // Null unless the server accepts memfd snapshots.
  MemfdSnapshots* memfd_snapshots() const { return options_.memfd_snapshots; }
  BlockingExecutor* executor() const { return executor_; }
  const Authenticator& auth() const { return *auth_; }
  WatchHub* watch_hub() { return &hub_; }
  void CountRequest() { requests_.fetch_add(1, std::memory_order_relaxed); }
  UploadLedger* uploads() { return jobs_->uploads(); }
  OpenCalls* open_calls() { return jobs_->open_calls(); }

 private:
  // The stored results of a watch resumed after cursor `after` (in the
  // caller's numbering: the feed's when it reads all, else its tenant's),
  // up to the feed's `until`, read on the executor.
  void LoadBacklog(WatchReactor* watcher, const Principal& caller,
                   int64_t after, int64_t until);

  const ServiceOptions options_;
  JobService* const jobs_;
  Metrics* const metrics_;
  BlockingExecutor* const executor_;
  const Authenticator* const auth_;
  WatchHub hub_;
  std::atomic<int64_t> requests_{0};
};

}  // namespace attnaudit::server

#endif  // ATTNAUDIT_SERVER_RPC_AUDIT_SERVICE_H_
