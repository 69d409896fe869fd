"""Async jobs through the store: small-snapshot Submit jobs/s and the
end-to-end latency (Submit sent -> result committed and seen by a
watcher), with the SQLite default, one replica on PostgreSQL, and three
replicas sharing PostgreSQL; then one W1 Submit's acknowledgement and
end-to-end time with its payload in the fleet store against the local
spool alone.

Method: every configuration gets fresh servers (attnaudit-server on
127.0.0.1, kernel-picked ports, a fresh data dir and, for PostgreSQL, a
fresh database of the cluster this script runs in: `make bench-fleet`
starts it under pg_virtualenv). The client (the Python package, one
AuditClient balancing round-robin over every replica) runs --clients
threads in a closed loop for --duration: each submits the snapshot (B=1,
--context tokens, llama3-8b) and goes on; one WatchResults stream with
resume_after records when each job's result arrives. jobs/s counts the
results that arrived within the window; latencies are arrival - send.
The servers share the machine with the client and PostgreSQL: on a small
machine three replicas add no compute, and the figures show what the
shared store costs, not scale-out.

usage: <py-venv>/bin/python fleet_rate.py --bin-dir build/bin [--json OUT]
"""

import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "common"))
import benchlib  # noqa: E402

import attnaudit  # noqa: E402  (the Python client, from build/py-venv)


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--bin-dir", required=True)
    p.add_argument("--workdir", default="/tmp")
    p.add_argument("--duration", type=float, default=10.0)
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--context", type=int, default=256)
    p.add_argument("--w1-runs", type=int, default=5)
    p.add_argument("--json")
    return p.parse_args()


class Replica:
    def __init__(self, bin_dir, workdir, name, store, workers):
        self.dir = tempfile.mkdtemp(prefix=f"attnaudit_fleet_{name}_",
                                    dir=workdir)
        self.log_path = os.path.join(self.dir, "server.log")
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen(
            [os.path.join(bin_dir, "attnaudit-server"), "--listen",
             "127.0.0.1:0", "--metrics-listen", "", "--data-dir",
             os.path.join(self.dir, "data"), "--store", store,
             "--replica-id", name, "--cpu-workers", str(workers),
             "--threads-per-job", "1", "--drain-timeout", "10s"],
            stdout=subprocess.DEVNULL, stderr=self.log)
        pattern = re.compile(r'msg="grpc listening" addr=(127\.0\.0\.1:\d+)')
        for _ in range(400):
            with open(self.log_path) as f:
                m = pattern.search(f.read())
            if m:
                self.addr = m.group(1)
                return
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"replica {name} did not start; see {self.log_path}")

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


def fresh_database(tag):
    name = f"attnaudit_bench_{tag}_{os.getpid()}"
    subprocess.run(["createdb", name], check=True)
    return f"postgresql:///{name}"


def percentile(values, q):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def closed_loop(client, snapshot, clients, duration):
    """Submits from `clients` threads for `duration` s; the jobs/s and
    end-to-end latencies of the results that arrived in the window."""
    sent, arrived = {}, {}
    lock = threading.Lock()
    stop = threading.Event()
    watch = client.watch(resume_after=0, timeout=duration + 60)

    def watcher():
        for r in watch:
            with lock:
                arrived[r.job_id] = time.monotonic()

    def submitter():
        while not stop.is_set():
            t0 = time.monotonic()
            job = client.submit(snapshot, timeout=30)
            with lock:
                sent[job.job_id] = t0

    w = threading.Thread(target=watcher, daemon=True)
    w.start()
    start = time.monotonic()
    threads = [threading.Thread(target=submitter) for _ in range(clients)]
    for t in threads:
        t.start()
    time.sleep(duration)
    stop.set()
    for t in threads:
        t.join()
    end = start + duration
    # Let what was sent finish, so latencies cover every job.
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        with lock:
            if all(j in arrived for j in sent):
                break
        time.sleep(0.05)
    watch.cancel()
    with lock:
        done_in_window = sum(1 for j, t in arrived.items()
                             if j in sent and t <= end)
        latencies = [arrived[j] - t for j, t in sent.items() if j in arrived]
    return {"jobs_per_second": done_in_window / duration,
            "jobs": len(sent), "lost": len(sent) - len(latencies),
            "p50_ms": 1e3 * statistics.median(latencies),
            "p99_ms": 1e3 * percentile(latencies, 0.99)}


def w1_runs(client, snapshot, runs):
    """Sequential W1 Submits: acknowledgement and end-to-end seconds."""
    acks, ends = [], []
    for _ in range(runs):
        t0 = time.monotonic()
        job = client.submit(snapshot, timeout=120)
        acks.append(time.monotonic() - t0)
        client.wait(job.job_id, timeout=300, poll=0.01)
        ends.append(time.monotonic() - t0)
    return {"ack_median_ms": 1e3 * statistics.median(acks),
            "end_to_end_median_ms": 1e3 * statistics.median(ends),
            "runs": runs}


def run_config(args, label, replicas, store, snapshot, w1):
    workers = max(1, (os.cpu_count() or 2) // replicas)
    names = ["a", "b", "c"][:replicas]
    servers = [Replica(args.bin_dir, args.workdir, n, store, workers)
               for n in names]
    try:
        client = attnaudit.AuditClient([s.addr for s in servers])
        client.wait_for_ready(30)
        result = closed_loop(client, snapshot, args.clients, args.duration)
        if w1 is not None:
            result["w1"] = w1_runs(client, w1, args.w1_runs)
        client.close()
    finally:
        for s in servers:
            s.stop()
    result.update({"config": label, "replicas": replicas,
                   "cpu_workers_each": workers})
    print(f"  {label}: {result['jobs_per_second']:.1f} jobs/s, "
          f"p50 {result['p50_ms']:.1f} ms, p99 {result['p99_ms']:.1f} ms, "
          f"lost {result['lost']}"
          + (f"; W1 ack {result['w1']['ack_median_ms']:.0f} ms, end to end "
             f"{result['w1']['end_to_end_median_ms']:.0f} ms"
             if w1 is not None else ""), file=sys.stderr, flush=True)
    return result


def main():
    args = parse_args()
    tmp = tempfile.mkdtemp(prefix="attnaudit_fleet_bench_", dir=args.workdir)
    small_path = os.path.join(tmp, "small.pb")
    w1_path = os.path.join(tmp, "w1.pb")
    benchlib.synth_snapshot(args.bin_dir, small_path, 1, args.context)
    benchlib.synth_snapshot(args.bin_dir, w1_path, 8, 4096, permute_pages=False)
    small = attnaudit.Snapshot.load(small_path)
    w1 = attnaudit.Snapshot.load(w1_path)
    results = [
        run_config(args, "sqlite, 1 replica", 1, "sqlite", small, w1),
        run_config(args, "postgresql, 1 replica", 1, fresh_database("one"),
                   small, w1),
        run_config(args, "postgresql, 3 replicas", 3, fresh_database("three"),
                   small, None),
    ]
    shutil.rmtree(tmp, ignore_errors=True)
    out = {"machine": benchlib.cpu_description(), "clients": args.clients,
           "duration_s": args.duration, "context": args.context,
           "results": results}
    print(json.dumps(out, indent=2))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)


if __name__ == "__main__":
    main()
