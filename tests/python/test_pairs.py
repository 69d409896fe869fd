"""Train–rollout pairs (attnaudit.pairs): the same rows of one layer as a
rollout engine and a trainer computed them, joined by (request id,
position) and judged with each side's audit by a real attnaudit-server.

The two sides here are numpy engines over the same tokens: the rollout
reads a paged cache with its pages scattered (float32 softmax, bf16 out),
the trainer one contiguous cache per sequence (float64, bf16 out), so
correct sides differ in their last bits only; the bugs are put in one side.

Each pair is also saved (Snapshot.save) and compared by `attnaudit pair
--json`, the same rules in C++ (core/pairs), auditing each side in process:
its verdict per row must be Python's. Python compares with the server's
audit reports where the test has them; where it has none (its noise is then
4 ulps of the output), the rows are bitwise equal or their inputs are, so
the verdicts do not depend on the reports.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import sys
import tempfile
import time

import ml_dtypes
import numpy as np
import pytest

import attnaudit
import attnaudit.aio
from attnaudit import pairs
from attnaudit.v1 import snapshot_pb2

BF16 = ml_dtypes.bfloat16
HQ, HKV, D, PAGE = 8, 2, 64, 16
LENS = (150, 97, 260, 33)
IDS = ("req-a", "req-b", "req-c", "req-d")


class Tokens:
    """The rows' keys, values and queries (bf16), with peaked attention:
    every row's first key is a sink most queries attend to."""

    def __init__(self, seed: int = 0):
        g = np.random.default_rng(seed)
        self.k = [g.standard_normal((n, HKV, D)).astype(BF16) for n in LENS]
        self.v = [g.standard_normal((n, HKV, D)).astype(BF16) for n in LENS]
        self.q = g.standard_normal((len(LENS), HQ, D)).astype(BF16)
        for k in self.k:
            k[0] = (k[0].astype(np.float32) * 4).astype(BF16)


def attend(q, k, v, dtype, cap: float = 0.0) -> np.ndarray:
    """[Hq, D] attention of one query row over its keys in `dtype`; in
    float32 the probabilities are rounded to bf16 before the PV product,
    as FlashAttention-style kernels do."""
    q, k, v = (np.asarray(x, dtype=dtype) for x in (q, k, v))
    heads = np.arange(HQ) // (HQ // HKV)
    s = np.einsum("hd,nhd->hn", q, k[:, heads]) * dtype(D ** -0.5)
    if cap:
        s = cap * np.tanh(s / cap)
    w = np.exp(s - s.max(axis=1, keepdims=True))
    p = w / w.sum(axis=1, keepdims=True)
    if dtype == np.float32:
        p = p.astype(BF16).astype(np.float32)
    return np.einsum("hn,nhd->hd", p, v[:, heads])


