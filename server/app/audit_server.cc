#include "server/app/audit_server.h"

#include <fcntl.h>
#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/health_check_service_interface.h>
#include <malloc.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "core/common/status_macros.h"
#include "server/device_pool/device_pool.h"
#include "server/log/log.h"
#include "server/rpc/rpc_methods.h"
#include "transport/credentials/credential_files.h"

#ifndef ATTNAUDIT_VERSION
#define ATTNAUDIT_VERSION "unknown"
#endif

namespace attnaudit::server {
namespace {

// The default replica id.
std::string HostName() {
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0 || name[0] == '\0') {
    return "attnaudit";
  }
  return name;
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeCredentials(
    const TlsFiles& tls) {
  if (tls.cert.empty() && tls.key.empty()) {
    if (!tls.client_ca.empty()) {
      return absl::InvalidArgumentError(
          "--tls-client-ca: needs --tls-cert and --tls-key");
    }
    return grpc::InsecureServerCredentials();
  }
  if (tls.cert.empty() || tls.key.empty()) {
    return absl::InvalidArgumentError(
        "--tls-cert: --tls-cert and --tls-key go together");
  }
  ATTNAUDIT_ASSIGN_OR_RETURN(std::string cert,
                             ReadPemFile("tls-cert", tls.cert));
  ATTNAUDIT_ASSIGN_OR_RETURN(std::string key, ReadPemFile("tls-key", tls.key));
  grpc::SslServerCredentialsOptions ssl(
      tls.client_ca.empty()
          ? GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE
          : GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  if (!tls.client_ca.empty()) {
    ATTNAUDIT_ASSIGN_OR_RETURN(ssl.pem_root_certs,
                               ReadPemFile("tls-client-ca", tls.client_ca));
  }
  ssl.pem_key_cert_pairs.push_back({std::move(key), std::move(cert)});
  return grpc::SslServerCredentials(ssl);
}

// Checks that the data directory can be created, written and synced, so
// that a read-only or full file system is found at start, in one line
// naming the flag, rather than by the first Submit.
absl::Status ProbeDataDir(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  auto fail = [&dir](int err) {
    const char* why =
        err == EROFS                     ? "the file system is read-only"
        : err == ENOSPC || err == EDQUOT ? "no space left on the file system"
        : err == EACCES || err == EPERM  ? "not writable (permission denied)"
                                         : std::strerror(err);
    return absl::FailedPreconditionError(
        absl::StrCat("--data-dir ", dir, ": ", why,
                     "; the spool and results.db need a writable directory "
                     "with free space"));
  };
  if (ec) return fail(ec.value());
  // 1 MiB: a disk with less than that free is full for our purposes.
  const std::string probe = dir + "/.write-probe";
  const int fd =
      ::open(probe.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return fail(errno);
  const std::string block(64 << 10, '\0');
  int err = 0;
  for (int i = 0; i < 16 && err == 0; ++i) {
    if (::write(fd, block.data(), block.size()) !=
        static_cast<ssize_t>(block.size())) {
      err = errno != 0 ? errno : ENOSPC;
    }
  }
  if (err == 0 && ::fsync(fd) != 0) err = errno;
  ::close(fd);
  ::unlink(probe.c_str());
  return err == 0 ? absl::OkStatus() : fail(err);
}

// "--data-dir DIR: <what failed>" for errors of the store and spool.
absl::Status DataDirError(const std::string& dir, const absl::Status& s) {
  return absl::Status(s.code(),
                      absl::StrCat("--data-dir ", dir, ": ", s.message()));
}

int ClampMs(absl::Duration d) {
  const int64_t ms = absl::ToInt64Milliseconds(d);
  return static_cast<int>(std::min<int64_t>(ms, INT32_MAX));
}

void ApplyConnectionOptions(const ConnectionOptions& c,
                            grpc::ServerBuilder* builder) {
  if (c.keepalive_time > absl::ZeroDuration()) {
    builder->AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS,
                                ClampMs(c.keepalive_time));
    builder->AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  }
  if (c.keepalive_timeout > absl::ZeroDuration()) {
    builder->AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS,
                                ClampMs(c.keepalive_timeout));
  }
  if (c.keepalive_min_ping_interval > absl::ZeroDuration()) {
    // Clients pinging more often than this get GOAWAY too_many_pings.
    builder->AddChannelArgument(
        GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS,
        ClampMs(c.keepalive_min_ping_interval));
  }
  if (c.max_connection_age > absl::ZeroDuration()) {
    builder->AddChannelArgument(GRPC_ARG_MAX_CONNECTION_AGE_MS,
                                ClampMs(c.max_connection_age));
    builder->AddChannelArgument(GRPC_ARG_MAX_CONNECTION_AGE_GRACE_MS,
                                ClampMs(c.max_connection_age_grace));
  }
  if (c.max_connection_idle > absl::ZeroDuration()) {
    builder->AddChannelArgument(GRPC_ARG_MAX_CONNECTION_IDLE_MS,
                                ClampMs(c.max_connection_idle));
  }
  if (c.max_concurrent_streams > 0) {
    builder->AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS,
                                c.max_concurrent_streams);
  }
}

// Default pool shape: up to 16 cores one worker gets them all (one audit is
// then as fast as `attnaudit check`); larger machines get a worker per 16
// cores, so a long job cannot hold every core.
void PoolShape(int cpu_workers, int threads_per_job, int* workers,
               int* threads) {
  const int hw = std::max(1u, std::thread::hardware_concurrency());
  if (cpu_workers <= 0 && threads_per_job <= 0) {
    *workers = std::max(1, hw / 16);
    *threads = std::max(1, hw / *workers);
  } else if (cpu_workers <= 0) {
    *threads = threads_per_job;
    *workers = std::max(1, hw / threads_per_job);
  } else if (threads_per_job <= 0) {
    *workers = cpu_workers;
    *threads = std::max(1, hw / cpu_workers);
  } else {
    *workers = cpu_workers;
    *threads = threads_per_job;
  }
}

}  // namespace

