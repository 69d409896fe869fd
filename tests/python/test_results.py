"""Stored results against the real server: list_results (filters, pages,
limit, the tables), watch(resume_after=...), the cursor and replica of a
JobResult, and one client balancing round-robin over two servers."""

from __future__ import annotations

import asyncio
import datetime
import os
import sys
import time

import pytest

import attnaudit
import attnaudit.aio
from attnaudit import _calls
from attnaudit.results import COLUMNS, record_of

UTC = datetime.timezone.utc


@pytest.fixture(scope="module")
def files(cli, tmp_path_factory):
    d = tmp_path_factory.mktemp("results")
    return {
        "small": cli.synth(str(d / "small.pb"), "--preset", "phi4-mini", "--context", "64"),
        "stale": cli.synth(str(d / "stale.pb"), "--preset", "phi4-mini", "--context", "64",
                           "--fault", "stale-page"),
    }


def labelled(path: str, **labels) -> attnaudit.Snapshot:
    snap = attnaudit.Snapshot.load(path)
    for k, v in labels.items():
        setattr(snap.labels, k, v)
    return snap


def unique(prefix: str) -> str:
    return f"{prefix}-{os.getpid()}-{time.monotonic_ns()}"


def eventually(fn, want, deadline: float = 30.0):
    """fn() until it returns `want` (bounded); the last value."""
    end = time.monotonic() + deadline
    while True:
        got = fn()
        if got == want or time.monotonic() > end:
            return got
        time.sleep(0.05)


# ---------------------------------------------------------------------------
# list_results
# ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def listed(client, files):
    """Six stored results of one run: three PASS submits (layers 0-2, steps
    10-12), two DRIFT submits (layer 5, steps 20-21) and one PASS Audit
    (layer 7, step 30)."""
    run, model = unique("list-run"), unique("list-model")
    passed = [client.submit(labelled(files["small"], model=model, run=run, layer=i,
                                     step=10 + i)).job_id for i in range(3)]
    drifted = [client.submit(labelled(files["stale"], model=model, run=run, layer=5,
                                      step=20 + i)).job_id for i in range(2)]
    report = client.audit(labelled(files["small"], model=model, run=run, layer=7, step=30))
    assert report.passed and report.labels.run == run
    for job in passed + drifted:
        assert client.wait(job, timeout=120).done
    # The Audit's result is stored as it finishes; give it a moment.
    n = eventually(lambda: len(list(client.list_results(run=run))), 6)
    assert n == 6
    return {"run": run, "model": model, "passed": passed, "drifted": drifted}


def ids(results) -> list:
    return [r.job_id for r in results]


def test_the_cli_shows_the_run_and_request_ids(cli, client, server, listed, tmp_path):
    table = cli.run("list", "--addr", server.address,
                    "--label", f"run={listed['run']}").stdout.decode()
    header, *rows = table.splitlines()
    assert header.split()[4] == "run", header
    assert len(rows) == 6 and all(listed["run"][:16] in r for r in rows), table
    snap = attnaudit.Snapshot.load(cli.synth(str(tmp_path / "six.pb"), "--preset", "phi4-mini",
                                             "--context", "64", "--batch", "6"))
    snap.labels.run = unique("cli-run")
    del snap.labels.request_ids[:]
    snap.labels.request_ids.extend([f"req-{i}" for i in range(6)])
    job = client.submit(snap).job_id
    assert client.wait(job, timeout=120).done
    text = cli.run("get", job, "--addr", server.address).stdout.decode()
    line = next(x for x in text.splitlines() if x.startswith("labels:"))
    assert f"run={snap.labels.run}" in line, line
    assert "requests=req-0,req-1,req-2,req-3,... (6 rows)" in line, line


