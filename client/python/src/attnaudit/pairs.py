"""Train–rollout pairs: the trainer's attention beside the rollout's.

A rollout snapshot (the engine's decode step, e.g. from the vLLM plugin)
and a trainer snapshot (the same tokens recomputed by the trainer, e.g.
from attnaudit.trainer) hold rows keyed by (request id, query position).
`compare` joins the rows both hold and, for each pair, compares:

  * the outputs: bitwise equal?, max |diff|, and that in ulps of the
    output dtype at the largest output;
  * the inputs: q, and K and V over the common prefix of keys (ulps, the
    same way);
  * the inputs' effect: attention in float64 on the trainer's q/K/V and
    on the rollout's, with the same parameters: the output difference the
    inputs alone explain, whatever either kernel's arithmetic.

With each side's audit against the float64 reference (their reports, or
audits made here through a client), each pair gets one verdict:

  both-drift / rollout-drift / trainer-drift
                   a side's own audit DRIFTs: that side's kernel is off
                   (its report's diagnosis says how);
  consistent       outputs bitwise equal;
  inputs-differ    the inputs differ beyond the rounding of the ops that
                   made them (INPUT_ROUNDING_ULPS) and their effect
                   exceeds the attention's noise (the larger of the two
                   audits' output tolerances): the divergence entered
                   before attention;
  stale-prefix-kv  the same, but q and the newest key and value (made in
                   the same forward as q) agree within that rounding while
                   the K/V of the older prefix do not: the prefix's cache
                   was filled otherwise than the trainer recomputes it (a
                   prefix cache filled under older weights and reused after
                   a weight update; or a prefill path that computes
                   differently). When the newest key differs too, the
                   hidden states differ everywhere: inputs-differ;
  within-noise     both audits PASS and the inputs explain no more than
                   the noise: the two kernels' rounding.

Over a model's layers the first layer whose pairs are inputs-differ is
where a divergence enters: a norm, projection or RoPE that differs there
(e.g. another RMSNorm epsilon) shows at its own layer. Deeper layers of
two correct stacks differ too, by the rounding of every op before them,
amplified (a trainer's and an engine's GEMMs round differently): their
pairs may be inputs-differ or stale-prefix-kv without any bug, which is
why the first layer is the finding.

Which input differs is kept (q, or only K/V of the prefix: a prefix cache
filled under other weights, or another upstream difference).

Both snapshots must be post-RoPE with the same heads (a tensor-parallel
rank's snapshot pairs with the trainer's snapshot of the same heads only
if the trainer's holds just those). Pages may be NHD or HND, bf16, f16 or
f32; fp8 pages are not compared.

The server makes the same comparison (core/pairs, the same rules) as
snapshots arrive: a rollout snapshot and a trainer snapshot labelled with
their role, the same run and layer and common (request id, position) rows,
each audited once, are joined and stored. AuditClient.list_pairs() reads
those pairs back as PairResult views, whose `report` is a PairReport like
compare()'s.

Thread safety: functions only; no shared state (PairResult views are
immutable). Errors: ValueError naming what cannot be compared.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from ._enums import Comparison, Verdict
from ._pair_views import (INPUT_ROUNDING_ULPS, PAIR_COLUMNS, PAIR_VERDICTS, PairReport,
                          PairResult, RowPair, verdict_name, verdict_number)
from .report import Report
from .snapshot import Snapshot
from .v1 import snapshot_pb2

__all__ = ["INPUT_ROUNDING_ULPS", "PAIR_COLUMNS", "PAIR_VERDICTS", "PairReport", "PairResult",
           "RowPair", "as_metrics", "compare", "compare_files", "first_layer_inputs_differ",
           "main", "verdict_name", "verdict_number"]

# Mantissa bits of the float formats a pair may hold.
_MANTISSA = {"bfloat16": 7, "float16": 10, "float32": 23, "float64": 52}


def compare(rollout: Snapshot, trainer: Snapshot, *,
            rollout_report: Optional[Report] = None,
            trainer_report: Optional[Report] = None, client: Any = None) -> PairReport:
    """Pairs the rows of two Snapshots (see the module docstring). Each
    side's Report is audited through `client` when not given; without
    either, no side is called drifting and the noise is the output dtype's
    (4 ulps of the largest output)."""
    if client is not None:
        rollout_report = rollout_report or client.audit(rollout)
        trainer_report = trainer_report or client.audit(trainer)
    matched, unmatched_r, unmatched_t = _match(_row_keys(rollout), _row_keys(trainer))
    rv, tv = _verdict(rollout_report), _verdict(trainer_report)
    noise = max(_tolerance(rollout_report), _tolerance(trainer_report))
    rows = tuple(_pair_row(rollout, trainer, key, r, t, rv, tv, noise)
                 for key, r, t in matched)
    layer = rollout.labels.layer if rollout.labels.HasField("layer") else None
    return PairReport(layer=layer, rows=rows, rollout_verdict=rv, trainer_verdict=tv,
                      rollout_diagnosis=_diagnosis(rollout_report),
                      trainer_diagnosis=_diagnosis(trainer_report),
                      unmatched_rollout=unmatched_r, unmatched_trainer=unmatched_t)


# ----------------------------------------------------------------------
# Joining rows
# ----------------------------------------------------------------------


def _row_keys(snap: Snapshot) -> List[Tuple[str, int]]:
    """(request id, position) per row of a decode snapshot (Sq = 1)."""
    ids = list(snap.labels.request_ids)
    positions = np.asarray(snap.tensor("query_positions"))
    if positions.ndim != 2 or positions.shape[1] != 1:
        raise ValueError(f"query_positions: shape {positions.shape}; pairs compare "
                         "decode rows (one query per row)")
    if not ids:
        raise ValueError("labels.request_ids: empty; rows are paired by request id")
    return [(str(ids[b]), int(positions[b, 0])) for b in range(positions.shape[0])]


def _match(rk: List[Tuple[str, int]], tk: List[Tuple[str, int]]
           ) -> Tuple[List[Tuple[Tuple[str, int], int, int]], int, int]:
    where = {key: t for t, key in enumerate(tk)}
    matched = [(key, r, where[key]) for r, key in enumerate(rk) if key in where]
    return matched, len(rk) - len(matched), len(tk) - len(matched)


# ----------------------------------------------------------------------
# One pair
# ----------------------------------------------------------------------


def _pair_row(rollout: Snapshot, trainer: Snapshot, key: Tuple[str, int], r: int, t: int,
              rv: Optional[Verdict], tv: Optional[Verdict], noise: float) -> RowPair:
    out_r, out_t = _output(rollout, r), _output(trainer, t)
    if out_r.shape != out_t.shape:
        raise ValueError(f"engine.out: row shapes {out_r.shape} and {out_t.shape} differ "
                         "(the same heads on both sides are needed)")
    q_r, q_t = _q(rollout, r), _q(trainer, t)
    k_r, v_r = _keys(rollout, r)
    k_t, v_t = _keys(trainer, t)
    n = min(len(k_r), len(k_t))
    params = _attention_params(rollout)
    effect = float(np.max(np.abs(_attend(q_t, k_t, v_t, params)
                                 - _attend(q_r, k_r, v_r, params)), initial=0.0))
    if noise <= 0.0:
        noise = 4.0 * _ulp(float(np.max(np.abs(out_r.astype(np.float64)), initial=0.0)),
                           _dtype_name(rollout, "engine.out"))
    bitwise = out_r.tobytes() == out_t.tobytes()
    q_ulps = _max_ulps(q_r, q_t, _dtype_name(rollout, "q"))
    kv_ulps = _kv_ulps(rollout, k_r, v_r, k_t, v_t, 0, n)
    newest_ulps = _kv_ulps(rollout, k_r, v_r, k_t, v_t, n - 1, n)
    diff = np.abs(out_r.astype(np.float64) - out_t.astype(np.float64))
    return RowPair(
        request_id=key[0], position=key[1], rollout_row=r, trainer_row=t,
        out_bitwise=bitwise, out_max_abs=float(np.max(diff, initial=0.0)),
        out_max_ulps=_max_ulps(out_r, out_t, _dtype_name(rollout, "engine.out")),
        q_ulps=q_ulps, kv_ulps=kv_ulps, newest_kv_ulps=newest_ulps, keys_compared=n,
        input_effect=effect, noise=noise,
        verdict=_row_verdict(rv, tv, bitwise, effect, noise, q_ulps, kv_ulps, newest_ulps))


def _kv_ulps(snap: Snapshot, k_r: np.ndarray, v_r: np.ndarray, k_t: np.ndarray,
             v_t: np.ndarray, lo: int, hi: int) -> float:
    if hi <= lo or lo < 0:
        return 0.0
    return max(_max_ulps(k_r[lo:hi], k_t[lo:hi], _dtype_name(snap, "k_pages")),
               _max_ulps(v_r[lo:hi], v_t[lo:hi], _dtype_name(snap, "v_pages")))


def _row_verdict(rv: Optional[Verdict], tv: Optional[Verdict], bitwise: bool,
                 effect: float, noise: float, q_ulps: float, kv_ulps: float,
                 newest_kv_ulps: float) -> str:
    r_drift, t_drift = rv == Verdict.DRIFT, tv == Verdict.DRIFT
    if r_drift and t_drift:
        return "both-drift"
    if r_drift:
        return "rollout-drift"
    if t_drift:
        return "trainer-drift"
    if bitwise:
        return "consistent"
    if effect <= noise or max(q_ulps, kv_ulps) <= INPUT_ROUNDING_ULPS:
        return "within-noise"
    fresh = max(q_ulps, newest_kv_ulps)
    return "inputs-differ" if fresh > INPUT_ROUNDING_ULPS else "stale-prefix-kv"


# ----------------------------------------------------------------------
# Tensors of one row
# ----------------------------------------------------------------------


def _output(snap: Snapshot, b: int) -> np.ndarray:
    out = np.asarray(snap.tensor("engine.out"))
    return out[b].reshape(-1, snap.dims["D"]) if out.ndim == 2 else out[b].reshape(
        out.shape[-2], out.shape[-1])


def _q(snap: Snapshot, b: int) -> np.ndarray:
    return np.asarray(snap.tensor("q"))[b, 0]  # [Hq, D]


def _keys(snap: Snapshot, b: int) -> Tuple[np.ndarray, np.ndarray]:
    """K and V [n, Hkv, D] of row b's keys, in logical order."""
    meta = snap.meta
    if meta.HasField("rope") and meta.rope.k_state == snapshot_pb2.ROPE_STATE_PRE_ROPE:
        raise ValueError("rope.k_state: pre-RoPE keys; pairs compare post-RoPE snapshots")
    n = int(np.asarray(snap.tensor("kv_seq_lens"))[b])
    table = np.asarray(snap.tensor("block_table"))[b]
    wire = {int(p): i for i, p in enumerate(np.asarray(snap.tensor("page_ids")))}
    k_pages, v_pages = snap.tensor("k_pages"), snap.tensor("v_pages")
    if "float8" in str(k_pages.dtype):
        raise ValueError("k_pages: fp8 pages are not compared")
    hnd = meta.kv_layout == snapshot_pb2.KV_LAYOUT_HND
    page = int(k_pages.shape[2] if hnd else k_pages.shape[1])
    blocks = [wire[int(table[j])] for j in range((n + page - 1) // page)]

    def gather(pages: np.ndarray) -> np.ndarray:
        chosen = pages[blocks]
        if hnd:
            chosen = chosen.swapaxes(1, 2)
        return chosen.reshape(-1, chosen.shape[-2], chosen.shape[-1])[:n]
    return gather(k_pages), gather(v_pages)


def _attention_params(snap: Snapshot) -> Dict[str, Any]:
    meta = snap.meta
    D = snap.dims["D"]
    sinks = snap.tensor("sinks") if "sinks" in snap.tensor_paths() else None
    flash_left = snapshot_pb2.SLIDING_WINDOW_CONVENTION_FLASH_LEFT
    return {"scale": meta.softmax_scale or D ** -0.5, "cap": meta.logit_softcap,
            "window": int(meta.sliding_window),
            "flash_left": meta.window_convention == flash_left,
            "sinks": None if sinks is None else np.asarray(sinks, dtype=np.float64)}


def _attend(q: np.ndarray, k: np.ndarray, v: np.ndarray, p: Dict[str, Any]) -> np.ndarray:
    """Attention of one decode query over its keys, in float64."""
    q64, k64, v64 = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    hq, hkv = q64.shape[0], k64.shape[1]
    if p["window"] > 0:
        keep = p["window"] + (1 if p["flash_left"] else 0)
        k64, v64 = k64[-keep:], v64[-keep:]
    kv_head = np.arange(hq) // (hq // hkv)
    s = np.einsum("hd,nhd->hn", q64, k64[:, kv_head]) * p["scale"]
    if p["cap"]:
        s = p["cap"] * np.tanh(s / p["cap"])
    m = s.max(axis=1, keepdims=True)
    if p["sinks"] is not None:
        m = np.maximum(m, p["sinks"][:, None])
    w = np.exp(s - m)
    total = w.sum(axis=1, keepdims=True)
    if p["sinks"] is not None:
        total = total + np.exp(p["sinks"][:, None] - m)
    return np.einsum("hn,nhd->hd", w / total, v64[:, kv_head])


# ----------------------------------------------------------------------
# Numbers
# ----------------------------------------------------------------------


def _dtype_name(snap: Snapshot, path: str) -> str:
    name = str(snap.tensor(path).dtype)
    return name if name in _MANTISSA else "float32"


def _ulp(x: float, dtype: str) -> float:
    """The spacing of `dtype` at |x| (float32's smallest normal's below it)."""
    mag = max(abs(x), float(np.finfo(np.float32).tiny))
    return float(2.0 ** (np.floor(np.log2(mag)) - _MANTISSA[dtype]))


def _max_ulps(a: np.ndarray, b: np.ndarray, dtype: str) -> float:
    """The largest |a - b| in ulps of `dtype` at the largest magnitude of
    either array (an element near zero would otherwise count its tiny
    spacing)."""
    if a.size == 0:
        return 0.0
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    diff = float(np.max(np.abs(a64 - b64)))
    if diff == 0.0:
        return 0.0
    mag = max(float(np.max(np.abs(a64))), float(np.max(np.abs(b64))))
    return diff / _ulp(mag, dtype)


def _verdict(report: Optional[Report]) -> Optional[Verdict]:
    return None if report is None else report.verdict


def _diagnosis(report: Optional[Report]) -> Optional[str]:
    top = None if report is None else report.diagnosis
    if top is None:
        return None
    # Some summaries name their hypothesis already (core/diagnosis).
    prefix = f"{top.hypothesis}: "
    return top.summary if top.summary.startswith(prefix) else prefix + top.summary


def _tolerance(report: Optional[Report]) -> float:
    """The report's engine-vs-reference output tolerance (0 when none)."""
    if report is None:
        return 0.0
    best: float = 0.0
    for c in report.comparisons:
        out = c.out
        if (out is not None and c.comparison == Comparison.ENGINE_VS_REFERENCE
                and out.tolerance > 0):
            best = max(best, float(out.tolerance))
    return float(best)


def first_layer_inputs_differ(reports: Sequence[PairReport]) -> Optional[int]:
    """The first layer with an inputs-differ (or stale-prefix-kv) pair:
    where a divergence enters the stack (see the module docstring); None
    when none does."""
    upstream = ("inputs-differ", "stale-prefix-kv")
    layers = [p.layer for p in reports if p.layer is not None
              and any(r.verdict in upstream for r in p.rows)]
    return min(layers, default=None)


def as_metrics(reports: Sequence[PairReport], prefix: str = "attnaudit/pairs/"
               ) -> Dict[str, Any]:
    """Flat numbers of one training step's pairs for a metrics logger
    (wandb.log): pairs per verdict, the first layer whose inputs differ
    (-1: none) and the largest output difference."""
    out: Dict[str, Any] = {f"{prefix}{v}": 0 for v in PAIR_VERDICTS}
    worst = 0.0
    for p in reports:
        for r in p.rows:
            out[f"{prefix}{r.verdict}"] += 1
            worst = max(worst, r.out_max_abs)
    first = first_layer_inputs_differ(reports)
    out[f"{prefix}first_layer_inputs_differ"] = -1 if first is None else first
    out[f"{prefix}out_max_abs"] = worst
    return out


def compare_files(rollout_path: str, trainer_path: str, client: Any = None) -> PairReport:
    """compare() on two saved snapshots (Snapshot.save)."""
    return compare(Snapshot.load(rollout_path), Snapshot.load(trainer_path), client=client)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """python -m attnaudit.pairs ROLLOUT.pb TRAINER.pb [--server ADDR]"""
    import argparse
    ap = argparse.ArgumentParser(prog="python -m attnaudit.pairs", description=__doc__.split(
        "\n")[0])
    ap.add_argument("rollout")
    ap.add_argument("trainer")
    ap.add_argument("--server", help="audit each side on this attnaudit server")
    args = ap.parse_args(argv)
    client = None
    if args.server:
        from .client import AuditClient
        client = AuditClient(args.server)
    report = compare_files(args.rollout, args.trainer, client=client)
    print(report.line())
    for r in report.rows:
        print(f"  {r.request_id}@{r.position}: {r.verdict}; out {r.out_max_abs:.3g} "
              f"({r.out_max_ulps:.3g} ulps); q {r.q_ulps:.3g} ulps, K/V {r.kv_ulps:.3g} "
              f"ulps over {r.keys_compared} keys; input effect {r.input_effect:.3g}, "
              f"noise {r.noise:.3g}")
    return 0 if report.verdict in (None, "consistent", "within-noise") else 1


if __name__ == "__main__":
    raise SystemExit(main())
