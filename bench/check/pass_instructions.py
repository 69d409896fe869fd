"""Instructions per audit pass: a figure that a noisy VM cannot blur.

The dev VMs' wall-clock times drift by tens of percent between runs (and
between two runs of one binary a minute apart), so a change worth 5 % is
lost in them. The fused R + P pass is bound by how many instructions it
issues (docs/PERF.md, "Method"), and valgrind's callgrind counts those
exactly: the same binary on the same input gives the same count, whatever
else the machine is doing.

Method: synthesise a llama3-8b-shaped snapshot (B rows of L tokens, pages
permuted), run `attnaudit check --threads 1` under callgrind with
collection switched on only inside the pass (RunPassItemImpl, every SIMD
target's copy) and once for the whole process; print instructions per
(page, KV head) and per multiply-add of the pass (R's and P's, scores and
values: 4 * L * B * Hq * D of them), with the CPU's vector ISA. The
callgrind run is single-threaded and ~50x slower than native; L=512 keeps
it to seconds. Needs valgrind (Debian: valgrind).

usage: pass_instructions.py --bin-dir build/bin [--context 512] [--batch 8]
                            [--workdir /tmp] [--json OUT]
"""

import argparse
import json
import os
import re
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "common"))

import benchlib  # noqa: E402

# llama3-8b, as `attnaudit synth --preset llama3-8b` writes it.
Q_HEADS, KV_HEADS, HEAD_DIM, PAGE = 32, 8, 128, 16


def callgrind_total(cmd, workdir, toggle=None):
    """Instructions callgrind counted for cmd (inside `toggle` only when
    given)."""
    out = os.path.join(workdir, f"callgrind_{os.getpid()}.out")
    args = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}"]
    if toggle:
        args.append(f"--toggle-collect={toggle}")
    proc = subprocess.run(args + cmd, capture_output=True, text=True)
    try:
        os.remove(out)
    except OSError:
        pass
    if proc.returncode != 0:
        raise RuntimeError(f"callgrind failed: {proc.stderr[-2000:]}")
    match = re.search(r"Collected : (\d+)", proc.stderr)
    if not match:
        raise RuntimeError(f"no count in callgrind's output: {proc.stderr}")
    return int(match.group(1))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--bin-dir", required=True)
    p.add_argument("--context", type=int, default=512)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--workdir", default="/tmp")
    p.add_argument("--json")
    args = p.parse_args()
    if shutil.which("valgrind") is None:
        sys.exit("pass_instructions: valgrind is not installed "
                 "(apt-get install valgrind)")
    path = os.path.join(args.workdir, f"instructions_{os.getpid()}.pb")
    benchlib.synth_snapshot(args.bin_dir, path, args.batch, args.context)
    try:
        cmd = [os.path.join(args.bin_dir, "attnaudit"), "check", "--threads",
               "1", path]
        pass_count = callgrind_total(cmd, args.workdir,
                                     toggle="*RunPassItemImpl*")
        process = callgrind_total(cmd, args.workdir)
    finally:
        os.remove(path)
    pages = args.batch * (args.context // PAGE)
    multiply_adds = 4 * args.batch * args.context * Q_HEADS * HEAD_DIM
    result = {
        "machine": benchlib.cpu_description(),
        "batch": args.batch, "context": args.context,
        "pass_instructions": pass_count,
        "process_instructions": process,
        "per_page_and_kv_head": pass_count / (pages * KV_HEADS),
        "per_multiply_add": pass_count / multiply_adds,
    }
    m = result["machine"]
    print(f"machine: {m['cpu']}, {m['cores']} cores, {m['isa']}")
    print(f"snapshot: llama3-8b B={args.batch} context={args.context} "
          f"(pages permuted), check --threads 1 under callgrind")
    print("| instructions | count |\n|---|---|")
    print(f"| fused R + P pass | {pass_count:,} |")
    print(f"| whole check process | {process:,} |")
    print(f"| pass, per (page, KV head) | "
          f"{result['per_page_and_kv_head']:,.0f} |")
    print(f"| pass, per multiply-add (R and P, scores and values) | "
          f"{result['per_multiply_add']:.3f} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
