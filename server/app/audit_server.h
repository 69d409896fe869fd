// AuditServer: the whole service in one object, as attnaudit-server runs it
// and as the integration tests embed it: metrics (own HTTP port, optionally
// TLS and a bearer token), result store, spool, scheduler with its device
// pool, the blocking executor, the job lifecycle (server/jobs JobService),
// the AuditService on gRPC's callback API adapting it,
// grpc.health.v1 with real service names ("" and
// "attnaudit.v1.AuditService"), reflection, TLS/mTLS, tenants and
// permissions (server/auth), keepalive and connection age, a bounded
// receive size, and a reclaimer that hands freed memory back to the system
// once the server has been idle for a moment after a burst.
//
//   AuditServerOptions options;  options.listen = "127.0.0.1:0"; ...
//   ATTNAUDIT_ASSIGN_OR_RETURN(auto server,
//   AuditServer::Start(std::move(options)));
//   ... server->port() ...
//   server->Shutdown();  // the SIGTERM sequence; also run by the destructor
//
// Shutdown sequence (docs/OPERATIONS.md): health NOT_SERVING -> wait
// drain_delay (load balancers notice) -> refuse new work (UNAVAILABLE) ->
// drain queued and running jobs up to drain_timeout (JobService::Drain;
// leftover spooled jobs stay on disk for the next start) -> end
// WatchResults streams -> gRPC Shutdown with a short grace -> workers
// joined -> JobService::Shutdown -> store, spool -> metrics last (the
// final counts stay scrapeable until then).
//
// Thread safety: all methods are thread-safe; Shutdown is idempotent and
// blocks until the sequence is complete.
#ifndef ATTNAUDIT_SERVER_APP_AUDIT_SERVER_H_
#define ATTNAUDIT_SERVER_APP_AUDIT_SERVER_H_

#include <grpcpp/grpcpp.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "absl/types/optional.h"
#include "core/validate/validate.h"
#include "server/app/data_dir_lock.h"
#include "server/auth/tenants.h"
#include "server/device_pool/device_selection.h"
#include "server/jobs/blocking_executor.h"
#include "server/jobs/jobs.h"
#include "server/jobs/result_journal.h"
#include "server/metrics/metrics.h"
#include "server/metrics_http/metrics_http.h"
#include "server/pairs/joiner.h"
#include "server/rpc/audit_service.h"
#include "server/rpc/callback_queue_waker.h"
#include "server/scheduler/device.h"
#include "server/scheduler/scheduler.h"
#include "server/spool/spool.h"
#include "server/store/job_ids.h"
#include "server/store/job_store.h"

namespace attnaudit::server {

struct TlsFiles {
  std::string cert;       // PEM chain; empty: plaintext
  std::string key;        // PEM private key
  std::string client_ca;  // PEM CA bundle; non-empty: mTLS required
};

struct ConnectionOptions {
  // Zero durations leave gRPC's default (or "never" for age/idle).
  absl::Duration keepalive_time = absl::Minutes(2);
  absl::Duration keepalive_timeout = absl::Seconds(20);
  absl::Duration keepalive_min_ping_interval = absl::Seconds(30);
  absl::Duration max_connection_age = absl::Minutes(30);
  absl::Duration max_connection_age_grace = absl::Minutes(5);
  absl::Duration max_connection_idle = absl::Minutes(15);
  // Calls one connection may have open at once. A unary request is
  // received whole before its handler can refuse it, so this bounds the
  // memory of requests being received on a connection (streams x the
  // message size) on top of the memory budget. 0: gRPC's default.
  int max_concurrent_streams = 64;
};

struct AuditServerOptions {
  std::string listen = "localhost:50051";         // port 0 picks a free one
  std::string metrics_listen = "localhost:9464";  // empty: no endpoint
  std::string data_dir = "./var/attnaudit";
  // "sqlite": <data_dir>/results.db; or a postgresql:// URL shared by a
  // fleet (server/store/job_store.h). The spool stays under data_dir.
  std::string store_url = "sqlite";
  // This replica's name, stored as the owner of the jobs it accepts;
  // empty: the host name.
  std::string replica_id;
  // Audit/AuditStream results are stored too (GetResult, ListResults);
  // those the store cannot take are kept in <data_dir>/journal, up to
  // result_journal_bytes, until it can (server/jobs/result_journal.h).
  bool store_audit_results = true;
  int64_t result_journal_bytes = int64_t{256} << 20;
  // Train-rollout pairs (server/pairs/joiner.h): how long a side waits in
  // the store for its counterpart (zero: no pairs) and the largest kept.
  absl::Duration pair_wait = absl::Minutes(10);
  int64_t pair_max_side_bytes = int64_t{64} << 20;
  // A fleet: a replica whose heartbeat is older than this is gone and its
  // unfinished jobs are taken over by the others.
  absl::Duration fleet_lease = absl::Seconds(15);

