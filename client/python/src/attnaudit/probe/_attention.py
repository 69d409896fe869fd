"""The attention experiments: crafted rows whose fp32 arithmetic is exact,
run through the engine's op, and the fit of its roundings.

  output   equal scores, so the output is the mean of V exactly in fp32;
           V built so the mean lies a quarter, a half (a tie) or three
           quarters of an ulp above a model-dtype value: the engine's
           output is that value rounded by its output cast.
  scores   two score groups S and S + d, d below a 16-bit ulp at S = 12-28,
           with V = -w / +w: the output is w tanh(d'/2), so d' (the score
           difference the engine saw) shows whether it rounded its scores.
  probs    scores 0 and -d (exact in every dtype), V = -w / +w: the output
           w (p - 1)/(p + 1), p = exp(-d), magnifies the rounding of p.
  exp      the op in fp32, one-hot V: out_j / out_max = exp(s_j) up to the
           exp's error and two roundings, over flat and peaked rows.
  long     random rows of 1k-32k keys, flat and peaked (a sink key, outlier
           channels), against a replay in the fitted arithmetic: the mean
           signed error in output ulps (truncation: -0.5, nearest: 0).

Rows come in two lengths (2-4 keys and 1,024), so the fit covers the
kernel's tiled and split paths, not only its first block.
"""

from __future__ import annotations

import math
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from . import _replay as R
from ._numerics import ROUNDING_NAMES, exact, f32, narrow, spacing
from ._types import AttentionOp, Engine, Finding

EPS_F32 = 2.0 ** -23
OUT_MODES = ("rne", "rna", "rtz")


class Batch:
    """One call's inputs: q [B, H, D], per-row k and v [L, Hkv, D], scale."""

    def __init__(self, q: np.ndarray, ks: List[np.ndarray], vs: List[np.ndarray],
                 scale: float):
        self.q, self.ks, self.vs, self.scale = q, ks, vs, float(np.float32(scale))


def run(op: AttentionOp, batch: Batch, dtype: str) -> Tuple[np.ndarray, Optional[np.ndarray]]:
    """The op on a batch: (out [B, H, D], lse [B, H] or None), checked."""
    res = op(batch.q, batch.ks, batch.vs, batch.scale)
    out = np.asarray(res.out, np.float64).reshape(batch.q.shape)
    if not np.all(np.isfinite(out)):
        raise ValueError("the engine's attention output is not finite")
    if not np.array_equal(exact(out, dtype), out):
        raise ValueError(f"the engine's attention output is not {dtype}: "
                         "the adapter must return the output's exact values")
    lse = None if res.lse is None else np.asarray(res.lse, np.float64).reshape(
        batch.q.shape[:2])
    return out, lse


def _magnitudes(rng: np.random.Generator, shape: Tuple[int, ...], dtype: str,
                room: int = 4) -> np.ndarray:
    """Values in [1, 2) * 2^e (e in -2..2), `room` ulps below the binade's
    top, exact in dtype, random signs."""
    e = rng.integers(-2, 3, size=shape)
    mant = exact(rng.uniform(1.0, 1.9, size=shape), dtype)
    sign = np.where(rng.random(shape) < 0.5, -1.0, 1.0)
    return sign * np.ldexp(mant, e)


# ----------------------------------------------------------------------
# Output rounding
# ----------------------------------------------------------------------


