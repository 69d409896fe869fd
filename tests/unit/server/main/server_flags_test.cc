// attnaudit-server's flags and the configuration they build: documented
// defaults, every flag reaching its option, both value spellings, the
// dashed names (and their underscore form, absl's), errors that name the
// flag, and --help generated from the absl flag definitions.
#include "server/main/server_flags.h"

#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/marshalling.h"
#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"
#include "server/device_pool/device_selection.h"

namespace attnaudit::server {
namespace {

constexpr int kInteractive = static_cast<int>(PriorityClass::kInteractive);
constexpr int kSampled = static_cast<int>(PriorityClass::kSampled);

// The server flags --help lists, dashed, without --help and --version.
std::set<std::string> HelpFlagNames() {
  std::set<std::string> names;
  for (absl::string_view line : absl::StrSplit(ServerHelpText(), '\n')) {
    if (!absl::StartsWith(line, "  --")) continue;
    names.emplace(line.substr(4, line.find(' ', 4) - 4));
  }
  names.erase("help");
  names.erase("version");
  return names;
}

TEST(ServerFlagsTest, DefaultsAreTheDocumentedOnes) {
  absl::StatusOr<ServerConfig> f = ParseServerFlags({});
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->options.listen, "localhost:50051");
  EXPECT_EQ(f->options.metrics_listen, "localhost:9464");
  EXPECT_EQ(f->options.data_dir, "./var/attnaudit");
  EXPECT_EQ(f->options.max_message_bytes, 256 * 1024 * 1024);
  EXPECT_EQ(f->options.drain_timeout, absl::Seconds(30));
  EXPECT_EQ(f->options.device_selection.mode, DeviceSelection::Mode::kCpu);
  EXPECT_EQ(f->options.callback_wake_period, absl::Milliseconds(250));
  // --sampled-promote-after 0 is "never", which the scheduler spells as
  // an infinite wait.
  EXPECT_EQ(f->options.sampled_promote_after, absl::InfiniteDuration());
  EXPECT_EQ(f->options.gang_backfill_runs, 2.0);
  EXPECT_EQ(f->log_level, "info");
  EXPECT_FALSE(f->help);
}

TEST(ServerFlagsTest, SchedulerTuningFlagsParseAndCheckTheirRange) {
  absl::StatusOr<ServerConfig> f = ParseServerFlags(
      {"--sampled-promote-after", "2m", "--gang-backfill-runs=0.5"});
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->options.sampled_promote_after, absl::Minutes(2));
  EXPECT_EQ(f->options.gang_backfill_runs, 0.5);
  for (const char* bad : {"-1", "2e6", "nan"}) {
    f = ParseServerFlags({"--gang-backfill-runs", bad});
    ASSERT_FALSE(f.ok()) << bad;
    EXPECT_TRUE(absl::StartsWith(f.status().message(), "--gang-backfill-runs"))
        << f.status();
  }
  f = ParseServerFlags({"--sampled-promote-after", "soon"});
  ASSERT_FALSE(f.ok());
  EXPECT_TRUE(absl::StartsWith(f.status().message(), "--sampled-promote-after"))
      << f.status();
}

// --devices is the GPU overlay's interface (deploy/k8s/overlays/gpu):
// cpu, all, or a list of GPUs; the pool it selects is device_pool_test's.
TEST(ServerFlagsTest, DevicesIsCpuAllOrAListOfGpus) {
  const std::pair<const char*, const char*> good[] = {
      {"cpu", "cpu"},       {"all", "all"},
      {"cuda:0", "cuda:0"}, {"cuda:1,cuda:0", "cuda:0,cuda:1"},
      {"CUDA:3", "cuda:3"},
  };
  for (const auto& [ok, canonical] : good) {
    absl::StatusOr<ServerConfig> f = ParseServerFlags({"--devices", ok});
    ASSERT_TRUE(f.ok()) << ok << ": " << f.status();
    EXPECT_EQ(DeviceSelectionText(f->options.device_selection), canonical);
  }
  for (const char* bad : {"gpu", "cuda:", "cuda:x", "cuda:0,cuda:0", "cuda:-1",
                          "cpu,cuda:0", ""}) {
    absl::StatusOr<ServerConfig> f = ParseServerFlags({"--devices", bad});
    ASSERT_FALSE(f.ok()) << bad;
    EXPECT_TRUE(absl::StartsWith(f.status().message(), "--devices"))
        << f.status();
  }
}

