// The engine presets: what a snapshot declares for a named engine (the
// Python client's builders, engine="vllm-cpu"): its precision profile
// (arithmetic.h) and where its RoPE rounds (RopeCastPoint; docs/NUMERICS.md,
// "Engine precision", "RoPE arithmetic"), and the cast point of each Hugging
// Face model family whose modeling code rounds its RoPE differently from
// Llama's. This is the one table of them: `attnaudit presets --json` prints
// it, client/python/scripts/gen_presets.py (make py-presets) generates the
// Python client's copy from that (attnaudit/_presets.py, which the package
// carries so that it installs without this repository), and
// tests/python/test_presets.py fails while the copy is not what it writes.
//
// Pure data and lookups; thread-safe.
#ifndef ATTNAUDIT_CORE_ENGINE_PRESETS_H_
#define ATTNAUDIT_CORE_ENGINE_PRESETS_H_

#include "absl/strings/string_view.h"
#include "core/snapshot/snapshot.h"

namespace attnaudit {

struct EnginePreset {
  absl::string_view name;  // engine="..."
  EngineProfile profile;
  RopeCastPoint cast_point;
  // Checked by the conformance suite on the engine's own code
  // (docs/CONFORMANCE.md); false: written from the engine's code (the GPU
  // kernels), not yet run by the suite.
  bool conformance_checked;
};

inline constexpr EnginePreset kEnginePresets[] = {
    {"vllm-cpu", EngineProfile::kVllmCpu, RopeCastPoint::kCosSin, true},
    {"hf-eager", EngineProfile::kHfEager, RopeCastPoint::kEachOp, true},
    {"hf-sdpa", EngineProfile::kTorchFlashCpu, RopeCastPoint::kEachOp, true},
    {"torch-flash-cpu", EngineProfile::kTorchFlashCpu,
     RopeCastPoint::kAfterRope, true},
    {"vllm", EngineProfile::kFlashDecoding, RopeCastPoint::kCosSin, false},
    {"flash-decoding", EngineProfile::kFlashDecoding, RopeCastPoint::kAfterRope,
     false},
};

// Hugging Face models round their RoPE where their family's modeling code
// does (engine="hf-eager/<family>"), measured bit for bit by
// attnaudit.probe (docs/PYTHON.md, "Engine presets"). A family not listed
// rotates as Llama does: kHfDefaultCastPoint.
struct FamilyCastPoint {
  absl::string_view family;
  RopeCastPoint cast_point;
};

inline constexpr FamilyCastPoint kHfFamilyCastPoints[] = {
    {"cohere", RopeCastPoint::kCosSin},  // fp32 rotation, cos/sin cast first
    {"cohere2", RopeCastPoint::kCosSin},
    {"olmo2", RopeCastPoint::kAfterRope},  // q and k upcast to fp32
};
inline constexpr RopeCastPoint kHfDefaultCastPoint = RopeCastPoint::kEachOp;

// The preset named `name`; nullptr when there is none.
const EnginePreset* FindEnginePreset(absl::string_view name);

// The cast point's name as the wire spells it, lower case: "after_rope",
// "cos_sin", "each_op".
absl::string_view RopeCastPointName(RopeCastPoint point);

}  // namespace attnaudit

#endif  // ATTNAUDIT_CORE_ENGINE_PRESETS_H_
