"""Context and batch sweeps of `attnaudit check`: time per token and peak
RSS per snapshot shape, each next to its floor measured in the same run.

For every (B, L) shape: `attnaudit synth --preset llama3-8b --batch B
--context L --permute-pages` writes the snapshot (row b holds L - 7b
tokens), the file is read once into the page cache, then `attnaudit check
FILE` runs as a child process once untimed and --repeats times timed: wall
time (process start to exit) and the child's peak RSS (getrusage
ru_maxrss). The file is deleted before the next shape, so at most one
snapshot (<= 512 MiB) is on disk at a time.

Sweeps (a shape shared by two sweeps is measured once):
  context  B=1, L in --contexts (default 1k 4k 16k 64k 128k)
  tokens   B*L = --tokens (default 32k): L in --contexts up to 32k
  batch    L = --batch-context (default 4k), B in --batches (1 2 4 8 16 32)
Checks printed at the end (figures, not test assertions): time per token
flat within +-20% (each within [0.8, 1.2] x the median) from 4k to 128k at
B=1; the largest context's time against its floor; peak RSS against the
file size + 64 MiB.

In process (--only inprocess, on by default): the same B=1 contexts from
4k up through `attnaudit_bench_check --batch 1 --context L`, whose audit in
memory and fused pass exclude what a process adds (its start, and mapping
the file: one page-table entry per 4 KiB page); the same flatness check
on the audit's time per token, and each audit against the floor that
benchmark measures in its own run.

usage: sweeps.py --bin-dir build/bin [--workdir DIR] [--repeats N]
                 [--threads N] [--only context,tokens,batch,inprocess]
                 [--json OUT]
Standard library only (runs on the system python3).
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

MIB = 1 << 20


def ints(text):
    out = []
    for part in text.replace(",", " ").split():
        scale = 1024 if part.lower().endswith("k") else 1
        out.append(int(part.rstrip("kK")) * scale)
    return out


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--bin-dir", required=True)
    p.add_argument("--workdir", default="/tmp")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--contexts", type=ints, default=ints("1k 4k 16k 64k 128k"))
    p.add_argument("--tokens", type=ints, default=ints("32k"))
    p.add_argument("--batches", type=ints, default=ints("1 2 4 8 16 32"))
    p.add_argument("--batch-context", type=ints, default=ints("4k"))
    p.add_argument("--only", default="context,tokens,batch,inprocess")
    p.add_argument("--json")
    return p.parse_args()


def shapes(args):
    """(sweep name, B, L) in run order."""
    only = set(args.only.split(","))
    out = []
    if "context" in only:
        out += [("context", 1, L) for L in args.contexts]
    if "tokens" in only:
        total = args.tokens[0]
        out += [("tokens", total // L, L)
                for L in sorted(set(args.contexts + [total])) if L <= total]
    if "batch" in only:
        out += [("batch", B, args.batch_context[0]) for B in args.batches]
    return out


def measure(args, batch, context):
    cli = os.path.join(args.bin_dir, "attnaudit")
    path = os.path.join(args.workdir,
                        f"sweep_b{batch}_l{context}_{os.getpid()}.pb")
    benchlib.synth_snapshot(args.bin_dir, path, batch, context)
    try:
        work = benchlib.snapshot_work(args.bin_dir, path)
        benchlib.warm_page_cache(path)
        cmd = [cli, "check", path, "--threads", str(args.threads)]
        benchlib.run_child(cmd, ok_codes=(0, 1))
        runs = [benchlib.run_child(cmd, ok_codes=(0, 1))
                for _ in range(args.repeats)]
    finally:
        os.remove(path)
    seconds = [r[0] for r in runs]
    return {"batch": batch, "context": context, "work": work,
            **benchlib.summarize(seconds),
            "report_median_s": statistics.median(r[3] for r in runs),
            "peak_rss_bytes": max(r[1] for r in runs)}


def stage_median_ms(text, stage):
    """The median of one stage line of attnaudit_bench_check's output."""
    for line in text.splitlines():
        if line.strip().startswith(stage):
            return float(line.split("median")[1].split("ms")[0])
    raise RuntimeError(f"attnaudit_bench_check printed no '{stage}' line")


