"""Every AuditClient call against the real server, sync and asyncio, and
the typed errors (code, field path, retry hint)."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import threading
import time

import grpc
import numpy as np
import pytest

import attnaudit
import attnaudit.aio
from attnaudit import errors
from conftest import comparable, report_json


@pytest.fixture(scope="module")
def files(cli, tmp_path_factory):
    d = tmp_path_factory.mktemp("client")
    return {
        "small": cli.synth(str(d / "small.pb"), "--preset", "phi4-mini", "--context", "64"),
        "stale": cli.synth(str(d / "stale.pb"), "--preset", "phi4-mini", "--context", "64",
                           "--fault", "stale-page"),
        "medium": cli.synth(str(d / "medium.pb"), "--preset", "llama3-8b", "--batch", "4",
                            "--context", "1024"),
        # 32 query positions per row: ~30x the arithmetic per byte of
        # "medium", so an audit outlasts its own upload and a queue builds
        # behind a single worker however fast the audit gets.
        "busy": cli.synth(str(d / "busy.pb"), "--preset", "llama3-8b", "--batch", "2",
                          "--context", "1024", "--queries", "32"),
    }


def tiny(block_table=((0, 1),), lens=(20,), **options) -> attnaudit.Snapshot:
    """A small valid f32 snapshot in wire layout (B=1, Hq=4, Hkv=2, D=8, P=16)."""
    rng = np.random.default_rng(1)
    pages = rng.standard_normal((2, 16, 2, 8)).astype(np.float32)
    slot = np.full((2, 16), -1)
    slot[0] = np.arange(16)
    slot[1, :4] = np.arange(16, 20)
    return attnaudit.Snapshot.from_arrays(
        q=rng.standard_normal((1, 1, 4, 8)).astype(np.float32), k_pages=pages,
        v_pages=pages * 0.5, block_table=np.array(block_table), kv_seq_lens=np.array(lens),
        query_positions=np.array([[19]]), slot_positions=slot, **options)


# ---------------------------------------------------------------------------
# Sync client
# ---------------------------------------------------------------------------


def test_capabilities(client):
    caps = client.capabilities()
    assert caps.api_version == "attnaudit.v1"
    assert caps.version and caps.fingerprint_version
    assert caps.limits.max_receive_message_bytes > 0
    assert any(b.name == "cpu" and b.available for b in caps.backends)
    assert client.capabilities() is caps  # cached
    assert client.capabilities(refresh=True) is not caps


def test_audit_matches_offline_check(client, cli, files):
    report = client.audit(attnaudit.Snapshot.load(files["small"]))
    assert isinstance(report, attnaudit.Report)
    assert report.verdict == attnaudit.Verdict.PASS and report.passed
    assert comparable(report_json(report)) == comparable(cli.check_json(files["small"]))
    er = report.engine_vs_reference
    assert er.out.max_abs <= er.out.tolerance and er.out.count > 0
    assert er.logprob_agreement is not None and er.logprob_agreement.count == 1
    assert report.labels.model == "phi4-mini"


def test_drift_report_has_reasons(client, files):
    report = client.audit(attnaudit.Snapshot.load(files["stale"]), transport="stream")
    assert report.verdict == attnaudit.Verdict.DRIFT and report.drifted
    assert report.engine_vs_reference.verdict == attnaudit.Verdict.DRIFT
    assert report.replay_vs_reference.verdict == attnaudit.Verdict.PASS
    assert any("over tolerance" in r for r in report.reasons)


def test_drift_report_names_its_diagnosis(client, files):
    report = client.audit(attnaudit.Snapshot.load(files["stale"]))
    top = report.diagnosis
    assert isinstance(top, attnaudit.Diagnosis)
    assert top.hypothesis == "stale-page" and top.score >= 0.5
    assert top.row is not None and top.page is not None
    assert top.page == top.location.page and top.summary
    assert [d.hypothesis for d in report.diagnoses][0] == "stale-page"
    assert "stale-page" in repr(top)
    assert report.engine_profile == "flash-decoding"  # what synth declares
    clean = client.audit(attnaudit.Snapshot.load(files["small"]))
    assert clean.diagnosis is None and clean.diagnoses == []


def test_rolling_rope_check_reports_a_shifted_query(client):
    """q rotated at its position + 1 while the snapshot carries the query
    before RoPE: the rolling check drifts and names the shift."""
    rng = np.random.default_rng(3)
    D = 8
    q_pre = rng.standard_normal((1, 1, 4, D)).astype(np.float32)
    pos = 19
    inv = 10000.0 ** (-np.arange(0, D, 2, dtype=np.float64) / D)

    def rotate(x, p):  # NeoX in float64, rounded once to f32
        a = p * inv
        x1, x2 = x[..., : D // 2], x[..., D // 2:]
        return np.concatenate([x1 * np.cos(a) - x2 * np.sin(a),
                               x2 * np.cos(a) + x1 * np.sin(a)], -1).astype(np.float32)

    base = tiny()
    snap = attnaudit.Snapshot.from_arrays(
        q=rotate(q_pre.astype(np.float64), pos + 1), k_pages=base.tensor("k_pages"),
        v_pages=base.tensor("v_pages"), block_table=base.tensor("block_table"),
        kv_seq_lens=base.tensor("kv_seq_lens"),
        query_positions=base.tensor("query_positions"),
        slot_positions=base.tensor("slot_positions"), pre_rope_q=q_pre)
    report = client.audit(snap)
    assert report.drifted
    [check] = report.rope_checks
    assert check.what == "q" and check.mismatches > 0
    assert report.diagnosis.hypothesis == "rope-offset"
    assert report.diagnosis.detail == "+1"


def test_snapshots_past_the_unary_limit_stream_on_their_own(make_server, files):
    snap = attnaudit.Snapshot.load(files["small"])
    limit = snap.nbytes // 2  # the server takes no unary request this big
    server = make_server("--max-message-bytes", str(limit), "--cpu-workers", "1")
    with attnaudit.AuditClient(server.address) as c:
        assert c.capabilities().limits.max_receive_message_bytes == limit
        auto = c.audit(snap)
        assert auto.verdict == attnaudit.Verdict.PASS
        with pytest.raises(attnaudit.ResourceExhaustedError) as e:
            c.audit(snap, transport="unary")
        assert e.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert comparable(report_json(auto)) == comparable(
        report_json(attnaudit.AuditClient(server.address).audit(snap, transport="stream")))


def test_memfd_snapshots_are_read_in_place(make_server, cli, files):
    """A server with --accept-memfd-snapshots audits the snapshot in a
    sealed memfd: the offline check's report; one memfd rewritten between
    audits is read afresh; a server without the switch refuses it."""
    small = attnaudit.Snapshot.load(files["small"])
    stale = attnaudit.Snapshot.load(files["stale"])
    server = make_server("--accept-memfd-snapshots", "--cpu-workers", "1")
    with attnaudit.AuditClient(server.address) as c:
        report = c.audit(small, transport="memfd")
        assert comparable(report_json(report)) == comparable(cli.check_json(files["small"]))
        with attnaudit.MemfdSnapshot(stale) as m:
            assert c.audit_memfd(m).verdict == attnaudit.Verdict.DRIFT
            m.write(small)
            assert c.audit_memfd(m).verdict == attnaudit.Verdict.PASS
            m.write(stale)
            assert c.audit_memfd(m).verdict == attnaudit.Verdict.DRIFT

        async def aio_audit():
            async with attnaudit.aio.AuditClient(server.address) as ac:
                return await ac.audit(small, transport="memfd")
        assert asyncio.run(aio_audit()).verdict == attnaudit.Verdict.PASS
    plain = make_server("--cpu-workers", "1")
    with attnaudit.AuditClient(plain.address) as c:
        with pytest.raises(attnaudit.AuditError) as e:
            c.audit(small, transport="memfd")
        assert e.value.code == grpc.StatusCode.FAILED_PRECONDITION
        assert "--accept-memfd-snapshots" in str(e.value)


def test_submit_get_wait_and_idempotency(client, files):
    snap = attnaudit.Snapshot.load(files["small"])
    key = f"pytest-{os.getpid()}-{time.monotonic_ns()}"
    job = client.submit(snap, idempotency_key=key, job_timeout=60,
                        options={"worst_heads": 2})
    assert isinstance(job, attnaudit.Submitted) and job.job_id and not job.deduplicated
    again = client.submit(snap, idempotency_key=key)
    assert again.deduplicated and again.job_id == job.job_id
    result = client.wait(job.job_id, timeout=60)
    assert result.state == attnaudit.JobState.DONE and result.done
    assert result.verdict == attnaudit.Verdict.PASS
    assert result.priority == attnaudit.Priority.SAMPLED
    assert len(result.report.engine_vs_reference.worst_heads) == 2
    assert client.get(job.job_id).job_id == job.job_id


def test_cancel(make_server, files):
    server = make_server("--cpu-workers", "1", "--threads-per-job", "1")
    with attnaudit.AuditClient(server.address) as c:
        busy = attnaudit.Snapshot.load(files["busy"])
        small = attnaudit.Snapshot.load(files["small"])
        # A job queued behind audits on the only worker is cancelled before
        # it runs. Whether it is still queued when Cancel arrives depends on
        # the machine's speed, so the queue ahead doubles until it is (a
        # job that finished first must report DONE consistently).
        cancelled = None
        for ahead in (3, 6, 12, 24):
            jobs = [c.submit(busy).job_id for _ in range(ahead)]
            last = c.submit(small).job_id
            state = c.cancel(last)
            result = c.wait(last, timeout=120)
            if state == attnaudit.JobState.RUNNING:
                # Cancel flags a running job; the device stops between work
                # items, so a job with one item may still finish.
                assert result.state in (attnaudit.JobState.CANCELLED,
                                        attnaudit.JobState.DONE), result
                state = result.state
            assert result.state == state, (state, result)
            if state == attnaudit.JobState.CANCELLED:
                cancelled = result
                break
            assert state == attnaudit.JobState.DONE and result.report is not None
        assert cancelled is not None, "never caught a queued job"
        assert cancelled.report is None
        assert isinstance(cancelled.error, attnaudit.CancelledError)
        done = c.wait(jobs[0], timeout=300)
        assert done.state == attnaudit.JobState.DONE
        assert c.cancel(jobs[0]) == attnaudit.JobState.DONE  # finished: unchanged
        with pytest.raises(attnaudit.NotFoundError) as e:
            c.cancel("no-such-job")
        assert e.value.code == grpc.StatusCode.NOT_FOUND


def _watch_until(watch_factory, submit, want: int, deadline: float = 30.0):
    """Opens a watch, submits until `want` results arrived (the server
    registers a watch asynchronously, so the first submissions may finish
    before it listens), returns (results, submitted ids)."""
    got, submitted = [], []
    watch = watch_factory()

    def consume():
        for r in watch:
            got.append(r)
            if len(got) >= want:
                watch.cancel()
                return

    t = threading.Thread(target=consume, daemon=True)
    t.start()
    end = time.monotonic() + deadline
    while t.is_alive() and time.monotonic() < end:
        submitted.append(submit())
        t.join(timeout=0.3)
    watch.cancel()
    t.join(timeout=5)
    return got, submitted


def test_watch_streams_matching_results(client, files):
    small = attnaudit.Snapshot.load(files["small"])
    small.labels.model = f"watch-{os.getpid()}"
    stale = attnaudit.Snapshot.load(files["stale"])
    stale.labels.model = small.labels.model

    def submit():
        client.submit(small)  # PASS: filtered out by the verdict
        return client.submit(stale).job_id

    got, submitted = _watch_until(
        lambda: client.watch(model=small.labels.model, verdicts=["DRIFT"], timeout=40),
        submit, want=2)
    assert len(got) >= 2
    for r in got:
        assert isinstance(r, attnaudit.JobResult)
        assert r.job_id in submitted and r.verdict == attnaudit.Verdict.DRIFT
        assert r.labels.model == small.labels.model


def test_watch_ends_quietly_at_its_deadline(client):
    start = time.monotonic()
    assert list(client.watch(model="nobody-submits-this", timeout=0.5)) == []
    assert time.monotonic() - start < 30


def test_invalid_snapshot_names_the_field(client):
    bad = tiny(block_table=((0, 5),))  # page 5 of a 2-page pool
    for transport in ("unary", "stream"):
        with pytest.raises(attnaudit.InvalidArgumentError) as e:
            client.audit(bad, transport=transport)
        assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT
        assert e.value.field_path.endswith("snapshot.block_table[0][1]"), e.value.message
        assert "out of range" in e.value.message
    with pytest.raises(attnaudit.InvalidArgumentError) as e:
        client.submit(bad)
    assert e.value.field_path == "snapshot.block_table[0][1]"
    # The same error is a ValueError for code that does not know attnaudit.
    assert isinstance(e.value, ValueError)
    with pytest.raises(attnaudit.InvalidArgumentError) as e:
        client.audit(tiny(softmax_scale=-1.0))
    assert e.value.field_path == "snapshot.softmax_scale"


def test_other_typed_errors(client, make_server, files, tmp_path):
    with pytest.raises(attnaudit.NotFoundError):
        client.get("no-such-job")
    with pytest.raises(attnaudit.DeadlineExceededError):
        client.audit(attnaudit.Snapshot.load(files["medium"]), timeout=0.005)
    with attnaudit.AuditClient("127.0.0.1:1", timeout=3) as nowhere:
        with pytest.raises(attnaudit.UnavailableError):
            nowhere.capabilities()
    token_file = tmp_path / "token"
    token_file.write_text("s3cret\n")
    server = make_server("--auth-token-file", str(token_file), "--cpu-workers", "1")
    with attnaudit.AuditClient(server.address) as anonymous:
        with pytest.raises(attnaudit.UnauthenticatedError):
            anonymous.capabilities()
    with attnaudit.AuditClient(server.address, token="s3cret") as authed:
        assert authed.audit(tiny()).verdict == attnaudit.Verdict.PASS


def test_retry_hint_and_field_path_parsing():
    class Fake(grpc.RpcError):
        def code(self):
            return grpc.StatusCode.RESOURCE_EXHAUSTED

        def details(self):
            return "queue sampled is full (1024 jobs)"

        def trailing_metadata(self):
            return (("retry-after-ms", "250"),)

    e = errors.from_rpc_error(Fake())
    assert isinstance(e, attnaudit.ResourceExhaustedError)
    assert e.retry_after == 0.25 and e.field_path is None
    assert errors.field_path_of("snapshot.k_pages[3][0][1][7]: value is not finite") \
        == "snapshot.k_pages[3][0][1][7]"
    assert errors.field_path_of("header.manifest[2].byte_length: 12 != 16") \
        == "header.manifest[2].byte_length"
    assert errors.field_path_of("stream ended after 10 of 20 bytes") is None


# ---------------------------------------------------------------------------
# asyncio client
# ---------------------------------------------------------------------------


def test_async_client_every_call(server, cli, files):
    small = attnaudit.Snapshot.load(files["small"])
    stale = attnaudit.Snapshot.load(files["stale"])
    stale.labels.model = f"aio-watch-{os.getpid()}"
    offline = comparable(cli.check_json(files["small"]))

    async def main():
        async with attnaudit.aio.AuditClient(server.address, timeout=60) as c:
            await c.wait_for_ready(10)
            caps = await c.capabilities()
            assert caps.api_version == "attnaudit.v1"
            unary = await c.audit(small, transport="unary")
            stream = await c.audit(small, transport="stream")
            auto = await c.audit(small)
            for r in (unary, stream, auto):
                assert comparable(report_json(r)) == offline
            job = await c.submit(small, idempotency_key=f"aio-{time.monotonic_ns()}")
            assert (await c.wait(job.job_id, timeout=60)).verdict == attnaudit.Verdict.PASS
            assert (await c.get(job.job_id)).state == attnaudit.JobState.DONE
            assert await c.cancel(job.job_id) == attnaudit.JobState.DONE
            with pytest.raises(attnaudit.NotFoundError):
                await c.get("no-such-job")
            with pytest.raises(attnaudit.InvalidArgumentError) as e:
                await c.audit(tiny(block_table=((0, 5),)))
            assert e.value.field_path == "snapshot.block_table[0][1]"
            # watch: submit until the watcher has seen a matching result.
            watch = c.watch(model=stale.labels.model, timeout=40)
            submitted = []

            async def first():
                async for r in watch:
                    return r

            task = asyncio.ensure_future(first())
            while not task.done():
                submitted.append((await c.submit(stale)).job_id)
                await asyncio.wait([task], timeout=0.3)
            result = task.result()
            watch.cancel()
            assert result.job_id in submitted and result.verdict == attnaudit.Verdict.DRIFT
            async for _ in c.watch(model="nobody-submits-this", timeout=0.3):
                raise AssertionError("nothing matches this filter")

    asyncio.run(asyncio.wait_for(main(), 120))


def test_tls_mismatches_get_a_hint(server, make_server, tmp_path):
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed: no test certificate")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=localhost", "-keyout", str(key), "-out", str(cert),
                    "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"],
                   check=True, capture_output=True)
    tls_server = make_server("--tls-cert", str(cert), "--tls-key", str(key),
                             "--cpu-workers", "1")
    with attnaudit.AuditClient(tls_server.address, timeout=5) as plaintext:
        with pytest.raises(attnaudit.UnavailableError, match="hint: if the server serves TLS"):
            plaintext.capabilities()
    with attnaudit.AuditClient(tls_server.address, timeout=5, tls=True) as untrusted:
        with pytest.raises(attnaudit.UnavailableError, match="not signed by a CA"):
            untrusted.capabilities()
    with attnaudit.AuditClient(server.address, timeout=5, tls=True) as at_plaintext:
        with pytest.raises(attnaudit.UnavailableError, match="does not speak TLS"):
            at_plaintext.capabilities()
    with attnaudit.AuditClient(tls_server.address, timeout=5, tls={"ca": str(cert)}) as ok:
        assert ok.capabilities() is not None
