// attnaudit presets [--json]: the engine presets of core/engine/presets.h,
// the one table of them (the Python client's copy is checked against this
// output by tests/python/test_presets.py).
#include <iostream>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/cli/commands.h"
#include "core/engine/arithmetic.h"
#include "core/engine/presets.h"

namespace attnaudit::client::cli_internal {
namespace {

struct PresetsCommand {
  bool json = false;
};

// The table's names are literals of lower-case ASCII, digits, '-' and '_':
// nothing JSON escapes.
std::string Quoted(absl::string_view name) {
  return absl::StrCat("\"", name, "\"");
}

std::string Json() {
  std::string out = "{\n  \"engine_presets\": {";
  const char* separator = "\n";
  for (const EnginePreset& p : kEnginePresets) {
    absl::StrAppend(
        &out, separator, "    ", Quoted(p.name),
        ": {\"precision\": ", Quoted(EngineProfileName(p.profile)),
        ", \"cast_point\": ", Quoted(RopeCastPointName(p.cast_point)),
        ", \"conformance_checked\": ", p.conformance_checked ? "true" : "false",
        "}");
    separator = ",\n";
  }
  absl::StrAppend(&out, "\n  },\n  \"hf_family_cast_points\": {");
  separator = "\n";
  for (const FamilyCastPoint& f : kHfFamilyCastPoints) {
    absl::StrAppend(&out, separator, "    ", Quoted(f.family), ": ",
                    Quoted(RopeCastPointName(f.cast_point)));
    separator = ",\n";
  }
  absl::StrAppend(&out, "\n  },\n  \"hf_default_cast_point\": ",
                  Quoted(RopeCastPointName(kHfDefaultCastPoint)), "\n}\n");
  return out;
}

std::string Table() {
  std::string out = absl::StrFormat("%-16s %-16s %-11s %s\n", "engine",
                                    "precision", "rope cast", "checked by");
  for (const EnginePreset& p : kEnginePresets) {
    absl::StrAppendFormat(
        &out, "%-16s %-16s %-11s %s\n", p.name, EngineProfileName(p.profile),
        RopeCastPointName(p.cast_point),
        p.conformance_checked ? "the conformance suite" : "(from its code)");
  }
  absl::StrAppendFormat(&out,
                        "\nhf-eager/<family>, hf-sdpa/<family>: the family's "
                        "RoPE cast point (%s when not listed)\n",
                        RopeCastPointName(kHfDefaultCastPoint));
  for (const FamilyCastPoint& f : kHfFamilyCastPoints) {
    absl::StrAppendFormat(&out, "  %-14s %s\n", f.family,
                          RopeCastPointName(f.cast_point));
  }
  return out;
}

int RunPresets(const PresetsCommand& o) {
  std::cout << (o.json ? Json() : Table());
  return 0;
}

}  // namespace

void AddPresetsCommand(CLI::App* app, int* exit_code) {
  auto [command, o] = AddCommand<PresetsCommand>(
      app, exit_code, "presets",
      "print the engine presets: each engine's precision profile and RoPE "
      "cast point",
      "The names the Python client's builders take as engine=... "
      "(docs/PYTHON.md, \"Engine presets\").",
      &RunPresets);
  command->add_flag("--json", o->json, "print them as JSON");
}

}  // namespace attnaudit::client::cli_internal
