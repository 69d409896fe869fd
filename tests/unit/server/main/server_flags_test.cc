// attnaudit-server's flags: documented defaults, both value spellings, the
// dashed names (and their underscore form, absl's), errors that name the
// flag, and --help generated from the absl flag definitions.
#include "server/main/server_flags.h"

#include <string>
#include <vector>

#include "absl/flags/marshalling.h"
#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"

namespace attnaudit::server {
namespace {

TEST(ServerFlagsTest, DefaultsAreTheDocumentedOnes) {
  absl::StatusOr<ServerFlags> f = ParseServerFlags({});
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->listen, "localhost:50051");
  EXPECT_EQ(f->metrics_listen, "localhost:9464");
  EXPECT_EQ(f->data_dir, "./var/attnaudit");
  EXPECT_EQ(f->max_message_bytes, 256 * 1024 * 1024);
  EXPECT_EQ(f->drain_timeout, absl::Seconds(30));
  EXPECT_EQ(f->devices, "cpu");
  EXPECT_EQ(f->callback_wake_period, absl::Milliseconds(250));
  EXPECT_EQ(f->sampled_promote_after, absl::ZeroDuration());
  EXPECT_EQ(f->gang_backfill_runs, 2.0);
  EXPECT_FALSE(f->help);
}

TEST(ServerFlagsTest, SchedulerTuningFlagsParseAndCheckTheirRange) {
  absl::StatusOr<ServerFlags> f = ParseServerFlags(
      {"--sampled-promote-after", "2m", "--gang-backfill-runs=0.5"});
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->sampled_promote_after, absl::Minutes(2));
  EXPECT_EQ(f->gang_backfill_runs, 0.5);
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
  for (const char* ok : {"cpu", "all", "cuda:0", "cuda:1,cuda:0", "CUDA:3"}) {
    absl::StatusOr<ServerFlags> f = ParseServerFlags({"--devices", ok});
    ASSERT_TRUE(f.ok()) << ok << ": " << f.status();
    EXPECT_EQ(f->devices, ok);
  }
  for (const char* bad : {"gpu", "cuda:", "cuda:x", "cuda:0,cuda:0", "cuda:-1",
                          "cpu,cuda:0", ""}) {
    absl::StatusOr<ServerFlags> f = ParseServerFlags({"--devices", bad});
    ASSERT_FALSE(f.ok()) << bad;
    EXPECT_TRUE(absl::StartsWith(f.status().message(), "--devices"))
        << f.status();
  }
}

TEST(ServerFlagsTest, GpuMemoryPoolBytesTakesASize) {
  absl::StatusOr<ServerFlags> f =
      ParseServerFlags({"--gpu-memory-pool-bytes", "32GiB"});
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->gpu_memory_pool_bytes, int64_t{32} << 30);
  f = ParseServerFlags({});
  ASSERT_TRUE(f.ok());
  EXPECT_EQ(f->gpu_memory_pool_bytes, 0);
  f = ParseServerFlags({"--gpu-memory-pool-bytes", "lots"});
  ASSERT_FALSE(f.ok());
  EXPECT_TRUE(absl::StartsWith(f.status().message(), "--gpu-memory-pool-bytes"))
      << f.status();
}

TEST(ServerFlagsTest, ParsesBothSpellingsAndUnits) {
  absl::StatusOr<ServerFlags> f = ParseServerFlags(
      {"--listen", "0.0.0.0:6000", "--max-message-bytes=64MiB",
       "--memory-budget-bytes", "2G", "--retention-age=3d", "--drain-timeout",
       "1m30s", "--queue-interactive=5", "--cpu-workers", "3", "--tls-cert",
       "c.pem", "--tls-key=k.pem", "--max-connection-age", "0",
       "--callback-wake-period=0"});
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->listen, "0.0.0.0:6000");
  EXPECT_EQ(f->max_message_bytes, 64 << 20);
  EXPECT_EQ(f->memory_budget_bytes, int64_t{2} << 30);
  EXPECT_EQ(f->retention_age, absl::Hours(72));
  EXPECT_EQ(f->drain_timeout, absl::Seconds(90));
  EXPECT_EQ(f->queue_interactive, 5);
  EXPECT_EQ(f->cpu_workers, 3);
  EXPECT_EQ(f->tls_cert, "c.pem");
  EXPECT_EQ(f->tls_key, "k.pem");
  EXPECT_EQ(f->max_connection_age, absl::ZeroDuration());
  EXPECT_EQ(f->callback_wake_period, absl::ZeroDuration());
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
    absl::StatusOr<ServerFlags> f = ParseServerFlags(c.argv);
    ASSERT_FALSE(f.ok()) << c.argv[0];
    EXPECT_EQ(f.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(absl::StartsWith(f.status().message(), c.prefix))
        << f.status() << " expected prefix " << c.prefix;
  }
}

TEST(ServerFlagsTest, HelpListsEveryFlagWithItsDefault) {
  absl::StatusOr<ServerFlags> f = ParseServerFlags({"--help"});
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
  for (absl::string_view line : absl::StrSplit(help, '\n')) {
    if (!absl::StartsWith(line, "  --")) continue;
    absl::string_view name = line.substr(4, line.find(' ', 4) - 4);
    EXPECT_FALSE(absl::StrContains(name, "_")) << name;
  }
}

