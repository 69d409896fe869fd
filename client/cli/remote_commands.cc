// The subcommands that talk to attnaudit-server: audit, submit, get, watch,
// cancel, caps. Connection flags: remote_common.h.
#include <google/protobuf/util/json_util.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "client/cli/args.h"
#include "client/cli/commands.h"
#include "client/cli/remote_common.h"
#include "client/cli/report_printer.h"
#include "proto/codec/codec.h"

namespace attnaudit::cli {
namespace {

constexpr int kExitNotFinished = 3;  // get: the job is queued or running

constexpr char kAuditHelp[] =
    "usage: attnaudit audit FILE [--json] [--unary | --stream]\n"
    "                       [--priority interactive|sampled]\n"
    "                       [--out-tol X] [--lse-tol X] [--logprob-tol X]\n"
    "                       [--kv-fingerprint] [connection flags]\n"
    "Audits a snapshot file on a server and prints the same report as\n"
    "`attnaudit check` (--json: the report as JSON). Snapshots past the\n"
    "server's unary limit are streamed. Exit 0 PASS, 1 DRIFT, 2 invalid\n"
    "input or error.\n";
constexpr char kSubmitHelp[] =
    "usage: attnaudit submit FILE... [--priority sampled|interactive]\n"
    "                        [--idempotency-key KEY] [--job-timeout DUR]\n"
    "                        [--retries N] [connection flags]\n"
    "Submits each file as a durable async job and prints \"FILE JOB_ID\" per\n"
    "line on stdout; a progress bar goes to stderr. Full queues are retried\n"
    "after the server's hint, at most --retries times (default 20).\n"
    "--idempotency-key (one file only) makes a retried submit return the\n"
    "same job. Exit 0 when every file was accepted, else 2.\n";
constexpr char kGetHelp[] =
    "usage: attnaudit get JOB_ID [--json] [--wait DUR] [connection flags]\n"
    "Prints a job's state and, once DONE, its report. --wait polls until the\n"
    "job finishes (at most DUR). Exit: DONE 0 PASS / 1 DRIFT / 2 INVALID;\n"
    "FAILED or CANCELLED 2; still QUEUED/RUNNING 3.\n";
constexpr char kWatchHelp[] =
    "usage: attnaudit watch [--verdict PASS|DRIFT|INVALID]... [--model M]\n"
    "                       [--layer N] [--engine E] [--backend B]\n"
    "                       [--count N] [--duration DUR] [--json]\n"
    "                       [connection flags]\n"
    "Prints one line per job that finishes from now on and matches the\n"
    "filter (--json: one JSON object per line). Ends after --count results,\n"
    "after --duration, or when interrupted.\n";
constexpr char kCancelHelp[] =
    "usage: attnaudit cancel JOB_ID [connection flags]\n"
    "Cancels a queued or running job and prints its state.\n";
constexpr char kCapsHelp[] =
    "usage: attnaudit caps [--json] [connection flags]\n"
    "Prints the server's version, backends, devices and limits.\n";

}  // namespace

int RunAudit(const Argv& argv) {
  Args args(
      WithConnectionFlags({"priority", "out-tol", "lse-tol", "logprob-tol"}),
      WithConnectionBoolFlags({"json", "unary", "stream", "kv-fingerprint"}));
  int code = 0;
  if (!ParseCommand("audit", kAuditHelp, &args, argv, &code)) return code;
  if (args.positional().size() != 1 ||
      (args.Has("unary") && args.Has("stream"))) {
    std::cerr << kAuditHelp << kConnectionHelp;
    return kExitError;
  }
  client::CallOptions call;
  absl::StatusOr<v1::Priority> priority = ParsePriority(args);
  if (!priority.ok()) return Fail("audit", priority.status());
  call.priority = *priority;
  if (absl::Status s = ParseTolerances(args, &call.audit_options); !s.ok()) {
    return Fail("audit", s);
  }
  absl::StatusOr<std::unique_ptr<client::Client>> client =
      ConnectFromArgs(args);
  if (!client.ok()) return Fail("audit", client.status());
  absl::StatusOr<Snapshot> snapshot = ReadSnapshotFile(args.positional()[0]);
  if (!snapshot.ok()) return Fail("audit", snapshot.status());
  const client::Transport transport =
      args.Has("unary")    ? client::Transport::kUnary
      : args.Has("stream") ? client::Transport::kStream
                           : client::Transport::kAuto;
  absl::StatusOr<AuditReport> report =
      (*client)->Audit(*snapshot, call, transport);
  if (!report.ok()) {
    if (report.status().code() == absl::StatusCode::kInvalidArgument) {
      std::cerr << "attnaudit audit: invalid snapshot: "
                << report.status().message() << "\n";
      return kExitError;
    }
    return Fail("audit", report.status());
  }
  if (args.Has("json")) {
    absl::StatusOr<std::string> json = ReportToJson(*report);
    if (!json.ok()) return Fail("audit", json.status());
    std::cout << *json << "\n";
  } else {
    std::cout << FormatReport(*report);
  }
  return ExitCodeFor(report->verdict);
}

int RunSubmit(const Argv& argv) {
  Args args(WithConnectionFlags(
                {"priority", "idempotency-key", "job-timeout", "retries"}),
            WithConnectionBoolFlags({}));
  int code = 0;
  if (!ParseCommand("submit", kSubmitHelp, &args, argv, &code)) return code;
  const std::vector<std::string>& files = args.positional();
  if (files.empty()) {
    std::cerr << kSubmitHelp << kConnectionHelp;
    return kExitError;
  }
  client::SubmitOptions call;
  absl::StatusOr<v1::Priority> priority = ParsePriority(args);
  if (!priority.ok()) return Fail("submit", priority.status());
  call.priority = *priority;
  call.idempotency_key = args.Get("idempotency-key");
  if (!call.idempotency_key.empty() && files.size() != 1) {
    return Fail("submit", absl::InvalidArgumentError(
                              "--idempotency-key: only with a single FILE"));
  }
  if (args.Has("job-timeout")) {
    absl::StatusOr<absl::Duration> t =
        ParseCliDuration("job-timeout", args.Get("job-timeout"));
    if (!t.ok()) return Fail("submit", t.status());
    call.job_timeout = *t;
  }
  absl::StatusOr<int64_t> retries = args.GetInt("retries", 20);
  if (!retries.ok()) return Fail("submit", retries.status());
  absl::StatusOr<std::unique_ptr<client::Client>> client =
      ConnectFromArgs(args);
  if (!client.ok()) return Fail("submit", client.status());

  ProgressBar bar(files.size());
  size_t done = 0;
  size_t failed = 0;
  int64_t bytes = 0;
  bar.Update(0, 0, 0);
  for (const std::string& file : files) {
    absl::StatusOr<Snapshot> snapshot = ReadSnapshotFile(file);
    absl::Status status = snapshot.status();
    if (snapshot.ok()) {
      v1::SubmitRequest request;
      SnapshotToProto(*std::move(snapshot), request.mutable_snapshot());
      *request.mutable_options() = call.audit_options;
      request.set_priority(call.priority);
      request.set_idempotency_key(call.idempotency_key);
      if (call.job_timeout > absl::ZeroDuration()) {
        const int64_t ns = absl::ToInt64Nanoseconds(call.job_timeout);
        request.mutable_timeout()->set_seconds(ns / 1000000000);
        request.mutable_timeout()->set_nanos(
            static_cast<int32_t>(ns % 1000000000));
      }
      for (int64_t attempt = 0;; ++attempt) {
        absl::StatusOr<v1::SubmitResponse> response =
            (*client)->SubmitProto(request);
        status = response.status();
        if (response.ok()) {
          std::cout << file << " " << response->job_id()
                    << (response->deduplicated() ? " (deduplicated)" : "")
                    << "\n"
                    << std::flush;
          bytes += static_cast<int64_t>(request.ByteSizeLong());
          break;
        }
        if (response.status().code() != absl::StatusCode::kResourceExhausted ||
            attempt >= *retries) {
          break;
        }
        const absl::Duration wait =
            std::clamp(client::RetryAfter(response.status()),
                       absl::Milliseconds(50), absl::Seconds(10));
        absl::SleepFor(wait);
      }
    }
    if (!status.ok()) {
      ++failed;
      std::cerr << "\nattnaudit submit: " << file << ": "
                << DescribeError(status) << "\n";
    }
    bar.Update(++done, bytes, failed);
  }
  return failed == 0 ? 0 : kExitError;
}

int RunGet(const Argv& argv) {
  Args args(WithConnectionFlags({"wait"}), WithConnectionBoolFlags({"json"}));
  int code = 0;
  if (!ParseCommand("get", kGetHelp, &args, argv, &code)) return code;
  if (args.positional().size() != 1) {
    std::cerr << kGetHelp << kConnectionHelp;
    return kExitError;
  }
  absl::Duration wait = absl::ZeroDuration();
  if (args.Has("wait")) {
    absl::StatusOr<absl::Duration> w =
        ParseCliDuration("wait", args.Get("wait"));
    if (!w.ok()) return Fail("get", w.status());
    wait = *w;
  }
  absl::StatusOr<std::unique_ptr<client::Client>> client =
      ConnectFromArgs(args);
  if (!client.ok()) return Fail("get", client.status());
  const absl::Time until = absl::Now() + wait;
  absl::StatusOr<v1::JobResult> result;
  for (absl::Duration pause = absl::Milliseconds(50);;
       pause = std::min(pause * 2, absl::Seconds(1))) {
    result = (*client)->GetResult(args.positional()[0]);
    if (!result.ok()) return Fail("get", result.status());
    const bool finished = result->state() == v1::JOB_STATE_DONE ||
                          result->state() == v1::JOB_STATE_FAILED ||
                          result->state() == v1::JOB_STATE_CANCELLED;
    if (finished || absl::Now() + pause > until) break;
    absl::SleepFor(pause);
  }
  if (args.Has("json")) {
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
      if (!report.ok()) return Fail("get", report.status());
      if (!args.Has("json")) std::cout << FormatReport(*report);
      return ExitCodeFor(report->verdict);
    }
    case v1::JOB_STATE_QUEUED:
    case v1::JOB_STATE_RUNNING:
      return kExitNotFinished;
    default:
      return kExitError;
  }
}

