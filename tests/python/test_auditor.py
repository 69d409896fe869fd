"""RolloutAuditor: sampling, lazy builders, counters and verdicts, and
never blocking -- it drops while the server is paused (SIGSTOP) and recovers
when it resumes (SIGCONT)."""

from __future__ import annotations

import collections
import concurrent.futures
import threading
import time

import grpc
import pytest

import attnaudit
from attnaudit.v1 import report_pb2, service_pb2


@pytest.fixture(scope="module")
def snaps(cli, tmp_path_factory):
    d = tmp_path_factory.mktemp("auditor")
    ok = cli.synth(str(d / "ok.pb"), "--preset", "phi4-mini", "--context", "64")
    bad = cli.synth(str(d / "bad.pb"), "--preset", "phi4-mini", "--context", "64",
                    "--fault", "stale-page")
    return {"ok": ok, "bad": bad}


class Builder:
    """A builder that loads a snapshot and counts its calls."""

    def __init__(self, path):
        self.path = path
        self.calls = 0

    def __call__(self):
        self.calls += 1
        snap = attnaudit.Snapshot.load(self.path)
        snap.labels.ClearField("layer")  # the auditor fills in its own
        snap.labels.ClearField("step")
        return snap


def test_builders_run_only_for_sampled_steps(client, snaps):
    build = Builder(snaps["ok"])
    auditor = attnaudit.RolloutAuditor(client, sample_every=4, layers=[1, 3],
                                       max_in_flight=6)
    sampled = []
    for step in range(10):
        for layer in range(4):
            if auditor.step(build, layer=layer):
                sampled.append((step, layer))
    # Steps 0, 4, 8; layers 1 and 3 only.
    assert sampled == [(s, ly) for s in (0, 4, 8) for ly in (1, 3)]
    assert build.calls == 6
    assert auditor.flush(60)
    c = auditor.counters
    assert (c.steps, c.sampled, c.dropped, c.sent, c.passed, c.failed) == (40, 6, 0, 6, 6, 0)
    latest = auditor.latest
    assert set(latest) == {1, 3}
    assert latest[3].step == 8 and latest[3].verdict == attnaudit.Verdict.PASS
    assert latest[3].report.labels.layer == 3 and latest[3].report.labels.step == 8
    assert auditor.latest_verdicts == {1: attnaudit.Verdict.PASS, 3: attnaudit.Verdict.PASS}
    assert auditor.close()


def test_rotating_layers_and_explicit_steps(client, snaps):
    build = Builder(snaps["ok"])
    auditor = attnaudit.RolloutAuditor(client, sample_every=2, layers=[0, 5, 9],
                                       rotate_layers=True, max_in_flight=8)
    taken = [(s, ly) for s in range(100, 112) for ly in (0, 5, 9)
             if auditor.step(build, layer=ly, step=s)]
    # Sampled step s takes layer number (s // 2) mod 3: 50 mod 3 = 2 first.
    assert taken == [(100, 9), (102, 0), (104, 5), (106, 9), (108, 0), (110, 5)]
    assert auditor.flush(60) and auditor.counters.passed == 6
    auditor.close()


def test_drift_and_errors_are_counted(client, snaps):
    results = []
    auditor = attnaudit.RolloutAuditor(client, sample_every=1, max_in_flight=4,
                                       on_result=results.append)
    assert auditor.step(Builder(snaps["bad"]), layer=0)
    assert auditor.step(attnaudit.Snapshot.load(snaps["ok"]), layer=1)  # a built one

    def broken():
        raise RuntimeError("engine tensors gone")

    with pytest.warns(RuntimeWarning, match="engine tensors gone"):
        assert not auditor.step(broken, layer=2)
    invalid = attnaudit.Snapshot.load(snaps["ok"])
    invalid.meta.softmax_scale = -1.0
    assert auditor.step(invalid, layer=3)
    assert auditor.flush(60)
    c = auditor.counters
    assert (c.sampled, c.drifted, c.passed, c.failed, c.invalid) == (4, 1, 1, 1, 1)
    assert isinstance(auditor.last_error, (RuntimeError, attnaudit.InvalidArgumentError))
    verdicts = auditor.latest_verdicts
    assert verdicts[0] == attnaudit.Verdict.DRIFT and verdicts[1] == attnaudit.Verdict.PASS
    assert verdicts[2] is None and verdicts[3] == attnaudit.Verdict.INVALID
    assert auditor.latest[3].error.field_path == "snapshot.softmax_scale"
    assert len(results) == 4 and len(auditor.results()) == 4
    auditor.close()


def test_submit_mode_collects_verdicts(client, snaps):
    auditor = attnaudit.RolloutAuditor(client, sample_every=1, max_in_flight=2,
                                       mode="submit", poll_interval=0.05)
    auditor.step(Builder(snaps["ok"]), layer=0)
    auditor.step(Builder(snaps["bad"]), layer=1)
    assert auditor.flush(60)
    latest = auditor.latest
    assert latest[0].verdict == attnaudit.Verdict.PASS and latest[0].job_id
    assert latest[1].verdict == attnaudit.Verdict.DRIFT
    c = auditor.counters
    assert (c.sent, c.passed, c.drifted) == (2, 1, 1)
    auditor.close()