def test_list_results_newest_first_with_summaries(client, listed):
    run = listed["run"]
    results = list(client.list_results(run=run))
    assert all(isinstance(r, attnaudit.ResultSummary) for r in results)
    cursors = [r.cursor for r in results]
    assert all(c > 0 for c in cursors) and cursors == sorted(cursors, reverse=True)
    assert len(set(cursors)) == 6
    assert set(listed["passed"] + listed["drifted"]) < set(ids(results))
    for r in results:
        assert r.state == attnaudit.JobState.DONE and r.error is None
        assert r.run == run and r.labels.run == run and r.model == listed["model"]
        assert r.replica and r.audit_seconds > 0
        assert r.submit_time.tzinfo is not None and r.finish_time >= r.submit_time
        assert r.engine_out is not None and r.engine_out.tolerance > 0
        full = client.get(r.job_id)  # any stored result, Audit's included
        assert full.cursor == r.cursor and full.replica == r.replica
        assert full.run == run and full.finish_time == r.finish_time
    for r in results:
        if r.verdict == attnaudit.Verdict.DRIFT:
            assert r.diagnosis == "stale-page" and r.diagnosis_summary
            assert r.engine_out.max_abs > r.engine_out.tolerance
            assert r.diagnosis_location is not None
        else:
            assert r.verdict == attnaudit.Verdict.PASS and r.diagnosis is None
            assert r.engine_out.max_abs <= r.engine_out.tolerance
    [audited] = [r for r in results if r.layer == 7]
    assert audited.step == 30 and audited.job_id not in listed["passed"]
    assert client.get(audited.job_id).report.verdict == attnaudit.Verdict.PASS
    assert "cursor=" in repr(audited)


def test_list_results_filters(client, listed):
    run, model = listed["run"], listed["model"]

    def listing(**kw):
        return sorted(ids(client.list_results(run=run, **kw)))

    assert listing(verdict="DRIFT") == sorted(listed["drifted"])
    assert listing(verdict=attnaudit.Verdict.DRIFT) == sorted(listed["drifted"])
    assert len(listing(verdict="pass")) == 4
    assert listing(diagnosis="stale-page") == sorted(listed["drifted"])
    assert len(listing(model=model)) == 6 and listing(model=model + "-other") == []
    assert len(list(client.list_results(model=model))) == 6  # without run
    assert listing(layer=1) == [listed["passed"][1]]
    assert listing(layer=5) == sorted(listed["drifted"])
    assert listing(step=21) == [listed["drifted"][1]]
    assert listing(layer=5, step=10) == []
    assert len(listing(state="DONE")) == 6 and listing(state="FAILED") == []
    assert list(client.list_results(run=run + "-other")) == []
    now = datetime.datetime.now(UTC)
    assert len(listing(since=3600)) == 6
    assert len(listing(since=datetime.timedelta(hours=1),
                       until=now + datetime.timedelta(minutes=5))) == 6
    assert listing(since=now + datetime.timedelta(minutes=5)) == []
    assert listing(until=3600) == []


def test_list_results_pages_lazily(client, listed):
    run = listed["run"]
    full = ids(client.list_results(run=run))
    paged = client.list_results(run=run, page_size=2)
    assert paged.pages_read == 0
    first = next(paged)
    assert paged.pages_read == 1
    rest = ids(paged)
    assert [first.job_id] + rest == full  # every result once, in order
    assert paged.pages_read in (3, 4)  # the last page may be an empty one
    assert list(paged) == []
    limited = client.list_results(run=run, page_size=2, limit=3)
    assert ids(limited) == full[:3] and limited.pages_read == 2
    assert ids(client.list_results(run=run, limit=1)) == full[:1]
    nothing = client.list_results(run=run, limit=0)
    assert list(nothing) == [] and nothing.pages_read == 0
    assert ids(client.list_results(run=run, page_size=1000)) == full


def test_list_results_argument_errors(client):
    for bad in (0, 1001, True):
        with pytest.raises(ValueError, match="page_size"):
            client.list_results(page_size=bad)
    with pytest.raises(ValueError, match="verdict"):
        client.list_results(verdict="maybe")
    with pytest.raises(TypeError, match="since"):
        client.list_results(since="yesterday")
    with pytest.raises(ValueError, match="limit"):
        client.list_results(limit=-1)
    pending = client.list_results(state="QUEUED")  # nothing is sent yet
    with pytest.raises(attnaudit.InvalidArgumentError) as e:
        next(pending)
    assert e.value.field_path == "state"


def test_list_results_as_records_and_tables(client, listed, tmp_path, monkeypatch):
    run = listed["run"]
    records = client.list_results(run=run).to_records()
    assert len(records) == 6 and all(tuple(r) == COLUMNS for r in records)
    drift = [r for r in records if r["verdict"] == "DRIFT"]
    assert sorted(r["job_id"] for r in drift) == sorted(listed["drifted"])
    for r in drift:
        assert (r["state"], r["layer"], r["run"], r["diagnosis"]) == ("DONE", 5, run, "stale-page")
        assert r["engine_out_max_abs"] > 0 and r["cursor"] > 0 and r["replica"]
        assert r["error_code"] is None and r["error_message"] is None
        assert r["finish_time"].tzinfo is not None
        # A full JobResult tabulates exactly as its listed summary.
        assert record_of(client.get(r["job_id"])) == r
    # pandas and pyarrow are optional; without them the error says so.
    monkeypatch.setitem(sys.modules, "pandas", None)
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    with pytest.raises(ImportError, match="pip install pandas"):
        client.list_results(run=run).to_pandas()
    with pytest.raises(ImportError, match="pip install pyarrow"):
        attnaudit.results_to_parquet([], tmp_path / "none.parquet")
    monkeypatch.undo()


