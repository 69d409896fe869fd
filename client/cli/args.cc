#include "client/cli/args.h"

#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace attnaudit::cli {

Args::Args(std::set<std::string> value_flags, std::set<std::string> bool_flags,
           std::map<std::string, std::string> aliases)
    : value_flags_(std::move(value_flags)),
      bool_flags_(std::move(bool_flags)),
      aliases_(std::move(aliases)) {}

absl::Status Args::Parse(const std::vector<std::string>& argv) {
  for (size_t i = 0; i < argv.size(); ++i) {
    const std::string& arg = argv[i];
    if (arg.size() < 2 || arg[0] != '-' || arg == "--") {
      if (arg == "--") {
        for (++i; i < argv.size(); ++i) positional_.push_back(argv[i]);
        break;
      }
      positional_.push_back(arg);
      continue;
    }
    std::string name = arg.substr(arg[1] == '-' ? 2 : 1);
    std::string value;
    bool has_inline_value = false;
    if (size_t eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
      has_inline_value = true;
    }
    if (auto it = aliases_.find(name); it != aliases_.end()) name = it->second;
    if (bool_flags_.count(name)) {
      if (has_inline_value) {
        return absl::InvalidArgumentError(
            absl::StrCat("--", name, " takes no value"));
      }
      values_.emplace(name, "true");
    } else if (value_flags_.count(name)) {
      if (!has_inline_value) {
        if (i + 1 >= argv.size()) {
          return absl::InvalidArgumentError(
              absl::StrCat("--", name, " needs a value"));
        }
        value = argv[++i];
      }
      values_.emplace(name, value);
    } else {
      return absl::InvalidArgumentError(absl::StrCat("unknown flag ", arg));
    }
  }
  return absl::OkStatus();
}

bool Args::Has(const std::string& flag) const { return values_.count(flag); }

std::string Args::Get(const std::string& flag, const std::string& def) const {
  auto range = values_.equal_range(flag);
  if (range.first == range.second) return def;
  return std::prev(range.second)->second;  // last one wins
}

std::vector<std::string> Args::GetAll(const std::string& flag) const {
  std::vector<std::string> out;
  auto range = values_.equal_range(flag);
  for (auto it = range.first; it != range.second; ++it) {
    out.push_back(it->second);
  }
  return out;
}

absl::StatusOr<int64_t> Args::GetInt(const std::string& flag,
                                     int64_t def) const {
  if (!Has(flag)) return def;
  int64_t v = 0;
  if (!absl::SimpleAtoi(Get(flag), &v)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, ": '", Get(flag), "' is not an integer"));
  }
  return v;
}

absl::StatusOr<double> Args::GetDouble(const std::string& flag,
                                       double def) const {
  if (!Has(flag)) return def;
  double v = 0;
  if (!absl::SimpleAtod(Get(flag), &v)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, ": '", Get(flag), "' is not a number"));
  }
  return v;
}

}  // namespace attnaudit::cli
