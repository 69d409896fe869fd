"""The probe's vocabulary: what an engine hands the probe, what it gets back.

An engine is a few plain callables over numpy arrays (float64 arrays whose
values the engine's dtype holds exactly), so that the probe's fit runs on
synthetic numpy engines in `make test` and on real ones (attnaudit.probe.
adapters) alike.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np


@dataclasses.dataclass
class AttentionOutput:
    """One decode-attention call's result: out [B, H, D] (the engine's
    output values, exactly, as float64) and, when the op returns one, its
    log-sum-exp [B, H] (natural log)."""

    out: np.ndarray
    lse: Optional[np.ndarray] = None


# (q [B, H, D], k per row [L_b, Hkv, D], v per row [L_b, Hkv, D], scale)
# -> AttentionOutput. Query head h reads KV head h // (H // Hkv).
AttentionOp = Callable[[np.ndarray, Sequence[np.ndarray], Sequence[np.ndarray], float],
                       AttentionOutput]


@dataclasses.dataclass
class RopeOutput:
    """The engine's rotary op applied to x [T, Hx, D]: out [T, Hx, D], and
    the engine's own fp32 cos and sin [T, D / 2] for those positions (before
    any cast): with them the candidates are computed bit for bit, even where
    two libms' cos/sin differ. rotary_dim: the leading dimensions the op
    rotates (partial rotary; None: all D), the rest must pass through."""

    out: np.ndarray
    cos: np.ndarray
    sin: np.ndarray
    rotary_dim: Optional[int] = None


# (x [T, Hx, D], positions int64 [T]) -> RopeOutput
RopeOp = Callable[[np.ndarray, np.ndarray], RopeOutput]


@dataclasses.dataclass
class Engine:
    """An engine to probe.

    name: what the evidence calls it ("vllm-cpu"); dtype: the model dtype its
    ops run in ("bf16", "f16", "f32"); attention: its decode attention op;
    attention_f32: the same op run in fp32 (None: not available), where its
    exp is measured to an fp32 ulp; rope: its rotary op (None: it has none);
    rope_style: "neox" or "gptj"; max_position: the RoPE positions probed go
    up to this (exclusive; the op's table must cover it); profile: the
    attnaudit profile the measured fields refine ("vllm_cpu", "custom", ...);
    head_dim, heads (H, Hkv): the shape of the probe's rows; max_keys: the
    longest row (the long-row check); versions: library versions for the
    evidence ("torch 2.13.0"); notes: anything else the evidence should say
    (the kernel library loaded, the ISA path)."""

    name: str
    dtype: str
    attention: AttentionOp
    attention_f32: Optional[AttentionOp] = None
    rope: Optional[RopeOp] = None
    rope_style: str = "neox"
    max_position: int = 100_000
    profile: str = "custom"
    head_dim: int = 128
    heads: Tuple[int, int] = (8, 2)
    max_keys: int = 32768
    versions: Tuple[str, ...] = ()
    notes: Tuple[str, ...] = ()


@dataclasses.dataclass
class Finding:
    """One fitted quantity and what decided it.

    value: the winner ("toward_zero", "f32", "cos_sin/toward_zero", a
    number for exp), or "undetermined"; cases: what was measured (elements,
    rows); decisive: the cases where the leading candidates disagree;
    matched: of those, the ones the winner explains exactly; runner_up and
    its matches; counts: every candidate's exact matches; line: the phrase
    the evidence line carries."""

    name: str
    value: Any
    cases: int = 0
    decisive: int = 0
    matched: int = 0
    runner_up: Optional[str] = None
    runner_up_matched: int = 0
    counts: Dict[str, int] = dataclasses.field(default_factory=dict)
    stats: Dict[str, float] = dataclasses.field(default_factory=dict)
    line: str = ""

    @property
    def determined(self) -> bool:
        return self.value != "undetermined"


@dataclasses.dataclass
class ProbeResult:
    """The probe's fit for one engine and dtype.

    precision: an attnaudit.v1.EnginePrecision dict (Snapshot's precision=,
    attnaudit.snapshot.engine_precision): the profile, the measured fields
    that differ from the profile's assumptions, the roundings, source
    "measured" and the evidence line; cast_point: the RoPE cast point
    ("after_rope", "cos_sin", "each_op"; None when not measured or
    immaterial, e.g. in f32); findings: each fitted quantity; host: the
    CPU model and ISA flags, library versions; seconds: the probe's time."""

    engine: str
    dtype: str
    precision: Dict[str, Any]
    cast_point: Optional[str]
    findings: Dict[str, Finding]
    host: Dict[str, Any]
    seconds: float = 0.0
    measured: Dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def evidence(self) -> str:
        return str(self.precision.get("evidence", ""))

    def snapshot_options(self) -> Dict[str, Any]:
        """Keyword arguments for the Snapshot builders: precision=, and the
        RoPE cast point to merge into rope= (under "cast_point")."""
        out: Dict[str, Any] = {"precision": dict(self.precision)}
        if self.cast_point:
            out["cast_point"] = self.cast_point
        return out

    def to_dict(self) -> Dict[str, Any]:
        """Everything, JSON-serialisable."""
        return {"engine": self.engine, "dtype": self.dtype,
                "precision": dict(self.precision), "cast_point": self.cast_point,
                "measured": dict(self.measured),
                "findings": {k: _jsonable(dataclasses.asdict(f))
                             for k, f in self.findings.items()},
                "host": _jsonable(self.host), "seconds": round(self.seconds, 3)}


def _jsonable(x: Any) -> Any:
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, float) and not np.isfinite(x):
        return str(x)
    return x


Rows = List[np.ndarray]
