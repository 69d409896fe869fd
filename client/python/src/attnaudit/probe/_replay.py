"""Decode attention replayed in numpy under a candidate arithmetic.

A candidate says where the engine narrows from fp32 and how it rounds:

  scores        "f32"          s = fp32(scale * q.k)
                "once/<m>"     s = R(fp32(scale * q.k))        (one cast)
                "twice/<m>"    s = R(fp32(scale * R(q.k)))    (q.k^T written
                               in the model dtype, then scaled in it: HF eager)
  probabilities "f32"          out = sum u_j v_j / sum u_j,  u = exp(s - max)
                "norm/<m>"     P = R(u / sum u); out = sum P_j v_j (HF eager)
                "unnorm/<m>"   U = R(u); out = sum U_j v_j / sum u  (flash
                               kernels: P rounded for the P.V product)
                "unnorm_sum/<m>"  out = sum U_j v_j / sum U_j

R rounds to the model dtype with mode <m> ("rne", "rtz"; _numerics). The
replay returns the output before its last cast (float64); the output
rounding is applied by the caller. Where the probe's inputs make fp32 exact
(its crafted rows), a replay is exact; on random rows it is the candidate's
arithmetic up to fp32 summation order.
"""

from __future__ import annotations

from typing import List, Sequence, Tuple

import numpy as np

from ._numerics import f32, narrow

SCORE_MODES = ("rne", "rtz")


def score_candidates(dtype: str) -> List[str]:
    """The score variants worth trying for a model dtype."""
    if dtype == "f32":
        return ["f32"]
    return ["f32"] + [f"{kind}/{m}" for kind in ("once", "twice") for m in SCORE_MODES]


def probability_candidates(dtype: str) -> List[str]:
    """The probability variants worth trying for a model dtype."""
    if dtype == "f32":
        return ["f32"]
    return ["f32"] + [f"{kind}/{m}" for kind in ("norm", "unnorm", "unnorm_sum")
                      for m in SCORE_MODES]


def _split(variant: str) -> Tuple[str, str]:
    kind, _, mode = variant.partition("/")
    return kind, mode or "rne"


def scores(q: np.ndarray, k: np.ndarray, scale: float, dtype: str,
           variant: str) -> np.ndarray:
    """Scores [H, L] of one row: q [H, D], k [L, Hkv, D]."""
    H, Hkv = q.shape[0], k.shape[1]
    kk = np.repeat(k, H // Hkv, axis=1)                     # [L, H, D]
    qk = f32(np.einsum("hd,lhd->hl", q, kk))
    kind, mode = _split(variant)
    if kind == "f32":
        return f32(qk * scale)
    if kind == "once":
        return narrow(f32(qk * scale), dtype, mode)
    if kind == "twice":
        return narrow(f32(narrow(qk, dtype, mode) * scale), dtype, mode)
    raise ValueError(f"score variant {variant!r}")


def combine(s: np.ndarray, v: np.ndarray, heads: int, dtype: str,
            variant: str) -> np.ndarray:
    """out [H, D] from scores [H, L] and v [L, Hkv, D]."""
    Hkv = v.shape[1]
    vv = np.repeat(v, heads // Hkv, axis=1)                  # [L, H, D]
    u = np.exp(s - s.max(axis=1, keepdims=True))
    total = u.sum(axis=1, keepdims=True)
    kind, mode = _split(variant)
    if kind == "f32":
        w, den = u, total
    elif kind == "norm":
        w, den = narrow(u / total, dtype, mode), np.ones_like(total)
    elif kind == "unnorm":
        w, den = narrow(u, dtype, mode), total
    elif kind == "unnorm_sum":
        w = narrow(u, dtype, mode)
        den = w.sum(axis=1, keepdims=True)
    else:
        raise ValueError(f"probability variant {variant!r}")
    return np.einsum("hl,lhd->hd", w, vv) / den


def replay(q: np.ndarray, ks: Sequence[np.ndarray], vs: Sequence[np.ndarray],
           scale: float, dtype: str, score: str, probability: str) -> np.ndarray:
    """out [B, H, D] (before the output cast) of a batch under a candidate."""
    out = np.empty(q.shape, np.float64)
    for b in range(q.shape[0]):
        s = scores(q[b], ks[b], scale, dtype, score)
        out[b] = combine(s, vs[b], q.shape[1], dtype, probability)
    return out


def lse(q: np.ndarray, ks: Sequence[np.ndarray], scale: float) -> np.ndarray:
    """The exact log-sum-exp [B, H] of the scores (fp64 from the inputs)."""
    out = np.empty(q.shape[:2], np.float64)
    for b in range(q.shape[0]):
        H, Hkv = q.shape[1], ks[b].shape[1]
        kk = np.repeat(ks[b], H // Hkv, axis=1)
        s = scale * np.einsum("hd,lhd->hl", q[b], kk)
        m = s.max(axis=1)
        out[b] = m + np.log(np.exp(s - m[:, None]).sum(axis=1))
    return out
