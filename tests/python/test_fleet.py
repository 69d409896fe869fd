"""Three replicas sharing one PostgreSQL store (the throwaway cluster ctest
runs the Python tests in, pg_virtualenv): a RolloutAuditor in submit mode
over one round-robin client gets every step's result, whichever replica
accepted, ran or is asked about the job."""

from __future__ import annotations

import os
import subprocess
import uuid

import pytest

import attnaudit

pytestmark = pytest.mark.skipif(
    "PGHOST" not in os.environ,
    reason="no PostgreSQL cluster: ctest runs these tests under pg_virtualenv")


@pytest.fixture
def fleet(make_server):
    db = "attnaudit_py_" + uuid.uuid4().hex[:12]
    subprocess.run(["createdb", db], check=True)
    url = f"postgresql:///{db}"
    return [make_server("--store", url, "--replica-id", name,
                        "--cpu-workers", "1", "--threads-per-job", "1")
            for name in ("fleet-a", "fleet-b", "fleet-c")]


def test_rollout_auditor_in_submit_mode_across_three_replicas(fleet, cli, tmp_path):
    path = cli.synth(str(tmp_path / "ok.pb"), "--preset", "phi4-mini",
                     "--context", "64")
    client = attnaudit.AuditClient([s.address for s in fleet], timeout=60)
    steps = 12
    # Room for every step: the auditor drops rather than block the engine.
    auditor = attnaudit.RolloutAuditor(client, sample_every=1,
                                       max_in_flight=steps, mode="submit",
                                       poll_interval=0.05)
    for layer in range(steps):
        snap = attnaudit.Snapshot.load(path)
        snap.labels.ClearField("layer")
        assert auditor.step(snap, layer=layer)
    assert auditor.flush(120)
    results = auditor.results()
    assert len(results) == steps
    assert all(r.verdict == attnaudit.Verdict.PASS for r in results)
    c = auditor.counters
    assert (c.sent, c.passed, c.failed) == (steps, steps, 0)

    # Every replica answers for every job, and the work was spread.
    replicas = set()
    for replica in fleet:
        direct = attnaudit.AuditClient(replica.address, timeout=60)
        for r in results:
            got = direct.get(r.job_id)
            assert got.done and got.replica
            replicas.add(got.replica)
        listed = list(direct.list_results(limit=100))
        assert {s.job_id for s in listed} >= {r.job_id for r in results}
        direct.close()
    assert len(replicas) >= 2
    auditor.close()
    client.close()
