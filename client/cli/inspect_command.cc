// attnaudit inspect FILE
#include <iostream>
#include <string>

#include "client/cli/commands.h"
#include "client/cli/report_printer.h"
#include "proto/codec/codec.h"

namespace attnaudit::client::cli_internal {
namespace {

struct InspectCommand {
  std::string file;
};

int RunInspect(const InspectCommand& o) {
  absl::StatusOr<Snapshot> snapshot = ReadSnapshotFile(o.file);
  if (!snapshot.ok()) {
    std::cerr << "attnaudit inspect: " << snapshot.status().message() << "\n";
    return kExitError;
  }
  std::cout << o.file << "\n" << FormatSnapshotSummary(*snapshot);
  return 0;
}

}  // namespace

void AddInspectCommand(CLI::App* app, int* exit_code) {
  auto [command, o] = AddCommand<InspectCommand>(
      app, exit_code, "inspect",
      "print a snapshot's shapes, dtypes, sizes and labels",
      "Reads the file only; no validation or audit.", &RunInspect);
  command->add_option("FILE", o->file, "snapshot file")->required();
}

}  // namespace attnaudit::client::cli_internal
