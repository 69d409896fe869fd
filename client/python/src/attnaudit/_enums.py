"""Python enums mirroring the wire enums, and lenient parsing of enum args.

The IntEnum classes are derived from the generated descriptors, so they can
never drift from the .proto: Verdict.PASS == report_pb2.VERDICT_PASS.
"""

from __future__ import annotations

import enum
from typing import Any, Dict, Optional

from attnaudit.v1 import report_pb2, service_pb2, snapshot_pb2


def _mirror(name: str, enum_descriptor, prefix: str) -> type:
    members = {v.name[len(prefix):]: v.number for v in enum_descriptor.values}
    return enum.IntEnum(name, members, module=__name__)


Verdict = _mirror("Verdict", report_pb2.Verdict.DESCRIPTOR, "VERDICT_")
Comparison = _mirror("Comparison", report_pb2.Comparison.DESCRIPTOR, "COMPARISON_")
JobState = _mirror("JobState", service_pb2.JobState.DESCRIPTOR, "JOB_STATE_")
Priority = _mirror("Priority", service_pb2.Priority.DESCRIPTOR, "PRIORITY_")

Verdict.__doc__ = ("Outcome of an audit: UNSPECIFIED, PASS, DRIFT, INVALID, "
                   "INCONCLUSIVE (nothing drifted, but the audit could not "
                   "verify what a PASS promises).")
Comparison.__doc__ = "ENGINE_VS_REFERENCE, REPLAY_VS_REFERENCE, ENGINE_VS_REPLAY."
JobState.__doc__ = "QUEUED, RUNNING, DONE, FAILED, CANCELLED."
Priority.__doc__ = "INTERACTIVE (scheduled first) or SAMPLED (rollout traffic)."


def parse_enum(enum_type, prefix: str, value: Any, what: str,
               aliases: Optional[Dict[str, str]] = None) -> int:
    """The number of a wire enum value given as its number, its full name
    ("ROPE_STYLE_NEOX"), its short name ("neox", any case) or an alias.
    Unknown values raise ValueError naming `what` and the accepted names."""
    descriptor = enum_type.DESCRIPTOR
    if isinstance(value, enum.Enum):
        value = value.value
    if isinstance(value, int) and not isinstance(value, bool):
        if descriptor.values_by_number.get(value) is not None:
            return value
    elif isinstance(value, str):
        name = value.strip().upper()
        if aliases and value.strip().lower() in aliases:
            name = aliases[value.strip().lower()].upper()
        for candidate in (name, prefix + name):
            v = descriptor.values_by_name.get(candidate)
            if v is not None:
                return v.number
    names = [v.name[len(prefix):].lower() for v in descriptor.values
             if not v.name.endswith("UNSPECIFIED")]
    if aliases:
        names += sorted(aliases)
    raise ValueError(f"{what}: unknown value {value!r}; expected one of "
                     + ", ".join(names))


KV_LAYOUT = (snapshot_pb2.KvLayout, "KV_LAYOUT_")
ROPE_STATE = (snapshot_pb2.RopeState, "ROPE_STATE_")
ROPE_STYLE = (snapshot_pb2.RopeStyle, "ROPE_STYLE_")
ROPE_SCALING = (snapshot_pb2.RopeScalingType, "ROPE_SCALING_TYPE_")
CP_SHARDING = (snapshot_pb2.CpSharding, "CP_SHARDING_")
LSE_BASE = (snapshot_pb2.LseBase, "LSE_BASE_")
WINDOW = (snapshot_pb2.SlidingWindowConvention, "SLIDING_WINDOW_CONVENTION_")
SCHEME = (snapshot_pb2.FingerprintScheme, "FINGERPRINT_SCHEME_")
CAST_POINT = (snapshot_pb2.RopeCastPoint, "ROPE_CAST_POINT_")
ENGINE_PROFILE = (snapshot_pb2.EngineProfile, "ENGINE_PROFILE_")
ROUNDING = (snapshot_pb2.Rounding, "ROUNDING_")
PRECISION_SOURCE = (snapshot_pb2.PrecisionSource, "PRECISION_SOURCE_")

ROPE_STATE_ALIASES = {"post": "post_rope", "pre": "pre_rope"}
WINDOW_ALIASES = {"hf": "hugging_face", "huggingface": "hugging_face",
                  "flash": "flash_left", "fa": "flash_left"}
PROFILE_ALIASES = {"vllm-cpu": "vllm_cpu", "hf-eager": "hf_eager",
                   "torch-flash-cpu": "torch_flash_cpu",
                   "flash-decoding": "flash_decoding",
                   "conservative": "unspecified"}
ROUNDING_ALIASES = {"nearest": "nearest_even", "rne": "nearest_even",
                    "truncate": "toward_zero", "truncation": "toward_zero",
                    "rtz": "toward_zero"}
SCALING_ALIASES = {"default": "none", "llama3": "llama3", "yarn": "yarn",
                   "linear": "linear", "dynamic": "dynamic",
                   "longrope": "longrope", "su": "longrope"}