  // CPU pool: 0 derives from the machine (see attnaudit-server --help).
  int cpu_workers = 0;
  int threads_per_job = 0;
  // --devices (server/device_pool): the CPU pool, every GPU (the CPU pool
  // when there is none), or the GPUs listed; each GPU worker reserves
  // gpu_memory_pool_bytes (0: 3/4 of its free memory).
  DeviceSelection device_selection;
  int64_t gpu_memory_pool_bytes = 0;
  // Replaces the pool when non-empty (tests).
  std::vector<std::unique_ptr<Device>> devices;

  int64_t max_message_bytes = int64_t{256} << 20;
  std::array<int64_t, kNumPriorityClasses> queue_capacity = {64, 1024};
  // Queued snapshot bytes (scheduler) and, separately, bytes of stream
  // uploads in progress.
  int64_t memory_budget_bytes = int64_t{8} << 30;
  ValidationLimits limits;

  absl::Duration retention_age = absl::Hours(24 * 7);  // 0: keep forever
  int64_t retention_count = 100000;                    // 0: no cap
  absl::Duration prune_interval = absl::Minutes(5);

  absl::Duration drain_delay = absl::ZeroDuration();
  absl::Duration drain_timeout = absl::Seconds(30);

  // Interactive calls keep this share of memory_budget_bytes that SAMPLED
  // work cannot take (scheduler.h, Budgets). In [0, 1).
  double interactive_reserve = 0.25;
  // The scheduler's aging of SAMPLED jobs and CP gangs' backfill window
  // (server/scheduler/scheduler.h, SchedulerOptions).
  absl::Duration sampled_promote_after = absl::InfiniteDuration();
  double gang_backfill_runs = 2.0;
  // Every CP ring job on GPUs gets a gang of min(W, GPUs), not only those
  // that would not fit one GPU (server/jobs/admission.h, Shape).
  bool cp_ring_gang_always = false;
  // What one tenant may hold queued or running, unless its token-file line
  // says otherwise (zero fields: unlimited).
  TenantQuota tenant_quota;
  // Stream uploads in progress (server/jobs/upload_ledger.h): the share of
  // memory_budget_bytes one tenant may hold (1 without authentication,
  // where every caller is one tenant), and how long one may stay silent.
  // An upload must deliver upload_min_rate bytes per second, measured
  // over upload_idle_timeout (server/jobs/upload_progress.h).
  double upload_tenant_share = 0.5;
  absl::Duration upload_idle_timeout = absl::Seconds(30);
  int64_t upload_min_rate = int64_t{1} << 20;

  TlsFiles tls;
  // Tenants and permissions (server/auth/tenants.h): a token file, or for
  // embeddings and tests the text of one; both empty: no authentication
  // (everyone is tenant "default" with every permission). At most one.
  std::string auth_token_file;
  std::string auth_tokens;
  ConnectionOptions connection;

  // /metrics (server/metrics_http) over TLS (cert and key together) and/or
  // behind a bearer token (the first line of the file).
  std::string metrics_tls_cert;
  std::string metrics_tls_key;
  std::string metrics_token_file;

  // After a burst, once no call has arrived and nothing has been queued or
  // running for this long, freed memory is handed back to the system
  // (malloc_trim). 0: never.
  absl::Duration reclaim_after_idle = absl::Seconds(1);

  // How often gRPC's callback threads get an event while the server is
  // idle (server/rpc/callback_queue_waker.h: without it the first call
  // after a quiet second can wait up to 100 ms). 0: never.
  absl::Duration callback_wake_period = absl::Milliseconds(250);

  // Audit reads snapshots that local clients name as sealed memfds
  // (server/memfd); the reclaimer also drops their idle mappings.
  bool accept_memfd_snapshots = false;

