// list and export: the stored results of a server (ListResults), newest
// first. `list` prints a table (or JSON lines with --json) of at most
// --limit results; `export --format jsonl` writes every matching result,
// page after page, one ResultSummary per line (a file for pandas, jq or a
// notebook).
#include <iostream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "client/cli/cli_flags.h"
#include "client/cli/commands.h"
#include "client/cli/remote_common.h"
#include "google/protobuf/util/time_util.h"

namespace attnaudit::client::cli_internal {
namespace {

using google::protobuf::util::TimeUtil;

struct ListCommand {
  std::string verdict;
  std::string state;
  std::string model;
  int64_t layer = -1;
  std::string diagnosis;
  std::vector<std::string> labels;  // k=v: engine, backend, step, run
  std::string since;
  std::string until;
  int64_t limit = 50;
  bool json = false;
  std::string format = "jsonl";  // export
  ConnectionFlags connection;
};

absl::Status SetLabel(const std::string& label, v1::ListResultsRequest* r) {
  std::vector<std::string> kv = absl::StrSplit(label, absl::MaxSplits('=', 1));
  if (kv.size() != 2 || kv[1].empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--label '", label, "': expected KEY=VALUE"));
  }
  const std::string& key = kv[0];
  const std::string& value = kv[1];
  if (key == "engine") {
    r->set_engine(value);
  } else if (key == "backend") {
    r->set_backend(value);
  } else if (key == "run") {
    r->set_run(value);
  } else if (key == "model") {
    r->set_model(value);
  } else if (key == "step" || key == "layer") {
    int64_t n = 0;
    if (!absl::SimpleAtoi(value, &n) || n < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("--label ", key, "=", value, ": not a count"));
    }
    key == "step" ? r->set_step(n) : r->set_layer(n);
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("--label ", key,
                     ": one of engine, backend, run, step, "
                     "layer, model"));
  }
  return absl::OkStatus();
}

// The flags as a request (without paging); errors name the flag.
absl::StatusOr<v1::ListResultsRequest> RequestOf(const ListCommand& o) {
  v1::ListResultsRequest r;
  if (!o.verdict.empty()) {
    v1::Verdict v = v1::VERDICT_UNSPECIFIED;
    if (!v1::Verdict_Parse(
            absl::StrCat("VERDICT_", absl::AsciiStrToUpper(o.verdict)), &v)) {
      return absl::InvalidArgumentError(
          "--verdict: pass, drift, invalid or inconclusive");
    }
    r.set_verdict(v);
  }
  if (!o.state.empty()) {
    v1::JobState s = v1::JOB_STATE_UNSPECIFIED;
    if (!v1::JobState_Parse(
            absl::StrCat("JOB_STATE_", absl::AsciiStrToUpper(o.state)), &s)) {
      return absl::InvalidArgumentError("--state: done, failed or cancelled");
    }
    r.set_state(s);
  }
  r.set_model(o.model);
  if (o.layer >= 0) r.set_layer(o.layer);
  r.set_diagnosis(o.diagnosis);
  for (const std::string& label : o.labels) {
    if (absl::Status s = SetLabel(label, &r); !s.ok()) return s;
  }
  const absl::Time now = absl::Now();
  if (!o.since.empty()) {
    *r.mutable_finished_after() = TimeUtil::NanosecondsToTimestamp(
        absl::ToUnixNanos(now - CliDuration(o.since)));
  }
  if (!o.until.empty()) {
    *r.mutable_finished_before() = TimeUtil::NanosecondsToTimestamp(
        absl::ToUnixNanos(now - CliDuration(o.until)));
  }
  return r;
}

// Every matching result up to `limit` (0: all), newest first, to `emit`.
absl::Status ForEachResult(
    Client* client, v1::ListResultsRequest request, int64_t limit,
    const std::function<void(const v1::ResultSummary&)>& emit) {
  return ForEachPage(
      std::move(request), limit,
      [client](const v1::ListResultsRequest& r) {
        return client->ListResults(r);
      },
      [](const v1::ListResultsResponse& page) -> const auto& {
        return page.results();
      },
      emit);
}

std::string ShortTime(const google::protobuf::Timestamp& t) {
  if (t.seconds() == 0 && t.nanos() == 0) return "-";
  return absl::FormatTime("%Y-%m-%d %H:%M:%S",
                          absl::FromUnixSeconds(t.seconds()),
                          absl::UTCTimeZone());
}

