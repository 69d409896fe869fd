"""An independent float64 attention, written here, against the server's R.

The test computes decode attention itself in numpy float64 (gathering each
row's keys by hand, GQA, sliding window, soft-cap, sinks), submits the result
as the engine's output in f64, and requires the server's fp64 reference to
agree to 1e-12 relative. Nothing here uses attnaudit's numerics: the only
shared thing is the definition in docs/NUMERICS.md.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import attnaudit

B, HQ, HKV, D, P = 3, 8, 2, 32, 16
LENS = np.array([37, 64, 5])
NUM_BLOCKS = 12
SCALE = 0.17
WINDOW = 40      # Hugging Face convention: exactly WINDOW keys
SOFTCAP = 30.0


def _setup(seed=11):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((B, 1, HQ, D))
    k_cache = rng.standard_normal((NUM_BLOCKS, P, HKV, D))
    # Values in [1, 2]: every output element is then far from 0, so a
    # relative comparison measures the arithmetic, not a cancellation.
    v_cache = 1.0 + rng.random((NUM_BLOCKS, P, HKV, D))
    sinks = rng.standard_normal(HQ).astype(np.float32)
    order = rng.permutation(NUM_BLOCKS)
    table = np.full((B, 5), 3)  # stale ids past each row's end
    used = 0
    for b in range(B):
        n = -(-LENS[b] // P)
        table[b, :n] = order[used:used + n]
        used += n
    # Positions with an offset per row and a gap: row b starts at 100 b and
    # skips 3 positions after its 10th token.
    key_pos = np.zeros((B, LENS.max()), dtype=np.int64)
    for b in range(B):
        t = np.arange(LENS[b])
        key_pos[b, :LENS[b]] = 100 * b + t + 3 * (t >= 10)
    return q, k_cache, v_cache, sinks, table, key_pos


def _attention(q, k_cache, v_cache, sinks, table, key_pos):
    """Reference decode attention in float64, one (row, head) at a time."""
    out = np.zeros((B, 1, HQ, D))
    lse = np.zeros((B, 1, HQ))
    for b in range(B):
        L = LENS[b]
        t = np.arange(L)
        pages, slots = table[b, t // P], t % P
        keys = k_cache[pages, slots]      # [L, Hkv, D]
        values = v_cache[pages, slots]
        pos = key_pos[b, :L]
        qpos = pos[-1]
        visible = (pos <= qpos) & (qpos - pos < WINDOW)
        for h in range(HQ):
            g = h // (HQ // HKV)
            s = SCALE * (keys[visible, g] @ q[b, 0, h])
            s = SOFTCAP * np.tanh(s / SOFTCAP)
            m = max(s.max(), float(sinks[h]))
            w = np.exp(s - m)
            denom = w.sum() + math.exp(float(sinks[h]) - m)
            out[b, 0, h] = (w @ values[visible, g]) / denom
            lse[b, 0, h] = m + math.log(w.sum())  # over keys, without the sink
    return out, lse


def _snapshot(lse_values, lse_base, **extra):
    q, k_cache, v_cache, sinks, table, key_pos = _setup()
    out, _ = _attention(q, k_cache, v_cache, sinks, table, key_pos)
    return attnaudit.Snapshot.from_paged_kv(
        q, k_cache, v_cache, table, LENS, layout="nhd", key_positions=key_pos,
        softmax_scale=SCALE, sliding_window=WINDOW, window_convention="hf",
        logit_softcap=SOFTCAP, sinks=sinks, engine_out=out, engine_lse=lse_values,
        lse_base=lse_base, labels={"model": "f64-oracle"}, **extra)


def _oracle():
    q, k_cache, v_cache, sinks, table, key_pos = _setup()
    return _attention(q, k_cache, v_cache, sinks, table, key_pos)


@pytest.mark.parametrize("transport", ["unary", "stream"])
def test_numpy_f64_attention_agrees_with_reference(client, transport):
    out, lse = _oracle()
    snap = _snapshot(lse, "e")
    assert snap.wire_tensor("engine.out").dtype == 6  # f64 on the wire
    report = client.audit(snap, transport=transport)
    er = report.engine_vs_reference
    assert report.verdict == attnaudit.Verdict.PASS, report.reasons
    assert er.out.count == B * HQ * D and er.lse.count == B * HQ
    assert er.out.max_rel < 1e-12, er.out
    assert er.lse.max_rel < 1e-12, er.lse
    assert er.out.max_abs <= 1e-12 * np.abs(out).max()
    assert report.proto.provenance.output_dtype == 6


def test_base2_lse_declared_as_such_agrees(client):
    _, lse = _oracle()
    report = client.audit(_snapshot(lse / math.log(2.0), "2"))
    assert report.passed, report.reasons
    assert report.engine_vs_reference.lse.max_rel < 1e-12


def test_base2_lse_declared_natural_drifts(client):
    _, lse = _oracle()
    report = client.audit(_snapshot(lse / math.log(2.0), "e"))
    assert report.verdict == attnaudit.Verdict.DRIFT
    er = report.engine_vs_reference
    assert er.lse.over_tolerance > 0
    assert er.out.max_rel < 1e-12  # the output itself is right
    assert any(r.startswith("lse:") for r in er.reasons)