// Every flag reaches its place in the configuration, converted: each is
// set to a value other than its default and read back from the options.
TEST(ServerFlagsTest, EveryFlagReachesItsOption) {
  const std::vector<std::string> argv = {"--listen",
                                         "127.0.0.1:7000",
                                         "--metrics-listen",
                                         "127.0.0.1:7001",
                                         "--data-dir",
                                         "/d",
                                         "--store",
                                         "postgresql://u@h:5432/db",
                                         "--replica-id",
                                         "r1",
                                         "--store-audit-results=false",
                                         "--result-journal-bytes",
                                         "2MiB",
                                         "--fleet-lease",
                                         "20s",
                                         "--pair-wait",
                                         "3m",
                                         "--pair-max-side-bytes",
                                         "8MiB",
                                         "--cpu-workers",
                                         "3",
                                         "--threads-per-job",
                                         "5",
                                         "--devices",
                                         "cuda:1,cuda:0",
                                         "--gpu-memory-pool-bytes",
                                         "1GiB",
                                         "--max-message-bytes",
                                         "8MiB",
                                         "--queue-interactive",
                                         "7",
                                         "--queue-sampled",
                                         "9",
                                         "--memory-budget-bytes",
                                         "1GiB",
                                         "--interactive-reserve",
                                         "0.5",
                                         "--sampled-promote-after",
                                         "2m",
                                         "--gang-backfill-runs",
                                         "3",
                                         "--cp-ring-gang-always",
                                         "--upload-tenant-share",
                                         "0.75",
                                         "--upload-idle-timeout",
                                         "45s",
                                         "--upload-min-rate",
                                         "2MiB",
                                         "--tenant-max-jobs",
                                         "11",
                                         "--tenant-max-bytes",
                                         "3GiB",
                                         "--retention-age",
                                         "3d",
                                         "--retention-count",
                                         "12",
                                         "--drain-delay",
                                         "4s",
                                         "--drain-timeout",
                                         "50s",
                                         "--log-level",
                                         "debug",
                                         "--tls-cert",
                                         "c.pem",
                                         "--tls-key",
                                         "k.pem",
                                         "--tls-client-ca",
                                         "ca.pem",
                                         "--auth-token-file",
                                         "t",
                                         "--metrics-tls-cert",
                                         "mc.pem",
                                         "--metrics-tls-key",
                                         "mk.pem",
                                         "--metrics-token-file",
                                         "mt",
                                         "--keepalive-time",
                                         "3m",
                                         "--keepalive-timeout",
                                         "21s",
                                         "--keepalive-min-ping-interval",
                                         "31s",
                                         "--max-connection-age",
                                         "31m",
                                         "--max-connection-age-grace",
                                         "6m",
                                         "--max-connection-idle",
                                         "16m",
                                         "--callback-wake-period",
                                         "100ms",
                                         "--max-concurrent-streams",
                                         "17",
                                         "--accept-memfd-snapshots",
                                         "--metrics-max-models",
                                         "5",
                                         "--metrics-max-layers",
                                         "18"};
  // The command line above names every flag (a new one belongs here too).
  std::set<std::string> named;
  for (const std::string& arg : argv) {
    if (!absl::StartsWith(arg, "--")) continue;
    named.emplace(arg.substr(2, arg.find('=') - 2));
  }
  EXPECT_EQ(named, HelpFlagNames());

  absl::StatusOr<ServerConfig> c = ParseServerFlags(argv);
  ASSERT_TRUE(c.ok()) << c.status();
  const AuditServerOptions& o = c->options;
  EXPECT_EQ(o.listen, "127.0.0.1:7000");
  EXPECT_EQ(o.metrics_listen, "127.0.0.1:7001");
  EXPECT_EQ(o.data_dir, "/d");
  EXPECT_EQ(o.store_url, "postgresql://u@h:5432/db");
  EXPECT_EQ(o.replica_id, "r1");
  EXPECT_FALSE(o.store_audit_results);
  EXPECT_EQ(o.result_journal_bytes, int64_t{2} << 20);
  EXPECT_EQ(o.fleet_lease, absl::Seconds(20));
  EXPECT_EQ(o.pair_wait, absl::Minutes(3));
  EXPECT_EQ(o.pair_max_side_bytes, int64_t{8} << 20);
  EXPECT_EQ(o.cpu_workers, 3);
  EXPECT_EQ(o.threads_per_job, 5);
  EXPECT_EQ(o.device_selection.mode, DeviceSelection::Mode::kList);
  EXPECT_EQ(o.device_selection.gpus, (std::vector<int>{0, 1}));
  EXPECT_EQ(o.gpu_memory_pool_bytes, int64_t{1} << 30);
  EXPECT_EQ(o.max_message_bytes, int64_t{8} << 20);
  EXPECT_EQ(o.queue_capacity[kInteractive], 7);
  EXPECT_EQ(o.queue_capacity[kSampled], 9);
  EXPECT_EQ(o.memory_budget_bytes, int64_t{1} << 30);
  EXPECT_EQ(o.interactive_reserve, 0.5);
  EXPECT_EQ(o.sampled_promote_after, absl::Minutes(2));
  EXPECT_EQ(o.gang_backfill_runs, 3.0);
  EXPECT_TRUE(o.cp_ring_gang_always);
  EXPECT_EQ(o.upload_tenant_share, 0.75);
  EXPECT_EQ(o.upload_idle_timeout, absl::Seconds(45));
  EXPECT_EQ(o.upload_min_rate, int64_t{2} << 20);
  EXPECT_EQ(o.tenant_quota.max_jobs, 11);
  EXPECT_EQ(o.tenant_quota.max_bytes, int64_t{3} << 30);
  EXPECT_EQ(o.retention_age, absl::Hours(72));
  EXPECT_EQ(o.retention_count, 12);
  EXPECT_EQ(o.drain_delay, absl::Seconds(4));
  EXPECT_EQ(o.drain_timeout, absl::Seconds(50));
  EXPECT_EQ(c->log_level, "debug");
  EXPECT_EQ(o.tls.cert, "c.pem");
  EXPECT_EQ(o.tls.key, "k.pem");
  EXPECT_EQ(o.tls.client_ca, "ca.pem");
  EXPECT_EQ(o.auth_token_file, "t");
  EXPECT_EQ(o.metrics_tls_cert, "mc.pem");
  EXPECT_EQ(o.metrics_tls_key, "mk.pem");
  EXPECT_EQ(o.metrics_token_file, "mt");
  EXPECT_EQ(o.connection.keepalive_time, absl::Minutes(3));
  EXPECT_EQ(o.connection.keepalive_timeout, absl::Seconds(21));
  EXPECT_EQ(o.connection.keepalive_min_ping_interval, absl::Seconds(31));
  EXPECT_EQ(o.connection.max_connection_age, absl::Minutes(31));
  EXPECT_EQ(o.connection.max_connection_age_grace, absl::Minutes(6));
  EXPECT_EQ(o.connection.max_connection_idle, absl::Minutes(16));
  EXPECT_EQ(o.callback_wake_period, absl::Milliseconds(100));
  EXPECT_EQ(o.connection.max_concurrent_streams, 17);
  EXPECT_TRUE(o.accept_memfd_snapshots);
  EXPECT_EQ(o.metrics_max_models, 5);
  EXPECT_EQ(o.metrics_max_layers, 18);
}