const char* ServerVersion() { return ATTNAUDIT_VERSION; }

absl::StatusOr<std::unique_ptr<AuditServer>> AuditServer::Start(
    AuditServerOptions options) {
  std::unique_ptr<AuditServer> server(new AuditServer());
  server->options_ = std::move(options);
  absl::Status s = server->Init();
  if (!s.ok()) {
    server->Shutdown();
    return s;
  }
  return server;
}

absl::Status AuditServer::Init() {
  const AuditServerOptions& o = options_;
  if (o.max_message_bytes < 4096 || o.max_message_bytes > INT32_MAX) {
    return absl::InvalidArgumentError(
        "--max-message-bytes: must be in [4096, 2147483647]");
  }
  if (!(o.interactive_reserve >= 0 && o.interactive_reserve < 1)) {
    return absl::InvalidArgumentError(
        "--interactive-reserve: must be in [0, 1)");
  }
  started_ = absl::Now();
  replica_id_ = o.replica_id.empty() ? HostName() : o.replica_id;
  ATTNAUDIT_RETURN_IF_ERROR(OpenAuth());
  ATTNAUDIT_ASSIGN_OR_RETURN(std::vector<std::unique_ptr<Device>> devices,
                             MakeDevices());
  ATTNAUDIT_RETURN_IF_ERROR(OpenMetrics(devices));
  ATTNAUDIT_RETURN_IF_ERROR(OpenStorage());
  SchedulerOptions sched;
  sched.devices = std::move(devices);
  sched.max_queued = o.queue_capacity;
  sched.max_queued_bytes = o.memory_budget_bytes;
  sched.interactive_reserved_bytes = static_cast<int64_t>(
      o.interactive_reserve * static_cast<double>(o.memory_budget_bytes));
  sched.sampled_promote_after = o.sampled_promote_after;
  sched.gang_backfill_runs = o.gang_backfill_runs;
  sched.listener = metrics_->scheduler_listener();
  ATTNAUDIT_ASSIGN_OR_RETURN(scheduler_, Scheduler::Create(std::move(sched)));
  executor_ =
      std::make_unique<BlockingExecutor>(o.blocking_threads, o.blocking_queue);
  if (o.accept_memfd_snapshots) {
    // At start, not per call: a server that cannot read memfds must not
    // run as if the operator had not asked for them.
    MemfdSnapshotOptions mo;
    mo.max_bytes = o.max_message_bytes;
    mo.max_mapped_bytes = o.memory_budget_bytes;
    absl::StatusOr<std::unique_ptr<MemfdSnapshots>> memfds =
        MemfdSnapshots::Create(mo);
    if (!memfds.ok()) {
      return absl::Status(memfds.status().code(),
                          absl::StrCat("--accept-memfd-snapshots: ",
                                       memfds.status().message()));
    }
    memfd_snapshots_ = *std::move(memfds);
  }
  if (o.pair_wait > absl::ZeroDuration()) {
    PairJoinerOptions po;
    po.replica_id = replica_id_;
    po.wait = o.pair_wait;
    po.max_side_bytes = o.pair_max_side_bytes;
    po.max_queued_bytes = 4 * o.pair_max_side_bytes;
    ATTNAUDIT_ASSIGN_OR_RETURN(
        pair_joiner_, PairJoiner::Create(po, WirePairFormats(), store_.get(),
                                         metrics_.get()));
  }
  ATTNAUDIT_ASSIGN_OR_RETURN(
      jobs_, JobService::Create(MakeJobOptions(), WireJobFormats(),
                                scheduler_.get(), spool_.get(), store_.get(),
                                metrics_.get(), *job_id_key_));
  service_ = std::make_unique<AuditServiceImpl>(MakeServiceOptions(),
                                                jobs_.get(), metrics_.get(),
                                                executor_.get(), auth_.get());
  // Follows the result feed into the watchers; a fleet also refuses a live
  // replica's --replica-id, then heartbeats.
  ATTNAUDIT_RETURN_IF_ERROR(jobs_->Start(service_->result_subscriber()));
  ATTNAUDIT_RETURN_IF_ERROR(StartGrpc());
  StartBackgroundThreads();
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::unique_ptr<Device>>>
AuditServer::MakeDevices() {
  if (!options_.devices.empty()) {
    for (const auto& d : options_.devices) {
      device_descriptions_.push_back(d->Describe());
    }
    return std::move(options_.devices);
  }
  DevicePoolOptions o;
  o.selection = options_.device_selection;
  PoolShape(options_.cpu_workers, options_.threads_per_job, &o.cpu_workers,
            &o.cpu_threads);
  o.gpu_memory_pool_bytes = options_.gpu_memory_pool_bytes;
  ATTNAUDIT_ASSIGN_OR_RETURN(DevicePool pool, MakeDevicePool(o));
  devices_note_ = pool.note;
  device_descriptions_ = pool.descriptions;
  cuda_built_ = pool.cuda_built;
  return std::move(pool.devices);
}

absl::Status AuditServer::OpenAuth() {
  const AuditServerOptions& o = options_;
  if (!o.auth_token_file.empty() && !o.auth_tokens.empty()) {
    return absl::InvalidArgumentError(
        "--auth-token-file: give the token file or the tokens, not both");
  }
  if (!o.auth_tokens.empty()) {
    // The embedded form: the same text, without a file to reload.
    absl::StatusOr<TenantTable> table =
        TenantTable::Parse(o.auth_tokens, o.tenant_quota);
    if (!table.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("auth_tokens: ", table.status().message()));
    }
    ATTNAUDIT_ASSIGN_OR_RETURN(auth_, Authenticator::CreateFromTable(
                                          *std::move(table), o.tenant_quota));
    return absl::OkStatus();
  }
  ATTNAUDIT_ASSIGN_OR_RETURN(
      auth_, Authenticator::Create(o.auth_token_file, o.tenant_quota));
  return absl::OkStatus();
}

