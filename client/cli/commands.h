// The attnaudit CLI's subcommands. Each takes the arguments after its name
// and returns the process exit code: 0 success / PASS, 1 DRIFT, 2 invalid
// input or error (the message, naming the field, goes to stderr).
#ifndef ATTNAUDIT_CLIENT_CLI_COMMANDS_H_
#define ATTNAUDIT_CLIENT_CLI_COMMANDS_H_

#include <string>
#include <vector>

namespace attnaudit::cli {

constexpr int kExitPass = 0;
constexpr int kExitDrift = 1;
constexpr int kExitError = 2;

using Argv = std::vector<std::string>;

// Offline (core only).
int RunSynth(const Argv& args);    // synth_command.cc
int RunCheck(const Argv& args);    // check_command.cc
int RunInspect(const Argv& args);  // inspect_command.cc
// Against a server (client library).
int RunAudit(const Argv& args);  // remote_commands.cc
int RunSubmit(const Argv& args);
int RunGet(const Argv& args);
int RunWatch(const Argv& args);
int RunCancel(const Argv& args);
int RunCaps(const Argv& args);
int RunBench(const Argv& args);  // bench_command.cc (load generator)

}  // namespace attnaudit::cli

#endif  // ATTNAUDIT_CLIENT_CLI_COMMANDS_H_