// What no flag sets keeps AuditServerOptions' own default.
TEST(ServerFlagsTest, OptionsNoFlagSetsKeepTheirDefaults) {
  absl::StatusOr<ServerConfig> c = ParseServerFlags({"--queue-sampled", "9"});
  ASSERT_TRUE(c.ok()) << c.status();
  const AuditServerOptions defaults;
  EXPECT_EQ(c->options.watcher_buffer, defaults.watcher_buffer);
  EXPECT_EQ(c->options.prune_interval, defaults.prune_interval);
  EXPECT_EQ(c->options.reclaim_after_idle, defaults.reclaim_after_idle);
  EXPECT_TRUE(c->options.sync_storage);
  EXPECT_TRUE(c->options.devices.empty());
  EXPECT_EQ(c->options.queue_capacity[kInteractive], 64);
}

TEST(ServerFlagsTest, GpuMemoryPoolBytesTakesASize) {
  absl::StatusOr<ServerConfig> f =
      ParseServerFlags({"--gpu-memory-pool-bytes", "32GiB"});
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->options.gpu_memory_pool_bytes, int64_t{32} << 30);
  f = ParseServerFlags({});
  ASSERT_TRUE(f.ok());
  EXPECT_EQ(f->options.gpu_memory_pool_bytes, 0);
  f = ParseServerFlags({"--gpu-memory-pool-bytes", "lots"});
  ASSERT_FALSE(f.ok());
  EXPECT_TRUE(absl::StartsWith(f.status().message(), "--gpu-memory-pool-bytes"))
      << f.status();
}

