"""The engine presets of the builders' engine=... argument (re-exported as
attnaudit.ENGINE_PRESETS / attnaudit.HF_FAMILY_CAST_POINTS): data only,
so both the snapshot builders and attnaudit.probe read them without
importing each other.

GENERATED from core/engine/presets.h by client/python/scripts/gen_presets.py
(make py-presets); do not edit. The package carries it so that it installs
without the repository; tests/python/test_presets.py fails while it differs
from the server's table."""

from typing import Dict

# What the builders declare for an engine (engine=...): its attention
# precision profile, where its RoPE rounds (docs/NUMERICS.md, "Engine
# precision", "RoPE arithmetic"). The conformance suite checks each
# on the engine's own code, except the GPU kernels' (docs/CONFORMANCE.md).
ENGINE_PRESETS: Dict[str, Dict[str, str]] = {
    "vllm-cpu": {"precision": "vllm_cpu", "cast_point": "cos_sin"},
    "hf-eager": {"precision": "hf_eager", "cast_point": "each_op"},
    "hf-sdpa": {"precision": "torch_flash_cpu", "cast_point": "each_op"},
    "torch-flash-cpu": {"precision": "torch_flash_cpu", "cast_point": "after_rope"},
    "vllm": {"precision": "flash_decoding", "cast_point": "cos_sin"},
    "flash-decoding": {"precision": "flash_decoding", "cast_point": "after_rope"},
}

# The RoPE cast point of each Hugging Face family whose modeling code
# rounds its RoPE differently from Llama's: engine="hf-eager/<family>".
HF_FAMILY_CAST_POINTS: Dict[str, str] = {
    "cohere": "cos_sin",
    "cohere2": "cos_sin",
    "olmo2": "after_rope",
}

# A family not listed rotates as Llama does.
HF_DEFAULT_CAST_POINT = "each_op"