absl::Status AuditServer::ReloadCredentials() {
  if (auth_ == nullptr) return absl::FailedPreconditionError("not started");
  ATTNAUDIT_RETURN_IF_ERROR(auth_->Reload());
  if (jobs_ != nullptr) jobs_->RecheckOpenCalls(*auth_);
  return absl::OkStatus();
}

absl::Status AuditServer::OpenMetrics(
    const std::vector<std::unique_ptr<Device>>& devices) {
  const AuditServerOptions& o = options_;
  MetricsOptions mo;
  mo.version = ServerVersion();
  mo.max_models = o.metrics_max_models;
  mo.max_layers = o.metrics_max_layers;
  mo.device_kinds = {"cpu"};
  for (const auto& d : devices) {
    if (std::find(mo.device_kinds.begin(), mo.device_kinds.end(), d->kind()) ==
        mo.device_kinds.end()) {
      mo.device_kinds.push_back(d->kind());
    }
  }
  std::vector<const Device*> pool;
  for (const auto& d : devices) {
    mo.device_names.push_back(d->name());
    pool.push_back(d.get());
  }
  // The devices live in the scheduler, which finishes every job before it
  // is destroyed: the probe never outlives them.
  mo.device_memory = [pool](absl::string_view name) -> int64_t {
    for (const Device* d : pool) {
      if (d->name() == name) return d->memory_in_use_bytes();
    }
    return 0;
  };
  mo.queue_capacity = o.queue_capacity;
  ATTNAUDIT_ASSIGN_OR_RETURN(metrics_, Metrics::Create(mo));
  if (o.metrics_listen.empty()) return absl::OkStatus();
  MetricsHttpOptions ho;
  ho.listen_address = o.metrics_listen;
  ho.tls_cert_file = o.metrics_tls_cert;
  ho.tls_key_file = o.metrics_tls_key;
  ho.token_file = o.metrics_token_file;
  Metrics* m = metrics_.get();
  ATTNAUDIT_ASSIGN_OR_RETURN(metrics_http_, MetricsHttpServer::Start(ho, [m] {
                               return m->RenderText();
                             }));
  metrics_port_ = metrics_http_->port();
  return absl::OkStatus();
}