def in_process(args):
    """B=1 contexts (4k up) audited in memory: per-token time and floor."""
    rows = []
    for context in [L for L in args.contexts if L >= 4096]:
        print(f"  measuring in process: B=1 L={context}", file=sys.stderr,
              flush=True)
        path = os.path.join(args.workdir, f"inproc_l{context}_{os.getpid()}.pb")
        out = subprocess.run(
            [os.path.join(args.bin_dir, "attnaudit_bench_check"), "--batch",
             "1", "--context", str(context), "--repeats", str(args.repeats),
             "--threads", str(args.threads), "--file", path],
            check=True, capture_output=True, text=True).stdout
        floor_ms = next(float(line.split("->")[1].split("ms")[0])
                        for line in out.splitlines()
                        if line.startswith("floor:"))
        audit_ms = stage_median_ms(out, "audit in memory")
        rows.append({"context": context, "floor_ms": floor_ms,
                     "fused_ms": stage_median_ms(out, "R + P fused pass"),
                     "audit_ms": audit_ms,
                     "us_per_token": audit_ms * 1e3 / context,
                     "x_floor": audit_ms / floor_ms})
    if rows:
        mid = statistics.median(r["us_per_token"] for r in rows)
        for r in rows:
            r["spread"] = r["us_per_token"] / mid
    return rows


def report_in_process(rows):
    print("\nin process (attnaudit_bench_check, B=1)\n\n| L | fused pass ms | "
          "audit ms | audit us/token | x the median | audit x floor |\n"
          "|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['context']} | {r['fused_ms']:.2f} | {r['audit_ms']:.2f} | "
              f"{r['us_per_token']:.3f} | {r['spread']:.2f} | "
              f"{r['x_floor']:.2f} |")
    flat = all(0.8 <= r["spread"] <= 1.2 for r in rows)
    print("in process, time per token within +-20% from 4k: "
          f"{'yes' if flat else 'NO'}; "
          f"{rows[-1]['context'] // 1024}k: {rows[-1]['x_floor']:.1f}x "
          "its floor")


def finish(results, floor):
    for r in results:
        floor_s, memory_s, compute_s = benchlib.floor_seconds(r["work"], floor)
        r["floor_s"] = floor_s
        r["x_floor"] = r["median_s"] / floor_s
        r["report_x_floor"] = r["report_median_s"] / floor_s
        r["us_per_token"] = r["median_s"] / r["work"]["tokens"] * 1e6
        r["rss_over_file_mib"] = (r["peak_rss_bytes"] -
                                  r["work"]["file_bytes"]) / MIB


def checks(results):
    b1 = sorted((r for r in results if r["batch"] == 1 and
                 4096 <= r["context"] <= 131072), key=lambda r: r["context"])
    out = {}
    if len(b1) >= 2:
        per_token = [r["us_per_token"] for r in b1]
        mid = statistics.median(per_token)
        out["flat_4k_128k"] = {
            "contexts": [r["context"] for r in b1],
            "us_per_token": per_token,
            "spread": [x / mid for x in per_token],
            "within_20_percent": all(0.8 <= x / mid <= 1.2 for x in per_token)}
    if b1:
        out["largest_b1"] = {"context": b1[-1]["context"],
                             "x_floor": b1[-1]["x_floor"]}
    out["rss_within_file_plus_64mib"] = all(
        r["rss_over_file_mib"] <= 64 for r in results)
    return out


