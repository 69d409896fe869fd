"""Small audits through the server: the highest audits/s for a B=1,
1,024-token snapshot over loopback, and the latency at 80% of that rate.

Steps: synthesise the snapshot (llama3-8b, permuted pages; ~6 MB), start
attnaudit-server on 127.0.0.1 with kernel-picked ports and a temporary
data dir (its log names the ports), then run `attnaudit bench FILE --addr
... --concurrency N --duration D --json` for N = 1, 2, 4, ... until the
rate stops growing (two steps under +5%) or N reaches --max-concurrency.
The highest audits/s is the server's rate. Then an open-loop run
(`attnaudit bench --rate`) offers exactly 80% of that rate with enough
client threads (the peak's concurrency) and reports p50/p99 counted from
each audit's due time (no coordinated omission). The server's own audit
time per request comes from the report
(`audit_ms` in bench's JSON). Each --server-args configuration gets its
own server.

usage: server_rate.py --bin-dir build/bin [--duration 5s] [--workdir DIR]
                      [--transport auto|unary|stream|memfd]
                      [--server-args "--cpu-workers 2 --threads-per-job 1"]...
                      [--max-concurrency 64] [--json OUT]
Standard library only.
"""

import argparse
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "common"))
import benchlib  # noqa: E402


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--bin-dir", required=True)
    p.add_argument("--workdir", default="/tmp")
    p.add_argument("--duration", default="5s")
    p.add_argument("--context", type=int, default=1024)
    p.add_argument("--max-concurrency", type=int, default=64)
    p.add_argument("--server-args", action="append",
                   help="one server configuration (repeatable); default: the "
                        "server's defaults, then 2 workers x 1 thread")
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--transport", default="auto",
                   choices=["auto", "unary", "stream", "memfd"],
                   help="how the snapshot reaches the server (memfd: shared "
                        "memory; the server gets --accept-memfd-snapshots)")
    p.add_argument("--json")
    return p.parse_args()


class Server:
    """attnaudit-server on loopback with kernel-picked ports."""

    def __init__(self, bin_dir, extra_args, workdir):
        self.dir = tempfile.mkdtemp(prefix="attnaudit_rate_", dir=workdir)
        self.log_path = os.path.join(self.dir, "server.log")
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen(
            [os.path.join(bin_dir, "attnaudit-server"), "--listen",
             "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0", "--data-dir",
             os.path.join(self.dir, "data"), "--drain-timeout", "10s"] +
            extra_args, stdout=subprocess.DEVNULL, stderr=self.log)
        self.addr = self._wait_for_port()

    def _wait_for_port(self):
        pattern = re.compile(r'msg="grpc listening" addr=(127\.0\.0\.1:\d+)')
        for _ in range(400):
            with open(self.log_path) as f:
                m = pattern.search(f.read())
            if m:
                return m.group(1)
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        self.stop()
        raise RuntimeError("the server did not report its port")

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


def bench_args(bin_dir, path, addr, concurrency, duration, rate=0.0):
    """The `attnaudit bench ... --json` command line (loopback.py adds
    --transport)."""
    return [os.path.join(bin_dir, "attnaudit"), "bench", path, "--addr", addr,
            "--concurrency", str(concurrency), "--duration", duration,
            "--warmup", "1s", "--rate", f"{rate:.3f}", "--json"]


def bench(bin_dir, path, addr, concurrency, duration, rate=0.0,
          transport="auto"):
    out = subprocess.run(
        bench_args(bin_dir, path, addr, concurrency, duration, rate) +
        ["--transport", transport],
        check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def sweep(args, path, server_args):
    extra = ["--accept-memfd-snapshots"] if args.transport == "memfd" else []
    server = Server(args.bin_dir, server_args + extra, args.workdir)
    points = []
    try:
        concurrency, stalls = 1, 0
        while concurrency <= args.max_concurrency and stalls < 2:
            r = bench(args.bin_dir, path, server.addr, concurrency,
                      args.duration, transport=args.transport)
            print(f"  [{' '.join(server_args) or 'defaults'}] concurrency "
                  f"{concurrency}: {r['audits_per_second']:.1f} audits/s, "
                  f"p50 {r['p50_ms']:.2f} ms, p99 {r['p99_ms']:.2f} ms, "
                  f"server audit {r['audit_ms']:.2f} ms, errors {r['errors']}",
                  file=sys.stderr, flush=True)
            best = max((p["audits_per_second"] for p in points), default=0)
            stalls = stalls + 1 if r["audits_per_second"] < 1.05 * best else 0
            points.append(r)
            concurrency *= 2
        peak = max(points, key=lambda p: p["audits_per_second"])
        # Open loop at 80% of the peak: latency from each audit's due time.
        target = 0.8 * peak["audits_per_second"]
        at80 = bench(args.bin_dir, path, server.addr,
                     max(4, peak["concurrency"]), args.duration, rate=target,
                     transport=args.transport)
    finally:
        server.stop()
    return {"server_args": server_args, "points": points, "max": peak,
            "at_80_percent": at80, "target_rate": target}


def main():
    args = parse_args()
    configs = ([shlex.split(a) for a in args.server_args]
               if args.server_args else
               [[], ["--cpu-workers", str(args.threads),
                     "--threads-per-job", "1"]])
    machine = benchlib.cpu_description()
    path = os.path.join(args.workdir, f"rate_b1_l{args.context}_"
                        f"{os.getpid()}.pb")
    benchlib.synth_snapshot(args.bin_dir, path, 1, args.context)
    try:
        work = benchlib.snapshot_work(args.bin_dir, path)
        floor_before = benchlib.measure_floor(args.bin_dir, args.threads)
        results = [sweep(args, path, c) for c in configs]
        floor = benchlib.best_floor(
            floor_before, benchlib.measure_floor(args.bin_dir, args.threads))
    finally:
        os.remove(path)
    floor_s = benchlib.floor_seconds(work, floor)[0]
    machine["load_average_end"] = [round(x, 2) for x in os.getloadavg()]
    print(f"machine: {machine['cpu']}, {machine['cores']} cores, "
          f"{machine['isa']}; load average {machine['load_average']} at "
          f"start, {machine['load_average_end']} at the end")
    print(f"transport: {args.transport}")
    print(f"snapshot: B=1, {work['tokens']} tokens, "
          f"{work['file_bytes'] / 1e6:.1f} MB; audit floor "
          f"{floor_s * 1e3:.3f} ms")
    print("\n| server | max audits/s (concurrency) | open loop at 80% "
          "(audits/s offered) | served | p50 ms | p99 ms | server audit ms "
          "(x floor) |\n|---|---|---|---|---|---|---|")
    for r in results:
        m, a = r["max"], r["at_80_percent"]
        print(f"| {' '.join(r['server_args']) or 'defaults'} | "
              f"{m['audits_per_second']:.1f} ({m['concurrency']}) | "
              f"{r['target_rate']:.1f} | {a['audits_per_second']:.1f} "
              f"| {a['p50_ms']:.2f} | {a['p99_ms']:.2f} | "
              f"{a['audit_ms']:.2f} ({a['audit_ms'] / 1e3 / floor_s:.0f}x) |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": machine, "transport": args.transport,
                       "snapshot": work, "floor": floor,
                       "audit_floor_s": floor_s, "configs": results}, f,
                      indent=1)


if __name__ == "__main__":
    main()
