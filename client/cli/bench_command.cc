// attnaudit bench: a load generator against attnaudit-server. Closed loop
// (default): N client threads each send the same snapshot back to back
// (unary or stream). Open loop (--rate R): audits are due at R per second
// whatever the server does, sent by up to N threads, and each latency is
// counted from its due time, so a slow server shows as latency, not as a
// lower offered rate. Either way a warm-up and then a measured duration;
// prints audits/s, p50/p99 latency and the ingest rate (snapshot bytes
// delivered per second). Bounded: --duration is capped at one hour, every
// call has a deadline, and the threads stop on their own.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/cli/cli_flags.h"
#include "client/cli/commands.h"
#include "client/cli/remote_common.h"
#include "client/lib/memfd_snapshot.h"
#include "core/common/status_macros.h"
#include "proto/codec/codec.h"

namespace attnaudit::client::cli_internal {
namespace {

struct BenchCommand {
  std::string file;
  int64_t concurrency = 1;
  std::string duration = "10s";
  std::string warmup = "1s";
  std::string transport = "auto";
  int64_t requests = 0;  // 0: no cap
  double rate = 0;       // audits/s offered; 0: closed loop
  bool json = false;
  ConnectionFlags connection;
};

// What every worker sends. Unary: one request built once and shared
// read-only by every thread (serialising a const message concurrently is
// safe). Stream: the core snapshot, also only read.
struct Load {
  Snapshot snapshot;
  v1::AuditRequest request;
  // --transport memfd: the snapshot in shared memory, which `request`
  // names (kUnary then carries it).
  std::unique_ptr<client::MemfdSnapshot> memfd;
  int64_t bytes = 0;  // of the unary request
  Transport transport = Transport::kUnary;
};

// When the workers measure and stop, and how many audits they may issue.
struct Schedule {
  absl::Time start;  // of the warm-up
  absl::Time measure_from;
  absl::Time stop_at;
  int64_t max_requests = 0;  // 0: no cap
  double rate = 0;           // open loop: audit k is due at start + k / rate
};

// When the caller's next audit starts (closed loop: now) and the time its
// latency counts from (open loop: its due time, even when every thread was
// busy then). False when the schedule has ended.
bool NextAudit(const Schedule& schedule, std::atomic<int64_t>* next_due,
               absl::Time* due) {
  if (schedule.rate <= 0) {
    *due = absl::Now();
  } else {
    const int64_t k = next_due->fetch_add(1);
    *due =
        schedule.start + absl::Seconds(static_cast<double>(k) / schedule.rate);
    absl::SleepFor(*due - absl::Now());  // no-op when already late
  }
  return *due < schedule.stop_at;
}

struct WorkerStats {
  std::vector<double> latencies_ms;  // measured calls only
  double audit_seconds = 0;          // sum of the server's audit time (report)
  int64_t ok = 0;
  int64_t errors = 0;
  int64_t rejected = 0;  // RESOURCE_EXHAUSTED, retried after the hint
  absl::Time last_done = absl::InfinitePast();
  absl::Status first_error;
};

struct Summary {
  int64_t ok = 0, errors = 0, rejected = 0;
  double seconds = 0;  // measured wall time
  double per_second = 0, p50_ms = 0, p99_ms = 0, ingest_gbps = 0;
  // Per call: the server's audit time (from the report) and the rest of the
  // latency, i.e. sending, receiving, decoding and queueing the snapshot.
  double audit_ms = 0, transfer_ms = 0, transfer_gbps = 0;
  absl::Status first_error;
};

double Percentile(const std::vector<double>& sorted, double p) {
  if (sorted.empty()) return 0;
  // Nearest rank.
  const size_t rank = static_cast<size_t>(
      std::ceil(p / 100.0 * static_cast<double>(sorted.size())));
  return sorted[std::min(sorted.size(), std::max<size_t>(rank, 1)) - 1];
}

// Builds the unary request from the snapshot read from o.file and picks the
// transport (auto: what Client::Audit would use for this size). Errors are
// the server's (or the connection's).
absl::StatusOr<std::unique_ptr<Load>> PrepareLoad(Client* client,
                                                  const BenchCommand& o,
                                                  Snapshot snapshot) {
  auto load = std::make_unique<Load>();
  load->snapshot = std::move(snapshot);
  SnapshotToProto(load->snapshot, load->request.mutable_snapshot());
  load->bytes = static_cast<int64_t>(load->request.ByteSizeLong());
  if (!client->WaitForConnected(absl::Seconds(10))) {
    return absl::UnavailableError(
        absl::StrCat("cannot connect to ", client->options().address));
  }
  if (o.transport == "stream") {
    load->transport = Transport::kStream;
  } else if (o.transport == "memfd") {
    ATTNAUDIT_ASSIGN_OR_RETURN(load->memfd,
                               client::MemfdSnapshot::Create(load->snapshot));
    load->memfd->Describe(&load->request);
  } else if (o.transport == "auto") {
    ATTNAUDIT_ASSIGN_OR_RETURN(load->transport,
                               client->ChooseTransport(load->bytes));
  }
  if (load->transport == Transport::kStream) load->request.Clear();
  return load;
}

// One worker: audits back to back (or when due, open loop) until the
// schedule ends, the request cap is reached or ten calls failed.
void RunWorker(Client* client, const Load& load, const Schedule& schedule,
               std::atomic<int64_t>* issued, std::atomic<int64_t>* next_due,
               WorkerStats* st) {
  const CallOptions call;
  absl::Time t0;
  while (NextAudit(schedule, next_due, &t0)) {
    const bool measured = t0 >= schedule.measure_from;
    if (measured && schedule.max_requests > 0 &&
        issued->fetch_add(1) >= schedule.max_requests) {
      break;
    }
    absl::StatusOr<v1::AuditResponse> r =
        load.transport == Transport::kUnary
            ? client->AuditUnary(load.request, call)
            : client->AuditStream(load.snapshot, call);
    const absl::Time t1 = absl::Now();
    if (r.ok()) {
      if (!measured) continue;
      st->latencies_ms.push_back(absl::ToDoubleMilliseconds(t1 - t0));
      st->audit_seconds += r->report().provenance().timings().total_seconds();
      ++st->ok;
      st->last_done = t1;
    } else if (r.status().code() == absl::StatusCode::kResourceExhausted) {
      ++st->rejected;
      absl::SleepFor(std::clamp(RetryAfter(r.status()), absl::Milliseconds(1),
                                absl::Seconds(1)));
    } else {
      if (st->first_error.ok()) st->first_error = r.status();
      if (++st->errors >= 10) break;  // the server is not answering well
    }
  }
}

std::vector<WorkerStats> RunWorkers(Client* client, const Load& load,
                                    const Schedule& schedule,
                                    int64_t concurrency) {
  std::atomic<int64_t> issued{0};
  std::atomic<int64_t> next_due{0};
  std::vector<WorkerStats> stats(static_cast<size_t>(concurrency));
  std::vector<std::thread> threads;
  for (WorkerStats& st : stats) {
    threads.emplace_back([&, st = &st] {
      RunWorker(client, load, schedule, &issued, &next_due, st);
    });
  }
  for (std::thread& t : threads) t.join();
  return stats;
}

Summary Summarise(const std::vector<WorkerStats>& stats,
                  const Schedule& schedule, int64_t bytes) {
  Summary s;
  std::vector<double> all;
  double latency_seconds = 0;
  double audit_seconds = 0;
  absl::Time last = schedule.measure_from;
  for (const WorkerStats& st : stats) {
    all.insert(all.end(), st.latencies_ms.begin(), st.latencies_ms.end());
    for (double ms : st.latencies_ms) latency_seconds += ms / 1000;
    s.ok += st.ok;
    s.errors += st.errors;
    s.rejected += st.rejected;
    audit_seconds += st.audit_seconds;
    last = std::max(last, st.last_done);
    if (s.first_error.ok()) s.first_error = st.first_error;
  }
  std::sort(all.begin(), all.end());
  s.seconds =
      std::max(1e-9, absl::ToDoubleSeconds(std::max(last, schedule.stop_at) -
                                           schedule.measure_from));
  s.per_second = s.ok / s.seconds;
  s.p50_ms = Percentile(all, 50);
  s.p99_ms = Percentile(all, 99);
  s.ingest_gbps = static_cast<double>(s.ok) * bytes / s.seconds / 1e9;
  if (s.ok > 0) {
    s.audit_ms = audit_seconds / s.ok * 1e3;
    s.transfer_ms =
        std::max(0.0, (latency_seconds - audit_seconds) / s.ok * 1e3);
  }
  s.transfer_gbps = s.transfer_ms > 0 ? bytes / (s.transfer_ms / 1e3) / 1e9 : 0;
  return s;
}

void PrintSummary(const BenchCommand& o, const Load& load, const Summary& s) {
  const char* transport = load.memfd != nullptr                 ? "memfd"
                          : load.transport == Transport::kUnary ? "unary"
                                                                : "stream";
  const auto ll = [](int64_t v) { return static_cast<long long>(v); };
  if (o.json) {
    std::printf(
        "{\"file\": \"%s\", \"transport\": \"%s\", \"concurrency\": %lld, "
        "\"rate\": %.3f, "
        "\"snapshot_bytes\": %lld, \"seconds\": %.3f, \"audits\": %lld, "
        "\"audits_per_second\": %.3f, \"p50_ms\": %.3f, \"p99_ms\": %.3f, "
        "\"ingest_gb_per_second\": %.4f, \"audit_ms\": %.3f, "
        "\"transfer_ms\": %.3f, \"transfer_gb_per_second\": %.4f, "
        "\"errors\": %lld, \"rejected\": %lld}\n",
        o.file.c_str(), transport, ll(o.concurrency), o.rate, ll(load.bytes),
        s.seconds, ll(s.ok), s.per_second, s.p50_ms, s.p99_ms, s.ingest_gbps,
        s.audit_ms, s.transfer_ms, s.transfer_gbps, ll(s.errors),
        ll(s.rejected));
    return;
  }
  std::printf(
      "bench %s: transport=%s concurrency=%lld rate=%s snapshot=%.2f MiB "
      "measured=%.2fs\n"
      "  audits=%lld  audits/s=%.2f  p50=%.2f ms  p99=%.2f ms  "
      "ingest=%.3f GB/s\n"
      "  per audit: server audit %.2f ms + transfer/decode/queue %.2f ms "
      "(%.3f GB/s)\n"
      "  errors=%lld  rejected(retried)=%lld\n",
      o.file.c_str(), transport, ll(o.concurrency),
      o.rate > 0 ? absl::StrCat(o.rate, "/s").c_str() : "closed-loop",
      load.bytes / 1048576.0, s.seconds, ll(s.ok), s.per_second, s.p50_ms,
      s.p99_ms, s.ingest_gbps, s.audit_ms, s.transfer_ms, s.transfer_gbps,
      ll(s.errors), ll(s.rejected));
}

int RunBench(const BenchCommand& o) {
  const absl::Duration duration = CliDuration(o.duration);
  const absl::Duration warmup = CliDuration(o.warmup);
  if (duration <= absl::ZeroDuration() || duration > absl::Hours(1) ||
      warmup > absl::Minutes(10)) {
    return FailLocal("bench", absl::InvalidArgumentError(
                                  "--duration: must be in (0, 1h]; --warmup "
                                  "at most 10m"));
  }
  absl::StatusOr<Snapshot> snapshot = ReadSnapshotFile(o.file);
  if (!snapshot.ok()) return FailLocal("bench", snapshot.status());
  // The load generator counts refusals itself and waits their hint (the
  // workers' loop): no resends by gRPC's retry policy.
  ConnectionFlags connection = o.connection;
  connection.max_attempts = 1;
  absl::StatusOr<std::unique_ptr<Client>> client = Connect(connection);
  if (!client.ok()) return FailLocal("bench", client.status());
  absl::StatusOr<std::unique_ptr<Load>> load =
      PrepareLoad(client->get(), o, *std::move(snapshot));
  if (!load.ok()) return FailRemote("bench", o.connection, load.status());
  Schedule schedule;
  schedule.start = absl::Now();
  schedule.rate = o.rate;
  schedule.measure_from = schedule.start + warmup;
  schedule.stop_at = schedule.measure_from + duration;
  schedule.max_requests = o.requests;
  const Summary summary =
      Summarise(RunWorkers(client->get(), **load, schedule, o.concurrency),
                schedule, (*load)->bytes);
  PrintSummary(o, **load, summary);
  if (!summary.first_error.ok()) {
    std::cerr << "attnaudit bench: first error: "
              << DescribeError(summary.first_error) << "\n";
  }
  return summary.errors == 0 && summary.ok > 0 ? 0 : kExitError;
}

}  // namespace

void AddBenchCommand(CLI::App* app, int* exit_code) {
  auto [command, o] = AddCommand<BenchCommand>(
      app, exit_code, "bench", "load-generate against a server",
      "Closed-loop load: N threads audit FILE back to back for --warmup (not\n"
      "measured) then --duration (at most 1h) or until --requests audits.\n"
      "--rate R: open loop instead, audits due at R/s sent by up to N\n"
      "threads, latency counted from each audit's due time.\n"
      "Prints audits/s, p50/p99 latency, ingest GB/s (snapshot bytes per\n"
      "second of wall time), and per audit the server's audit time (from "
      "the\nreport) and the rest of the latency (transfer, decode, queue) "
      "with its\nGB/s. Exit 0 when every call succeeded, 2 otherwise.",
      &RunBench);
  command->add_option("FILE", o->file, "snapshot file")->required();
  command->add_option("--concurrency", o->concurrency, "client threads")
      ->capture_default_str()
      ->check(CLI::Range(1, 1024));
  command->add_option("--duration", o->duration, "measured time (at most 1h)")
      ->capture_default_str()
      ->check(DurationValidator());
  command->add_option("--warmup", o->warmup, "unmeasured lead-in (at most 10m)")
      ->capture_default_str()
      ->check(DurationValidator());
  command
      ->add_option("--transport", o->transport,
                   "auto, unary, stream or memfd (shared memory: a server on "
                   "this machine with --accept-memfd-snapshots)")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "unary", "stream", "memfd"},
                            CLI::ignore_case));
  command
      ->add_option("--requests", o->requests,
                   "stop after this many measured audits (0: no cap)")
      ->check(NonNegative());
  command
      ->add_option("--rate", o->rate,
                   "open loop: audits per second offered (0: closed loop)")
      ->check(CLI::Range(0.0, 1e6));
  command->add_flag("--json", o->json, "print one JSON object");
  AddConnectionFlags(command, &o->connection);
}

}  // namespace attnaudit::client::cli_internal