TEST(ServerFlagsTest, ParsesBothSpellingsAndUnits) {
  absl::StatusOr<ServerConfig> f = ParseServerFlags(
      {"--listen", "0.0.0.0:6000", "--max-message-bytes=64MiB",
       "--memory-budget-bytes", "2G", "--retention-age=3d", "--drain-timeout",
       "1m30s", "--queue-interactive=5", "--cpu-workers", "3", "--tls-cert",
       "c.pem", "--tls-key=k.pem", "--max-connection-age", "0",
       "--callback-wake-period=0"});
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->options.listen, "0.0.0.0:6000");
  EXPECT_EQ(f->options.max_message_bytes, 64 << 20);
  EXPECT_EQ(f->options.memory_budget_bytes, int64_t{2} << 30);
  EXPECT_EQ(f->options.retention_age, absl::Hours(72));
  EXPECT_EQ(f->options.drain_timeout, absl::Seconds(90));
  EXPECT_EQ(f->options.queue_capacity[kInteractive], 5);
  EXPECT_EQ(f->options.cpu_workers, 3);
  EXPECT_EQ(f->options.tls.cert, "c.pem");
  EXPECT_EQ(f->options.tls.key, "k.pem");
  EXPECT_EQ(f->options.connection.max_connection_age, absl::ZeroDuration());
  EXPECT_EQ(f->options.callback_wake_period, absl::ZeroDuration());
}