  int metrics_max_models = 4;
  int metrics_max_layers = 16;
  // Results buffered per WatchResults call before it is dropped: the
  // service's default (one number, the one docs/OPERATIONS.md states).
  size_t watcher_buffer = ServiceOptions().watcher_buffer;
  int blocking_threads = 4;
  size_t blocking_queue = 1024;
  // Tests only: skip fsync in the spool and the store.
  bool sync_storage = true;
  bool resume_spool = true;
};

class AuditServer {
 public:
  // Opens everything and starts serving. Errors name the failing part
  // ("--listen: cannot bind localhost:50051", "--tls-cert: ...",
  // "--data-dir DIR: the file system is read-only", the metrics port), in
  // one line.
  static absl::StatusOr<std::unique_ptr<AuditServer>> Start(
      AuditServerOptions options);
  ~AuditServer();
  AuditServer(const AuditServer&) = delete;
  AuditServer& operator=(const AuditServer&) = delete;

  // The bound gRPC port and metrics port (0 without an endpoint).
  int port() const { return port_; }
  int metrics_port() const { return metrics_port_; }
  // The options it was started with (less `devices`, which the pool took).
  const AuditServerOptions& options() const { return options_; }
  // What the device pool is and why, when it is not what --devices asked
  // for (e.g. --devices all without a GPU); empty for a plain CPU pool.
  const std::string& devices_note() const { return devices_note_; }

  // The SIGTERM sequence (see the file comment). Idempotent.
  void Shutdown();
  // SIGHUP: re-reads the token file. On error the current tenants stay in
  // force and the error (naming the line, never a token) is returned.
  absl::Status ReloadCredentials();
  // Principals of the token file now in force (0 without one).
  size_t principals() const {
    return auth_ == nullptr ? 0 : auth_->principals();
  }
  // Blocks until the start-up spool resume has finished (tests). False on
  // timeout.
  bool WaitForResume(absl::Duration timeout);
  int64_t resumed_jobs() const { return resumed_.load(); }

  Metrics* metrics() const { return metrics_.get(); }
  Scheduler* scheduler() const { return scheduler_.get(); }
  JobService* jobs() const { return jobs_.get(); }
  AuditServiceImpl* service() const { return service_.get(); }

 private:
  AuditServer() = default;
  // Start-up, one step each (Init runs them in order).
  absl::Status Init();
  absl::StatusOr<std::vector<std::unique_ptr<Device>>> MakeDevices();
  absl::Status OpenMetrics(const std::vector<std::unique_ptr<Device>>& devices);
  absl::Status OpenAuth();
  absl::Status OpenStorage();
  JobServiceOptions MakeJobOptions() const;
  ServiceOptions MakeServiceOptions() const;
  absl::Status StartGrpc();
  void StartBackgroundThreads();
  void PruneLoop();
  void ReclaimLoop();
  // Waits up to `d` for stop_; true when stopping.
  bool WaitForStop(absl::Duration d);

  AuditServerOptions options_;
  std::unique_ptr<Metrics> metrics_;
  std::unique_ptr<MetricsHttpServer> metrics_http_;
  std::unique_ptr<Authenticator> auth_;
  absl::optional<JobIdKey> job_id_key_;
  absl::Time started_ = absl::Now();
  std::unique_ptr<DataDirLock> data_dir_lock_;  // held until the very end
  std::unique_ptr<JobStore> store_;
  std::unique_ptr<Spool> spool_;
  std::unique_ptr<ResultJournal> result_journal_;  // store_audit_results
  std::unique_ptr<Scheduler> scheduler_;
  std::unique_ptr<BlockingExecutor> executor_;
  std::unique_ptr<MemfdSnapshots> memfd_snapshots_;  // outlives service_
  std::unique_ptr<PairJoiner> pair_joiner_;          // pair_wait > 0
  std::unique_ptr<JobService> jobs_;                 // outlives service_
  std::unique_ptr<AuditServiceImpl> service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<CallbackQueueWaker> waker_;  // goes before server_
  int port_ = 0;
  int metrics_port_ = 0;
  std::string devices_note_;
  std::string replica_id_;  // options_.replica_id, or the host name
  std::vector<DeviceDescription> device_descriptions_;
  bool cuda_built_ = false;

  std::atomic<bool> stop_{false};
  std::thread resume_thread_;
  absl::Notification resume_done_;
  std::atomic<int64_t> resumed_{0};
  std::thread prune_thread_;
  std::thread reclaim_thread_;
  absl::Mutex prune_mu_;
  absl::Mutex shutdown_mu_;
  bool shut_down_ = false;
};

// Version string of this build ("0.1.0").
const char* ServerVersion();

}  // namespace attnaudit::server

#endif  // ATTNAUDIT_SERVER_APP_AUDIT_SERVER_H_
