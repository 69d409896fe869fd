// attnaudit inspect FILE
#include <iostream>

#include "client/cli/args.h"
#include "client/cli/commands.h"
#include "client/cli/report_printer.h"
#include "proto/codec/codec.h"

namespace attnaudit::cli {

int RunInspect(const Argv& argv) {
  constexpr char kHelp[] =
      "usage: attnaudit inspect FILE\n"
      "Prints a snapshot's shapes, dtypes, sizes and labels (no audit).\n";
  Args args({}, {"help"});
  if (absl::Status st = args.Parse(argv); !st.ok()) {
    std::cerr << "attnaudit inspect: " << st.message() << "\n" << kHelp;
    return kExitError;
  }
  if (args.Has("help")) {
    std::cout << kHelp;
    return 0;
  }
  if (args.positional().size() != 1) {
    std::cerr << kHelp;
    return kExitError;
  }
  absl::StatusOr<Snapshot> snapshot = ReadSnapshotFile(args.positional()[0]);
  if (!snapshot.ok()) {
    std::cerr << "attnaudit inspect: " << snapshot.status().message() << "\n";
    return kExitError;
  }
  std::cout << args.positional()[0] << "\n" << FormatSnapshotSummary(*snapshot);
  return 0;
}

}  // namespace attnaudit::cli