def test_list_results_to_pandas(client, listed):
    pd = pytest.importorskip("pandas")
    run = listed["run"]
    df = client.list_results(run=run).to_pandas()
    assert list(df.columns) == list(COLUMNS) and len(df) == 6
    assert df["cursor"].is_monotonic_decreasing
    assert (df["verdict"] == "DRIFT").sum() == 2
    assert str(df["layer"].dtype) == "Int64"
    assert str(df["finish_time"].dtype) == "datetime64[ns, UTC]"
    assert df.loc[df["layer"] == 7, "step"].tolist() == [30]
    assert df["error_code"].isna().all()
    empty = client.list_results(run=run + "-other").to_pandas()
    assert list(empty.columns) == list(COLUMNS) and len(empty) == 0
    assert isinstance(attnaudit.results_to_pandas(client.list_results(run=run, limit=2)),
                      pd.DataFrame)


def test_list_results_to_parquet(client, listed, tmp_path):
    pq = pytest.importorskip("pyarrow.parquet")
    path = tmp_path / "results.parquet"
    assert client.list_results(run=listed["run"]).to_parquet(path) == 6
    table = pq.read_table(str(path))
    assert table.column_names == list(COLUMNS) and table.num_rows == 6


# ---------------------------------------------------------------------------
# watch(resume_after=...)
# ---------------------------------------------------------------------------


def test_watch_resumes_after_a_cursor(make_server, files):
    server = make_server("--cpu-workers", "1", "--threads-per-job", "1",
                         "--replica-id", "resume-a")
    model = unique("resume")
    with attnaudit.AuditClient(server.address, timeout=60) as c:
        jobs = [c.submit(labelled(files["small"], model=model)).job_id for _ in range(3)]
        done = sorted((c.wait(j, timeout=120) for j in jobs), key=lambda r: r.cursor)
        cursors = [r.cursor for r in done]
        assert cursors[0] > 0 and len(set(cursors)) == 3
        assert all(r.replica == "resume-a" for r in done)
        assert "cursor=" in repr(done[0])

        got = []
        with c.watch(model=model, resume_after=0, timeout=30) as w:
            for r in w:
                got.append(r)
                if len(got) == 3:
                    break
        assert [r.job_id for r in got] == [r.job_id for r in done]
        assert [r.cursor for r in got] == cursors
        assert all(r.report is not None and r.replica == "resume-a" for r in got)

        # From the second's cursor: only the third, then nothing until the
        # deadline ends the watch quietly.
        rest = list(c.watch(model=model, resume_after=cursors[1], timeout=2))
        assert [(r.job_id, r.cursor) for r in rest] == [(done[2].job_id, cursors[2])]
        assert list(c.watch(model=model, resume_after=cursors[2], timeout=1)) == []

        # Resuming continues with live results: a job finishing after the
        # call starts is never missed.
        with c.watch(model=model, resume_after=cursors[2], timeout=60) as w:
            fourth = c.submit(labelled(files["small"], model=model)).job_id
            live = next(iter(w))
        assert live.job_id == fourth and live.cursor > cursors[2]

        with pytest.raises(ValueError, match="resume_after"):
            c.watch(model=model, resume_after=-1)

    async def aio():
        async with attnaudit.aio.AuditClient(server.address, timeout=60) as ac:
            watched = [r async for r in ac.watch(model=model, resume_after=0, timeout=2)]
            listed = ac.list_results(model=model, page_size=1)
            summaries = await listed.to_list()
            return watched, summaries, listed.pages_read

    watched, summaries, pages = asyncio.run(asyncio.wait_for(aio(), 60))
    assert [r.job_id for r in watched] == [r.job_id for r in done] + [fourth]
    assert [s.job_id for s in summaries] == [fourth] + [r.job_id for r in reversed(done)]
    assert pages >= 4 and all(s.replica == "resume-a" for s in summaries)