std::string TableRow(const v1::ResultSummary& s) {
  const std::string verdict = s.state() == v1::JOB_STATE_DONE
                                  ? VerdictText(s.verdict())
                                  : StateName(s.state());
  const v1::Labels& l = s.labels();
  return absl::StrFormat(
      "%-19s  %-7s  %-16s %-16s %5s %6s  %10.3g  %-18s %-12s %s",
      ShortTime(s.finish_time()), verdict,
      l.model().empty() ? "-" : l.model().substr(0, 16),
      l.run().empty() ? "-" : l.run().substr(0, 16),
      l.has_layer() ? absl::StrCat(l.layer()) : "-",
      l.has_step() ? absl::StrCat(l.step()) : "-", s.engine_out().max_abs(),
      s.diagnosis().empty() ? "-" : s.diagnosis(),
      s.replica().empty() ? "-" : s.replica().substr(0, 12), s.job_id());
}

int RunList(const ListCommand& o) {
  absl::StatusOr<v1::ListResultsRequest> request = RequestOf(o);
  if (!request.ok()) return FailLocal("list", request.status());
  absl::StatusOr<std::unique_ptr<Client>> client = Connect(o.connection);
  if (!client.ok()) return FailLocal("list", client.status());
  if (!o.json) {
    std::cout << absl::StrFormat(
        "%-19s  %-7s  %-16s %-16s %5s %6s  %10s  %-18s %-12s %s\n",
        "finished (UTC)", "verdict", "model", "run", "layer", "step", "E-R out",
        "diagnosis", "replica", "job");
  }
  absl::Status s = ForEachResult(
      client->get(), *request, o.limit, [&o](const v1::ResultSummary& r) {
        std::cout << (o.json ? ToJson(r, /*pretty=*/false) : TableRow(r))
                  << "\n";
      });
  if (!s.ok()) return FailRemote("list", o.connection, s);
  return kExitPass;
}

int RunExport(const ListCommand& o) {
  if (o.format != "jsonl") {
    return FailLocal("export", absl::InvalidArgumentError(
                                   "--format: only jsonl is supported"));
  }
  absl::StatusOr<v1::ListResultsRequest> request = RequestOf(o);
  if (!request.ok()) return FailLocal("export", request.status());
  absl::StatusOr<std::unique_ptr<Client>> client = Connect(o.connection);
  if (!client.ok()) return FailLocal("export", client.status());
  absl::Status s = ForEachResult(
      client->get(), *request, o.limit, [](const v1::ResultSummary& r) {
        std::cout << ToJson(r, /*pretty=*/false) << "\n";
      });
  if (!s.ok()) return FailRemote("export", o.connection, s);
  return kExitPass;
}

void AddFilterFlags(CLI::App* command, ListCommand* o) {
  command->add_option("--verdict", o->verdict,
                      "pass, drift, invalid or inconclusive");
  command->add_option("--state", o->state, "done, failed or cancelled");
  command->add_option("--model", o->model, "the model label");
  command->add_option("--layer", o->layer, "the layer label")
      ->check(NonNegative());
  command->add_option("--diagnosis", o->diagnosis,
                      "the top diagnosis of a DRIFT, e.g. stale-page");
  command->add_option("--label", o->labels,
                      "KEY=VALUE (engine, backend, run, step, layer, model); "
                      "repeatable");
  command->add_option("--since", o->since, "finished at most this long ago")
      ->check(DurationValidator());
  command->add_option("--until", o->until, "finished at least this long ago")
      ->check(DurationValidator());
  AddConnectionFlags(command, &o->connection);
}

}  // namespace

void AddListCommands(CLI::App* app, int* exit_code) {
  auto [list, lo] = AddCommand<ListCommand>(
      app, exit_code, "list", "list stored results, newest first",
      "Prints the server's stored results (the caller's tenant's, or every\n"
      "tenant's for a read-all token), newest first: finish time, verdict,\n"
      "labels, E-R out max |diff|, top diagnosis, replica, job id. Full\n"
      "reports: attnaudit get JOB. Exit 0, or 2 on error.",
      &RunList);
  AddFilterFlags(list, lo);
  list->add_option("--limit", lo->limit, "at most this many (0: all)")
      ->capture_default_str()
      ->check(NonNegative());
  list->add_flag("--json", lo->json, "one ResultSummary JSON per line");

  auto [exp, eo] = AddCommand<ListCommand>(
      app, exit_code, "export", "write stored results as JSON lines",
      "Writes every matching stored result, newest first, one\n"
      "attnaudit.v1.ResultSummary JSON object per line (page after page).\n"
      "Exit 0, or 2 on error.",
      &RunExport);
  AddFilterFlags(exp, eo);
  eo->limit = 0;
  exp->add_option("--format", eo->format, "jsonl")->capture_default_str();
  exp->add_option("--limit", eo->limit, "at most this many (0: all)")
      ->capture_default_str()
      ->check(NonNegative());
}

}  // namespace attnaudit::client::cli_internal
