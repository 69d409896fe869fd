#!/usr/bin/env python3
"""What a pre-RoPE snapshot costs with and without the engine's RoPE table.

W1 (llama3-8b, B=8, 4,096 keys, pages permuted, q pre-RoPE as the
simulator sends it) is synthesised twice: once with the engine's inverse
frequencies (rope_table.inv_freq, what a hook that declares its RoPE sends)
and once without (--no-rope-table). Without the table attnaudit bounds how
far its own RoPE can be from the engine's (docs/NUMERICS.md, "RoPE
tables"), which takes one more read of the referenced K and V. The two
files are audited alternately, REPEATS times each, with `attnaudit check
--json`; the figure is the audit's own total (provenance.timings), not the
process's.

usage: rope_table_cost.py --bin-dir DIR [--repeats N] [--threads T]
                          [--workdir DIR] [--json OUT]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "common"))

import benchlib  # noqa: E402


def audit_seconds(cli, path, threads):
    out = subprocess.run([cli, "check", path, "--json", "--threads",
                          str(threads)], capture_output=True, text=True)
    if out.returncode not in (0, 1):
        raise RuntimeError(f"check failed: {out.stderr[-2000:]}")
    report = json.loads(out.stdout)
    return report["provenance"]["timings"]["total_seconds"]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--bin-dir", required=True)
    p.add_argument("--repeats", type=int, default=12)
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--workdir", default="/tmp")
    p.add_argument("--json")
    args = p.parse_args()
    cli = os.path.join(args.bin_dir, "attnaudit")
    threads = args.threads or os.cpu_count()
    paths = {}
    for name, extra in (("engine inv_freq", []), ("no table", ["--no-rope-table"])):
        path = os.path.join(args.workdir, f"rope_cost_{os.getpid()}_{len(paths)}.pb")
        subprocess.run([cli, "synth", "--preset", "llama3-8b", "--batch", "8",
                        "--context", "4096", "--permute-pages", "-o", path] + extra,
                       check=True, stderr=subprocess.DEVNULL)
        paths[name] = path
    seconds = {name: [] for name in paths}
    try:
        for path in paths.values():
            benchlib.warm_page_cache(path)
            audit_seconds(cli, path, threads)  # warm-up
        for _ in range(args.repeats):
            for name, path in paths.items():
                seconds[name].append(audit_seconds(cli, path, threads))
    finally:
        for path in paths.values():
            os.remove(path)
    m = benchlib.cpu_description()
    print(f"machine: {m['cpu']}, {m['cores']} cores, {m['isa']}")
    print(f"W1: llama3-8b B=8 context=4096, q pre-RoPE, check --threads {threads}, "
          f"{args.repeats} runs each, alternating")
    print("| RoPE values | median ms | min ms |\n|---|---|---|")
    result = {"machine": m, "threads": threads, "repeats": args.repeats}
    for name, v in seconds.items():
        med, low = statistics.median(v), min(v)
        print(f"| {name} | {med * 1e3:.1f} | {low * 1e3:.1f} |")
        result[name] = {"median_seconds": med, "min_seconds": low}
    ratio = (statistics.median(seconds["no table"]) /
             statistics.median(seconds["engine inv_freq"]))
    print(f"without the table: {ratio:.2f}x the audit's time")
    result["ratio"] = ratio
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
