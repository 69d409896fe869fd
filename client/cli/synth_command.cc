// attnaudit synth: writes a realistic synthetic snapshot whose engine
// outputs come from the engine simulator (sim/), optionally with a
// fault injected (docs/SIMULATOR.md).
#include <sys/stat.h>

#include <iostream>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/cli/commands.h"
#include "proto/codec/codec.h"
#include "sim/simulator.h"

namespace attnaudit::client::cli_internal {
namespace {

struct SynthCommand {
  SynthOptions synth;
  std::string kv_dtype;  // empty: SynthOptions' default
  std::string fault;     // empty: none
  std::string cp_sharding = "page";
  std::string cp_fault;  // empty: none
  // Labels of a train-rollout pair side (both empty: none).
  std::string role;
  std::string run;
  std::string output;
};

int Fail(absl::string_view message) {
  std::cerr << "attnaudit synth: " << message << "\n";
  return kExitError;
}

// The options with --kv-dtype and --fault applied.
absl::StatusOr<SynthOptions> ResolveOptions(const SynthCommand& o) {
  SynthOptions synth = o.synth;
  if (absl::StatusOr<ModelPreset> p = FindPreset(synth.preset); !p.ok()) {
    return p.status();
  }
  if (!o.kv_dtype.empty()) {
    synth.kv_dtype = DTypeFromName(o.kv_dtype);
    if (synth.kv_dtype != DType::kBF16 && synth.kv_dtype != DType::kF16 &&
        synth.kv_dtype != DType::kF32 && synth.kv_dtype != DType::kF8E4M3) {
      return absl::InvalidArgumentError(
          absl::StrCat("kv-dtype: unknown or unsupported '", o.kv_dtype,
                       "'; use bf16, f16, f32 or fp8_e4m3"));
    }
  }
  if (!o.fault.empty()) {
    absl::StatusOr<Fault> fault = ParseFault(o.fault);
    if (!fault.ok()) return fault.status();
    synth.fault = *fault;
  }
  synth.cp_sharding = o.cp_sharding == "owners" ? CpSharding::kExplicitOwners
                      : o.cp_sharding == "interleave"
                          ? CpSharding::kTokenInterleaved
                          : CpSharding::kPageInterleaved;
  if (!o.cp_fault.empty()) {
    absl::StatusOr<CpFault> fault = ParseCpFault(o.cp_fault);
    if (!fault.ok()) return fault.status();
    synth.cp_fault = *fault;
  }
  return synth;
}

// One line on stderr about what was written.
void PrintSummary(const SynthOptions& synth, const SynthDetails& details,
                  const Snapshot& snapshot, const std::string& path) {
  struct stat info;
  const int64_t bytes = ::stat(path.c_str(), &info) == 0 ? info.st_size : -1;
  const SnapshotDims d = DimsOf(snapshot);
  std::cerr << "attnaudit synth: " << synth.preset << " B=" << d.batch
            << " Sq=" << d.queries << " Hq=" << d.q_heads
            << " Hkv=" << d.kv_heads << " D=" << d.head_dim
            << " L0=" << snapshot.kv_seq_lens.IntAt(0)
            << " pages=" << d.num_pages << "x" << d.page_size
            << " kv=" << DTypeName(snapshot.k_pages.dtype());
  if (synth.cp_world_size > 1) {
    std::cerr << " cp=" << synth.cp_world_size << "x"
              << (synth.cp_sharding == CpSharding::kExplicitOwners ? "owners"
                  : synth.cp_sharding == CpSharding::kTokenInterleaved
                      ? absl::StrCat("interleave", synth.cp_interleave)
                      : "page");
  }
  std::cerr << " fault=" << details.fault << " -> " << path << " (" << bytes
            << " bytes)\n";
}

int RunSynth(const SynthCommand& o) {
  absl::StatusOr<SynthOptions> synth = ResolveOptions(o);
  if (!synth.ok()) return Fail(synth.status().message());
  SynthDetails details;
  absl::StatusOr<Snapshot> snapshot = Synthesize(*synth, &details);
  if (!snapshot.ok()) return Fail(snapshot.status().message());
  if (!o.role.empty()) {
    snapshot->labels.role =
        o.role == "trainer" ? SnapshotRole::kTrainer : SnapshotRole::kRollout;
  }
  snapshot->labels.run = o.run;
  for (const std::string& note : details.notes) {
    std::cerr << "attnaudit synth: note: " << note << "\n";
  }
  if (absl::Status st = WriteSnapshotFile(o.output, *snapshot); !st.ok()) {
    return Fail(st.message());
  }
  PrintSummary(*synth, details, *snapshot, o.output);
  return 0;
}

}  // namespace

void AddSynthCommand(CLI::App* app, int* exit_code) {
  auto [command, o] = AddCommand<SynthCommand>(
      app, exit_code, "synth",
      "write a realistic synthetic snapshot (engine simulator, faults)",
      "Writes a decode snapshot with real model shapes whose engine out/lse/\n"
      "log-probs come from a simulated split-KV flash-decoding kernel.",
      &RunSynth);
  SynthOptions& s = o->synth;
  command
      ->add_option(
          "--preset", s.preset,
          absl::StrCat("model shapes: ", absl::StrJoin(PresetNames(), ", ")))
      ->required();
  command->add_option("--batch", s.batch, "rows; row b holds L - 7b tokens")
      ->capture_default_str();
  command->add_option("--context", s.context, "KV length L of row 0")
      ->capture_default_str();
  command->add_option("--queries", s.queries, "queries per row (the last Sq)")
      ->capture_default_str();
  command->add_option("--page-size", s.page_size, "tokens per KV page")
      ->capture_default_str();
  command->add_option("--kv-dtype", o->kv_dtype,
                      "KV cache dtype: bf16 (default), f16, f32, fp8_e4m3 "
                      "(per-head scales)");
  command->add_flag("--permute-pages", s.permute_pages,
                    "scatter logical blocks over the page pool");
  command->add_flag(
      "--no-rope-table", [&s](int64_t) { s.send_rope_table = false; },
      "do not send the engine's inverse frequencies (attnaudit then computes "
      "its own RoPE, with its uncertainty)");
  command
      ->add_option("--prefix", s.prefix,
                   "tokens of a prefix shared by every row")
      ->capture_default_str();
  command->add_option("--seed", s.seed, "PRNG seed")->capture_default_str();
  command->add_option("--fault", o->fault,
                      absl::StrCat("inject an engine bug: ",
                                   absl::StrJoin(FaultNames(), ", ")));
  command
      ->add_option("--layer", s.layer,
                   "labels.layer; gemma2/gpt-oss slide on even layers")
      ->capture_default_str();
  command
      ->add_option("--split-tokens", s.split_tokens,
                   "the simulated kernel's split-KV size")
      ->capture_default_str();
  command
      ->add_option("--cp-world-size", s.cp_world_size,
                   "context-parallel ranks W: the engine runs sharded and "
                   "writes cp.rank_out/rank_lse")
      ->capture_default_str()
      ->check(CLI::Range(1, 1024));
  command
      ->add_option("--cp-sharding", o->cp_sharding,
                   "owners (contiguous block ranges), interleave (tokens) or "
                   "page")
      ->capture_default_str()
      ->check(CLI::IsMember({"owners", "interleave", "page"}));
  command
      ->add_option("--cp-interleave", s.cp_interleave,
                   "--cp-sharding interleave: consecutive tokens per rank")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 24));
  command->add_option("--cp-fault", o->cp_fault,
                      absl::StrCat("inject a context-parallel engine bug: ",
                                   absl::StrJoin(CpFaultNames(), ", ")));
  command
      ->add_option("--cp-fault-rank", s.cp_fault_rank,
                   "the rank a per-rank CP fault hits (-1: from the seed)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{-1}, int64_t{1023}));
  command
      ->add_option("--role", o->role,
                   "labels.role: rollout or trainer (a server joins the two "
                   "sides of one --run, layer and seed: attnaudit pairs)")
      ->check(CLI::IsMember({"rollout", "trainer"}));
  command->add_option("--run", o->run, "labels.run");
  command->add_option("-o,--output", o->output, "the snapshot file to write")
      ->required();
}

}  // namespace attnaudit::client::cli_internal
