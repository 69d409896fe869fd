#include "core/engine/presets.h"

namespace attnaudit {

const EnginePreset* FindEnginePreset(absl::string_view name) {
  for (const EnginePreset& preset : kEnginePresets) {
    if (preset.name == name) return &preset;
  }
  return nullptr;
}

absl::string_view RopeCastPointName(RopeCastPoint point) {
  switch (point) {
    case RopeCastPoint::kAfterRope:
      return "after_rope";
    case RopeCastPoint::kCosSin:
      return "cos_sin";
    case RopeCastPoint::kEachOp:
      return "each_op";
  }
  return "after_rope";
}

}  // namespace attnaudit
