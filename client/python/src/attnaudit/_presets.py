"""The engine presets of the builders' engine=... argument (re-exported as
attnaudit.ENGINE_PRESETS / attnaudit.HF_FAMILY_CAST_POINTS): data only,
so both the snapshot builders and attnaudit.probe read them without
importing each other.

A copy of core/engine/presets.h (`attnaudit presets --json` prints it),
carried so that the package installs without the repository;
tests/python/test_presets.py fails on any difference."""

from typing import Dict

# What the builders declare for an engine (engine=...): its attention
# precision profile and where its RoPE rounds (docs/NUMERICS.md, "Engine
# precision", "RoPE arithmetic"). The conformance suite checks each on the
# engine's own code (docs/CONFORMANCE.md).
ENGINE_PRESETS: Dict[str, Dict[str, str]] = {
    "vllm-cpu": {"precision": "vllm_cpu", "cast_point": "cos_sin"},
    "hf-eager": {"precision": "hf_eager", "cast_point": "each_op"},
    "hf-sdpa": {"precision": "torch_flash_cpu", "cast_point": "each_op"},
    "torch-flash-cpu": {"precision": "torch_flash_cpu", "cast_point": "after_rope"},
    # GPU kernels: written from their code, not yet run by the suite.
    "vllm": {"precision": "flash_decoding", "cast_point": "cos_sin"},
    "flash-decoding": {"precision": "flash_decoding", "cast_point": "after_rope"},
}

# Hugging Face models round their RoPE where their family's modeling code
# does: engine="hf-eager/<family>" (or hf-sdpa/...) takes the family's cast
# point, measured bit for bit by attnaudit.probe on transformers 5.19
# (--family; docs/PYTHON.md, "Engine presets"). A family not listed rotates
# as Llama does (each_op: q·cos and rotate_half(q)·sin rounded apart).
HF_FAMILY_CAST_POINTS: Dict[str, str] = {
    "cohere": "cos_sin",      # rotates in fp32 with cos/sin already cast
    "cohere2": "cos_sin",
    "olmo2": "after_rope",    # rotates q and k upcast to fp32
}