absl::Status AuditServer::OpenStorage() {
  const AuditServerOptions& o = options_;
  ATTNAUDIT_RETURN_IF_ERROR(ProbeDataDir(o.data_dir));
  // Before anything in it is opened: one server per data directory.
  ATTNAUDIT_ASSIGN_OR_RETURN(data_dir_lock_, DataDirLock::Acquire(o.data_dir));
  StoreConfig config;
  config.url = o.store_url;
  config.data_dir = o.data_dir;
  config.options.max_age = o.retention_age > absl::ZeroDuration()
                               ? o.retention_age
                               : absl::InfiniteDuration();
  config.options.max_results = o.retention_count;
  config.options.sync = o.sync_storage;
  absl::StatusOr<std::unique_ptr<JobStore>> store = OpenJobStore(config);
  if (!store.ok()) {
    if (o.store_url != "sqlite") return store.status();
    return DataDirError(o.data_dir, store.status());
  }
  store_ = *std::move(store);
  // A fleet derives idempotent job ids from one secret, so that a retry
  // reaching another replica names the same job.
  absl::StatusOr<JobIdKey> key = store_->shared()
                                     ? JobIdKey::Shared(*store_)
                                     : JobIdKey::LoadOrCreate(o.data_dir);
  if (!key.ok()) {
    return store_->shared() ? key.status()
                            : DataDirError(o.data_dir, key.status());
  }
  job_id_key_ = *std::move(key);
  SpoolOptions spo;
  spo.sync = o.sync_storage;
  spo.max_payload_bytes = std::max<int64_t>(o.max_message_bytes, 1 << 20) * 2;
  absl::StatusOr<std::unique_ptr<Spool>> spool = Spool::Open(o.data_dir, spo);
  if (!spool.ok()) return DataDirError(o.data_dir, spool.status());
  spool_ = *std::move(spool);
  if (!o.store_audit_results) return absl::OkStatus();
  ResultJournal::Options jo;
  jo.max_bytes = o.result_journal_bytes;
  jo.sync = o.sync_storage;
  absl::StatusOr<std::unique_ptr<ResultJournal>> journal =
      ResultJournal::Open(o.data_dir, jo);
  if (!journal.ok()) return DataDirError(o.data_dir, journal.status());
  result_journal_ = *std::move(journal);
  return absl::OkStatus();
}

JobServiceOptions AuditServer::MakeJobOptions() const {
  const AuditServerOptions& o = options_;
  JobServiceOptions jobs;
  jobs.replica_id = replica_id_;
  jobs.limits = o.limits;
  jobs.threads_per_job = 0;  // each device's own default (MakeDevices)
  jobs.ring_gang = o.cp_ring_gang_always ? Admission::RingGang::kAlways
                                         : Admission::RingGang::kWhenNeeded;
  jobs.upload_budget_bytes = o.memory_budget_bytes;
  jobs.upload_tenant_share =
      auth_ != nullptr && auth_->enabled() ? o.upload_tenant_share : 1.0;
  jobs.upload_idle_timeout = o.upload_idle_timeout;
  jobs.store_audit_results = o.store_audit_results;
  jobs.fleet_lease = o.fleet_lease;
  jobs.result_journal = result_journal_.get();
  jobs.pair_joiner = pair_joiner_.get();
  return jobs;
}

