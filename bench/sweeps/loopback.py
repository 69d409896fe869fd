"""W1 through the server on this machine, per transport, against the same
snapshot audited in process, in one run.

Steps: synthesise W1 (llama3-8b, B=8, 4,096 tokens, ~130 MiB); measure the
in-process audit (`attnaudit_bench_check`, median of --repeats, the
"audit in memory" row); start attnaudit-server on 127.0.0.1 with
--accept-memfd-snapshots; run `attnaudit bench W1 --transport T` closed
loop for each transport (unary: one message; stream: AuditStream chunks;
memfd: the snapshot in a sealed memfd the server reads in place, see
docs/OPERATIONS.md); measure the in-process audit again. Each transport's
p50 is reported as a ratio to the mean of the two in-process medians; the
server's own audit time (from the reports) and the rest of the latency
(transfer, decode, queueing) are reported separately.

usage: loopback.py --bin-dir build/bin [--duration 8s] [--repeats 9]
                   [--workdir DIR] [--json OUT]
Standard library only.
"""

import argparse
import json
import os
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "common"))
sys.path.insert(0, HERE)
import benchlib  # noqa: E402
from server_rate import Server, bench_args  # noqa: E402

TRANSPORTS = ("unary", "stream", "memfd")


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--bin-dir", required=True)
    p.add_argument("--workdir", default="/tmp")
    p.add_argument("--duration", default="8s")
    p.add_argument("--repeats", type=int, default=9)
    p.add_argument("--json")
    return p.parse_args()


def in_process_audit_ms(bin_dir, repeats):
    """The median of attnaudit_bench_check's "audit in memory" row."""
    out = subprocess.run(
        [os.path.join(bin_dir, "attnaudit_bench_check"), "--repeats",
         str(repeats)], check=True, capture_output=True, text=True).stdout
    m = re.search(r"audit in memory.*?median\s+([0-9.]+) ms", out)
    if not m:
        raise RuntimeError("attnaudit_bench_check printed no audit row")
    return float(m.group(1))


def through_server(args, path):
    server = Server(args.bin_dir, ["--accept-memfd-snapshots"], args.workdir)
    results = {}
    try:
        for transport in TRANSPORTS:
            out = subprocess.run(
                bench_args(args.bin_dir, path, server.addr, 1, args.duration)
                + ["--transport", transport],
                check=True, capture_output=True, text=True).stdout
            r = json.loads(out.strip().splitlines()[-1])
            print(f"  {transport}: p50 {r['p50_ms']:.2f} ms, p99 "
                  f"{r['p99_ms']:.2f} ms, server audit {r['audit_ms']:.2f} "
                  f"ms, rest {r['transfer_ms']:.2f} ms, errors {r['errors']}",
                  file=sys.stderr, flush=True)
            results[transport] = r
    finally:
        server.stop()
    return results


def main():
    args = parse_args()
    machine = benchlib.cpu_description()
    path = os.path.join(args.workdir, f"loopback_w1_{os.getpid()}.pb")
    benchlib.synth_snapshot(args.bin_dir, path, 8, 4096, permute_pages=False)
    try:
        before = in_process_audit_ms(args.bin_dir, args.repeats)
        results = through_server(args, path)
        after = in_process_audit_ms(args.bin_dir, args.repeats)
    finally:
        os.remove(path)
    audit_ms = (before + after) / 2
    machine["load_average_end"] = [round(x, 2) for x in os.getloadavg()]
    print(f"machine: {machine['cpu']}, {machine['cores']} cores, "
          f"{machine['isa']}; load average {machine['load_average']} at "
          f"start, {machine['load_average_end']} at the end")
    print(f"in-process audit (median of {args.repeats}): {before:.2f} ms "
          f"before, {after:.2f} ms after")
    print("\n| transport | p50 ms | p99 ms | server audit ms | rest ms | "
          "p50 / in-process audit |\n|---|---|---|---|---|---|")
    for transport in TRANSPORTS:
        r = results[transport]
        print(f"| {transport} | {r['p50_ms']:.2f} | {r['p99_ms']:.2f} | "
              f"{r['audit_ms']:.2f} | {r['transfer_ms']:.2f} | "
              f"{r['p50_ms'] / audit_ms:.2f}x |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": machine, "in_process_audit_ms":
                       [before, after], "transports": results}, f, indent=1)


if __name__ == "__main__":
    main()
