"""The RoPE experiment: the engine's rotary op on a grid of positions (short
ones and 60k-100k), matched bit for bit against every cast point and
rounding, computed in numpy from the engine's own fp32 cos/sin.

  after_rope   cos/sin and the rotation in fp32 (with or without an FMA),
               one cast at the end
  cos_sin      cos/sin rounded to the model dtype (nearest even, torch's
               .to()), the rotation in fp32, one cast (vLLM's rotary op)
  each_op      cos/sin rounded, x cos and rotate_half(x) sin each rounded,
               and their sum (Hugging Face's apply_rotary_pos_emb)

each with the last casts rounded to nearest even, nearest away or toward
zero. Products of two 16-bit values are exact in fp32, so cos_sin and
each_op are exact here; after_rope is tried with plain and fused products.
"""

from __future__ import annotations

from typing import Dict, Tuple

import numpy as np

from ._numerics import ROUNDING_NAMES, exact, f32, narrow
from ._types import Engine, Finding

CAST_POINTS = ("after_rope", "after_rope_fma", "cos_sin", "each_op")
MODES = ("rne", "rna", "rtz")


def positions(max_position: int, rng: np.random.Generator, count: int = 128) -> np.ndarray:
    """Sorted distinct positions: a third below 4,096, a sixth to 60,000 and
    the rest in 60,000-100,000 (all below max_position)."""
    top = max(2, int(max_position))
    spans = [(0, min(4096, top), count // 3), (min(4096, top - 1), min(60000, top), count // 6),
             (min(60000, top - 1), min(100000, top), count - count // 3 - count // 6)]
    pos = np.concatenate([rng.integers(lo, max(lo + 1, hi), size=n) for lo, hi, n in spans]
                         + [np.array([0, top - 1])])
    return np.unique(pos).astype(np.int64)


def _halves(x: np.ndarray, style: str) -> Tuple[np.ndarray, np.ndarray]:
    if style == "neox":
        half = x.shape[-1] // 2
        return x[..., :half], x[..., half:]
    return x[..., 0::2], x[..., 1::2]


def _join(a: np.ndarray, b: np.ndarray, style: str) -> np.ndarray:
    if style == "neox":
        return np.concatenate([a, b], axis=-1)
    out = np.empty(a.shape[:-1] + (2 * a.shape[-1],))
    out[..., 0::2], out[..., 1::2] = a, b
    return out


def candidate(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, dtype: str, style: str,
              cast_point: str, mode: str) -> np.ndarray:
    """x [T, H, D] rotated under one candidate (cos/sin [T, D/2] fp32)."""
    c, s = cos[:, None, :], sin[:, None, :]
    x1, x2 = _halves(x, style)
    if cast_point == "after_rope":
        a = f32(f32(x1 * c) - f32(x2 * s))
        b = f32(f32(x2 * c) + f32(x1 * s))
    elif cast_point == "after_rope_fma":
        a = f32(x1 * c - f32(x2 * s))
        b = f32(x2 * c + f32(x1 * s))
    elif cast_point == "cos_sin":
        cr, sr = exact(c, dtype), exact(s, dtype)
        a, b = f32(x1 * cr - x2 * sr), f32(x2 * cr + x1 * sr)
    elif cast_point == "each_op":
        cr, sr = exact(c, dtype), exact(s, dtype)
        a = narrow(narrow(x1 * cr, dtype, mode) - narrow(x2 * sr, dtype, mode), dtype, mode)
        b = narrow(narrow(x2 * cr, dtype, mode) + narrow(x1 * sr, dtype, mode), dtype, mode)
        return _join(a, b, style)
    else:
        raise ValueError(f"cast point {cast_point!r}")
    return _join(narrow(a, dtype, mode), narrow(b, dtype, mode), style)


def fit_rope(engine: Engine, rng: np.random.Generator) -> Finding:
    """The engine's cast point and rounding, matched bit for bit."""
    if engine.rope is None:
        return Finding("rope", "undetermined", line="rope not measured (no rotary op)")
    dt = engine.dtype
    pos = positions(engine.max_position, rng)
    heads = 4
    x = exact(rng.standard_normal((pos.size, heads, engine.head_dim))
              * np.exp(rng.uniform(-2, 2, size=(pos.size, heads, 1))), dt)
    res = engine.rope(x, pos)
    got = np.asarray(res.out, np.float64).reshape(x.shape)
    cos = np.asarray(res.cos, np.float64).reshape(pos.size, -1)
    sin = np.asarray(res.sin, np.float64).reshape(pos.size, -1)
    r = int(res.rotary_dim or x.shape[-1])
    passed = int(np.sum(got[..., r:] != x[..., r:]))   # a partial rotary's rest
    x, got = x[..., :r], got[..., :r]
    counts: Dict[str, int] = {}
    styles = ("neox", "gptj") if engine.rope_style not in ("neox", "gptj") else (engine.rope_style,)
    for style in styles:
        for cp in CAST_POINTS:
            for mode in (MODES if dt != "f32" else ("rne",)):
                pred = candidate(x, cos, sin, dt, style, cp, mode)
                counts[f"{style}/{cp}/{mode}"] = int(np.sum(pred == got))
    order = sorted(counts, key=lambda k: -counts[k])
    best = order[0]
    style, cp, mode = best.split("/")
    n = int(got.size)
    rival = next((k for k in order if _declared(k) != _declared(best)), None)
    stats = {"positions": int(pos.size), "max_position": int(pos.max()), "style": style,
             "rotary_dim": r, "pass_through_changed": passed}
    if passed:
        counts = dict.fromkeys(counts, 0)     # an op that changes what it must not
        best = order[0]
    if dt == "f32":
        value = "immaterial" if counts[best] >= 0.99 * n else "undetermined"
        return Finding("rope", value, cases=n, decisive=n, matched=counts[best], counts=counts,
                       stats=stats,  # type: ignore[arg-type]
                       line=f"rope f32: {counts[best]}/{n} elements as fp32 rotation")
    exact_fit = counts[best] == n
    ok = counts[best] >= 0.999 * n
    point = cp.removesuffix("_fma")
    value = f"{point}/{ROUNDING_NAMES[mode]}" if ok else "undetermined"
    how = "bit for bit" if exact_fit else "elements"
    line = (f"rope {point}+{_mode_name(mode)}: {counts[best]}/{n} {how} at positions "
            f"{int(pos.min())}-{int(pos.max())}")
    if rival is not None:
        rs, rc, rm = rival.split("/")
        line += f" ({rc.removesuffix('_fma')}+{_mode_name(rm)} {counts[rival]})"
    return Finding("rope", value, cases=n, decisive=n, matched=counts[best],
                   runner_up=rival, runner_up_matched=counts.get(rival or "", 0),
                   counts=counts, stats=stats, line=line)  # type: ignore[arg-type]


def _declared(key: str) -> Tuple[str, str]:
    """What a candidate "style/cast point/mode" declares: (cast point,
    rounding); fused and plain products, ties even or away, are one."""
    _, cp, mode = key.split("/")
    return cp.removesuffix("_fma"), ROUNDING_NAMES[mode]


def _mode_name(mode: str) -> str:
    return {"rne": "nearest", "rna": "nearest-away", "rtz": "truncation"}[mode]