def test_run_labels(client, snaps):
    auditor = attnaudit.RolloutAuditor(client, sample_every=1, max_in_flight=3,
                                       run="rl-run-a")
    assert auditor.step(Builder(snaps["ok"]), layer=0)
    assert auditor.step(Builder(snaps["ok"]), layer=1, run="rl-run-b")
    labelled = attnaudit.Snapshot.load(snaps["ok"])
    labelled.labels.run = "own-run"  # a snapshot's own label wins
    assert auditor.step(labelled, layer=2)
    assert auditor.flush(60)
    runs = {layer: r.report.labels.run for layer, r in auditor.latest.items()}
    assert runs == {0: "rl-run-a", 1: "rl-run-b", 2: "own-run"}
    auditor.close()
    snap = attnaudit.Snapshot.load(snaps["ok"])
    with_dict = attnaudit.Snapshot.from_arrays(
        q=snap.tensor("q"), k_pages=snap.tensor("k_pages"), v_pages=snap.tensor("v_pages"),
        block_table=snap.tensor("block_table"), kv_seq_lens=snap.tensor("kv_seq_lens"),
        query_positions=snap.tensor("query_positions"),
        slot_positions=snap.tensor("slot_positions"),
        labels={"model": "m", "step": 3, "run": "grpo-7"})
    assert (with_dict.labels.run, with_dict.labels.step) == ("grpo-7", 3)


class LaggingReplica:
    """A client whose get() answers NOT_FOUND for a job's first `hidden`
    polls (a replica that does not see the job yet), and forever for job
    ids in `lost`."""

    def __init__(self, hidden: int, lost=()):
        self.hidden = hidden
        self.lost = set(lost)
        self.polls = collections.Counter()
        self.next_id = list(self.lost)

    def submit(self, snapshot, **kw):
        job = self.next_id.pop(0) if self.next_id else f"job-{len(self.polls)}"
        self.polls[job] += 0
        return attnaudit.Submitted(job, False)

    def get(self, job_id, **kw):
        self.polls[job_id] += 1
        if job_id in self.lost or self.polls[job_id] <= self.hidden:
            raise attnaudit.NotFoundError(grpc.StatusCode.NOT_FOUND, f"job {job_id} not found")
        proto = service_pb2.JobResult(job_id=job_id, state=service_pb2.JOB_STATE_DONE)
        proto.report.verdict = report_pb2.VERDICT_PASS
        return attnaudit.JobResult(proto)


def test_submit_mode_polls_through_a_short_not_found(snaps):
    snap = attnaudit.Snapshot.load(snaps["ok"])
    lagging = LaggingReplica(hidden=3)
    auditor = attnaudit.RolloutAuditor(lagging, sample_every=1, mode="submit",
                                       poll_interval=0.02, not_found_grace=5.0)
    assert auditor.step(snap, layer=0)
    assert auditor.flush(30)
    c = auditor.counters
    assert (c.sent, c.passed, c.failed) == (1, 1, 0)
    assert lagging.polls["job-0"] == 4
    assert auditor.latest[0].verdict == attnaudit.Verdict.PASS
    auditor.close()

    lost = LaggingReplica(hidden=0, lost=["gone"])
    auditor = attnaudit.RolloutAuditor(lost, sample_every=1, mode="submit",
                                       poll_interval=0.02, not_found_grace=0.3)
    start = time.monotonic()
    assert auditor.step(snap, layer=0)
    assert auditor.flush(30)
    assert time.monotonic() - start >= 0.3  # NOT_FOUND was final only after the grace
    c = auditor.counters
    assert (c.sent, c.passed, c.failed) == (1, 0, 1)
    assert isinstance(auditor.latest[0].error, attnaudit.NotFoundError)
    assert auditor.latest[0].job_id == "gone" and lost.polls["gone"] > 1
    auditor.close()


def _step_returns(auditor, builder, **kw) -> bool:
    """Runs auditor.step on a thread; True if it returned within 10 s
    (a blocked hook would hang for the 60 s call deadline)."""
    out = {}
    t = threading.Thread(target=lambda: out.setdefault("r", auditor.step(builder, **kw)),
                         daemon=True)
    t.start()
    t.join(timeout=10)
    return not t.is_alive()


