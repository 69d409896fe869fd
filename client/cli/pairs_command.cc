// pairs: the train-rollout pairs a server joined (ListPairs), newest first.
// A table of at most --limit pairs (each with its rows under --rows), or
// one attnaudit.v1.PairResult JSON per line with --json.
#include <functional>
#include <iostream>
#include <string>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "absl/time/clock.h"
#include "client/cli/cli_flags.h"
#include "client/cli/commands.h"
#include "client/cli/remote_common.h"
#include "google/protobuf/util/time_util.h"

namespace attnaudit::client::cli_internal {
namespace {

using google::protobuf::util::TimeUtil;

struct PairsCommand {
  std::string run;
  int64_t layer = -1;
  int64_t step = -1;
  std::string verdict;
  std::string request_id;
  std::string since;
  std::string until;
  int64_t limit = 50;
  bool json = false;
  bool rows = false;
  ConnectionFlags connection;
};

// "PAIR_VERDICT_WITHIN_NOISE" -> "within-noise".
std::string PairVerdictText(int verdict) {
  std::string name = v1::PairVerdict_Name(verdict);
  if (verdict == v1::PAIR_VERDICT_UNSPECIFIED) return "no-common-rows";
  name = absl::AsciiStrToLower(name.substr(sizeof("PAIR_VERDICT_") - 1));
  return absl::StrReplaceAll(name, {{"_", "-"}});
}

absl::StatusOr<v1::ListPairsRequest> RequestOf(const PairsCommand& o) {
  v1::ListPairsRequest r;
  if (!o.verdict.empty()) {
    v1::PairVerdict v = v1::PAIR_VERDICT_UNSPECIFIED;
    const std::string wire = absl::StrCat(
        "PAIR_VERDICT_",
        absl::AsciiStrToUpper(absl::StrReplaceAll(o.verdict, {{"-", "_"}})));
    if (!v1::PairVerdict_Parse(wire, &v) || v == v1::PAIR_VERDICT_UNSPECIFIED) {
      return absl::InvalidArgumentError(
          "--verdict: consistent, within-noise, inputs-differ, "
          "stale-prefix-kv, rollout-drift, trainer-drift or both-drift");
    }
    r.set_verdict(v);
  }
  r.set_run(o.run);
  if (o.layer >= 0) r.set_layer(o.layer);
  if (o.step >= 0) r.set_step(o.step);
  r.set_request_id(o.request_id);
  const absl::Time now = absl::Now();
  if (!o.since.empty()) {
    *r.mutable_joined_after() = TimeUtil::NanosecondsToTimestamp(
        absl::ToUnixNanos(now - CliDuration(o.since)));
  }
  if (!o.until.empty()) {
    *r.mutable_joined_before() = TimeUtil::NanosecondsToTimestamp(
        absl::ToUnixNanos(now - CliDuration(o.until)));
  }
  return r;
}

// Every matching pair up to `limit` (0: all), newest first, to `emit`.
absl::Status ForEachPair(
    Client* client, v1::ListPairsRequest request, int64_t limit,
    const std::function<void(const v1::PairResult&)>& emit) {
  return ForEachPage(
      std::move(request), limit,
      [client](const v1::ListPairsRequest& r) { return client->ListPairs(r); },
      [](const v1::ListPairsResponse& page) -> const auto& {
        return page.pairs();
      },
      emit);
}

std::string Step(bool has, int64_t step) {
  return has ? absl::StrCat(step) : "-";
}

std::string TableRow(const v1::PairResult& p) {
  const v1::PairReport& r = p.report();
  const std::string joined = absl::FormatTime(
      "%Y-%m-%d %H:%M:%S", absl::FromUnixSeconds(p.join_time().seconds()),
      absl::UTCTimeZone());
  return absl::StrFormat(
      "%-19s  %-15s  %-16s %5s %6s %6s %5d  %-7s %-7s  %s %s", joined,
      PairVerdictText(r.verdict()), p.run().substr(0, 16),
      p.has_layer() ? absl::StrCat(p.layer()) : "-",
      Step(p.has_rollout_step(), p.rollout_step()),
      Step(p.has_trainer_step(), p.trainer_step()), r.rows_size(),
      VerdictText(r.rollout_verdict()), VerdictText(r.trainer_verdict()),
      p.rollout_job_id(), p.trainer_job_id());
}

std::string RowLines(const v1::PairResult& p) {
  std::string out;
  const v1::PairReport& r = p.report();
  if (!r.rollout_diagnosis().empty()) {
    absl::StrAppend(&out, "    rollout diagnosis: ", r.rollout_diagnosis(),
                    "\n");
  }
  if (!r.trainer_diagnosis().empty()) {
    absl::StrAppend(&out, "    trainer diagnosis: ", r.trainer_diagnosis(),
                    "\n");
  }
  if (p.rollout_weight_version() != p.trainer_weight_version()) {
    absl::StrAppend(&out, "    weight versions differ: rollout '",
                    p.rollout_weight_version(), "', trainer '",
                    p.trainer_weight_version(), "'\n");
  }
  for (const v1::PairRow& row : r.rows()) {
    absl::StrAppend(
        &out,
        absl::StrFormat(
            "    %-24s %8d  %-15s out %8.3g ulps  q %6.3g  kv %6.3g  "
            "effect/noise %.3g/%.3g\n",
            row.request_id().substr(0, 24), row.position(),
            PairVerdictText(row.verdict()), row.out_max_ulps(), row.q_ulps(),
            row.kv_ulps(), row.input_effect(), row.noise()));
  }
  return out;
}

int RunPairs(const PairsCommand& o) {
  absl::StatusOr<v1::ListPairsRequest> request = RequestOf(o);
  if (!request.ok()) return FailLocal("pairs", request.status());
  absl::StatusOr<std::unique_ptr<Client>> client = Connect(o.connection);
  if (!client.ok()) return FailLocal("pairs", client.status());
  if (!o.json) {
    std::cout << absl::StrFormat(
        "%-19s  %-15s  %-16s %5s %6s %6s %5s  %-7s %-7s  %s\n", "joined (UTC)",
        "pair verdict", "run", "layer", "r.step", "t.step", "rows", "rollout",
        "trainer", "rollout job, trainer job");
  }
  absl::Status s = ForEachPair(
      client->get(), *request, o.limit, [&o](const v1::PairResult& p) {
        if (o.json) {
          std::cout << ToJson(p, /*pretty=*/false) << "\n";
          return;
        }
        std::cout << TableRow(p) << "\n" << (o.rows ? RowLines(p) : "");
      });
  if (!s.ok()) return FailRemote("pairs", o.connection, s);
  return kExitPass;
}

}  // namespace

void AddPairsCommand(CLI::App* app, int* exit_code) {
  auto [pairs, o] = AddCommand<PairsCommand>(
      app, exit_code, "pairs", "list the train-rollout pairs a server joined",
      "Prints the pairs the server joined (the caller's tenant's, or every\n"
      "tenant's for a read-all token), newest first: a rollout snapshot and\n"
      "a trainer snapshot (Labels.role) of one run and layer that hold the\n"
      "same (request id, position) rows. Per pair: its verdict (the gravest\n"
      "row's), run, layer, each side's step and audit verdict, the row\n"
      "count and the two job ids (attnaudit get JOB has each side's report);\n"
      "--rows adds one line per row. Offline: attnaudit pair. Exit 0, or 2\n"
      "on error.",
      &RunPairs);
  pairs->add_option("--run", o->run, "the run label");
  pairs->add_option("--layer", o->layer, "the layer label")
      ->check(NonNegative());
  pairs->add_option("--step", o->step, "either side's step label")
      ->check(NonNegative());
  pairs->add_option("--verdict", o->verdict,
                    "consistent, within-noise, inputs-differ, "
                    "stale-prefix-kv, rollout-drift, trainer-drift or "
                    "both-drift");
  pairs->add_option("--request-id", o->request_id,
                    "a request id the pair's rows hold");
  pairs->add_option("--since", o->since, "joined at most this long ago")
      ->check(DurationValidator());
  pairs->add_option("--until", o->until, "joined at least this long ago")
      ->check(DurationValidator());
  pairs->add_option("--limit", o->limit, "at most this many (0: all)")
      ->capture_default_str()
      ->check(NonNegative());
  pairs->add_flag("--json", o->json, "one PairResult JSON per line");
  pairs->add_flag("--rows", o->rows, "each pair's rows under it");
  AddConnectionFlags(pairs, &o->connection);
}

}  // namespace attnaudit::client::cli_internal