// Every error starts with the flag it is about.
TEST(ServerFlagsTest, ErrorsNameTheFlag) {
  struct Case {
    std::vector<std::string> argv;
    const char* prefix;
  };
  const Case cases[] = {
      {{"--max-message-bytes", "0"}, "--max-message-bytes"},
      {{"--max-message-bytes", "3GiB"}, "--max-message-bytes"},  // > int
      {{"--max-message-bytes", "lots"}, "--max-message-bytes"},
      {{"--queue-sampled", "0"}, "--queue-sampled"},
      {{"--cpu-workers", "-1"}, "--cpu-workers"},
      {{"--drain-timeout", "soon"}, "--drain-timeout"},
      {{"--drain-timeout", "-5s"}, "--drain-timeout"},
      {{"--listen"}, "--listen"},
      {{"--tls-cert", "c.pem"}, "--tls-key"},
      {{"--tls-client-ca", "ca.pem"}, "--tls-client-ca"},
      {{"--bogus", "1"}, "unknown flag --bogus"},
      {{"--metrics-max-models", "0"}, "--metrics-max-models"},
      {{"--metrics_max_layers=x"}, "--metrics-max-layers"},
      {{"--retention-age", "3 days"}, "--retention-age"},
      {{"listen"}, "unexpected argument 'listen'"},
      {{"--interactive-reserve", "1"}, "--interactive-reserve"},
      {{"--interactive-reserve", "-0.1"}, "--interactive-reserve"},
      {{"--interactive-reserve", "half"}, "--interactive-reserve"},
      {{"--tenant-max-jobs", "-1"}, "--tenant-max-jobs"},
      {{"--tenant-max-bytes", "lots"}, "--tenant-max-bytes"},
      {{"--metrics-tls-cert", "c.pem"}, "--metrics-tls-key"},
      {{"--metrics-tls-key", "k.pem"}, "--metrics-tls-cert"},
      {{"--upload-min-rate", "0"}, "--upload-min-rate"},
      {{"--result-journal-bytes", "64KiB"}, "--result-journal-bytes"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<ServerConfig> f = ParseServerFlags(c.argv);
    ASSERT_FALSE(f.ok()) << c.argv[0];
    EXPECT_EQ(f.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(absl::StartsWith(f.status().message(), c.prefix))
        << f.status() << " expected prefix " << c.prefix;
  }
}

TEST(ServerFlagsTest, VersionIsASwitchOfItsOwn) {
  absl::StatusOr<ServerConfig> f = ParseServerFlags({"--version"});
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_TRUE(f->version);
  EXPECT_FALSE(f->help);
  EXPECT_FALSE(ParseServerFlags({})->version);
  EXPECT_TRUE(absl::StrContains(ServerHelpText(), "  --version"));
}

TEST(ServerFlagsTest, HelpListsEveryFlagWithItsDefault) {
  absl::StatusOr<ServerConfig> f = ParseServerFlags({"--help"});
  ASSERT_TRUE(f.ok());
  EXPECT_TRUE(f->help);
  const std::string help = ServerHelpText();
  for (const char* expected : {"--listen",
                               "[localhost:50051]",
                               "--metrics-listen",
                               "[localhost:9464]",
                               "--data-dir",
                               "[./var/attnaudit]",
                               "--cpu-workers",
                               "--threads-per-job",
                               "--devices",
                               "[cpu]",
                               "--gpu-memory-pool-bytes",
                               "--max-message-bytes",
                               "[256MiB]",
                               "--queue-interactive",
                               "[64]",
                               "--queue-sampled",
                               "[1024]",
                               "--memory-budget-bytes",
                               "[8GiB]",
                               "--retention-age",
                               "[7d]",
                               "--retention-count",
                               "--drain-timeout",
                               "[30s]",
                               "--log-level",
                               "[info]",
                               "--tls-cert",
                               "--tls-key",
                               "--tls-client-ca",
                               "--auth-token-file",
                               "--interactive-reserve",
                               "[0.25]",
                               "--tenant-max-jobs",
                               "--tenant-max-bytes",
                               "--metrics-tls-cert",
                               "--metrics-tls-key",
                               "--metrics-token-file",
                               "--keepalive-time",
                               "--max-connection-age",
                               "[30m]",
                               "--upload-min-rate",
                               "[1MiB]",
                               "--result-journal-bytes",
                               "[256MiB]",
                               "--help"}) {
    EXPECT_TRUE(absl::StrContains(help, expected)) << expected;
  }
  // Flag names are spelled with dashes, never underscores.
  for (const std::string& name : HelpFlagNames()) {
    EXPECT_FALSE(absl::StrContains(name, "_")) << name;
  }
}

// The documented dashed names and absl's underscore names are the same
// flags, so existing command lines keep working.
TEST(ServerFlagsTest, DashesAndUnderscoresNameTheSameFlag) {
  absl::StatusOr<ServerConfig> dashed = ParseServerFlags(
      {"--metrics-listen", "127.0.0.1:0", "--max-connection-age-grace=1m",
       "--auth-token-file", "t"});
  absl::StatusOr<ServerConfig> underscored = ParseServerFlags(
      {"--metrics_listen", "127.0.0.1:0", "--max_connection_age_grace=1m",
       "--auth_token_file", "t"});
  ASSERT_TRUE(dashed.ok()) << dashed.status();
  ASSERT_TRUE(underscored.ok()) << underscored.status();
  for (const ServerConfig* f : {&*dashed, &*underscored}) {
    EXPECT_EQ(f->options.metrics_listen, "127.0.0.1:0");
    EXPECT_EQ(f->options.connection.max_connection_age_grace, absl::Minutes(1));
    EXPECT_EQ(f->options.auth_token_file, "t");
  }
  // A value is never rewritten, dashes and all.
  absl::StatusOr<ServerConfig> f =
      ParseServerFlags({"--data-dir", "-my-dir", "--listen=a-b:1"});
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->options.data_dir, "-my-dir");
  EXPECT_EQ(f->options.listen, "a-b:1");
}

TEST(ServerFlagsTest, FairnessTenantAndMetricsSecurityFlags) {
  absl::StatusOr<ServerConfig> d = ParseServerFlags({});
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->options.interactive_reserve, 0.25);
  EXPECT_EQ(d->options.tenant_quota.max_jobs, 0);
  EXPECT_EQ(d->options.tenant_quota.max_bytes, 0);
  EXPECT_TRUE(d->options.metrics_token_file.empty());
  absl::StatusOr<ServerConfig> f = ParseServerFlags(
      {"--interactive-reserve", "0.5", "--tenant-max-jobs", "32",
       "--tenant-max-bytes", "1GiB", "--metrics-tls-cert", "m.pem",
       "--metrics-tls-key", "m.key", "--metrics-token-file", "m.token"});
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->options.interactive_reserve, 0.5);
  EXPECT_EQ(f->options.tenant_quota.max_jobs, 32);
  EXPECT_EQ(f->options.tenant_quota.max_bytes, int64_t{1} << 30);
  EXPECT_EQ(f->options.metrics_tls_cert, "m.pem");
  EXPECT_EQ(f->options.metrics_tls_key, "m.key");
  EXPECT_EQ(f->options.metrics_token_file, "m.token");
}