int RunWatch(const Argv& argv) {
  Args args(WithConnectionFlags({"verdict", "model", "layer", "engine",
                                 "backend", "count", "duration"}),
            WithConnectionBoolFlags({"json"}));
  int code = 0;
  if (!ParseCommand("watch", kWatchHelp, &args, argv, &code)) return code;
  if (!args.positional().empty()) {
    std::cerr << kWatchHelp << kConnectionHelp;
    return kExitError;
  }
  v1::ResultFilter filter;
  for (const std::string& v : args.GetAll("verdict")) {
    const std::string u = absl::AsciiStrToUpper(v);
    v1::Verdict verdict;
    if (!v1::Verdict_Parse(absl::StrCat("VERDICT_", u), &verdict) ||
        verdict == v1::VERDICT_UNSPECIFIED) {
      return Fail("watch",
                  absl::InvalidArgumentError(absl::StrCat(
                      "--verdict: '", v, "' is not PASS, DRIFT or INVALID")));
    }
    filter.add_verdicts(verdict);
  }
  filter.set_model(args.Get("model"));
  filter.set_engine(args.Get("engine"));
  filter.set_backend(args.Get("backend"));
  if (args.Has("layer")) {
    absl::StatusOr<int64_t> layer = args.GetInt("layer", -1);
    if (!layer.ok()) return Fail("watch", layer.status());
    filter.set_layer(*layer);
  }
  absl::StatusOr<int64_t> count = args.GetInt("count", 0);
  if (!count.ok()) return Fail("watch", count.status());
  absl::Duration duration = absl::InfiniteDuration();
  if (args.Has("duration")) {
    absl::StatusOr<absl::Duration> d =
        ParseCliDuration("duration", args.Get("duration"));
    if (!d.ok()) return Fail("watch", d.status());
    duration = *d;
  }
  absl::StatusOr<std::unique_ptr<client::Client>> client =
      ConnectFromArgs(args);
  if (!client.ok()) return Fail("watch", client.status());
  int64_t seen = 0;
  const bool json = args.Has("json");
  absl::Status s = (*client)->Watch(
      filter,
      [&](const v1::JobResult& r) {
        if (json) {
          std::cout << ToJson(r, /*pretty=*/false) << "\n";
        } else {
          std::string line = absl::StrCat(
              r.job_id(), " ", StateName(r.state()), " ",
              VerdictText(r.report().verdict()),
              " model=", r.labels().model().empty() ? "-" : r.labels().model(),
              " layer=",
              r.labels().has_layer() ? absl::StrCat(r.labels().layer())
                                     : std::string("-"));
          for (const v1::ComparisonResult& c : r.report().comparisons()) {
            if (c.comparison() == v1::COMPARISON_ENGINE_VS_REFERENCE &&
                c.has_out()) {
              absl::StrAppendFormat(&line, " E-R out max_abs=%.3g",
                                    c.out().max_abs());
            }
          }
          if (r.has_error() && r.error().code() != 0) {
            absl::StrAppend(&line, " error=\"", r.error().message(), "\"");
          }
          std::cout << line << "\n";
        }
        std::cout.flush();
        return *count <= 0 || ++seen < *count;
      },
      duration);
  if (!s.ok()) return Fail("watch", s);
  return 0;
}