// The documented dashed names and absl's underscore names are the same
// flags, so existing command lines keep working.
TEST(ServerFlagsTest, DashesAndUnderscoresNameTheSameFlag) {
  absl::StatusOr<ServerFlags> dashed = ParseServerFlags(
      {"--metrics-listen", "127.0.0.1:0", "--max-connection-age-grace=1m",
       "--auth-token-file", "t"});
  absl::StatusOr<ServerFlags> underscored = ParseServerFlags(
      {"--metrics_listen", "127.0.0.1:0", "--max_connection_age_grace=1m",
       "--auth_token_file", "t"});
  ASSERT_TRUE(dashed.ok()) << dashed.status();
  ASSERT_TRUE(underscored.ok()) << underscored.status();
  for (const ServerFlags* f : {&*dashed, &*underscored}) {
    EXPECT_EQ(f->metrics_listen, "127.0.0.1:0");
    EXPECT_EQ(f->max_connection_age_grace, absl::Minutes(1));
    EXPECT_EQ(f->auth_token_file, "t");
  }
  // A value is never rewritten, dashes and all.
  absl::StatusOr<ServerFlags> f =
      ParseServerFlags({"--data-dir", "-my-dir", "--listen=a-b:1"});
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->data_dir, "-my-dir");
  EXPECT_EQ(f->listen, "a-b:1");
}

TEST(ServerFlagsTest, FairnessTenantAndMetricsSecurityFlags) {
  absl::StatusOr<ServerFlags> d = ParseServerFlags({});
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->interactive_reserve, 0.25);
  EXPECT_EQ(d->tenant_max_jobs, 0);
  EXPECT_EQ(d->tenant_max_bytes, 0);
  EXPECT_TRUE(d->metrics_token_file.empty());
  absl::StatusOr<ServerFlags> f = ParseServerFlags(
      {"--interactive-reserve", "0.5", "--tenant-max-jobs", "32",
       "--tenant-max-bytes", "1GiB", "--metrics-tls-cert", "m.pem",
       "--metrics-tls-key", "m.key", "--metrics-token-file", "m.token"});
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->interactive_reserve, 0.5);
  EXPECT_EQ(f->tenant_max_jobs, 32);
  EXPECT_EQ(f->tenant_max_bytes, int64_t{1} << 30);
  EXPECT_EQ(f->metrics_tls_cert, "m.pem");
  EXPECT_EQ(f->metrics_tls_key, "m.key");
  EXPECT_EQ(f->metrics_token_file, "m.token");
}

// Each parse starts from the defaults: a flag set by an earlier parse does
// not leak into the next.
TEST(ServerFlagsTest, ASwitchIsOnByItsNameAlone) {
  absl::StatusOr<ServerFlags> off = ParseServerFlags({});
  ASSERT_TRUE(off.ok());
  EXPECT_FALSE(off->accept_memfd_snapshots);
  // Alone, before another flag, and last.
  absl::StatusOr<ServerFlags> on =
      ParseServerFlags({"--accept-memfd-snapshots", "--listen", "127.0.0.1:0"});
  ASSERT_TRUE(on.ok()) << on.status();
  EXPECT_TRUE(on->accept_memfd_snapshots);
  EXPECT_EQ(on->listen, "127.0.0.1:0");
  on =
      ParseServerFlags({"--listen", "127.0.0.1:0", "--accept_memfd_snapshots"});
  ASSERT_TRUE(on.ok()) << on.status();
  EXPECT_TRUE(on->accept_memfd_snapshots);
  absl::StatusOr<ServerFlags> explicit_off =
      ParseServerFlags({"--accept-memfd-snapshots=false"});
  ASSERT_TRUE(explicit_off.ok()) << explicit_off.status();
  EXPECT_FALSE(explicit_off->accept_memfd_snapshots);
  absl::StatusOr<ServerFlags> bad =
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
    absl::StatusOr<ServerFlags> f = ParseServerFlags({"--listen", address});
    ASSERT_FALSE(f.ok()) << address;
    EXPECT_TRUE(absl::StartsWith(f.status().message(), "--listen: "))
        << f.status();
    EXPECT_NE(f.status().message().find(why), absl::string_view::npos)
        << address << ": " << f.status();
  }
  absl::StatusOr<ServerFlags> m =
      ParseServerFlags({"--metrics-listen", "localhost"});
  ASSERT_FALSE(m.ok());
  EXPECT_TRUE(absl::StartsWith(m.status().message(), "--metrics-listen: "));
  EXPECT_TRUE(ParseServerFlags({"--metrics-listen", ""}).ok());  // disabled
}

TEST(ServerFlagsTest, EveryParseStartsFromTheDefaults) {
  ASSERT_TRUE(ParseServerFlags({"--queue-sampled", "7"}).ok());
  absl::StatusOr<ServerFlags> f = ParseServerFlags({});
  ASSERT_TRUE(f.ok());
  EXPECT_EQ(f->queue_sampled, 1024);
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