// Each parse starts from the defaults: a flag set by an earlier parse does
// not leak into the next.
TEST(ServerFlagsTest, ASwitchIsOnByItsNameAlone) {
  absl::StatusOr<ServerConfig> off = ParseServerFlags({});
  ASSERT_TRUE(off.ok());
  EXPECT_FALSE(off->options.accept_memfd_snapshots);
  // Alone, before another flag, and last.
  absl::StatusOr<ServerConfig> on =
      ParseServerFlags({"--accept-memfd-snapshots", "--listen", "127.0.0.1:0"});
  ASSERT_TRUE(on.ok()) << on.status();
  EXPECT_TRUE(on->options.accept_memfd_snapshots);
  EXPECT_EQ(on->options.listen, "127.0.0.1:0");
  on =
      ParseServerFlags({"--listen", "127.0.0.1:0", "--accept_memfd_snapshots"});
  ASSERT_TRUE(on.ok()) << on.status();
  EXPECT_TRUE(on->options.accept_memfd_snapshots);
  absl::StatusOr<ServerConfig> explicit_off =
      ParseServerFlags({"--accept-memfd-snapshots=false"});
  ASSERT_TRUE(explicit_off.ok()) << explicit_off.status();
  EXPECT_FALSE(explicit_off->options.accept_memfd_snapshots);
  absl::StatusOr<ServerConfig> bad =
      ParseServerFlags({"--accept-memfd-snapshots=maybe"});
  ASSERT_FALSE(bad.ok());
  EXPECT_TRUE(
      absl::StartsWith(bad.status().message(), "--accept-memfd-snapshots"))
      << bad.status();
  // Valued flags still need their value.
  EXPECT_FALSE(ParseServerFlags({"--listen"}).ok());
}

