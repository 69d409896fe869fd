// Flags shared by several attnaudit subcommands (and the check benchmark),
// declared on a CLI11 app: the audit tolerances of `check` and `audit`, and
// the duration syntax of --timeout, --wait, --duration, ... Values are
// validated while parsing, so a bad one is a usage error naming the flag.
#ifndef ATTNAUDIT_CLIENT_CLI_CLI_FLAGS_H_
#define ATTNAUDIT_CLIENT_CLI_CLI_FLAGS_H_

#include <CLI/CLI.hpp>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "core/audit/audit.h"

namespace attnaudit::client {

// --out-tol X --lse-tol X --logprob-tol X (0: the policy's own),
// --kv-fingerprint and --cp-strategy ring|partials.
struct AuditFlags {
  double out_tol = 0;
  double lse_tol = 0;
  double logprob_tol = 0;
  bool kv_fingerprint = false;
  std::string cp_strategy;  // empty: the auditor chooses
};
void AddAuditFlags(CLI::App* app, AuditFlags* flags);
// The core options these flags ask for (threads and limits left default).
AuditOptions ToAuditOptions(const AuditFlags& flags);

// --cp-strategy ring|partials on `app` into *value (empty when not given).
void AddCpStrategyFlag(CLI::App* app, std::string* value);
// The strategy a --cp-strategy value names (kAuto for empty).
CpStrategy CpStrategyOf(const std::string& value);

// A CLI11 check that the value is a number >= 0 ("'-1' is not a number
// >= 0"; CLI11's own range check prints the double range).
CLI::Validator NonNegative();

// "30s", "2m", "1h30m", days ("7d", "1d12h") or plain seconds ("2.5");
// never negative.
absl::StatusOr<absl::Duration> ParseCliDuration(const std::string& value);
// A CLI11 check that the value parses with ParseCliDuration.
CLI::Validator DurationValidator();
// The value of a duration option that passed DurationValidator.
absl::Duration CliDuration(const std::string& value);

}  // namespace attnaudit::client

#endif  // ATTNAUDIT_CLIENT_CLI_CLI_FLAGS_H_
