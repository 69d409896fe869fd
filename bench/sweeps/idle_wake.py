"""Calls after idle: small audits offered slowly enough that the server
idles between them, with gRPC's callback threads kept awake (the server's
default, --callback-wake-period 250ms) and without (0); with the
waker on, also through the C++ client's AuditStream (its own completion
queue, not the callback API, for the same reason).

Why: gRPC 1.51's callback threads sleep 100 ms after a second without
events, so a call arriving 1.0-1.1 s after the previous one can wait for
them (server/rpc/callback_queue_waker.h). Each configuration gets its own
server; for each gap in --gaps (seconds between calls) `attnaudit bench
FILE --rate 1/gap --concurrency 1` offers calls at exactly that spacing
for --duration and reports p50/p99 from each call's due time, and the
part of the latency outside the server's audit.

usage: idle_wake.py --bin-dir build/bin [--workdir DIR] [--duration 12s]
                    [--gaps 1.03 1.06 1.09 1.5] [--json OUT]
Standard library only.
"""

import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "common"))
import benchlib  # noqa: E402
from server_rate import Server, bench  # noqa: E402

# (name, server flags, client transports)
CONFIGS = [("waker on (default)", [], ["unary", "stream"]),
           ("waker off", ["--callback-wake-period", "0"], ["unary"])]


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--bin-dir", required=True)
    p.add_argument("--workdir", default="/tmp")
    p.add_argument("--duration", default="12s")
    p.add_argument("--context", type=int, default=1024)
    p.add_argument("--gaps", type=float, nargs="+",
                   default=[1.03, 1.06, 1.09, 1.5])
    p.add_argument("--json")
    return p.parse_args()


def measure(args, path):
    rows = []
    for name, server_args, transports in CONFIGS:
        server = Server(args.bin_dir, server_args, args.workdir)
        try:
            for transport in transports:
                for gap in args.gaps:
                    r = bench(args.bin_dir, path, server.addr, 1,
                              args.duration, rate=1.0 / gap,
                              transport=transport)
                    rows.append({"config": name, "transport": transport,
                                 "gap_s": gap, **r})
                    print(f"  [{name}, {transport}] gap {gap:.2f} s: p50 "
                          f"{r['p50_ms']:.2f} ms, p99 {r['p99_ms']:.2f} ms, "
                          f"audits {r['audits']}", file=sys.stderr, flush=True)
        finally:
            server.stop()
    return rows


def main():
    args = parse_args()
    machine = benchlib.cpu_description()
    os.makedirs(args.workdir, exist_ok=True)
    path = os.path.join(args.workdir, f"idle_b1_l{args.context}_{os.getpid()}.pb")
    benchlib.synth_snapshot(args.bin_dir, path, 1, args.context)
    try:
        rows = measure(args, path)
    finally:
        os.remove(path)
    machine["load_average_end"] = [round(x, 2) for x in os.getloadavg()]
    print(f"machine: {machine['cpu']}, {machine['cores']} cores, "
          f"{machine['isa']}; load average {machine['load_average']} at "
          f"start, {machine['load_average_end']} at the end")
    print(f"snapshot: B=1, {args.context} tokens; one call every gap, "
          f"{args.duration} per row\n")
    print("| server | client | gap s | calls | p50 ms | p99 ms | "
          "server audit ms | rest ms (mean) |\n|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['config']} | {r['transport']} | {r['gap_s']:.2f} | "
              f"{r['audits']} | "
              f"{r['p50_ms']:.2f} | {r['p99_ms']:.2f} | {r['audit_ms']:.2f} | "
              f"{r['transfer_ms']:.2f} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": machine, "duration": args.duration,
                       "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
