"""Python enums mirroring the wire enums, and lenient parsing of enum args.

The enums are IntEnum classes a type checker sees, with the numbers of the
.proto (Verdict.PASS == report_pb2.VERDICT_PASS); a test checks them against
the generated descriptors, so they cannot drift from the .proto. str() and
format() give the member's name: print(report.verdict) prints "PASS".
"""

from __future__ import annotations

import enum
from typing import Any, Dict, Optional, Tuple

from attnaudit.v1 import snapshot_pb2


class WireEnum(enum.IntEnum):
    """An IntEnum that prints as its name ("DRIFT"); numeric format specs
    (f"{v:d}") still format the number."""

    def __str__(self) -> str:
        return self.name

    def __format__(self, spec: str) -> str:
        try:
            return format(self.name, spec)
        except ValueError:
            return int.__format__(int(self), spec)


class Verdict(WireEnum):
    """Outcome of an audit: UNSPECIFIED, PASS, DRIFT, INVALID, INCONCLUSIVE
    (nothing drifted, but the audit could not verify what a PASS
    promises)."""

    UNSPECIFIED = 0
    PASS = 1
    DRIFT = 2
    INVALID = 3
    INCONCLUSIVE = 4


class Comparison(WireEnum):
    """ENGINE_VS_REFERENCE, REPLAY_VS_REFERENCE, ENGINE_VS_REPLAY,
    ENGINE_VS_EMULATION."""

    UNSPECIFIED = 0
    ENGINE_VS_REFERENCE = 1
    REPLAY_VS_REFERENCE = 2
    ENGINE_VS_REPLAY = 3
    ENGINE_VS_EMULATION = 4


class JobState(WireEnum):
    """QUEUED, RUNNING, DONE, FAILED, CANCELLED."""

    UNSPECIFIED = 0
    QUEUED = 1
    RUNNING = 2
    DONE = 3
    FAILED = 4
    CANCELLED = 5


class Priority(WireEnum):
    """INTERACTIVE (scheduled first) or SAMPLED (rollout traffic)."""

    UNSPECIFIED = 0
    INTERACTIVE = 1
    SAMPLED = 2


# Each enum, the generated wire enum it mirrors and that enum's value prefix
# (checked by tests/python/test_stubs.py).
MIRRORS: Tuple[Tuple[type, str, str, str], ...] = (
    (Verdict, "report_pb2", "Verdict", "VERDICT_"),
    (Comparison, "report_pb2", "Comparison", "COMPARISON_"),
    (JobState, "service_pb2", "JobState", "JOB_STATE_"),
    (Priority, "service_pb2", "Priority", "PRIORITY_"),
)


def parse_enum(enum_type: Any, prefix: str, value: Any, what: str,
               aliases: Optional[Dict[str, str]] = None) -> Any:
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


def wire(number: int) -> Any:
    """`number` for a field of a generated enum type. The generated stubs
    type such a field as the enum's class, which no int is (parse_enum's
    results are typed the same way); the field takes any of its numbers."""
    return number


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
SNAPSHOT_ROLE = (snapshot_pb2.SnapshotRole, "SNAPSHOT_ROLE_")

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
