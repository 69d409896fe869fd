// The attnaudit CLI's subcommands, each registered on the CLI11 app by its
// Add*Command function. When the command line selects a subcommand, its
// callback runs the command and stores the process exit code in
// *exit_code: 0 success / PASS, 1 DRIFT, 2 invalid input or error (the
// message, naming the field, goes to stderr), 3 INCONCLUSIVE, 4 (`get`) a
// job not finished yet. Each subcommand owns its option values
// (captured by its callback), so they live as long as the app. Usage
// errors are CLI11 exceptions, caught in main.cc.
#ifndef ATTNAUDIT_CLIENT_CLI_COMMANDS_H_
#define ATTNAUDIT_CLIENT_CLI_COMMANDS_H_

#include <CLI/CLI.hpp>
#include <memory>
#include <utility>

#include "client/cli/report_printer.h"  // the exit codes

namespace attnaudit::client::cli_internal {

// Offline (core only): synth_command.cc, check_command.cc,
// inspect_command.cc, presets_command.cc, pair_command.cc.
void AddSynthCommand(CLI::App* app, int* exit_code);
void AddCheckCommand(CLI::App* app, int* exit_code);
void AddInspectCommand(CLI::App* app, int* exit_code);
void AddPresetsCommand(CLI::App* app, int* exit_code);
// pair: a rollout's and a trainer's snapshot compared (core/pairs).
void AddPairCommand(CLI::App* app, int* exit_code);
// Against a server (client library): remote_commands.cc adds audit, submit,
// get, watch, cancel and caps; bench_command.cc the load generator.
void AddRemoteCommands(CLI::App* app, int* exit_code);
// list and export (ListResults): list_command.cc.
void AddListCommands(CLI::App* app, int* exit_code);
// pairs (ListPairs): pairs_command.cc.
void AddPairsCommand(CLI::App* app, int* exit_code);
void AddBenchCommand(CLI::App* app, int* exit_code);

// Adds subcommand `name` whose callback stores run(options) in *exit_code.
// The options are owned by the callback (so they live as long as `app`);
// returns the subcommand and its options, on which the caller declares the
// command's arguments. `footer` ends the subcommand's --help.
template <typename Options>
std::pair<CLI::App*, Options*> AddCommand(CLI::App* app, int* exit_code,
                                          const char* name,
                                          const char* description,
                                          const char* footer,
                                          int (*run)(const Options&)) {
  auto options = std::make_shared<Options>();
  CLI::App* command = app->add_subcommand(name, description);
  command->footer(footer);
  command->callback([options, exit_code, run] { *exit_code = run(*options); });
  return {command, options.get()};
}

}  // namespace attnaudit::client::cli_internal

#endif  // ATTNAUDIT_CLIENT_CLI_COMMANDS_H_
