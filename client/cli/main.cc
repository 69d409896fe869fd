// attnaudit: the command-line tool. Offline commands run the core pipeline
// directly; remote commands talk to attnaudit-server. CLI11 parses the
// command line; its exceptions stop here (usage errors exit 2 with what
// was wrong, --help exits 0).
#include <CLI/CLI.hpp>
#include <algorithm>
#include <iostream>
#include <string>
#include <vector>

#include "client/cli/commands.h"

namespace attnaudit::client::cli_internal {
namespace {

// "attnaudit check: The following argument was not expected: b.pb", then
// where the usage is.
int UsageError(const CLI::App& app, const CLI::ParseError& e) {
  std::string command = "attnaudit";
  for (const CLI::App* sub : app.get_subcommands()) {
    command += " " + sub->get_name();
  }
  std::cerr << command << ": " << e.what() << "\n"
            << "run '" << command << " --help' for usage\n";
  return kExitError;
}

int Main(int argc, char** argv) {
  CLI::App app(
      "audits LLM decode attention: offline (synth, check, inspect) or on an "
      "attnaudit-server",
      "attnaudit");
  app.require_subcommand(1);
  app.footer("COMMAND --help prints the command's flags.");
  int exit_code = kExitError;
  AddSynthCommand(&app, &exit_code);
  AddCheckCommand(&app, &exit_code);
  AddInspectCommand(&app, &exit_code);
  AddRemoteCommands(&app, &exit_code);
  AddBenchCommand(&app, &exit_code);
  // `attnaudit help` is `attnaudit --help`.
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.size() == 1 && args[0] == "help") args[0] = "--help";
  // CLI11 would only say that a subcommand is required.
  if (!args.empty() && args[0][0] != '-' &&
      app.get_subcommands([&args](const CLI::App* command) {
           return command->check_name(args[0]);
         })
          .empty()) {
    std::cerr << "attnaudit: unknown command '" << args[0] << "'\n"
              << "run 'attnaudit --help' for the commands\n";
    return kExitError;
  }
  std::reverse(args.begin(), args.end());  // CLI11 takes them back to front
  try {
    app.parse(args);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == static_cast<int>(CLI::ExitCodes::Success)) {
      return app.exit(e);  // --help: the (sub)command's help on stdout
    }
    return UsageError(app, e);
  }
  return exit_code;
}

}  // namespace
}  // namespace attnaudit::client::cli_internal

int main(int argc, char** argv) {
  return attnaudit::client::cli_internal::Main(argc, argv);
}