def report(doc):
    m = doc["machine"]
    f = doc["floor"]
    print(f"machine: {m['cpu']}, {m['cores']} cores, {m['isa']}, "
          f"{doc['threads']} threads; load average {m['load_average']} at "
          f"start, {m['load_average_end']} at the end")
    print(f"floor probes (best of 2 runs): read "
          f"{f['read_bytes_per_second'] / 1e9:.2f} GB/s, fp64 "
          f"{f['fp64_flops_per_second'] / 1e9:.1f} GFLOP/s, fp32 "
          f"{f['fp32_flops_per_second'] / 1e9:.1f} GFLOP/s")
    print(f"process start (attnaudit check --help): median "
          f"{doc['process_start']['median_s'] * 1e3:.1f} ms")
    for sweep in ("context", "tokens", "batch"):
        rows = [(s, r) for s, r in doc["order"] if s == sweep]
        if not rows:
            continue
        print(f"\n{sweep} sweep (report: exec to the report's arrival; "
              "median, min: exec to exit)\n\n| B | L | tokens | file MiB | "
              "report ms | median ms | min ms | us/token | floor ms | "
              "report x floor | x floor | peak RSS MiB | RSS - file MiB |\n"
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|")
        for _, key in rows:
            r = doc["results"][key]
            print(f"| {r['batch']} | {r['context']} | {r['work']['tokens']} | "
                  f"{r['work']['file_bytes'] / MIB:.0f} | "
                  f"{r['report_median_s'] * 1e3:.1f} | "
                  f"{r['median_s'] * 1e3:.1f} | {r['min_s'] * 1e3:.1f} | "
                  f"{r['us_per_token']:.2f} | {r['floor_s'] * 1e3:.2f} | "
                  f"{r['report_x_floor']:.1f} | "
                  f"{r['x_floor']:.1f} | {r['peak_rss_bytes'] / MIB:.0f} | "
                  f"{r['rss_over_file_mib']:.0f} |")
    c = doc["checks"]
    if "flat_4k_128k" in c:
        flat = c["flat_4k_128k"]
        print("\ntime per token, B=1, " +
              ", ".join(f"{L // 1024}k: {x:.2f}" for L, x in
                        zip(flat["contexts"], flat["spread"])) +
              " x the median -> within +-20%: "
              f"{'yes' if flat['within_20_percent'] else 'NO'}")
    if "largest_b1" in c:
        print(f"B=1, {c['largest_b1']['context'] // 1024}k tokens: "
              f"{c['largest_b1']['x_floor']:.1f}x its floor")
    print("peak RSS <= file + 64 MiB for every shape: "
          f"{'yes' if c['rss_within_file_plus_64mib'] else 'NO'}")


def main():
    args = parse_args()
    machine = benchlib.cpu_description()
    floor_before = benchlib.measure_floor(args.bin_dir, args.threads)
    results, order = {}, []
    for sweep, batch, context in shapes(args):
        key = f"B{batch}_L{context}"
        if key not in results:
            print(f"  measuring {sweep}: B={batch} L={context}",
                  file=sys.stderr, flush=True)
            results[key] = measure(args, batch, context)
        order.append((sweep, key))
    floor = benchlib.best_floor(
        floor_before, benchlib.measure_floor(args.bin_dir, args.threads))
    # What any `attnaudit` process costs before it reads a byte.
    start_cmd = [os.path.join(args.bin_dir, "attnaudit"), "check", "--help"]
    process_start = benchlib.summarize(
        [benchlib.run_child(start_cmd)[0] for _ in range(args.repeats)])
    finish(results.values(), floor)
    machine["load_average_end"] = [round(x, 2) for x in os.getloadavg()]
    doc = {"machine": machine, "threads": args.threads, "floor": floor,
           "process_start": process_start,
           "results": results, "order": order,
           "checks": checks(list(results.values()))}
    if "inprocess" in args.only.split(","):
        doc["in_process"] = in_process(args)
    report(doc)
    if doc.get("in_process"):
        report_in_process(doc["in_process"])
    if args.json:
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1)


if __name__ == "__main__":
    main()
