// The subcommands that talk to attnaudit-server: audit, submit, get, watch,
// cancel, caps. Connection flags: remote_common.h.
#include <algorithm>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "client/cli/cli_flags.h"
#include "client/cli/commands.h"
#include "client/cli/findings.h"
#include "client/cli/remote_common.h"
#include "client/cli/report_printer.h"
#include "proto/codec/codec.h"

namespace attnaudit::client::cli_internal {
namespace {

// get: the job is queued or running (not 3: that is INCONCLUSIVE).
constexpr int kExitNotFinished = 4;

// ---- audit

struct AuditCommand {
  std::string file;
  bool json = false;
  bool unary = false;
  bool stream = false;
  bool memfd = false;
  std::string priority;
  AuditFlags audit;
  ConnectionFlags connection;
};

int RunAuditCommand(const AuditCommand& o) {
  CallOptions call;
  call.priority = PriorityOf(o.priority);
  AuditOptionsToProto(ToAuditOptions(o.audit), &call.audit_options);
  absl::StatusOr<Snapshot> snapshot = ReadSnapshotFile(o.file);
  if (!snapshot.ok()) return FailLocal("audit", snapshot.status());
  absl::StatusOr<std::unique_ptr<Client>> client = Connect(o.connection);
  if (!client.ok()) return FailLocal("audit", client.status());
  const Transport transport = o.unary    ? Transport::kUnary
                              : o.stream ? Transport::kStream
                              : o.memfd  ? Transport::kMemfd
                                         : Transport::kAuto;
  absl::StatusOr<AuditReport> report =
      (*client)->Audit(*snapshot, call, transport);
  if (!report.ok()) {
    if (report.status().code() == absl::StatusCode::kInvalidArgument) {
      std::cerr << "attnaudit audit: server " << o.connection.addr
                << ": invalid snapshot: " << report.status().message() << "\n";
      return kExitError;
    }
    return FailRemote("audit", o.connection, report.status());
  }
  return PrintReport("audit", *report, o.json);
}

void AddAudit(CLI::App* app, int* exit_code) {
  auto [command, o] = AddCommand<AuditCommand>(
      app, exit_code, "audit", "audit a snapshot file on a server",
      "Prints the same report as `attnaudit check` (--json: the report as "
      "JSON).\nSnapshots past the server's unary limit are streamed. Exit 0 "
      "PASS,\n1 DRIFT, 2 invalid input or error.",
      &RunAuditCommand);
  command->add_option("FILE", o->file, "snapshot file")->required();
  command->add_flag("--json", o->json, "print the report as JSON");
  CLI::Option* unary =
      command->add_flag("--unary", o->unary, "always the unary call");
  CLI::Option* stream =
      command->add_flag("--stream", o->stream, "always the streaming call")
          ->excludes(unary);
  command
      ->add_flag("--memfd", o->memfd,
                 "hand the snapshot over in shared memory (a server on this "
                 "machine with --accept-memfd-snapshots)")
      ->excludes(unary)
      ->excludes(stream);
  AddPriorityFlag(command, &o->priority);
  AddAuditFlags(command, &o->audit);
  AddConnectionFlags(command, &o->connection);
}

// ---- submit

struct SubmitCommand {
  std::vector<std::string> files;
  std::string priority;
  std::string idempotency_key;
  std::string job_timeout;
  int64_t retries = 20;
  std::string cp_strategy;
  ConnectionFlags connection;
};

// Submits one prepared request, retrying a full queue after the server's
// hint at most `retries` times.
absl::StatusOr<v1::SubmitResponse> SubmitWithRetries(
    Client* client, const v1::SubmitRequest& request, int64_t retries) {
  for (int64_t attempt = 0;; ++attempt) {
    absl::StatusOr<v1::SubmitResponse> response = client->SubmitProto(request);
    if (response.ok() ||
        response.status().code() != absl::StatusCode::kResourceExhausted ||
        attempt >= retries) {
      return response;
    }
    absl::SleepFor(std::clamp(RetryAfter(response.status()),
                              absl::Milliseconds(50), absl::Seconds(10)));
  }
}

int RunSubmitCommand(const SubmitCommand& o) {
  SubmitOptions call;
  call.priority = PriorityOf(o.priority);
  call.idempotency_key = o.idempotency_key;
  if (!o.cp_strategy.empty()) {
    AuditOptions audit;
    audit.cp_strategy = CpStrategyOf(o.cp_strategy);
    AuditOptionsToProto(audit, &call.audit_options);
  }
  if (!call.idempotency_key.empty() && o.files.size() != 1) {
    return FailLocal("submit", absl::InvalidArgumentError(
                                   "--idempotency-key: only with a single "
                                   "FILE"));
  }
  if (!o.job_timeout.empty()) call.job_timeout = CliDuration(o.job_timeout);
  absl::StatusOr<std::unique_ptr<Client>> client = Connect(o.connection);
  if (!client.ok()) return FailLocal("submit", client.status());
  ProgressBar bar(o.files.size());
  size_t done = 0;
  size_t failed = 0;
  int64_t bytes = 0;
  bar.Update(0, 0, 0);
  for (const std::string& file : o.files) {
    absl::StatusOr<Snapshot> snapshot = ReadSnapshotFile(file);
    if (!snapshot.ok()) {  // local: the message names the file
      ++failed;
      std::cerr << "\nattnaudit submit: " << snapshot.status().message()
                << "\n";
      bar.Update(++done, bytes, failed);
      continue;
    }
    const v1::SubmitRequest request = MakeSubmitRequest(*snapshot, call);
    absl::StatusOr<v1::SubmitResponse> response =
        SubmitWithRetries(client->get(), request, o.retries);
    if (response.ok()) {
      std::cout << file << " " << response->job_id()
                << (response->deduplicated() ? " (deduplicated)" : "") << "\n"
                << std::flush;
      bytes += static_cast<int64_t>(request.ByteSizeLong());
    } else {
      ++failed;
      std::cerr << "\nattnaudit submit: " << file << ": server "
                << o.connection.addr << ": " << DescribeError(response.status())
                << "\n";
    }
    bar.Update(++done, bytes, failed);
  }
  return failed == 0 ? 0 : kExitError;
}

void AddSubmit(CLI::App* app, int* exit_code) {
  auto [command, o] = AddCommand<SubmitCommand>(
      app, exit_code, "submit", "submit snapshots as durable async jobs",
      "Prints \"FILE JOB_ID\" per accepted file on stdout; a progress bar "
      "goes to\nstderr. Full queues are retried after the server's hint. "
      "Exit 0 when every\nfile was accepted, else 2.",
      &RunSubmitCommand);
  command->add_option("FILE", o->files, "snapshot files (one or more)")
      ->required();
  AddPriorityFlag(command, &o->priority);
  command->add_option("--idempotency-key", o->idempotency_key,
                      "one file only: a retried submit returns the same job");
  command
      ->add_option("--job-timeout", o->job_timeout,
                   "the job's own timeout on the server (waiting + running)")
      ->check(DurationValidator());
  command
      ->add_option("--retries", o->retries,
                   "retries of a RESOURCE_EXHAUSTED answer per file")
      ->capture_default_str()
      ->check(NonNegative());
  AddCpStrategyFlag(command, &o->cp_strategy);
  AddConnectionFlags(command, &o->connection);
}

// ---- get

struct GetCommand {
  std::string job_id;
  bool json = false;
  std::string wait;
  ConnectionFlags connection;
};

bool Finished(v1::JobState state) {
  return state == v1::JOB_STATE_DONE || state == v1::JOB_STATE_FAILED ||
         state == v1::JOB_STATE_CANCELLED;
}

// GetResult, polled with backoff until the job finishes or `wait` passes.
absl::StatusOr<v1::JobResult> PollResult(Client* client,
                                         const std::string& job_id,
                                         absl::Duration wait) {
  const absl::Time until = absl::Now() + wait;
  for (absl::Duration pause = absl::Milliseconds(50);;
       pause = std::min(pause * 2, absl::Seconds(1))) {
    absl::StatusOr<v1::JobResult> result = client->GetResult(job_id);
    // UNAVAILABLE (a server restarting, a connection that failed) is waited
    // out like an unfinished job: the job is in the server's spool. Any
    // other error ends the wait.
    const bool retry = result.ok() ? !Finished(result->state())
                                   : absl::IsUnavailable(result.status());
    const absl::Duration left = until - absl::Now();
    if (!retry || left <= absl::ZeroDuration()) return result;
    absl::SleepFor(std::min(pause, left));  // the last try at the deadline
  }
}

int RunGetCommand(const GetCommand& o) {
  absl::StatusOr<std::unique_ptr<Client>> client = Connect(o.connection);
  if (!client.ok()) return FailLocal("get", client.status());
  absl::StatusOr<v1::JobResult> result =
      PollResult(client->get(), o.job_id,
                 o.wait.empty() ? absl::ZeroDuration() : CliDuration(o.wait));
  if (!result.ok()) return FailRemote("get", o.connection, result.status());
  if (o.json) {
    std::cout << ToJson(*result, /*pretty=*/true) << "\n";
  } else {
    std::cout << "job " << result->job_id() << ": "
              << StateName(result->state()) << "\n";
    if (result->has_error() && result->error().code() != 0) {
      std::cout << "error: "
                << absl::StatusCodeToString(
                       static_cast<absl::StatusCode>(result->error().code()))
                << ": " << result->error().message() << "\n";
    }
  }
  switch (result->state()) {
    case v1::JOB_STATE_DONE: {
      absl::StatusOr<AuditReport> report = ReportFromProto(result->report());
      if (!report.ok()) return FailRemote("get", o.connection, report.status());
      if (!o.json) std::cout << FormatReport(*report);
      return ExitCodeFor(report->verdict);
    }
    case v1::JOB_STATE_QUEUED:
    case v1::JOB_STATE_RUNNING:
      return kExitNotFinished;
    default:
      return kExitError;
  }
}

void AddGet(CLI::App* app, int* exit_code) {
  auto [command, o] = AddCommand<GetCommand>(
      app, exit_code, "get", "print a job's state and result",
      "Prints a job's state and, once DONE, its report. Exit: DONE 0 PASS /\n"
      "1 DRIFT / 2 INVALID / 3 INCONCLUSIVE; FAILED or CANCELLED 2; still\n"
      "QUEUED/RUNNING 4.",
      &RunGetCommand);
  command->add_option("JOB_ID", o->job_id, "the job id Submit returned")
      ->required();
  command->add_flag("--json", o->json, "print the JobResult as JSON");
  command
      ->add_option("--wait", o->wait,
                   "poll until the job finishes, at most this long (an "
                   "unreachable server is retried)")
      ->check(DurationValidator());
  AddConnectionFlags(command, &o->connection);
}

// ---- watch

struct WatchCommand {
  std::vector<std::string> verdicts;
  std::string model;
  int64_t layer = -1;
  std::string engine;
  std::string backend;
  int64_t count = 0;
  std::string duration;
  bool json = false;
  ConnectionFlags connection;
};

// One line per result: id, state, verdict, labels, and the reason: for a
// finished audit what fired (or the E-R margin of a PASS), else the error.
std::string WatchLine(const v1::JobResult& r) {
  std::string line = absl::StrCat(
      r.job_id(), " ", StateName(r.state()), " ",
      VerdictText(r.report().verdict()),
      " model=", r.labels().model().empty() ? "-" : r.labels().model(),
      " layer=",
      r.labels().has_layer() ? absl::StrCat(r.labels().layer())
                             : std::string("-"));
  if (r.has_report()) {
    absl::StatusOr<AuditReport> report = ReportFromProto(r.report());
    absl::StrAppend(&line, ": ",
                    report.ok() ? ReasonLine(*report)
                                : absl::StrCat("unreadable report: ",
                                               report.status().message()));
  }
  if (r.has_error() && r.error().code() != 0) {
    absl::StrAppend(&line, ": error ",
                    absl::StatusCodeToString(
                        static_cast<absl::StatusCode>(r.error().code())),
                    ": ", r.error().message());
  }
  return line;
}

v1::ResultFilter FilterOf(const WatchCommand& o) {
  v1::ResultFilter filter;
  for (const std::string& v : o.verdicts) {
    v1::Verdict verdict = v1::VERDICT_UNSPECIFIED;
    v1::Verdict_Parse(absl::StrCat("VERDICT_", absl::AsciiStrToUpper(v)),
                      &verdict);
    filter.add_verdicts(verdict);
  }
  filter.set_model(o.model);
  filter.set_engine(o.engine);
  filter.set_backend(o.backend);
  if (o.layer >= 0) filter.set_layer(o.layer);
  return filter;
}

int RunWatchCommand(const WatchCommand& o) {
  absl::StatusOr<std::unique_ptr<Client>> client = Connect(o.connection);
  if (!client.ok()) return FailLocal("watch", client.status());
  int64_t seen = 0;
  absl::Status s = (*client)->Watch(
      FilterOf(o),
      [&](const v1::JobResult& r) {
        std::cout << (o.json ? ToJson(r, /*pretty=*/false) : WatchLine(r))
                  << "\n"
                  << std::flush;
        return o.count <= 0 || ++seen < o.count;
      },
      o.duration.empty() ? absl::InfiniteDuration() : CliDuration(o.duration));
  if (!s.ok()) return FailRemote("watch", o.connection, s);
  return 0;
}

void AddWatch(CLI::App* app, int* exit_code) {
  auto [command, o] = AddCommand<WatchCommand>(
      app, exit_code, "watch", "stream finished results",
      "Prints one line per job that finishes from now on and matches the\n"
      "filter (--json: one JSON object per line). Ends after --count "
      "results,\nafter --duration, or when interrupted.",
      &RunWatchCommand);
  command
      ->add_option("--verdict", o->verdicts,
                   "only this verdict (repeatable): PASS, DRIFT, INVALID or "
                   "INCONCLUSIVE")
      ->check(CLI::IsMember({"PASS", "DRIFT", "INVALID", "INCONCLUSIVE"},
                            CLI::ignore_case));
  command->add_option("--model", o->model, "only this model label");
  command->add_option("--layer", o->layer, "only this layer")
      ->check(NonNegative());
  command->add_option("--engine", o->engine, "only this engine label");
  command->add_option("--backend", o->backend, "only this backend label");
  command->add_option("--count", o->count, "stop after this many results")
      ->check(NonNegative());
  command->add_option("--duration", o->duration, "stop after this long")
      ->check(DurationValidator());
  command->add_flag("--json", o->json, "one JSON object per line");
  AddConnectionFlags(command, &o->connection);
}

// ---- cancel

struct CancelCommand {
  std::string job_id;
  ConnectionFlags connection;
};

int RunCancelCommand(const CancelCommand& o) {
  absl::StatusOr<std::unique_ptr<Client>> client = Connect(o.connection);
  if (!client.ok()) return FailLocal("cancel", client.status());
  absl::StatusOr<v1::JobState> state = (*client)->Cancel(o.job_id);
  if (!state.ok()) return FailRemote("cancel", o.connection, state.status());
  std::cout << "job " << o.job_id << ": " << StateName(*state) << "\n";
  return 0;
}

void AddCancel(CLI::App* app, int* exit_code) {
  auto [command, o] = AddCommand<CancelCommand>(
      app, exit_code, "cancel", "cancel a job",
      "Cancels a queued or running job and prints its state.",
      &RunCancelCommand);
  command->add_option("JOB_ID", o->job_id, "the job to cancel")->required();
  AddConnectionFlags(command, &o->connection);
}

// ---- caps

struct CapsCommand {
  bool json = false;
  ConnectionFlags connection;
};

void PrintCapabilities(const v1::Capabilities& caps) {
  std::cout << "attnaudit-server " << caps.version() << " ("
            << caps.api_version() << ", fingerprints "
            << caps.fingerprint_version() << ")\nbackends:";
  for (const v1::Backend& b : caps.backends()) {
    std::cout << " " << b.name();
    if (!b.available()) {
      std::cout << " (unavailable"
                << (b.detail().empty() ? "" : ": " + b.detail()) << ")";
    }
  }
  std::cout << "\ndevices:";
  for (const v1::Device& d : caps.devices()) {
    std::cout << " " << d.id()
              << (d.state() == v1::DEVICE_STATE_BUSY ? "(busy)" : "");
    if (d.state() == v1::DEVICE_STATE_UNAVAILABLE) {
      std::cout << "(failed: " << d.failure() << ")";
    }
    if (d.kind() == v1::DEVICE_KIND_GPU) {
      std::cout << absl::StrFormat(" [%s, %.1f GiB, sm %s]", d.name(),
                                   d.memory_bytes() / 1073741824.0,
                                   d.compute_capability());
    }
  }
  const v1::Limits& l = caps.limits();
  std::cout << absl::StrFormat(
      "\nlimits: unary %.1f MiB, stream %.1f MiB (chunks %.1f MiB), tensor "
      "%.1f MiB\n        batch %d, queries %d, heads %d, head_dim %d, "
      "page_size %d, blocks %d, context %d, cp %d, vocab %d\n"
      "queues: interactive %d, sampled %d, queued bytes %.1f MiB\n",
      l.max_receive_message_bytes() / 1048576.0,
      l.max_stream_bytes() / 1048576.0, l.recommended_chunk_bytes() / 1048576.0,
      l.max_tensor_bytes() / 1048576.0, l.max_batch(), l.max_queries(),
      l.max_heads(), l.max_head_dim(), l.max_page_size(), l.max_blocks(),
      l.max_context(), l.max_cp_world_size(), l.max_vocab(),
      l.interactive_queue_capacity(), l.sampled_queue_capacity(),
      l.queued_bytes_budget() / 1048576.0);
  std::cout << "memfd snapshots: "
            << (caps.accepts_memfd_snapshots()
                    ? "accepted (audit --memfd, from this machine)"
                    : "not accepted")
            << "\n";
}

int RunCapsCommand(const CapsCommand& o) {
  absl::StatusOr<std::unique_ptr<Client>> client = Connect(o.connection);
  if (!client.ok()) return FailLocal("caps", client.status());
  absl::StatusOr<v1::Capabilities> caps = (*client)->Capabilities();
  if (!caps.ok()) return FailRemote("caps", o.connection, caps.status());
  if (o.json) {
    std::cout << ToJson(*caps, /*pretty=*/true) << "\n";
  } else {
    PrintCapabilities(*caps);
  }
  return 0;
}

void AddCaps(CLI::App* app, int* exit_code) {
  auto [command, o] = AddCommand<CapsCommand>(
      app, exit_code, "caps", "print a server's capabilities",
      "Prints the server's version, backends, devices and limits.",
      &RunCapsCommand);
  command->add_flag("--json", o->json, "print the Capabilities as JSON");
  AddConnectionFlags(command, &o->connection);
}

}  // namespace

void AddRemoteCommands(CLI::App* app, int* exit_code) {
  AddAudit(app, exit_code);
  AddSubmit(app, exit_code);
  AddGet(app, exit_code);
  AddWatch(app, exit_code);
  AddCancel(app, exit_code);
  AddCaps(app, exit_code);
}

}  // namespace attnaudit::client::cli_internal