def output_batch(engine: Engine, rng: np.random.Generator) -> Tuple[Batch, np.ndarray]:
    """Rows whose outputs are V means at 1/4, 2/4, 3/4 ulp past a dtype
    value; returns the batch and the exact means [B, H, D]."""
    H, Hkv = engine.heads
    D, dt = engine.head_dim, engine.dtype
    lengths = [4] + ([1024] if engine.max_keys >= 1024 else [])
    q, ks, vs, means = [], [], [], []
    for L in lengths:
        for frac in (1, 2, 3):
            base = _magnitudes(rng, (Hkv, D), dt)
            step = np.sign(base) * spacing(base, dt)
            up = (np.arange(L) < frac * L // 4)[:, None, None]
            v = base[None] + up * step[None]                 # [L, Hkv, D]
            k = np.broadcast_to(exact(rng.standard_normal((1, Hkv, D)), dt), (L, Hkv, D))
            q.append(exact(rng.standard_normal((H, D)), dt))
            ks.append(np.array(k))
            vs.append(v)
            mean = base + step * (frac / 4.0)
            means.append(np.repeat(mean, H // Hkv, axis=0))
    return Batch(np.stack(q), ks, vs, D ** -0.5), np.stack(means)


def fit_output(engine: Engine, rng: np.random.Generator) -> Finding:
    """Which cast turns the fp32 output into the model dtype: nearest or
    truncation from the elements 3/4 ulp past a dtype value (robust to an
    exp(0) that is not exactly 1), ties even or away from the exact ties."""
    dt = engine.dtype
    if dt == "f32":
        return Finding("output", "n/a", line="output f32, no cast")
    batch, means = output_batch(engine, rng)
    out, _ = run(engine.attention, batch, dt)
    preds = {m: narrow(means, dt, m) for m in OUT_MODES}
    frac = (means - narrow(means, dt, "rtz")) / spacing(narrow(means, dt, "rtz"), dt)
    between = preds["rne"] != preds["rtz"]
    between &= np.abs(np.abs(frac) - 0.5) > 0.1
    ties = (preds["rne"] != preds["rna"]) | ((preds["rne"] != preds["rtz"]) & ~between)
    near = int(np.sum((out == preds["rne"]) & between))
    trunc = int(np.sum((out == preds["rtz"]) & between))
    n = int(between.sum())
    counts = {"rne": near, "rtz": trunc}
    tie_counts = {m: int(np.sum((out == preds[m]) & ties)) for m in OUT_MODES}
    n_ties = int(ties.sum())
    if n and trunc >= 0.99 * n:
        mode = "rtz"
    elif n and near >= 0.99 * n:
        mode = "rna" if tie_counts["rna"] > tie_counts["rne"] else "rne"
    else:
        mode = ""
    value = ROUNDING_NAMES[mode] if mode else "undetermined"
    shown = {"rtz": "truncation", "rne": "nearest-even", "rna": "nearest (ties away)"}
    line = (f"output {shown.get(mode, 'undetermined')}: {max(near, trunc)}/{n} "
            f"between-neighbour elements (the other {min(near, trunc)}), ties "
            f"{tie_counts[mode or 'rne']}/{n_ties}")
    return Finding("output", value, cases=int(out.size), decisive=n,
                   matched=max(near, trunc), runner_up="rne" if mode == "rtz" else "rtz",
                   runner_up_matched=min(near, trunc), counts={**counts, **{
                       f"ties_{m}": c for m, c in tie_counts.items()}},
                   stats={"mode": mode or "rne", "ties": n_ties},  # type: ignore[dict-item]
                   line=line)


def _pretty(mode: Optional[str]) -> str:
    return {"rne": "nearest-even", "rna": "nearest-away", "rtz": "truncation"}.get(
        mode or "", str(mode))


# ----------------------------------------------------------------------
# Scores and probabilities
# ----------------------------------------------------------------------


def score_batches(engine: Engine, rng: np.random.Generator) -> List[Tuple[Batch, str]]:
    """(batch, kind) pairs: score rows at two softmax scales (1/8 and
    128^-1/2, which tells one rounding from two) and probability rows."""
    H, Hkv = engine.heads
    D, dt = engine.head_dim, engine.dtype
    long = engine.max_keys >= 1024
    out = []
    for scale, groups in ((0.125, (12.0, 20.0, 28.0)), (128 ** -0.5, (12.0, 20.0))):
        scale = float(np.float32(scale))
        rows = [_score_row(H, Hkv, D, dt, S, scale, L, rng)
                for S in groups for L in ((2, 1024) if long else (2,))]
        out.append((_stack(rows, scale), "scores"))
    rows = [_probability_row(H, Hkv, D, dt, L, lo, hi, rng)
            for L in ((2, 1024) if long else (2,)) for lo, hi in ((0.004, 0.06), (0.05, 0.7))]
    out.append((_stack(rows, 0.125), "probabilities"))
    return out


def _stack(rows: Any, scale: float) -> Batch:
    return Batch(np.stack([r[0] for r in rows]), [r[1] for r in rows],
                 [r[2] for r in rows], scale)


FILLER = -2048.0   # a filler key's q.k: its score is below the max by > 104


def _with_filler(L: int, first: np.ndarray, second: np.ndarray, v1: np.ndarray,
                 v2: np.ndarray, rng: np.random.Generator,
                 dt: str) -> Tuple[np.ndarray, np.ndarray]:
    """k, v [L, Hkv, D]: the two decisive keys side by side at a random even
    place among L - 2 filler keys whose scores (dimension 2 of q is 1,
    theirs FILLER) are so low that exp underflows to 0 in fp32: a long row
    whose fp32 arithmetic is the two-key row's, exactly, through every
    block and split (the pair never straddles a block of an even size, so
    an online softmax sees both under one running max)."""
    Hkv, D = first.shape
    k = np.zeros((L, Hkv, D))
    k[:, :, 2] = FILLER
    v = exact(rng.standard_normal((L, Hkv, D)), dt)
    i = 2 * int(rng.integers(0, L // 2))
    k[i], k[i + 1], v[i], v[i + 1] = first, second, v1, v2
    return k, v


def _safe(x: np.ndarray, dt: str, margin: float = 2.0 ** -17) -> np.ndarray:
    """Where x is exact in dt, or farther than margin |x| from every point
    where a rounding to dt changes its mind (dt values for truncation,
    midpoints for nearest): there an engine's fp32 noise cannot flip the
    rounding that tells the candidates apart."""
    x = f32(x)
    lo = narrow(x, dt, "rtz")
    frac = np.abs(x - lo) / spacing(lo, dt)
    gap = np.minimum(np.minimum(frac, 1.0 - frac), np.abs(frac - 0.5)) * spacing(lo, dt)
    return (x == lo) | (gap > margin * np.abs(x))


def _pick(pool: np.ndarray, ok: np.ndarray, n: int) -> np.ndarray:
    """n values of pool where ok, spread over it (sorted pool)."""
    good = pool[ok]
    if good.size < n:
        raise RuntimeError("the probe found too few boundary-free inputs")
    return good[np.linspace(0, good.size - 1, n).round().astype(int)]


def _score_row(H: int, Hkv: int, D: int, dt: str, S: float, scale: float, L: int,
               rng: np.random.Generator) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """q.k = a c (+ b_h for the second key): scores S and S + scale b_h,
    exact in fp32 (a c has few bits, b_h is one dtype value); b_h chosen
    away from the rounding points of every candidate."""
    a = 16.0
    c = float(exact(S / (scale * a), dt))
    pool = np.unique(exact(np.linspace(0.01, 0.12, 16 * H) * rng.uniform(0.9, 1.1)
                           / scale, dt))
    qk = a * c + pool
    ok = _safe(qk, dt) & _safe(f32(qk * scale), dt)
    for m in ("rne", "rtz"):
        ok &= _safe(f32(narrow(qk, dt, m) * scale), dt)
    q = np.zeros((H, D))
    q[:, 0] = a
    q[:, 1] = _pick(pool, ok, H)
    q[:, 2] = 1.0
    k1, k2 = np.zeros((Hkv, D)), np.zeros((Hkv, D))
    k1[:, 0] = c
    k2[:, 0] = c
    k2[:, 1] = 1.0
    w = np.abs(_magnitudes(rng, (Hkv, D), dt))
    k, v = _with_filler(L, k1, k2, -w, w, rng, dt)
    return q, k, v


def _probability_row(H: int, Hkv: int, D: int, dt: str, L: int, lo: float, hi: float,
                     rng: np.random.Generator) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Scores 0 and -d_h, exact in every dtype (scale 1/8, k = -8); d_h
    chosen so that p = exp(-d), 1/(1+p) and p/(1+p) are away from the
    rounding points."""
    pool = np.unique(exact(np.geomspace(lo, hi, 16 * H) * rng.uniform(0.95, 1.05), dt))
    p = np.exp(-pool)
    ok = _safe(p, dt) & _safe(1.0 / (1.0 + p), dt) & _safe(p / (1.0 + p), dt)
    q = np.zeros((H, D))
    q[:, 0] = _pick(pool, ok, H)
    q[:, 2] = 1.0
    k1, k2 = np.zeros((Hkv, D)), np.zeros((Hkv, D))
    k2[:, 0] = -8.0
    w = np.abs(_magnitudes(rng, (Hkv, D), dt))
    k, v = _with_filler(L, k1, k2, -w, w, rng, dt)
    return q, k, v


def fit_scores_probabilities(engine: Engine, out_mode: str,
                             rng: np.random.Generator) -> Tuple[Finding, Finding, Tuple[str, str]]:
    """The score and probability arithmetic, fitted jointly (each candidate
    pair replayed on every row, its output cast with `out_mode`)."""
    dt = engine.dtype
    if dt == "f32":
        return (Finding("scores", "f32", line="scores f32 (model dtype f32)"),
                Finding("probabilities", "f32", line="P f32 (model dtype f32)"),
                ("f32", "f32"))
    runs = []
    for batch, kind in score_batches(engine, rng):
        out, lse = run(engine.attention, batch, dt)
        runs.append((batch, kind, out, lse))
    combos = [(s, p) for s in R.score_candidates(dt) for p in R.probability_candidates(dt)]
    table: Dict[Tuple[str, str], Dict[str, Tuple[int, int, int]]] = {}
    for combo in combos:
        per_kind: Dict[str, List[int]] = {"scores": [0, 0, 0], "probabilities": [0, 0, 0]}
        for batch, kind, out, _ in runs:
            pred = narrow(R.replay(batch.q, batch.ks, batch.vs, batch.scale, dt, *combo),
                          dt, out_mode)
            err = np.abs(out - pred) / spacing(pred, dt)
            acc = per_kind[kind]
            acc[0] += int(np.sum(err == 0))
            acc[1] += int(np.sum(err <= 1.0))
            acc[2] += int(err.size)
        table[combo] = {k: (v[0], v[1], v[2]) for k, v in per_kind.items()}

    def total(c: Tuple[str, str]) -> Tuple[int, int]:
        t = table[c]
        return (t["scores"][0] + t["probabilities"][0], t["scores"][1] + t["probabilities"][1])

    best = max(combos, key=total)
    scores = _side("scores", 0, best, table, dt)
    probs = _side("probabilities", 1, best, table, dt)
    return scores, probs, best


def _side(kind: str, index: int, best: Tuple[str, str],
          table: Dict[Tuple[str, str], Dict[str, Tuple[int, int, int]]], dt: str) -> Finding:
    """The Finding for one side of the best pair: its value, and how the best
    pair with the other dtype class on that side does on the same rows."""
    mine = best[index]
    narrowed = mine != "f32"
    others = [c for c in table if (c[index] != "f32") != narrowed
              and c[1 - index] == best[1 - index]]
    rival = max(others, key=lambda c: table[c][kind]) if others else None
    exact_n, within, n = table[best][kind]
    # Decided when the winner explains nearly every element to an ulp and
    # the best candidate of the other dtype class clearly does not (an
    # engine's own fp32 order of operations moves a few elements by more).
    rival_within = table[rival][kind][1] if rival is not None else 0
    decided = within >= 0.95 * n and rival_within <= 0.8 * n
    value = (dt if narrowed else "f32") if decided else "undetermined"
    label = "P" if kind == "probabilities" else kind
    line = f"{label} {_describe(mine, dt)}: {exact_n}/{n} elements exact"
    if rival is not None:
        line += f" ({_describe(rival[index], dt)} {table[rival][kind][0]})"
    counts = {f"{c[0]}|{c[1]}": table[c][kind][0] for c in table}
    return Finding(kind, value, cases=n, decisive=n, matched=exact_n,
                   runner_up=None if rival is None else rival[index],
                   runner_up_matched=0 if rival is None else table[rival][kind][0],
                   counts=counts,
                   stats={"within_1ulp": within, "variant": mine,  # type: ignore[dict-item]
                          "rival_within_1ulp": rival_within},
                   line=line if value != "undetermined" else
                   f"{label} undetermined (best {mine}: {within}/{n} within 1 ulp)")


def _describe(variant: str, dt: str) -> str:
    if variant == "f32":
        return "f32"
    kind, _, mode = variant.partition("/")
    how = {"once": "rounded once", "twice": "rounded twice", "norm": "normalised",
           "unnorm": "unnormalised", "unnorm_sum": "unnormalised, summed rounded"}[kind]
    return f"{dt} ({how}, {_pretty(mode)})"


# ----------------------------------------------------------------------
# exp accuracy
# ----------------------------------------------------------------------


def exp_batch(engine: Engine, rng: np.random.Generator) -> Tuple[Batch, np.ndarray]:
    """fp32 rows with one-hot V (L = min(D, 128) keys), flat to peaked:
    returns the batch and the exact scores [B, H, L]."""
    H, Hkv = engine.heads
    D = engine.head_dim
    L = min(D, 128)
    gains = np.array([1.0, 0.5, 0.25, 0.125])[np.arange(H) % 4]
    q, ks, vs, ss = [], [], [], []
    for lo in (-1.0, -8.0, -30.0, -80.0):
        s = np.round(rng.uniform(lo, 0.0, size=(Hkv, L)) * 4096) / 4096
        s[:, 0] = 0.0
        k = np.zeros((L, Hkv, D))
        k[:, :, 0] = 8.0 * s.T
        v = np.zeros((L, Hkv, D))
        v[np.arange(L), :, np.arange(L)] = 1.0
        qq = np.zeros((H, D))
        qq[:, 0] = gains
        q.append(qq)
        ks.append(k)
        vs.append(v)
        ss.append(gains[:, None] * np.repeat(s, H // Hkv, axis=0))
    return Batch(np.stack(q), ks, vs, 0.125), np.stack(ss)


def fit_exp(engine: Engine, rng: np.random.Generator) -> Finding:
    """An upper bound on the exp's error in fp32 ulps (the op in fp32)."""
    if engine.attention_f32 is None:
        return Finding("exp", "undetermined", line="exp not measured (no f32 op)")
    batch, s = exp_batch(engine, rng)
    out, lse = run(engine.attention_f32, batch, "f32")
    L = s.shape[2]
    p = out[:, :, :L]
    ratio = p / p[:, :, :1]
    valid = (p > 0) & (s > -87.0)
    err = np.where(valid, np.abs(ratio / np.exp(s) - 1.0) / EPS_F32, 0.0)
    # Kept whole (the two outputs' normalisation roundings included): an
    # upper bound, not an estimate.
    own = err
    units = math.ceil(math.log2(max(2, engine.head_dim))) + 1
    beyond = np.maximum(own - units * np.abs(s), 0.0)   # the fp32-score allowance
    flat = np.abs(s) <= 1.0
    stats = {"max_ulps": float(own.max()), "max_ulps_flat": float(own[flat].max()),
             "max_ulps_per_unit_score": float(np.max(own / np.maximum(np.abs(s), 1.0))),
             "ratios": int(valid.sum())}
    if lse is not None:
        x = R.lse(batch.q, batch.ks, batch.scale)
        stats["lse_units"] = float(np.max(np.abs(lse - x) / (
            EPS_F32 * (np.abs(x) + math.log(L)))))
    bound = max(1, int(math.ceil(beyond.max())))
    line = (f"exp {bound} ulp past the fp32 score allowance ({int(valid.sum())} f32 ratios; "
            f"raw flat {stats['max_ulps_flat']:.1f}, to |s| 80 {stats['max_ulps']:.1f} ulp")
    if "lse_units" in stats:
        line += f"; f32 LSE {stats['lse_units']:.1f} eps(|lse|+ln L)"
    line += ")"
    return Finding("exp", bound, cases=int(valid.sum()), decisive=int(valid.sum()),
                   matched=int(valid.sum()), stats=stats, line=line)


def lse_error(engine: Engine, batch: Batch, lse: Optional[np.ndarray]) -> Optional[float]:
    """max |lse - exact| / (eps_f32 (|lse| + ln L)) of one call, if it
    returned an LSE."""
    if lse is None:
        return None
    x = R.lse(batch.q, batch.ks, batch.scale)
    L = np.array([k.shape[0] for k in batch.ks], np.float64)[:, None]
    return float(np.max(np.abs(lse - x) / (EPS_F32 * (np.abs(x) + np.log(L)))))


# ----------------------------------------------------------------------
# Long, realistic rows
# ----------------------------------------------------------------------


def long_batch(engine: Engine, rng: np.random.Generator) -> Tuple[Batch, List[str]]:
    """Random rows of 1k, 4k and max_keys keys: flat (logits of spread 1)
    and peaked (spread 2.5, four outlier channels, a sink key that takes
    about half the weight)."""
    H, Hkv = engine.heads
    D, dt = engine.head_dim, engine.dtype
    scale = float(np.float32(D ** -0.5))
    lengths = sorted({L for L in (1024, 4096, engine.max_keys) if L <= engine.max_keys})
    q, ks, vs, kinds = [], [], [], []
    for L in lengths:
        for kind, gain in (("flat", 1.0), ("peaked", 2.5)):
            qq = rng.standard_normal((H, D)) * gain
            k = rng.standard_normal((L, Hkv, D))
            if kind == "peaked":
                k[:, :, :4] *= 3.0                                  # outlier channels
                k[0] = _sink(qq.reshape(Hkv, H // Hkv, D), scale, math.log(L) + 2.0)
            q.append(exact(qq, dt))
            ks.append(exact(k, dt))
            vs.append(exact(rng.standard_normal((L, Hkv, D)), dt))
            kinds.append(f"{kind}/{L}")
    return Batch(np.stack(q), ks, vs, scale), kinds


def _sink(q_groups: np.ndarray, scale: float, logit: float) -> np.ndarray:
    """A key per KV head along its queries' mean, scored about `logit`."""
    mean = q_groups.mean(axis=1)                                  # [Hkv, D]
    unit = mean / np.linalg.norm(mean, axis=1, keepdims=True)
    proj = np.einsum("hgd,hd->hg", q_groups, unit).mean(axis=1)   # [Hkv]
    return unit * (logit / (scale * np.maximum(proj, 1e-3)))[:, None]


def check_long_rows(engine: Engine, combo: Tuple[str, str], out_mode: str,
                    rng: np.random.Generator) -> Finding:
    """The fitted arithmetic against the engine on long realistic rows: the
    mean signed error toward zero in output ulps over the elements the cast
    must round (-0.5 for truncation, 0 for nearest) and the largest
    error."""
    dt = engine.dtype
    batch, kinds = long_batch(engine, rng)
    out, lse = run(engine.attention, batch, dt)
    x = R.replay(batch.q, batch.ks, batch.vs, batch.scale, dt, *combo)
    ulp = spacing(x, dt)
    signed = np.sign(x) * (out - x) / ulp             # < 0: toward zero
    rounds = narrow(x, dt) != x
    stats: Dict[str, float] = {"elements": int(out.size),
                               "longest": max(k.shape[0] for k in batch.ks)}
    e = lse_error(engine, batch, lse)
    if e is not None:
        stats["lse_units"] = e
    if dt == "f32":
        rel = float(np.max(np.abs(out - x)) / np.max(np.abs(x)))
        stats["max_relative"] = rel
        return Finding("long_rows", "consistent", cases=int(out.size), stats=stats,
                       line=f"long rows to L={stats['longest']}: max error {rel:.1e} of max|out|")
    bias = float(signed[rounds].mean())
    # The largest error where the output is not a cancellation's remainder
    # (|x| at least 1/16 of its head's largest): there an ulp of x is tiny
    # against the fp32 noise of the sum.
    big = np.abs(x) >= np.max(np.abs(x), axis=2, keepdims=True) / 16
    worst = float(np.max(np.abs(out - x)[big] / ulp[big]))
    stats.update(bias_ulps=bias, max_ulps=worst)
    for i, kind in enumerate(kinds):
        stats[f"bias_{kind}"] = float(signed[i][rounds[i]].mean())
    want = {"rtz": (-0.75, -0.25)}.get(out_mode, (-0.2, 0.2))
    ok = want[0] <= bias <= want[1]
    line = (f"long rows to L={stats['longest']}: mean error toward zero {bias:+.2f} ulp, "
            f"max {worst:.1f} ulp over {out.size} elements")
    if e is not None:
        line += f", LSE {e:.1f} eps(|lse|+ln L)"
    return Finding("long_rows", "consistent" if ok else "inconsistent", cases=int(out.size),
                   stats=stats, line=line if ok else line + " (disagrees with the fit)")