def test_drops_instead_of_blocking_while_the_server_is_paused(make_server, snaps):
    server = make_server("--cpu-workers", "1")
    client = attnaudit.AuditClient(server.address, timeout=60)
    client.wait_for_ready(10)
    client.capabilities()  # cached: the hook path makes no extra call
    build = Builder(snaps["ok"])
    auditor = attnaudit.RolloutAuditor(client, sample_every=1, max_in_flight=2,
                                       timeout=60)
    try:
        server.pause()
        for i in range(12):
            assert _step_returns(auditor, build, layer=0), f"step {i} blocked"
        c = auditor.counters
        # Two snapshots hang in flight at the paused server; the rest were
        # dropped before their builder ran.
        assert (c.sampled, c.dropped, c.sent) == (12, 10, 0)
        assert build.calls == 2 and auditor.in_flight == 2
    finally:
        server.resume()
    assert auditor.flush(60), "the in-flight audits did not finish after SIGCONT"
    assert auditor.counters.sent == 2 and auditor.counters.passed == 2
    for _ in range(3):
        assert auditor.step(build, layer=0)
        assert auditor.flush(60)
    c = auditor.counters
    assert (c.sent, c.passed, c.dropped, c.failed) == (5, 5, 10, 0)
    assert auditor.close()
    client.close()


class CountedWaits:
    """Wraps concurrent.futures.wait, through which the auditor's flush()
    and close() wait for in-flight snapshots: records each call's timeout,
    how many futures it waited for and how many were done at its end."""

    def __init__(self, monkeypatch):
        self.calls = []
        self._wait = concurrent.futures.wait
        monkeypatch.setattr(concurrent.futures, "wait", self)

    def __call__(self, fs, timeout=None, **kw):
        done, not_done = self._wait(fs, timeout=timeout, **kw)
        self.calls.append((timeout, len(fs), len(done)))
        return done, not_done


class StalledClient:
    """A client whose audit() blocks until `release` is set, as on a server
    that stopped answering, then fails UNAVAILABLE."""

    def __init__(self):
        self.release = threading.Event()
        self.started = threading.Semaphore(0)

    def audit(self, snapshot, **kw):
        self.started.release()
        self.release.wait()
        raise attnaudit.UnavailableError(grpc.StatusCode.UNAVAILABLE, "stopped")


def test_flush_and_close_wait_one_timeout_in_all(snaps, monkeypatch):
    stalled = StalledClient()
    auditor = attnaudit.RolloutAuditor(stalled, sample_every=1, max_in_flight=2,
                                       timeout=10)
    snap = attnaudit.Snapshot.load(snaps["ok"])
    assert auditor.step(snap, layer=0) and auditor.step(snap, layer=1)
    for _ in range(2):  # both sends are under way
        assert stalled.started.acquire(timeout=30)
    waits = CountedWaits(monkeypatch)
    try:
        assert auditor.flush(timeout=1) is False
        assert auditor.close(timeout=2) is False
        # Each waited once, on both sends, for no more than its own timeout,
        # and neither was done: no second wait, no wait for the threads.
        assert len(waits.calls) == 2
        (t1, n1, done1), (t2, n2, done2) = waits.calls
        assert 0 < t1 <= 1 and 0 < t2 <= 2
        assert (n1, done1, n2, done2) == (2, 0, 2, 0)
        assert auditor.in_flight == 2 and auditor.counters.failed == 0
    finally:
        stalled.release.set()
    # The abandoned sends still end and are counted.
    assert auditor.flush(60)
    c = auditor.counters
    assert (c.sampled, c.sent, c.failed, auditor.in_flight) == (2, 0, 2, 0)
    assert not auditor.step(snap, layer=0)  # closed: dropped


def test_close_of_sends_to_a_stopped_server_waits_one_timeout(make_server, snaps,
                                                              monkeypatch):
    server = make_server("--cpu-workers", "1")
    client = attnaudit.AuditClient(server.address, timeout=60)
    client.wait_for_ready(10)
    client.capabilities()  # cached: the sends make no other call
    build = Builder(snaps["ok"])
    auditor = attnaudit.RolloutAuditor(client, sample_every=1, max_in_flight=2,
                                       timeout=60)
    server.pause()
    try:
        assert auditor.step(build, layer=0) and auditor.step(build, layer=1)
        waits = CountedWaits(monkeypatch)
        # The sends' deadline is 60 s: close gives up on them after one
        # wait of at most its 2 s.
        assert auditor.close(timeout=2) is False
        assert len(waits.calls) == 1
        timeout, n, done = waits.calls[0]
        assert 0 < timeout <= 2 and (n, done) == (2, 0)
        assert auditor.counters.sent == 0
    finally:
        server.resume()
    assert auditor.flush(60)
    assert auditor.counters.sent == 2 and auditor.counters.passed == 2
    client.close()


def test_closed_auditor_drops(client, snaps):
    auditor = attnaudit.RolloutAuditor(client, sample_every=1)
    assert auditor.close()
    build = Builder(snaps["ok"])
    assert not auditor.step(build)
    assert build.calls == 0 and auditor.counters.dropped == 1


def test_argument_checks(client):
    with pytest.raises(ValueError, match="sample_every"):
        attnaudit.RolloutAuditor(client, sample_every=0)
    with pytest.raises(ValueError, match="rotate_layers"):
        attnaudit.RolloutAuditor(client, rotate_layers=True)
    with pytest.raises(ValueError, match="mode"):
        attnaudit.RolloutAuditor(client, mode="fire-and-forget")
