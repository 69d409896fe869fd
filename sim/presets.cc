// Model presets of the engine simulator (the fault names are the fault
// registry's, sim/fault_registry.cc).
//
// The shapes are the published model configs (docs/SIMULATOR.md,
// "Presets"). Only what decode attention needs is modelled; in particular Phi-4
// mini's LongRoPE short/long factors are not (plain NeoX RoPE, partial 96),
// and Qwen3's QK-norm is baked into q/K before they reach attention.
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "sim/simulator.h"

namespace attnaudit {
namespace {

ModelPreset Base(const char* name, int64_t hq, int64_t hkv, int64_t d,
                 double theta) {
  ModelPreset p;
  p.name = name;
  p.q_heads = hq;
  p.kv_heads = hkv;
  p.head_dim = d;
  p.rope.theta = theta;
  p.rope.style = RopeStyle::kNeox;
  p.rope.rotary_dim = d;
  return p;
}

std::vector<ModelPreset> AllPresets() {
  std::vector<ModelPreset> out;
  {
    // Llama-3.1-8B: rope_scaling {rope_type: llama3, factor 8,
    // low_freq_factor 1, high_freq_factor 4, original 8192}.
    ModelPreset p = Base("llama3-8b", 32, 8, 128, 500000.0);
    p.rope.scaling.type = RopeScalingType::kLlama3;
    p.rope.scaling.factor = 8.0;
    p.rope.scaling.low_freq_factor = 1.0;
    p.rope.scaling.high_freq_factor = 4.0;
    p.rope.scaling.original_max_position = 8192;
    out.push_back(p);
  }
  out.push_back(Base("qwen3-8b", 32, 8, 128, 1000000.0));
  {
    // Gemma-2-9B: query_pre_attn_scalar 256 (= head_dim here), attention
    // logit soft-cap 50, a 4096 window on alternating (even) layers.
    ModelPreset p = Base("gemma2-9b", 16, 8, 256, 10000.0);
    p.softmax_scale = 1.0 / std::sqrt(256.0);
    p.sliding_window = 4096;
    p.logit_softcap = 50.0;
    out.push_back(p);
  }
  {
    // gpt-oss-20b: YaRN x32 from 4096 (beta_fast 32, beta_slow 1), a 128
    // window on even layers, learned per-head sinks.
    ModelPreset p = Base("gpt-oss-20b", 64, 8, 64, 150000.0);
    p.rope.scaling.type = RopeScalingType::kYarn;
    p.rope.scaling.factor = 32.0;
    p.rope.scaling.original_max_position = 4096;
    p.rope.scaling.beta_fast = 32.0;
    p.rope.scaling.beta_slow = 1.0;
    p.sliding_window = 128;
    p.has_sinks = true;
    out.push_back(p);
  }
  {
    // GLM-4-9B: GPT-J interleaved pairs on half of the head (64 of 128).
    ModelPreset p = Base("glm4-9b", 32, 2, 128, 10000.0);
    p.rope.style = RopeStyle::kGptj;
    p.rope.rotary_dim = 64;
    out.push_back(p);
  }
  {
    // Phi-4-mini: partial rotary factor 0.75 (96 of 128).
    ModelPreset p = Base("phi4-mini", 24, 8, 128, 10000.0);
    p.rope.rotary_dim = 96;
    out.push_back(p);
  }
  return out;
}

}  // namespace

std::vector<std::string> PresetNames() {
  std::vector<std::string> names;
  for (const ModelPreset& p : AllPresets()) names.push_back(p.name);
  return names;
}

absl::StatusOr<ModelPreset> FindPreset(const std::string& name) {
  for (ModelPreset& p : AllPresets()) {
    if (p.name == name) return std::move(p);
  }
  return absl::NotFoundError(
      absl::StrCat("preset: unknown preset '", name,
                   "'; known presets: ", absl::StrJoin(PresetNames(), ", ")));
}

}  // namespace attnaudit