ServiceOptions AuditServer::MakeServiceOptions() const {
  const AuditServerOptions& o = options_;
  ServiceOptions svc;
  svc.max_message_bytes = o.max_message_bytes;
  svc.max_stream_bytes =
      std::min(o.limits.max_total_bytes, o.memory_budget_bytes);
  svc.upload_idle_timeout = o.upload_idle_timeout;
  svc.upload_min_rate = o.upload_min_rate;
  svc.limits = o.limits;
  svc.queue_capacity = o.queue_capacity;
  svc.queued_bytes_budget = o.memory_budget_bytes;
  svc.watcher_buffer = o.watcher_buffer;
  svc.version = ServerVersion();
  svc.cuda_built = cuda_built_;
  svc.device_descriptions = device_descriptions_;
  svc.devices_note = devices_note_;
  svc.memfd_snapshots = memfd_snapshots_.get();
  return svc;
}

absl::Status AuditServer::StartGrpc() {
  const AuditServerOptions& o = options_;
  ATTNAUDIT_ASSIGN_OR_RETURN(std::shared_ptr<grpc::ServerCredentials> creds,
                             MakeCredentials(o.tls));
  static std::once_flag plugins_once;
  std::call_once(plugins_once, [] {
    grpc::EnableDefaultHealthCheckService(true);
    grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  });
  grpc::ServerBuilder builder;
  builder.AddListeningPort(o.listen, creds, &port_);
  builder.RegisterService(service_.get());
  builder.SetMaxReceiveMessageSize(static_cast<int>(o.max_message_bytes));
  // Reports are small, but cap them too (never unlimited).
  builder.SetMaxSendMessageSize(static_cast<int>(
      std::max<int64_t>(o.max_message_bytes, int64_t{64} << 20)));
  ApplyConnectionOptions(o.connection, &builder);
  // gRPC sets SO_REUSEPORT by default: a second server on the same port
  // would start "fine" and split the traffic. Fail loudly instead.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  server_ = builder.BuildAndStart();
  if (server_ == nullptr || port_ == 0) {
    return absl::UnavailableError(
        absl::StrCat("--listen: cannot listen on ", o.listen,
                     " (address in use or not local?)"));
  }
  if (grpc::HealthCheckServiceInterface* health =
          server_->GetHealthCheckService();
      health != nullptr) {
    health->SetServingStatus("", true);
    health->SetServingStatus(std::string(kRpcServiceName), true);
  }
  if (o.callback_wake_period > absl::ZeroDuration()) {
    waker_ = std::make_unique<CallbackQueueWaker>(
        server_->InProcessChannel(grpc::ChannelArguments()),
        o.callback_wake_period);
  }
  return absl::OkStatus();
}

void AuditServer::StartBackgroundThreads() {
  if (options_.resume_spool) {
    resume_thread_ = std::thread([this] {
      resumed_.store(jobs_->ResumeSpool(stop_, started_));
      resume_done_.Notify();
    });
  } else {
    resume_done_.Notify();
  }
  prune_thread_ = std::thread([this] { PruneLoop(); });
  if (options_.reclaim_after_idle > absl::ZeroDuration() ||
      options_.accept_memfd_snapshots) {
    reclaim_thread_ = std::thread([this] { ReclaimLoop(); });
  }
}

bool AuditServer::WaitForStop(absl::Duration d) {
  absl::MutexLock lock(&prune_mu_);
  prune_mu_.AwaitWithTimeout(
      absl::Condition(
          +[](std::atomic<bool>* stop) { return stop->load(); }, &stop_),
      d);
  return stop_.load();
}

// Snapshot buffers are kept in the heap for reuse while the server is
// busy (main.cc: mallopt), which makes ingest faster but would keep the
// process at its peak size forever. Once nothing has arrived and nothing
// is queued, running or uploading for reclaim_after_idle, freed memory is
// handed back (malloc_trim releases the free pages of every arena). Every
// 250 ms it also drops memfd mappings left idle (server/memfd).
void AuditServer::ReclaimLoop() {
  int64_t seen = -1;
  absl::Time last_active = absl::Now();
  bool dirty = false;
  while (!WaitForStop(absl::Milliseconds(250))) {
    // Busy or not: a client that went away must not pin its memfd.
    if (memfd_snapshots_ != nullptr) memfd_snapshots_->DropIdle();
    const SchedulerStats st = scheduler_->Stats();
    const int64_t requests = service_->requests_received();
    const bool busy = st.in_flight > 0 || st.queued[0] > 0 ||
                      st.queued[1] > 0 || service_->uploading_bytes() > 0;
    if (busy || requests != seen) {
      seen = requests;
      last_active = absl::Now();
      dirty = true;
      continue;
    }
    if (dirty && options_.reclaim_after_idle > absl::ZeroDuration() &&
        absl::Now() - last_active >= options_.reclaim_after_idle) {
      malloc_trim(0);
      dirty = false;
      ATTNAUDIT_LOG(debug, "idle: freed memory handed back");
    }
  }
}

