"""The engine probe: an engine's arithmetic measured, not assumed.

    from attnaudit import probe
    result = probe.run(probe.adapters.vllm_cpu("bf16"))
    print(result.evidence)
    snap = Snapshot.from_paged_kv(..., precision=result.precision,
                                  rope=dict(rope, cast_point=result.cast_point))

or `python -m attnaudit.probe --engine vllm-cpu --dtype bf16`.

run() calls the engine's own attention op and RoPE op once on synthetic
inputs whose fp64 answers are known (attnaudit.probe._attention and
_rope say how each is built) and fits: the output's rounding (nearest even
or truncation), the score and probability dtypes and their rounding, an
upper bound on the exp's error (the op in fp32; its LSE where it returns
one), the RoPE cast point and its rounding, and checks the fit on long
realistic rows (1k-32k keys, flat and peaked). It returns a ProbeResult
whose `precision` is an attnaudit.v1.EnginePrecision dict with source
"measured" and a one-line evidence (host CPU and ISA, versions, the
decisive counts).

Declared fields: the roundings of every narrowing the probe saw, and the
dtypes and exp bound only where they differ from what the engine's profile
already assumes (docs/NUMERICS.md, "Engine precision"): a measured value
equal to the profile's is left to the profile, so a profile's own measured
allowances (torch-flash-cpu's LSE) stay in force.

An Engine is a handful of numpy callables (attnaudit.probe.Engine); the
adapters for real engines (vLLM CPU, Hugging Face eager and sdpa, torch's
CPU flash attention; FlashAttention and FlashInfer, untested without a GPU)
import torch and vLLM lazily, so this module needs numpy only.
"""

from __future__ import annotations

import time
from typing import Any, Dict, Optional, Tuple

import numpy as np

from . import _attention, _host, _rope
from ._numerics import dtype_name
from ._types import (AttentionOp, AttentionOutput, Engine, Finding, ProbeResult,
                     RopeOp, RopeOutput)

__all__ = ["AttentionOp", "AttentionOutput", "Engine", "Finding", "ProbeResult",
           "RopeOp", "RopeOutput", "preset", "run"]

EVIDENCE_BYTES = 1024

# What each profile assumes (core/engine/arithmetic.cc): scores, P, exp ulps.
# "model": the model dtype; "kv": the KV dtype (the model dtype here).
PROFILE_ASSUMES: Dict[str, Tuple[str, str, int]] = {
    "unspecified": ("model", "model", 20), "custom": ("f32", "f32", 2),
    "flash_decoding": ("f32", "kv", 2), "vllm_cpu": ("f32", "model", 4),
    "hf_eager": ("model", "model", 2), "torch_flash_cpu": ("f32", "model", 20),
}


def run(engine: Engine, *, seed: int = 0) -> ProbeResult:
    """Probes `engine` (see the module docstring). Raises what the engine's
    ops raise; an op that returns values its dtype cannot hold is a
    ValueError (an adapter bug)."""
    start = time.monotonic()
    engine.dtype = dtype_name(engine.dtype)
    rng = np.random.default_rng(seed)
    findings: Dict[str, Finding] = {}
    findings["output"] = _attention.fit_output(engine, rng)
    out_mode = str(findings["output"].stats.get("mode", "rne"))
    scores, probs, combo = _attention.fit_scores_probabilities(engine, out_mode, rng)
    findings["scores"], findings["probabilities"] = scores, probs
    findings["exp"] = _attention.fit_exp(engine, rng)
    findings["long_rows"] = _attention.check_long_rows(engine, combo, out_mode, rng)
    findings["rope"] = _rope.fit_rope(engine, rng)
    info = _host.host(())
    info["versions"] = list(engine.versions)
    info["notes"] = list(engine.notes)
    precision, cast_point, measured = _declare(engine, findings, info)
    return ProbeResult(engine=engine.name, dtype=engine.dtype, precision=precision,
                       cast_point=cast_point, findings=findings, host=info,
                       seconds=time.monotonic() - start, measured=measured)