def snapshot(t: Tokens, *, scattered: bool, dtype, q=None, k=None, cap: float = 0.0,
             declared_cap: float = 0.0, read=None, out_error: float = 0.0,
             labels=None) -> attnaudit.Snapshot:
    """One side's decode snapshot of every row (its last token the query).
    read(b, k, v) -> (k, v): what its kernel read instead, if not the cache.
    out_error: added to the first head's output of every row. labels:
    added to (or replacing) the test's."""
    q = t.q if q is None else q
    k = t.k if k is None else k
    pages_k, pages_v, table = [], [], np.zeros((len(LENS), 32), dtype=np.int32)
    for b, n in enumerate(LENS):
        for j in range(0, n, PAGE):
            chunk_k = np.zeros((PAGE, HKV, D), dtype=BF16)
            chunk_v = np.zeros((PAGE, HKV, D), dtype=BF16)
            chunk_k[:min(PAGE, n - j)] = k[b][j:j + PAGE]
            chunk_v[:min(PAGE, n - j)] = t.v[b][j:j + PAGE]
            table[b, j // PAGE] = len(pages_k)
            pages_k.append(chunk_k)
            pages_v.append(chunk_v)
    order = np.random.default_rng(7).permutation(len(pages_k)) if scattered \
        else np.arange(len(pages_k))
    where = np.argsort(order)  # page i of the list sits at pool index where[i]
    kp, vp = np.stack(pages_k)[order], np.stack(pages_v)[order]
    out = np.zeros((len(LENS), HQ, D), dtype=BF16)
    for b in range(len(LENS)):
        kb, vb = (k[b], t.v[b]) if read is None else read(b, k[b], t.v[b])
        out[b] = attend(q[b], kb, vb, dtype, cap).astype(BF16)
        out[b, 0] = (out[b, 0].astype(np.float32) + out_error).astype(BF16)
    return attnaudit.Snapshot.from_paged_kv(
        q, kp, vp, where[table], np.array(LENS), layout="nhd", engine_out=out,
        logit_softcap=declared_cap or None, engine="flash-decoding",
        labels={"request_ids": list(IDS), "layer": 3, "run": "pairs", **(labels or {})})


@pytest.fixture(scope="module")
def tokens():
    return Tokens()


def rollout_of(t: Tokens, **kw) -> attnaudit.Snapshot:
    return snapshot(t, scattered=True, dtype=np.float32, **kw)


def trainer_of(t: Tokens, **kw) -> attnaudit.Snapshot:
    return snapshot(t, scattered=False, dtype=np.float64, **kw)


def cli_pairs(cli, rollout: attnaudit.Snapshot, trainer: attnaudit.Snapshot,
              expected: pairs.PairReport) -> dict:
    """`attnaudit pair --json` on the two sides saved to files; asserts it
    pairs the same rows with the same verdicts as `expected`."""
    with tempfile.TemporaryDirectory(prefix="attnaudit_pairs_") as d:
        paths = [os.path.join(d, "rollout.pb"), os.path.join(d, "trainer.pb")]
        rollout.save(paths[0])
        trainer.save(paths[1])
        p = cli.run("pair", *paths, "--json")
    got = json.loads(p.stdout)
    assert [(r["request_id"], r["position"], r["verdict"]) for r in got["rows"]] == \
        [(r.request_id, r.position, r.verdict) for r in expected.rows]
    assert (got["unmatched_rollout"], got["unmatched_trainer"]) == \
        (expected.unmatched_rollout, expected.unmatched_trainer)
    assert got["verdict"] == expected.verdict
    assert p.returncode == (0 if expected.verdict in (None, "consistent",
                                                      "within-noise") else 1)
    if expected.rollout_verdict is not None:
        assert got["rollout_verdict"] == expected.rollout_verdict.name
        assert got["trainer_verdict"] == expected.trainer_verdict.name
    for g, e in zip(got["rows"], expected.rows, strict=True):
        assert g["out_bitwise"] == e.out_bitwise
        assert g["keys_compared"] == e.keys_compared
        assert g["inputs_differing"] == e.inputs_differing
        for field in ("out_max_abs", "q_ulps", "kv_ulps", "newest_kv_ulps",
                      "input_effect"):
            assert g[field] == pytest.approx(getattr(e, field), rel=1e-9, abs=1e-12)
    return got


def test_the_same_arithmetic_on_both_sides_is_consistent(tokens, cli):
    rollout = rollout_of(tokens)
    trainer = snapshot(tokens, scattered=False, dtype=np.float32)
    report = pairs.compare(rollout, trainer)
    cli_pairs(cli, rollout, trainer, report)
    assert report.verdict == "consistent"
    assert [r.verdict for r in report.rows] == ["consistent"] * 4
    assert [(r.request_id, r.position) for r in report.rows] == \
        [(i, n - 1) for i, n in zip(IDS, LENS, strict=True)]
    assert all(r.keys_compared == n for r, n in zip(report.rows, LENS, strict=True))


def test_two_correct_kernels_differ_within_noise(tokens, client, cli):
    rollout, trainer = rollout_of(tokens), trainer_of(tokens)
    report = pairs.compare(rollout, trainer, client=client)
    cli_pairs(cli, rollout, trainer, report)
    assert report.rollout_verdict == report.trainer_verdict == attnaudit.Verdict.PASS
    assert {r.verdict for r in report.rows} <= {"consistent", "within-noise"}
    assert any(not r.out_bitwise for r in report.rows)  # the kernels' last bits
    assert all(r.q_ulps == 0 and r.kv_ulps == 0 and r.input_effect == 0
               for r in report.rows)
    assert report.verdict in ("consistent", "within-noise")


def test_a_trainer_without_its_soft_cap_is_named(tokens, client, cli):
    rollout = rollout_of(tokens, cap=5.0, declared_cap=5.0)
    trainer = trainer_of(tokens, cap=0.0, declared_cap=5.0)
    report = pairs.compare(rollout, trainer, client=client)
    got = cli_pairs(cli, rollout, trainer, report)
    assert got["trainer_diagnosis"] == report.trainer_diagnosis
    assert report.trainer_verdict == attnaudit.Verdict.DRIFT
    assert report.rollout_verdict == attnaudit.Verdict.PASS
    assert report.verdict == "trainer-drift"
    assert "trainer-drift" in report.line()


def test_a_rollout_reading_a_stale_page_is_named(tokens, client, cli):
    stale = np.random.default_rng(3).standard_normal((PAGE, HKV, D)).astype(BF16)

    def read(b, k, v):
        if b != 2:
            return k, v
        k, v = k.copy(), v.copy()
        k[PAGE:2 * PAGE], v[PAGE:2 * PAGE] = stale, stale
        return k, v
    rollout, trainer = rollout_of(tokens, read=read), trainer_of(tokens)
    report = pairs.compare(rollout, trainer, client=client)
    got = cli_pairs(cli, rollout, trainer, report)
    assert got["rollout_diagnosis"] == report.rollout_diagnosis
    assert report.rollout_verdict == attnaudit.Verdict.DRIFT
    assert report.verdict == "rollout-drift"
    assert report.rollout_diagnosis


def test_inputs_that_differ_upstream_are_named(tokens, client, cli):
    # The trainer's q off by ~5 % (an upstream difference such as another
    # norm epsilon); both kernels compute their own inputs correctly.
    g = np.random.default_rng(11)
    q = (tokens.q.astype(np.float32) * (1 + 0.05 * g.standard_normal(tokens.q.shape))
         ).astype(BF16)
    rollout, trainer = rollout_of(tokens), trainer_of(tokens, q=q)
    report = pairs.compare(rollout, trainer, client=client)
    cli_pairs(cli, rollout, trainer, report)
    assert report.rollout_verdict == report.trainer_verdict == attnaudit.Verdict.PASS
    assert report.verdict == "inputs-differ"
    worst = max(report.rows, key=lambda r: r.input_effect)
    assert worst.inputs_differing == "q" and worst.input_effect > worst.noise


def test_a_prefix_cached_under_other_weights_is_named(tokens, client, cli):
    # The rollout read the first page of req-b's prefix as it was cached
    # under older weights; the decode token's q is the same on both sides.
    k = [x.copy() for x in tokens.k]
    k[1][:PAGE] = (k[1][:PAGE].astype(np.float32) * 1.5).astype(BF16)
    rollout, trainer = rollout_of(tokens, k=k), trainer_of(tokens)
    report = pairs.compare(rollout, trainer, client=client)
    cli_pairs(cli, rollout, trainer, report)
    assert report.rollout_verdict == report.trainer_verdict == attnaudit.Verdict.PASS
    row = next(r for r in report.rows if r.request_id == "req-b")
    assert row.verdict == "stale-prefix-kv" and row.inputs_differing == "K/V"
    assert row.q_ulps == 0 and row.kv_ulps > pairs.INPUT_ROUNDING_ULPS
    assert {r.verdict for r in report.rows if r.request_id != "req-b"} <= \
        {"consistent", "within-noise"}


def test_keys_that_differ_up_to_the_newest_are_not_called_stale(tokens, client, cli):
    # Every key of req-b differs, the newest (made with q) included: the
    # hidden states differ, as in a deeper layer of two correct stacks,
    # even where q happens to agree. Not a stale prefix.
    k = [x.copy() for x in tokens.k]
    k[1] = (k[1].astype(np.float32) * 1.5).astype(BF16)
    rollout, trainer = rollout_of(tokens, k=k), trainer_of(tokens)
    report = pairs.compare(rollout, trainer, client=client)
    cli_pairs(cli, rollout, trainer, report)
    row = next(r for r in report.rows if r.request_id == "req-b")
    assert row.q_ulps == 0 and row.newest_kv_ulps > pairs.INPUT_ROUNDING_ULPS
    assert row.verdict == "inputs-differ" and row.inputs_differing == "K/V"


def test_rows_only_one_side_holds_are_counted(tokens, cli):
    trainer = trainer_of(tokens)
    del trainer.labels.request_ids[:]
    trainer.labels.request_ids.extend(["req-a", "req-x", "req-c", "req-y"])
    rollout = rollout_of(tokens)
    report = pairs.compare(rollout, trainer)
    cli_pairs(cli, rollout, trainer, report)
    assert [r.request_id for r in report.rows] == ["req-a", "req-c"]
    assert (report.unmatched_rollout, report.unmatched_trainer) == (2, 2)


def test_what_cannot_be_paired_is_refused(tokens, cli):
    unlabelled = rollout_of(tokens)
    del unlabelled.labels.request_ids[:]
    with pytest.raises(ValueError, match="request_ids"):
        pairs.compare(unlabelled, trainer_of(tokens))
    with tempfile.TemporaryDirectory(prefix="attnaudit_pairs_") as d:
        paths = [os.path.join(d, "rollout.pb"), os.path.join(d, "trainer.pb")]
        unlabelled.save(paths[0])
        trainer_of(tokens).save(paths[1])
        p = cli.run("pair", *paths, check=False)
    assert p.returncode == 2
    assert b"labels.request_ids: empty" in p.stderr


def test_a_steps_pairs_as_metrics(tokens):
    reports = [pairs.compare(rollout_of(tokens), trainer_of(tokens))]
    q = (tokens.q.astype(np.float32) * 1.1).astype(BF16)
    report = pairs.compare(rollout_of(tokens), trainer_of(tokens, q=q))
    reports.append(dataclasses.replace(report, layer=5))
    m = pairs.as_metrics(reports)
    assert m["attnaudit/pairs/inputs-differ"] == 4
    assert m["attnaudit/pairs/consistent"] + m["attnaudit/pairs/within-noise"] == 4
    assert m["attnaudit/pairs/first_layer_inputs_differ"] == 5
    assert m["attnaudit/pairs/out_max_abs"] == max(r.out_max_abs for p in reports
                                                   for r in p.rows)


# ----------------------------------------------------------------------
# Pairs joined by the server (ListPairs)
# ----------------------------------------------------------------------


def test_labels_take_a_role_and_a_weight_version():
    from attnaudit.snapshot import make_labels
    labels = make_labels({"role": "trainer", "weight_version": 7, "run": "r"})
    assert labels.role == snapshot_pb2.SNAPSHOT_ROLE_TRAINER
    assert labels.weight_version == "7"
    assert make_labels({"role": "ROLLOUT"}).role == snapshot_pb2.SNAPSHOT_ROLE_ROLLOUT
    assert make_labels({"role": snapshot_pb2.SNAPSHOT_ROLE_TRAINER}).role == \
        snapshot_pb2.SNAPSHOT_ROLE_TRAINER
    assert make_labels({"role": None, "weight_version": None}) == snapshot_pb2.Labels()
    with pytest.raises(ValueError, match=r"labels\.role: unknown value 'critic'.*"
                                         r"rollout, trainer"):
        make_labels({"role": "critic"})
    with pytest.raises(ValueError, match=r"labels\.role"):
        make_labels({"role": 9})
    with pytest.raises(TypeError, match="unknown key 'side'.*role, weight_version"):
        make_labels({"side": "rollout"})


def side(t: Tokens, role: str, run: str, step: int, weight_version: str,
         **kw) -> attnaudit.Snapshot:
    """A pair side: the rollout's arithmetic (paged, float32), labelled."""
    return rollout_of(t, labels={"role": role, "run": run, "step": step,
                                 "weight_version": weight_version}, **kw)


def joined(client, run: str, timeout: float = 30.0) -> list:
    """The server's pairs of `run` once there is one (the join is
    asynchronous: it follows the second side's audit)."""
    deadline = time.monotonic() + timeout
    while True:
        found = client.list_pairs(run=run).to_list()
        if found or time.monotonic() > deadline:
            return found
        time.sleep(0.05)


def other_job(client, run: str, known: str) -> str:
    """The job id of run's stored result that is not `known` (an Audit's
    id, which attnaudit.Report does not carry)."""
    ids = [s.job_id for s in client.list_results(run=run)]
    assert len(ids) == 2 and known in ids, ids
    return next(i for i in ids if i != known)


def test_the_server_joins_a_rollout_and_a_trainer_snapshot(tokens, client, server):
    run = "r"
    rollout = side(tokens, "rollout", run, 5, "7")
    trainer = side(tokens, "trainer", run, 6, "7")       # the same rows, bit for bit
    rollout_job = client.submit(rollout).job_id
    assert client.wait(rollout_job).report.verdict == attnaudit.Verdict.PASS
    assert client.audit(trainer).verdict == attnaudit.Verdict.PASS
    found = joined(client, run)
    assert len(found) == 1, found
    p = found[0]
    assert isinstance(p, attnaudit.PairResult)
    assert p.verdict == "consistent"
    assert (p.rollout_job_id, p.trainer_job_id) == (rollout_job,
                                                    other_job(client, run, rollout_job))
    assert (p.run, p.layer, p.rollout_step, p.trainer_step) == (run, 3, 5, 6)
    assert (p.rollout_weight_version, p.trainer_weight_version) == ("7", "7")
    assert not p.weight_versions_differ
    assert p.rollout_verdict == p.trainer_verdict == attnaudit.Verdict.PASS
    assert p.rollout_diagnosis is None and p.trainer_diagnosis is None
    assert [(r.request_id, r.position, r.verdict) for r in p.rows] == \
        [(i, n - 1, "consistent") for i, n in zip(IDS, LENS, strict=True)]
    assert all(r.out_bitwise and r.out_max_ulps == 0 and r.q_ulps == 0 and r.kv_ulps == 0
               and r.input_effect == 0 and r.keys_compared == n
               for r, n in zip(p.rows, LENS, strict=True))
    assert p.join_time is not None and p.join_time.tzinfo is not None
    assert p.report.verdict == "consistent" and "consistent 4" in p.line()
    # The filters.
    assert [x.trainer_job_id for x in client.list_pairs(run=run, verdict="consistent",
                                                        layer=3, step=6,
                                                        request_id="req-c",
                                                        since=600)] == [p.trainer_job_id]
    for miss in (dict(verdict="trainer-drift"), dict(layer=4), dict(step=7),
                 dict(request_id="req-z"), dict(until=600)):
        assert client.list_pairs(run=run, **miss).to_list() == [], miss
    assert client.list_pairs(run=run, limit=0).to_list() == []
    records = client.list_pairs(run=run).to_records()
    assert [r["request_id"] for r in records] == list(IDS)
    assert list(records[0]) == list(pairs.PAIR_COLUMNS)
    assert records[0]["pair_verdict"] == "consistent"
    assert records[0]["rollout_verdict"] == "PASS"

    async def listed():
        async with attnaudit.aio.AuditClient(server.address) as c:
            return [x.trainer_job_id async for x in c.list_pairs(run=run, verdict=2)]
    # verdict as its wire number: 2 is within-noise, which this pair is not.
    assert asyncio.run(listed()) == []


def test_a_trainer_output_off_beyond_noise_is_a_trainer_drift_pair(tokens, client):
    # The rows as the rollout computed them, but the trainer's output is off
    # by 0.25 in one head: the trainer's own audit DRIFTs, the rollout's
    # PASSes, so every row -- and the pair -- is trainer-drift (the side
    # audits decide before the outputs and inputs are compared).
    run = "r-trainer-drift"
    rollout = side(tokens, "rollout", run, 5, "7")
    trainer = side(tokens, "trainer", run, 6, "8", out_error=0.25)
    rollout_report = client.audit(rollout)
    trainer_job = client.submit(trainer).job_id
    trainer_report = client.wait(trainer_job).report
    assert trainer_report.verdict == attnaudit.Verdict.DRIFT
    found = joined(client, run)
    assert len(found) == 1, found
    p = found[0]
    assert p.verdict == "trainer-drift"
    assert p.trainer_job_id == trainer_job
    assert p.rollout_verdict == attnaudit.Verdict.PASS
    assert p.trainer_verdict == attnaudit.Verdict.DRIFT
    assert p.rollout_diagnosis is None
    assert p.weight_versions_differ
    assert (p.rollout_weight_version, p.trainer_weight_version) == ("7", "8")
    assert all(not r.out_bitwise and r.out_max_abs > 0.2 for r in p.rows)
    # The server's rows are the client's, given the same audits.
    here = pairs.compare(rollout, trainer, rollout_report=rollout_report,
                         trainer_report=trainer_report)
    assert [(r.request_id, r.position, r.verdict) for r in p.rows] == \
        [(r.request_id, r.position, r.verdict) for r in here.rows]
    assert p.trainer_diagnosis == here.trainer_diagnosis
    for a, b in zip(p.rows, here.rows, strict=True):
        for field in ("out_max_abs", "out_max_ulps", "q_ulps", "kv_ulps", "input_effect",
                      "noise"):
            assert getattr(a, field) == pytest.approx(getattr(b, field), rel=1e-9,
                                                      abs=1e-12), field
    assert client.list_pairs(run=run, verdict="trainer_drift").to_list()[0].trainer_job_id \
        == trainer_job


def test_list_pairs_arguments_are_checked(client, monkeypatch):
    with pytest.raises(ValueError, match="unknown pair verdict 'drift'.*consistent, "
                                         "within-noise"):
        client.list_pairs(verdict="drift")
    with pytest.raises(ValueError, match="page_size"):
        client.list_pairs(page_size=0)
    with pytest.raises(TypeError, match="since"):
        client.list_pairs(since="yesterday")
    monkeypatch.setitem(sys.modules, "pandas", None)
    with pytest.raises(ImportError, match="pip install pandas"):
        client.list_pairs(run="r").to_pandas()