void AuditServer::PruneLoop() {
  for (;;) {
    if (WaitForStop(options_.prune_interval)) return;
    absl::StatusOr<int64_t> pruned = store_->Prune(absl::Now());
    if (!pruned.ok()) {
      ATTNAUDIT_LOG(warn, "result store prune failed")
          .Kv("status", pruned.status());
    } else if (*pruned > 0) {
      ATTNAUDIT_LOG(info, "result store pruned").Kv("rows", *pruned);
    }
  }
}

bool AuditServer::WaitForResume(absl::Duration timeout) {
  return resume_done_.WaitForNotificationWithTimeout(timeout);
}

void AuditServer::Shutdown() {
  absl::MutexLock lock(&shutdown_mu_);
  if (shut_down_) return;
  shut_down_ = true;
  const absl::Time begin = absl::Now();
  if (server_ != nullptr) {
    // 1. Readiness off first, so load balancers stop sending work.
    if (auto* health = server_->GetHealthCheckService(); health != nullptr) {
      health->SetServingStatus(std::string(kRpcServiceName), false);
      health->SetServingStatus("", false);
    }
    if (options_.drain_delay > absl::ZeroDuration()) {
      ATTNAUDIT_LOG(info, "draining: NOT_SERVING, waiting for load balancers")
          .Kv("drain_delay_s", absl::ToDoubleSeconds(options_.drain_delay));
      absl::SleepFor(options_.drain_delay);
    }
  }
  // 2. Refuse new work; stop resuming the spool.
  stop_.store(true);
  if (jobs_ != nullptr) jobs_->StartDraining();
  // 3. Let queued and running jobs finish, up to the drain timeout. The
  //    JobService then retires this replica in a fleet (what the drain
  //    left unfinished is claimed by the others at once; it stays in the
  //    local spool too, for a restart), stops the result feed, and sends
  //    the interactive results still to be kept to the local journal
  //    (stored by the next start), not to a store that may be slow or away.
  if (jobs_ != nullptr || scheduler_ != nullptr) {
    absl::Status drained = jobs_ != nullptr
                               ? jobs_->Drain(options_.drain_timeout)
                               : scheduler_->Drain(options_.drain_timeout);
    ATTNAUDIT_LOG(info, "scheduler drained")
        .Kv("status", drained)
        .Kv("seconds", absl::ToDoubleSeconds(absl::Now() - begin));
  }
  // 4. End the endless streams, then stop gRPC (a short grace for calls
  //    being answered right now; the rest are cancelled).
  // Watchers resume on another replica (or after a restart) from the
  // last cursor they saw.
  if (service_ != nullptr) service_->CloseWatchers();
  waker_.reset();  // its pings go through server_
  if (server_ != nullptr) {
    server_->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
  }
  {
    absl::MutexLock prune_lock(&prune_mu_);  // wakes PruneLoop
  }
  if (resume_thread_.joinable()) resume_thread_.join();
  if (prune_thread_.joinable()) prune_thread_.join();
  if (reclaim_thread_.joinable()) reclaim_thread_.join();
  if (executor_ != nullptr) executor_->Shutdown();
  server_.reset();
  scheduler_.reset();  // joins the workers
  // Results the store still refuses stay spooled for the next start;
  // interactive results still queued are kept and answered (to the
  // watchers too, so the service goes after it).
  if (jobs_ != nullptr) jobs_->Shutdown();
  // No job ends any more: the sides not yet handled are dropped.
  if (pair_joiner_ != nullptr) pair_joiner_->Shutdown();
  service_.reset();
  jobs_.reset();
  pair_joiner_.reset();
  executor_.reset();
  spool_.reset();
  result_journal_.reset();
  store_.reset();
  data_dir_lock_.reset();  // the directory is free for the next server
  // 5. Metrics last: the final counts were scrapeable until now.
  metrics_http_.reset();
  metrics_.reset();
}

AuditServer::~AuditServer() { Shutdown(); }

}  // namespace attnaudit::server