TEST(ServerFlagsTest, ListenAddressesNeedAHostAndAPort) {
  for (const char* ok : {"localhost:50051", "0.0.0.0:0", "[::1]:7",
                         "[::]:65535", "unix:/run/a.sock", "unix-abstract:x"}) {
    EXPECT_TRUE(ParseServerFlags({"--listen", ok}).ok()) << ok;
    EXPECT_TRUE(ParseServerFlags({"--metrics-listen", ok}).ok()) << ok;
  }
  // Without a port gRPC would bind 443.
  const std::pair<const char*, const char*> bad[] = {
      {"localhost", "has no port"},     {"0.0.0.0:", "is not a number"},
      {"host:http", "is not a number"}, {"host:65536", "is not a number"},
      {":50051", "has no host"},        {"::1:50051", "in brackets"},
      {"[::1]", "has no port"},         {"[::1", "without ']'"},
  };
  for (const auto& [address, why] : bad) {
    absl::StatusOr<ServerConfig> f = ParseServerFlags({"--listen", address});
    ASSERT_FALSE(f.ok()) << address;
    EXPECT_TRUE(absl::StartsWith(f.status().message(), "--listen: "))
        << f.status();
    EXPECT_NE(f.status().message().find(why), absl::string_view::npos)
        << address << ": " << f.status();
  }
  absl::StatusOr<ServerConfig> m =
      ParseServerFlags({"--metrics-listen", "localhost"});
  ASSERT_FALSE(m.ok());
  EXPECT_TRUE(absl::StartsWith(m.status().message(), "--metrics-listen: "));
  EXPECT_TRUE(ParseServerFlags({"--metrics-listen", ""}).ok());  // disabled
}

TEST(ServerFlagsTest, EveryParseStartsFromTheDefaults) {
  ASSERT_TRUE(ParseServerFlags({"--queue-sampled", "7"}).ok());
  absl::StatusOr<ServerConfig> f = ParseServerFlags({});
  ASSERT_TRUE(f.ok());
  EXPECT_EQ(f->options.queue_capacity[kSampled], 1024);
}

TEST(ServerFlagsTest, SizeAndDurationFormatsRoundTrip) {
  for (int64_t v :
       {int64_t{4096}, int64_t{1} << 20, int64_t{3} << 30, int64_t{1000}}) {
    ByteSize back;
    std::string error;
    ASSERT_TRUE(absl::ParseFlag(absl::UnparseFlag(ByteSize{v}), &back, &error))
        << error;
    EXPECT_EQ(back.bytes, v);
  }
  EXPECT_EQ(absl::UnparseFlag(ByteSize{int64_t{256} << 20}), "256MiB");
  for (absl::Duration d : {absl::Seconds(30), absl::Hours(24 * 7),
                           absl::Minutes(90), absl::ZeroDuration()}) {
    FlagDuration back;
    std::string error;
    const std::string text = absl::UnparseFlag(FlagDuration{d});
    ASSERT_TRUE(absl::ParseFlag(text, &back, &error)) << text << error;
    EXPECT_EQ(back.value, d);
  }
  EXPECT_EQ(absl::UnparseFlag(FlagDuration{absl::Hours(24 * 7)}), "7d");
  ByteSize size;
  FlagDuration duration;
  std::string error;
  EXPECT_FALSE(absl::ParseFlag("-1", &size, &error));
  EXPECT_FALSE(absl::ParseFlag("99999999999G", &size, &error));
  EXPECT_FALSE(absl::ParseFlag("-5s", &duration, &error));
  EXPECT_FALSE(absl::ParseFlag("inf", &duration, &error));
  EXPECT_FALSE(absl::ParseFlag("xd", &duration, &error));
  EXPECT_TRUE(absl::StartsWith(error, "'xd' is not a duration")) << error;
}

}  // namespace
}  // namespace attnaudit::server