def _declare(engine: Engine, f: Dict[str, Finding],
             info: Dict[str, Any]) -> Tuple[Dict[str, Any], Optional[str], Dict[str, Any]]:
    """(precision dict, cast point, everything measured) from the findings."""
    dt = engine.dtype
    profile = engine.profile if engine.profile in PROFILE_ASSUMES else "custom"
    score_assumed, prob_assumed, exp_assumed = PROFILE_ASSUMES[profile]
    assumed = {"scores": dt if score_assumed == "model" else score_assumed,
               "probabilities": dt if prob_assumed in ("model", "kv") else prob_assumed}
    precision: Dict[str, Any] = {"profile": profile}
    measured: Dict[str, Any] = {}
    for key, field in (("scores", "score"), ("probabilities", "probability")):
        finding = f[key]
        if not finding.determined:
            continue
        measured[f"{field}_dtype"] = finding.value
        if finding.value != assumed[key]:
            precision[f"{field}_dtype"] = finding.value
        variant = str(finding.stats.get("variant", "f32"))
        if variant != "f32":
            mode = variant.partition("/")[2]
            name = "toward_zero" if mode == "rtz" else "nearest_even"
            precision[f"{field}_rounding"] = measured[f"{field}_rounding"] = name
    if f["exp"].determined:
        measured["exp_ulps"] = f["exp"].value
        if int(f["exp"].value) > exp_assumed:
            precision["exp_ulps"] = int(f["exp"].value)
    if f["output"].determined and f["output"].value != "n/a":
        precision["output_rounding"] = measured["output_rounding"] = f["output"].value
    cast_point = None
    rope = f["rope"]
    if rope.determined and rope.value != "immaterial":
        cast_point, _, rounding = str(rope.value).partition("/")
        precision["rope_rounding"] = measured["rope_rounding"] = rounding
        measured["cast_point"] = cast_point
    precision["source"] = "measured"
    precision["evidence"] = evidence_line(engine, f, info)
    return precision, cast_point, measured


def evidence_line(engine: Engine, f: Dict[str, Finding], info: Dict[str, Any]) -> str:
    """One line (<= 1,024 bytes): where, with what, and the decisive counts."""
    what = ", ".join([engine.name + f" {engine.dtype}"] + list(info.get("versions", []))
                     + list(info.get("notes", [])))
    head = f"measured on {info.get('cpu') or 'unknown CPU'} ({info.get('isa', '')}): {what}"
    parts = [f[k].line for k in ("output", "scores", "probabilities", "exp", "rope",
                                 "long_rows") if f[k].line]
    return truncate_utf8(head + ": " + "; ".join(parts), EVIDENCE_BYTES)


def truncate_utf8(text: str, limit: int) -> str:
    """text cut to at most `limit` UTF-8 bytes, on a character boundary."""
    data = text.encode("utf-8")
    if len(data) <= limit:
        return text
    return data[: limit - 3].decode("utf-8", errors="ignore") + "..."


def preset(engine: str, dtype: str, *, cpu: Optional[Dict[str, object]] = None,
           rope_style: str = "neox") -> Dict[str, Any]:
    """The fallback when the probe cannot run: an engine preset's precision
    (attnaudit.ENGINE_PRESETS) resolved by what is known without running
    the engine. vllm-cpu in bf16: output truncated where the CPU lacks
    AVX512_BF16 (vLLM then loads its AVX2 or AVX512 build, whose bf16
    conversion drops the low bits; measured on an AVX2 host), rounded to
    nearest with it; its RoPE op truncates the same way on the NeoX path
    only (its GPT-J path rounds to nearest: measured bit for bit on the same
    host); in f16 and f32 nearest. Returns an EnginePrecision dict with
    source "preset" and an evidence line."""
    from ..snapshot import ENGINE_PRESETS
    name = str(engine).lower()
    if name not in ENGINE_PRESETS:
        raise ValueError(f"engine: unknown {engine!r}; expected one of "
                         + ", ".join(sorted(ENGINE_PRESETS)))
    dt = dtype_name(dtype)
    out: Dict[str, Any] = {"profile": ENGINE_PRESETS[name]["precision"], "source": "preset"}
    evidence = f"engine preset {name!r} ({dt})"
    if name == "vllm-cpu" and dt == "bf16":
        info = cpu if cpu is not None else _host.cpuinfo()
        hw = _host.has_avx512_bf16(info)
        if hw is not None:
            rounding = "nearest_even" if hw else "toward_zero"
            out["output_rounding"] = rounding
            out["rope_rounding"] = rounding if rope_style == "neox" else "nearest_even"
            evidence += (f" on {info.get('model') or 'this CPU'} "
                         f"({'avx512_bf16' if hw else 'no avx512_bf16'}): output and RoPE "
                         f"{'rounded to nearest' if hw else 'truncated'} by the CPU's ISA, "
                         "not measured")
        else:
            evidence += ": ISA unknown, rounding not resolved"
    out["evidence"] = evidence
    return out
