#include "server/device_pool/device_selection.h"

#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace attnaudit::server {
namespace {

constexpr int kMaxOrdinal = 1023;

absl::Status Bad(absl::string_view text) {
  return absl::InvalidArgumentError(
      absl::StrCat("'", text, "' is not cpu, all or cuda:N[,cuda:M...]"));
}

}  // namespace

absl::StatusOr<DeviceSelection> ParseDeviceSelection(absl::string_view text) {
  const std::string lower =
      absl::AsciiStrToLower(absl::StripAsciiWhitespace(text));
  DeviceSelection out;
  if (lower == "cpu") return out;
  if (lower == "all") {
    out.mode = DeviceSelection::Mode::kAll;
    return out;
  }
  out.mode = DeviceSelection::Mode::kList;
  for (absl::string_view entry : absl::StrSplit(lower, ',')) {
    entry = absl::StripAsciiWhitespace(entry);
    int ordinal = -1;
    if (!absl::ConsumePrefix(&entry, "cuda:") ||
        !absl::SimpleAtoi(entry, &ordinal) || ordinal < 0 ||
        ordinal > kMaxOrdinal) {
      return Bad(text);
    }
    if (std::find(out.gpus.begin(), out.gpus.end(), ordinal) !=
        out.gpus.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("'", text, "' names cuda:", ordinal, " twice"));
    }
    out.gpus.push_back(ordinal);
  }
  std::sort(out.gpus.begin(), out.gpus.end());
  return out;
}

std::string DeviceSelectionText(const DeviceSelection& selection) {
  switch (selection.mode) {
    case DeviceSelection::Mode::kCpu:
      return "cpu";
    case DeviceSelection::Mode::kAll:
      return "all";
    case DeviceSelection::Mode::kList:
      break;
  }
  return absl::StrJoin(selection.gpus, ",", [](std::string* out, int g) {
    absl::StrAppend(out, "cuda:", g);
  });
}

}  // namespace attnaudit::server