int RunCancel(const Argv& argv) {
  Args args(WithConnectionFlags({}), WithConnectionBoolFlags({}));
  int code = 0;
  if (!ParseCommand("cancel", kCancelHelp, &args, argv, &code)) return code;
  if (args.positional().size() != 1) {
    std::cerr << kCancelHelp << kConnectionHelp;
    return kExitError;
  }
  absl::StatusOr<std::unique_ptr<client::Client>> client =
      ConnectFromArgs(args);
  if (!client.ok()) return Fail("cancel", client.status());
  absl::StatusOr<v1::JobState> state = (*client)->Cancel(args.positional()[0]);
  if (!state.ok()) return Fail("cancel", state.status());
  std::cout << "job " << args.positional()[0] << ": " << StateName(*state)
            << "\n";
  return 0;
}

int RunCaps(const Argv& argv) {
  Args args(WithConnectionFlags({}), WithConnectionBoolFlags({"json"}));
  int code = 0;
  if (!ParseCommand("caps", kCapsHelp, &args, argv, &code)) return code;
  absl::StatusOr<std::unique_ptr<client::Client>> client =
      ConnectFromArgs(args);
  if (!client.ok()) return Fail("caps", client.status());
  absl::StatusOr<v1::Capabilities> caps = (*client)->Capabilities();
  if (!caps.ok()) return Fail("caps", caps.status());
  if (args.Has("json")) {
    std::cout << ToJson(*caps, /*pretty=*/true) << "\n";
    return 0;
  }
  std::cout << "attnaudit-server " << caps->version() << " ("
            << caps->api_version() << ", fingerprints "
            << caps->fingerprint_version() << ")\n";
  std::cout << "backends:";
  for (const v1::Backend& b : caps->backends()) {
    std::cout << " " << b.name() << (b.available() ? "" : " (unavailable")
              << (!b.available() && !b.detail().empty() ? ": " + b.detail()
                                                        : "")
              << (b.available() ? "" : ")");
  }
  std::cout << "\ndevices:";
  for (const v1::Device& d : caps->devices()) {
    std::cout << " " << d.id()
              << (d.state() == v1::DEVICE_STATE_BUSY ? "(busy)" : "");
  }
  const v1::Limits& l = caps->limits();
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
  return 0;
}

}  // namespace attnaudit::cli
