// attnaudit bench: a closed-loop load generator against attnaudit-server.
// N client threads each send the same snapshot back to back (unary or
// stream) for a warm-up and then a measured duration, and the command
// prints audits/s, p50/p99 latency and the ingest rate (snapshot bytes
// delivered per second). Bounded: --duration is capped at one hour, every
// call has a deadline, and the threads stop on their own.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "client/cli/args.h"
#include "client/cli/commands.h"
#include "client/cli/remote_common.h"
#include "proto/codec/codec.h"

namespace attnaudit::cli {
namespace {

constexpr char kBenchHelp[] =
    "usage: attnaudit bench FILE [--addr HOST:PORT] [--concurrency N]\n"
    "                       [--duration DUR] [--warmup DUR]\n"
    "                       [--transport auto|unary|stream] [--requests N]\n"
    "                       [--json] [connection flags]\n"
    "Closed-loop load: N threads (default 1) audit FILE back to back for\n"
    "--warmup (default 1s, not measured) then --duration (default 10s, at\n"
    "most 1h) or until --requests audits. Prints audits/s, p50/p99 latency,\n"
    "ingest GB/s (snapshot bytes per second of wall time), and per audit the\n"
    "server's audit time (from the report) and the rest of the latency\n"
    "(transfer, decode, queue) with its GB/s. Exit 0 when every call\n"
    "succeeded, 2 otherwise.\n";

struct WorkerStats {
  std::vector<double> latencies_ms;  // measured calls only
  double audit_seconds = 0;          // sum of the server's audit time (report)
  int64_t ok = 0;
  int64_t errors = 0;
  int64_t rejected = 0;  // RESOURCE_EXHAUSTED, retried after the hint
  absl::Time last_done = absl::InfinitePast();
  absl::Status first_error;
};

double Percentile(std::vector<double>* sorted, double p) {
  if (sorted->empty()) return 0;
  // Nearest rank.
  const size_t rank = static_cast<size_t>(
      std::ceil(p / 100.0 * static_cast<double>(sorted->size())));
  return (*sorted)[std::min(sorted->size(), std::max<size_t>(rank, 1)) - 1];
}

}  // namespace

int RunBench(const Argv& argv) {
  Args args(WithConnectionFlags(
                {"concurrency", "duration", "warmup", "transport", "requests"}),
            WithConnectionBoolFlags({"json"}));
  if (absl::Status st = args.Parse(argv); !st.ok()) {
    std::cerr << "attnaudit bench: " << st.message() << "\n"
              << kBenchHelp << kConnectionHelp;
    return kExitError;
  }
  if (args.Has("help")) {
    std::cout << kBenchHelp << kConnectionHelp;
    return 0;
  }
  if (args.positional().size() != 1) {
    std::cerr << kBenchHelp << kConnectionHelp;
    return kExitError;
  }
  auto fail = [](const absl::Status& s) {
    std::cerr << "attnaudit bench: " << DescribeError(s) << "\n";
    return kExitError;
  };
  absl::StatusOr<int64_t> concurrency = args.GetInt("concurrency", 1);
  if (!concurrency.ok()) return fail(concurrency.status());
  if (*concurrency < 1 || *concurrency > 1024) {
    return fail(
        absl::InvalidArgumentError("--concurrency: must be in [1, 1024]"));
  }
  absl::StatusOr<int64_t> max_requests = args.GetInt("requests", 0);
  if (!max_requests.ok()) return fail(max_requests.status());
  absl::StatusOr<absl::Duration> duration =
      ParseCliDuration("duration", args.Get("duration", "10s"));
  if (!duration.ok()) return fail(duration.status());
  absl::StatusOr<absl::Duration> warmup =
      ParseCliDuration("warmup", args.Get("warmup", "1s"));
  if (!warmup.ok()) return fail(warmup.status());
  if (*duration <= absl::ZeroDuration() || *duration > absl::Hours(1) ||
      *warmup > absl::Minutes(10)) {
    return fail(absl::InvalidArgumentError(
        "--duration: must be in (0, 1h]; --warmup at most 10m"));
  }
  const std::string transport_name =
      absl::AsciiStrToLower(args.Get("transport", "auto"));
  if (transport_name != "auto" && transport_name != "unary" &&
      transport_name != "stream") {
    return fail(absl::InvalidArgumentError(
        "--transport: must be auto, unary or stream"));
  }

  absl::StatusOr<std::unique_ptr<client::Client>> client =
      ConnectFromArgs(args);
  if (!client.ok()) return fail(client.status());
  absl::StatusOr<Snapshot> snapshot = ReadSnapshotFile(args.positional()[0]);
  if (!snapshot.ok()) return fail(snapshot.status());
  // Unary: one request built once and shared read-only by every thread
  // (serialising a const message concurrently is safe). Stream: the core
  // snapshot, also only read.
  v1::AuditRequest request;
  SnapshotToProto(*snapshot, request.mutable_snapshot());
  const int64_t bytes = static_cast<int64_t>(request.ByteSizeLong());
  if (!(*client)->WaitForConnected(absl::Seconds(10))) {
    return fail(absl::UnavailableError(
        absl::StrCat("cannot connect to ", (*client)->options().address)));
  }
  client::Transport transport = client::Transport::kUnary;
  if (transport_name == "stream") {
    transport = client::Transport::kStream;
  } else if (transport_name == "auto") {
    absl::StatusOr<client::Transport> t = (*client)->ChooseTransport(bytes);
    if (!t.ok()) return fail(t.status());
    transport = *t;
  }
  if (transport == client::Transport::kStream) request.Clear();

  const absl::Time start = absl::Now();
  const absl::Time measure_from = start + *warmup;
  const absl::Time stop_at = measure_from + *duration;
  std::atomic<int64_t> issued{0};
  std::vector<WorkerStats> stats(static_cast<size_t>(*concurrency));
  std::vector<std::thread> threads;
  for (int64_t w = 0; w < *concurrency; ++w) {
    threads.emplace_back([&, w] {
      WorkerStats& st = stats[static_cast<size_t>(w)];
      client::CallOptions call;
      while (absl::Now() < stop_at) {
        const absl::Time t0 = absl::Now();
        const bool measured = t0 >= measure_from;
        if (measured && *max_requests > 0 &&
            issued.fetch_add(1) >= *max_requests) {
          break;
        }
        absl::StatusOr<v1::AuditResponse> r =
            transport == client::Transport::kUnary
                ? (*client)->AuditUnary(request, call)
                : (*client)->AuditStream(*snapshot, call);
        const absl::Time t1 = absl::Now();
        if (r.ok()) {
          if (measured) {
            st.latencies_ms.push_back(absl::ToDoubleMilliseconds(t1 - t0));
            st.audit_seconds +=
                r->report().provenance().timings().total_seconds();
            ++st.ok;
            st.last_done = t1;
          }
        } else if (r.status().code() == absl::StatusCode::kResourceExhausted) {
          ++st.rejected;
          absl::SleepFor(std::clamp(client::RetryAfter(r.status()),
                                    absl::Milliseconds(1), absl::Seconds(1)));
        } else {
          if (st.first_error.ok()) st.first_error = r.status();
          ++st.errors;
          if (st.errors >= 10) break;  // the server is not answering well
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();

  std::vector<double> all;
  int64_t ok = 0, errors = 0, rejected = 0;
  double audit_seconds = 0, latency_seconds = 0;
  absl::Time last = measure_from;
  absl::Status first_error;
  for (WorkerStats& st : stats) {
    all.insert(all.end(), st.latencies_ms.begin(), st.latencies_ms.end());
    ok += st.ok;
    audit_seconds += st.audit_seconds;
    for (double ms : st.latencies_ms) latency_seconds += ms / 1000;
    errors += st.errors;
    rejected += st.rejected;
    last = std::max(last, st.last_done);
    if (first_error.ok()) first_error = st.first_error;
  }
  std::sort(all.begin(), all.end());
  const double seconds = std::max(
      1e-9, absl::ToDoubleSeconds(std::max(last, stop_at) - measure_from));
  const double per_s = ok / seconds;
  const double gbps = static_cast<double>(ok) * bytes / seconds / 1e9;
  // Per call: the server's audit time (from the report) and the rest of the
  // latency, i.e. sending, receiving, decoding and queueing the snapshot.
  const double audit_ms = ok ? audit_seconds / ok * 1e3 : 0;
  const double transfer_ms =
      ok ? std::max(0.0, (latency_seconds - audit_seconds) / ok * 1e3) : 0;
  const double transfer_gbps =
      transfer_ms > 0 ? bytes / (transfer_ms / 1e3) / 1e9 : 0;
  const char* tname =
      transport == client::Transport::kUnary ? "unary" : "stream";
  if (args.Has("json")) {
    std::printf(
        "{\"file\": \"%s\", \"transport\": \"%s\", \"concurrency\": %lld, "
        "\"snapshot_bytes\": %lld, \"seconds\": %.3f, \"audits\": %lld, "
        "\"audits_per_second\": %.3f, \"p50_ms\": %.3f, \"p99_ms\": %.3f, "
        "\"ingest_gb_per_second\": %.4f, \"audit_ms\": %.3f, "
        "\"transfer_ms\": %.3f, \"transfer_gb_per_second\": %.4f, "
        "\"errors\": %lld, \"rejected\": %lld}\n",
        args.positional()[0].c_str(), tname,
        static_cast<long long>(*concurrency), static_cast<long long>(bytes),
        seconds, static_cast<long long>(ok), per_s, Percentile(&all, 50),
        Percentile(&all, 99), gbps, audit_ms, transfer_ms, transfer_gbps,
        static_cast<long long>(errors), static_cast<long long>(rejected));
  } else {
    std::printf(
        "bench %s: transport=%s concurrency=%lld snapshot=%.2f MiB "
        "measured=%.2fs\n"
        "  audits=%lld  audits/s=%.2f  p50=%.2f ms  p99=%.2f ms  "
        "ingest=%.3f GB/s\n"
        "  per audit: server audit %.2f ms + transfer/decode/queue %.2f ms "
        "(%.3f GB/s)\n"
        "  errors=%lld  rejected(retried)=%lld\n",
        args.positional()[0].c_str(), tname,
        static_cast<long long>(*concurrency), bytes / 1048576.0, seconds,
        static_cast<long long>(ok), per_s, Percentile(&all, 50),
        Percentile(&all, 99), gbps, audit_ms, transfer_ms, transfer_gbps,
        static_cast<long long>(errors), static_cast<long long>(rejected));
  }
  if (!first_error.ok()) {
    std::cerr << "attnaudit bench: first error: " << DescribeError(first_error)
              << "\n";
  }
  return errors == 0 && ok > 0 ? 0 : kExitError;
}

}  // namespace attnaudit::cli
