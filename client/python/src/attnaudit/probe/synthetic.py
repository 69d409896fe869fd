"""Engines written in numpy with a known arithmetic, for the probe's tests
and for trying the probe without torch: fp32 arithmetic (numpy float32
dot products, exp and sums) with the narrowings a real engine does placed
where its kind places them.

    eng = synthetic.engine("bf16", output="rtz", cast_point="cos_sin")
    probe.run(eng).precision["output_rounding"]   # "toward_zero"

Knobs: scores ("f32", "once/rne", "twice/rne", ... as attnaudit.probe.
_replay names them), probabilities ("f32", "norm/rne", "unnorm/rne", ...),
output ("rne", "rtz", "rna"), exp_ulps (each exp perturbed by up to that
many fp32 ulps), lse (return one), cast_point and rope_rounding for the
rotary op, rope_style.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import numpy as np

from ._numerics import narrow
from ._types import AttentionOp, AttentionOutput, Engine, RopeOp, RopeOutput

F32 = np.float32


def _n(x: np.ndarray, dtype: str, mode: str) -> np.ndarray:
    return narrow(x, dtype, mode).astype(F32)


def attention_op(dtype: str, *, scores: str = "f32", probabilities: str = "f32",
                 output: str = "rne", exp_ulps: int = 0, lse: bool = False) -> AttentionOp:
    """A decode attention op in fp32 with the given narrowings."""
    def op(q: np.ndarray, ks: Sequence[np.ndarray], vs: Sequence[np.ndarray],
           scale: float) -> AttentionOutput:
        B, H, D = q.shape
        out = np.empty((B, H, D))
        lses = np.empty((B, H))
        for b in range(B):
            group = H // ks[b].shape[1]
            k = np.repeat(ks[b].astype(F32), group, axis=1)        # [L, H, D]
            v = np.repeat(vs[b].astype(F32), group, axis=1)
            qk = np.einsum("hd,lhd->hl", q[b].astype(F32), k)       # fp32 sums
            s = _scores(qk, F32(scale), dtype, scores)
            m = s.max(axis=1, keepdims=True)
            u = _exp(s - m, exp_ulps)
            total = u.sum(axis=1, keepdims=True, dtype=F32)
            acc = _combine(u, total, v, dtype, probabilities)
            out[b] = narrow(acc, dtype, output)
            lses[b] = (m[:, 0] + np.log(total[:, 0])).astype(F32)
        return AttentionOutput(out, lses if lse else None)

    return op


def _exp(x: np.ndarray, ulps: int) -> np.ndarray:
    """fp32 exp, off by up to `ulps` fp32 ulps (a deterministic function of
    the argument, as a real exp is; exp(0) stays 1)."""
    u = np.exp(x.astype(F32))
    if not ulps:
        return u
    bits = x.astype(F32).view(np.uint32).astype(np.uint64)
    steps = ((bits * 2654435761) >> 7) % (2 * ulps + 1)
    k = np.where(x == 0, ulps, steps).astype(np.float64) - ulps
    return (u * (1.0 + k * 2.0 ** -23)).astype(F32)


def _scores(qk: np.ndarray, scale: np.float32, dtype: str, variant: str) -> np.ndarray:
    kind, _, mode = variant.partition("/")
    if kind == "f32":
        return (qk * scale).astype(F32)
    if kind == "once":
        return _n(qk * scale, dtype, mode)
    return _n(_n(qk, dtype, mode) * scale, dtype, mode)


def _combine(u: np.ndarray, total: np.ndarray, v: np.ndarray, dtype: str,
             variant: str) -> np.ndarray:
    kind, _, mode = variant.partition("/")
    if kind == "f32":
        return np.einsum("hl,lhd->hd", u, v).astype(F32) / total
    if kind == "norm":
        return np.einsum("hl,lhd->hd", _n(u / total, dtype, mode), v).astype(F32)
    w = _n(u, dtype, mode)
    den = total if kind == "unnorm" else w.sum(axis=1, keepdims=True, dtype=F32)
    return np.einsum("hl,lhd->hd", w, v).astype(F32) / den


def rope_op(dtype: str, *, cast_point: str = "after_rope", rounding: str = "rne",
            style: str = "neox", theta: float = 10000.0,
            rotary_dim: Optional[int] = None) -> RopeOp:
    """A rotary op: fp32 angles and cos/sin (numpy's libm), then the
    rotation with the cast point's roundings; rotary_dim: only the leading
    dimensions rotate (partial rotary)."""

    def op(x_all: np.ndarray, positions: np.ndarray) -> RopeOutput:
        D = rotary_dim or x_all.shape[-1]
        x = x_all[..., :D]
        inv = (1.0 / theta ** (np.arange(0, D, 2, dtype=F32) / F32(D))).astype(F32)
        ang = (positions.astype(F32)[:, None] * inv[None, :]).astype(F32)
        cos, sin = np.cos(ang).astype(F32), np.sin(ang).astype(F32)
        c, s = cos[:, None, :], sin[:, None, :]
        if cast_point != "after_rope":
            c, s = _n(c, dtype, "rne"), _n(s, dtype, "rne")
        xf = x.astype(F32)
        x1, x2 = (xf[..., : D // 2], xf[..., D // 2:]) if style == "neox" else \
            (xf[..., 0::2], xf[..., 1::2])
        if cast_point == "each_op":
            a = _n(_n(x1 * c, dtype, rounding) - _n(x2 * s, dtype, rounding), dtype, rounding)
            b = _n(_n(x2 * c, dtype, rounding) + _n(x1 * s, dtype, rounding), dtype, rounding)
        else:
            a = _n(x1 * c - x2 * s, dtype, rounding)
            b = _n(x2 * c + x1 * s, dtype, rounding)
        out = x_all.astype(np.float64).copy()
        if style == "neox":
            out[..., : D // 2], out[..., D // 2:D] = a, b
        else:
            out[..., 0:D:2], out[..., 1:D:2] = a, b
        return RopeOutput(out, cos, sin, rotary_dim=D)

    return op


def engine(dtype: str = "bf16", *, scores: str = "f32", probabilities: str = "f32",
           output: str = "rne", exp_ulps: int = 0, lse: bool = False,
           cast_point: Optional[str] = "after_rope", rope_rounding: Optional[str] = None,
           rope_style: str = "neox", head_dim: int = 64, heads: Any = (4, 2),
           max_keys: int = 4096, profile: str = "custom", name: str = "synthetic") -> Engine:
    """A synthetic Engine (see the module docstring); rope_rounding defaults
    to the output's; cast_point None: no rotary op."""
    rope = None if cast_point is None else rope_op(
        dtype, cast_point=cast_point, rounding=rope_rounding or output, style=rope_style)
    return Engine(name=name, dtype=dtype,
                  attention=attention_op(dtype, scores=scores, probabilities=probabilities,
                                         output=output, exp_ulps=exp_ulps, lse=lse),
                  attention_f32=attention_op("f32", exp_ulps=exp_ulps, lse=lse),
                  rope=rope, rope_style=rope_style, profile=profile,
                  head_dim=head_dim, heads=tuple(heads), max_keys=max_keys,
                  versions=(f"numpy {np.__version__}",))