# ---------------------------------------------------------------------------
# A fleet: several addresses, round-robin
# ---------------------------------------------------------------------------


def test_fleet_addresses_make_one_balanced_target():
    assert _calls.channel_target("localhost:50051") == ("localhost:50051", None)
    assert _calls.channel_target("dns:///attnaudit-headless:50051") == (
        "dns:///attnaudit-headless:50051", None)
    assert _calls.channel_target("ipv4:10.0.0.1:1,10.0.0.2:2")[0] == "ipv4:10.0.0.1:1,10.0.0.2:2"
    assert _calls.channel_target(["10.0.0.1:1", "10.0.0.2:2"]) == (
        "ipv4:10.0.0.1:1,10.0.0.2:2", None)
    assert _calls.channel_target("10.0.0.1:1, 10.0.0.2:2")[0] == "ipv4:10.0.0.1:1,10.0.0.2:2"
    assert _calls.channel_target(["[::1]:1", "10.0.0.2:2"])[0] == "ipv6:[::1]:1,[::ffff:10.0.0.2]:2"
    assert _calls.channel_target(["127.0.0.1:7"]) == ("127.0.0.1:7", None)
    target, authority = _calls.channel_target(["localhost:1", "127.0.0.1:2"])
    assert target.startswith(("ipv4:", "ipv6:")) and authority == "localhost:1"
    for bad in ([], ["127.0.0.1", "127.0.0.1:2"], ["::1:5", "127.0.0.1:1"],
                "127.0.0.1:1,,127.0.0.1:2", ["dns:///x:1", "127.0.0.1:1"]):
        with pytest.raises(ValueError):
            _calls.channel_target(bad)
    with pytest.raises(attnaudit.UnavailableError):
        _calls.channel_target(["no-such-host.invalid:1", "127.0.0.1:2"])
    for addr in ("127.0.0.1:1", ["127.0.0.1:1", "127.0.0.1:2"]):
        _, _, options = _calls.channel_args(addr, None)
        assert ("grpc.lb_policy_name", "round_robin") in options


def _owner(clients: dict, job_id: str) -> str:
    """The name of the one server that knows `job_id`."""
    owners = []
    for name, c in clients.items():
        try:
            c.get(job_id)
            owners.append(name)
        except attnaudit.NotFoundError:
            pass
    assert len(owners) == 1, (job_id, owners)
    return owners[0]


def test_one_client_round_robins_over_two_servers(make_server, files):
    a = make_server("--cpu-workers", "1", "--threads-per-job", "1", "--replica-id", "fleet-a")
    b = make_server("--cpu-workers", "1", "--threads-per-job", "1", "--replica-id", "fleet-b")
    direct = {"fleet-a": attnaudit.AuditClient(a.address, timeout=60),
              "fleet-b": attnaudit.AuditClient(b.address, timeout=60)}
    try:
        for form in ([a.address, b.address], f"{a.address},{b.address}"):
            run = unique("fleet")
            with attnaudit.AuditClient(form, timeout=30) as fleet:
                assert fleet.target == f"ipv4:{a.address},{b.address}"
                fleet.wait_for_ready(20)
                for _ in range(10):
                    assert fleet.capabilities(refresh=True).api_version == "attnaudit.v1"
                # The servers share nothing: each job is on the one server
                # its Submit reached. Both must get some.
                owners: dict = {"fleet-a": [], "fleet-b": []}
                for i in range(40):
                    job = fleet.submit(labelled(files["small"], run=run, step=i)).job_id
                    owners[_owner(direct, job)].append(job)
                    if i >= 5 and min(len(v) for v in owners.values()) >= 2:
                        break
                assert all(len(v) >= 2 for v in owners.values()), owners
            for name, jobs in owners.items():
                c = direct[name]
                for job in jobs:
                    assert c.wait(job, timeout=120).replica == name
                listed = list(c.list_results(run=run))
                assert sorted(ids(listed)) == sorted(jobs)
                assert {s.replica for s in listed} == {name}

        async def aio():
            async with attnaudit.aio.AuditClient([a.address, b.address], timeout=30) as ac:
                await ac.wait_for_ready(20)
                versions = {(await ac.capabilities(refresh=True)).api_version
                            for _ in range(6)}
                return ac.target, versions

        target, versions = asyncio.run(asyncio.wait_for(aio(), 60))
        assert target.startswith("ipv4:") and versions == {"attnaudit.v1"}
    finally:
        for c in direct.values():
            c.close()
