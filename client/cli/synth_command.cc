// attnaudit synth: writes a realistic synthetic snapshot whose engine
// outputs come from the engine simulator (core/sim), optionally with a
// fault injected (docs/SIMULATOR.md).
#include <sys/stat.h>

#include <iostream>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/cli/args.h"
#include "client/cli/commands.h"
#include "core/sim/simulator.h"
#include "proto/codec/codec.h"

namespace attnaudit::cli {
namespace {

constexpr char kHelp[] =
    "usage: attnaudit synth --preset NAME [--batch B] [--context L]\n"
    "         [--queries Sq] [--page-size P] [--kv-dtype "
    "bf16|f16|f32|fp8_e4m3]\n"
    "         [--permute-pages] [--prefix N] [--seed S] [--fault KIND]\n"
    "         [--layer N] [--split-tokens T] -o FILE\n"
    "Writes a decode snapshot with real model shapes whose engine out/lse/\n"
    "log-probs come from a simulated split-KV flash-decoding kernel.\n"
    "  --preset        llama3-8b, qwen3-8b, gemma2-9b, gpt-oss-20b, glm4-9b,\n"
    "                  phi4-mini\n"
    "  --batch         rows (default 1); row b holds L - 7b tokens\n"
    "  --context       KV length L of row 0 (default 1024)\n"
    "  --queries       queries per row, the last Sq tokens (default 1)\n"
    "  --page-size     tokens per KV page (default 16)\n"
    "  --kv-dtype      KV cache dtype (default bf16; fp8 uses per-head "
    "scales)\n"
    "  --permute-pages scatter logical blocks over the page pool\n"
    "  --prefix        tokens of a prefix shared by every row (default 0)\n"
    "  --seed          PRNG seed (default 1)\n"
    "  --fault         inject an engine bug: stale-page, swapped-pages,\n"
    "                  rope-offset, k-rope-twice, lse-base2, wrong-scale,\n"
    "                  gqa-mapping, drop-block, fp8-scale\n"
    "  --layer         labels.layer; gemma2/gpt-oss slide on even layers\n"
    "  --split-tokens  the simulated kernel's split-KV size (default 256)\n"
    "  -o, --output    the snapshot file to write\n";

int Fail(const std::string& message) {
  std::cerr << "attnaudit synth: " << message << "\n";
  return kExitError;
}

// Reads one integer flag into *out (left unchanged when absent).
bool IntFlag(const Args& args, const char* flag, int64_t* out,
             std::string* error) {
  absl::StatusOr<int64_t> v = args.GetInt(flag, *out);
  if (!v.ok()) {
    *error = std::string(v.status().message());
    return false;
  }
  *out = *v;
  return true;
}

}  // namespace

int RunSynth(const Argv& argv) {
  Args args({"preset", "batch", "context", "queries", "page-size", "kv-dtype",
             "prefix", "seed", "fault", "layer", "split-tokens", "output"},
            {"permute-pages", "help"}, {{"o", "output"}});
  if (absl::Status st = args.Parse(argv); !st.ok()) {
    std::cerr << "attnaudit synth: " << st.message() << "\n" << kHelp;
    return kExitError;
  }
  if (args.Has("help")) {
    std::cout << kHelp;
    return 0;
  }
  if (!args.positional().empty()) {
    return Fail(absl::StrCat("unexpected argument '", args.positional()[0],
                             "' (the output goes after -o)"));
  }
  if (!args.Has("preset")) {
    return Fail(absl::StrCat("--preset is required; known presets: ",
                             absl::StrJoin(PresetNames(), ", ")));
  }
  if (!args.Has("output") || args.Get("output").empty()) {
    return Fail("-o FILE is required");
  }
  SynthOptions o;
  o.preset = args.Get("preset");
  if (absl::StatusOr<ModelPreset> p = FindPreset(o.preset); !p.ok()) {
    return Fail(std::string(p.status().message()));
  }
  std::string error;
  int64_t seed = static_cast<int64_t>(o.seed);
  if (!IntFlag(args, "batch", &o.batch, &error) ||
      !IntFlag(args, "context", &o.context, &error) ||
      !IntFlag(args, "queries", &o.queries, &error) ||
      !IntFlag(args, "page-size", &o.page_size, &error) ||
      !IntFlag(args, "prefix", &o.prefix, &error) ||
      !IntFlag(args, "seed", &seed, &error) ||
      !IntFlag(args, "layer", &o.layer, &error) ||
      !IntFlag(args, "split-tokens", &o.split_tokens, &error)) {
    return Fail(error);
  }
  o.seed = static_cast<uint64_t>(seed);
  o.permute_pages = args.Has("permute-pages");
  if (args.Has("kv-dtype")) {
    o.kv_dtype = DTypeFromName(args.Get("kv-dtype"));
    if (o.kv_dtype != DType::kBF16 && o.kv_dtype != DType::kF16 &&
        o.kv_dtype != DType::kF32 && o.kv_dtype != DType::kF8E4M3) {
      return Fail(absl::StrCat("kv-dtype: unknown or unsupported '",
                               args.Get("kv-dtype"),
                               "'; use bf16, f16, f32 or fp8_e4m3"));
    }
  }
  if (args.Has("fault")) {
    absl::StatusOr<Fault> fault = ParseFault(args.Get("fault"));
    if (!fault.ok()) return Fail(std::string(fault.status().message()));
    o.fault = *fault;
  }

  SynthDetails details;
  absl::StatusOr<Snapshot> snapshot = Synthesize(o, &details);
  if (!snapshot.ok()) return Fail(std::string(snapshot.status().message()));
  for (const std::string& note : details.notes) {
    std::cerr << "attnaudit synth: note: " << note << "\n";
  }
  const std::string path = args.Get("output");
  if (absl::Status st = WriteSnapshotFile(path, *snapshot); !st.ok()) {
    return Fail(std::string(st.message()));
  }
  struct stat info;
  const int64_t bytes = ::stat(path.c_str(), &info) == 0 ? info.st_size : -1;
  const SnapshotDims d = DimsOf(*snapshot);
  std::cerr << "attnaudit synth: " << o.preset << " B=" << d.batch
            << " Sq=" << d.queries << " Hq=" << d.q_heads
            << " Hkv=" << d.kv_heads << " D=" << d.head_dim
            << " L0=" << snapshot->kv_seq_lens.IntAt(0)
            << " pages=" << d.num_pages << "x" << d.page_size
            << " kv=" << DTypeName(snapshot->k_pages.dtype())
            << " fault=" << details.fault << " -> " << path << " (" << bytes
            << " bytes)\n";
  return 0;
}

}  // namespace attnaudit::cli
