// attnaudit: the command-line tool. Offline commands run the core pipeline
// directly; remote commands talk to attnaudit-server.
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "client/cli/commands.h"

namespace {

struct Command {
  const char* name;
  int (*run)(const attnaudit::cli::Argv&);
  const char* help;
};

const Command kCommands[] = {
    {"synth", attnaudit::cli::RunSynth,
     "write a realistic synthetic snapshot (engine simulator, faults)"},
    {"check", attnaudit::cli::RunCheck,
     "audit a snapshot file offline (exit 0 PASS, 1 DRIFT, 2 invalid)"},
    {"inspect", attnaudit::cli::RunInspect,
     "print a snapshot's shapes, dtypes, sizes and labels"},
#ifdef ATTNAUDIT_HAVE_REMOTE
    {"audit", attnaudit::cli::RunAudit, "audit a snapshot on a server"},
    {"submit", attnaudit::cli::RunSubmit, "submit snapshots as async jobs"},
    {"get", attnaudit::cli::RunGet, "get a job's result"},
    {"watch", attnaudit::cli::RunWatch, "stream finished results"},
    {"cancel", attnaudit::cli::RunCancel, "cancel a job"},
    {"caps", attnaudit::cli::RunCaps, "print a server's capabilities"},
    {"bench", attnaudit::cli::RunBench, "load-generate against a server"},
#endif
};

void Usage(FILE* out) {
  std::fprintf(out,
               "usage: attnaudit COMMAND [ARGS...]   (COMMAND --help for "
               "its flags)\n\ncommands:\n");
  for (const Command& c : kCommands) {
    std::fprintf(out, "  %-8s %s\n", c.name, c.help);
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || std::strcmp(argv[1], "--help") == 0 ||
      std::strcmp(argv[1], "-h") == 0 || std::strcmp(argv[1], "help") == 0) {
    Usage(argc < 2 ? stderr : stdout);
    return argc < 2 ? attnaudit::cli::kExitError : 0;
  }
  for (const Command& c : kCommands) {
    if (std::strcmp(argv[1], c.name) == 0) {
      return c.run(attnaudit::cli::Argv(argv + 2, argv + argc));
    }
  }
  std::fprintf(stderr, "attnaudit: unknown command '%s'\n\n", argv[1]);
  Usage(stderr);
  return attnaudit::cli::kExitError;
}
