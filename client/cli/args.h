// A small command-line parser for the attnaudit subcommands: positional
// arguments and --flag VALUE / --flag=VALUE / boolean --flag. Unknown flags
// are errors, so typos never pass silently. Not thread-safe (one per call).
#ifndef ATTNAUDIT_CLIENT_CLI_ARGS_H_
#define ATTNAUDIT_CLIENT_CLI_ARGS_H_

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace attnaudit::cli {

class Args {
 public:
  // value_flags take a value, bool_flags do not (names without dashes);
  // short aliases map e.g. "o" -> "output".
  Args(std::set<std::string> value_flags, std::set<std::string> bool_flags,
       std::map<std::string, std::string> aliases = {});

  absl::Status Parse(const std::vector<std::string>& argv);

  bool Has(const std::string& flag) const;
  std::string Get(const std::string& flag, const std::string& def = "") const;
  // All values of a repeated flag, in order.
  std::vector<std::string> GetAll(const std::string& flag) const;
  absl::StatusOr<int64_t> GetInt(const std::string& flag, int64_t def) const;
  absl::StatusOr<double> GetDouble(const std::string& flag, double def) const;
  const std::vector<std::string>& positional() const { return positional_; }

 private:
  std::set<std::string> value_flags_;
  std::set<std::string> bool_flags_;
  std::map<std::string, std::string> aliases_;
  std::multimap<std::string, std::string> values_;
  std::vector<std::string> positional_;
};

}  // namespace attnaudit::cli

#endif  // ATTNAUDIT_CLIENT_CLI_ARGS_H_
