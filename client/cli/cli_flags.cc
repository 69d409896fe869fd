#include "client/cli/cli_flags.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace attnaudit::client {

CLI::Validator NonNegative() {
  return CLI::Validator(
      [](std::string& value) {
        double x = 0;
        if (absl::SimpleAtod(value, &x) && x >= 0) return std::string();
        return absl::StrCat("'", value, "' is not a number >= 0");
      },
      "X>=0");
}

void AddAuditFlags(CLI::App* app, AuditFlags* flags) {
  app->add_option("--out-tol", flags->out_tol,
                  "absolute tolerance of the attention output (0: policy)")
      ->check(NonNegative());
  app->add_option("--lse-tol", flags->lse_tol,
                  "absolute tolerance of the LSE (0: policy)")
      ->check(NonNegative());
  app->add_option("--logprob-tol", flags->logprob_tol,
                  "absolute tolerance of the selected-token log-prob "
                  "(0: policy)")
      ->check(NonNegative());
  app->add_flag("--kv-fingerprint", flags->kv_fingerprint,
                "also compute the KV-cache fingerprint");
  AddCpStrategyFlag(app, &flags->cp_strategy);
}

void AddCpStrategyFlag(CLI::App* app, std::string* value) {
  app->add_option("--cp-strategy", *value,
                  "context-parallel snapshots: replay the ranks as a ring or "
                  "merge per-rank partials (default: partials)")
      ->check(CLI::IsMember({"ring", "partials"}));
}

CpStrategy CpStrategyOf(const std::string& value) {
  if (value == "ring") return CpStrategy::kRing;
  if (value == "partials") return CpStrategy::kPartials;
  return CpStrategy::kAuto;
}

AuditOptions ToAuditOptions(const AuditFlags& flags) {
  AuditOptions options;
  options.compute_kv_fingerprint = flags.kv_fingerprint;
  options.tolerances.out_abs = flags.out_tol;
  options.tolerances.lse_abs = flags.lse_tol;
  options.tolerances.logprob_abs = flags.logprob_tol;
  options.cp_strategy = CpStrategyOf(flags.cp_strategy);
  return options;
}

namespace {

// "7d", "1.5d" or "1d12h": whole or fractional days, then optionally an
// absl duration (absl's syntax stops at hours).
bool ParseDays(absl::string_view value, absl::Duration* out) {
  const size_t d = value.find('d');
  if (d == absl::string_view::npos || d == 0) return false;
  double days = 0;
  if (!absl::SimpleAtod(value.substr(0, d), &days) || days < 0 || days > 1e6) {
    return false;
  }
  absl::Duration rest = absl::ZeroDuration();
  const absl::string_view tail = value.substr(d + 1);
  if (!tail.empty() &&
      (!absl::ParseDuration(tail, &rest) || rest < absl::ZeroDuration())) {
    return false;
  }
  *out = absl::Hours(24) * days + rest;
  return true;
}

}  // namespace

absl::StatusOr<absl::Duration> ParseCliDuration(const std::string& value) {
  absl::Duration d;
  double seconds = 0;
  if (absl::SimpleAtod(value, &seconds) && seconds >= 0) {
    return absl::Seconds(seconds);
  }
  if (absl::ParseDuration(value, &d) && d >= absl::ZeroDuration()) return d;
  if (ParseDays(value, &d)) return d;
  return absl::InvalidArgumentError(absl::StrCat(
      "'", value, "' is not a duration (e.g. 30s, 2m, 1h30m, 7d, 10)"));
}

CLI::Validator DurationValidator() {
  return CLI::Validator(
      [](std::string& value) {
        absl::StatusOr<absl::Duration> d = ParseCliDuration(value);
        return d.ok() ? std::string() : std::string(d.status().message());
      },
      "DURATION");
}

absl::Duration CliDuration(const std::string& value) {
  absl::StatusOr<absl::Duration> d = ParseCliDuration(value);
  return d.ok() ? *d : absl::ZeroDuration();
}

}  // namespace attnaudit::client
