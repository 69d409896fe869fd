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
// where the usage is. CLI11 checks required arguments before it complains
// about unexpected ones, so `check --nope` would only say that FILE is
// required: an unexpected argument is named first.
int UsageError(const CLI::App& app, const CLI::ParseError& e) {
  std::string command = "attnaudit";
  std::vector<std::string> unexpected;
  for (const CLI::App* sub : app.get_subcommands()) {
    command += " " + sub->get_name();
    for (const std::string& arg : sub->remaining()) unexpected.push_back(arg);
  }
  std::string what = e.what();
  if (!unexpected.empty() && what.find("not expected") == std::string::npos) {
    std::string list;
    for (const std::string& arg : unexpected) list += " " + arg;
    what = "The following argument was not expected:" + list + " (and " + what +
           ")";
  }
  std::cerr << command << ": " << what << "\n"
            << "run '" << command << " --help' for usage\n";
  return kExitError;
}

// Handles what CLI11 would misreport at the top level (it only says that a
// subcommand is required): `help [COMMAND]`, `--version`, an unknown option
// or command. Returns -1 to go on parsing `args` (possibly rewritten).
int TopLevel(const CLI::App& app, std::vector<std::string>* args) {
  if (args->empty()) return -1;
  std::string& first = args->front();
  if (first == "help") {  // `attnaudit help [COMMAND]` = COMMAND --help
    args->erase(args->begin());
    args->push_back("--help");
    return TopLevel(app, args);
  }
  if (first == "--version") {
    std::cout << "attnaudit " << ATTNAUDIT_VERSION << "\n";
    return 0;
  }
  if (first == "-h" || first == "--help") return -1;
  const bool known = !app.get_subcommands([&first](const CLI::App* command) {
                           return command->check_name(first);
                         })
                          .empty();
  if (known) return -1;
  if (first[0] == '-') {
    std::cerr << "attnaudit: unknown option '" << first
              << "' (options follow the command: attnaudit COMMAND [OPTIONS])"
              << "\nrun 'attnaudit --help' for the commands\n";
  } else {
    std::cerr << "attnaudit: unknown command '" << first << "'\n"
              << "run 'attnaudit --help' for the commands\n";
  }
  return kExitError;
}

int Main(int argc, char** argv) {
  CLI::App app(
      "audits LLM decode attention: offline (synth, check, inspect, pair) or "
      "on an attnaudit-server",
      "attnaudit");
  app.require_subcommand(1);
  app.footer(
      "attnaudit COMMAND --help (or attnaudit help COMMAND) prints the "
      "command's flags.\nattnaudit --version prints the version.");
  int exit_code = kExitError;
  AddSynthCommand(&app, &exit_code);
  AddCheckCommand(&app, &exit_code);
  AddInspectCommand(&app, &exit_code);
  AddPresetsCommand(&app, &exit_code);
  AddPairCommand(&app, &exit_code);
  AddRemoteCommands(&app, &exit_code);
  AddListCommands(&app, &exit_code);
  AddPairsCommand(&app, &exit_code);
  AddBenchCommand(&app, &exit_code);
  std::vector<std::string> args(argv + 1, argv + argc);
  if (const int done = TopLevel(app, &args); done >= 0) return done;
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
