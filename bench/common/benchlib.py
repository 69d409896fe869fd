"""Helpers shared by the Python benchmarks (bench/peers, bench/sweeps).

Standard library only, so the sweeps run on the system python3. They call
attnaudit's own binaries for everything numerical: the machine floor
(attnaudit_bench_floor, the same probe as the C++ benchmarks; its header
bench/common/machine_floor.h states the method) and a snapshot's work
(attnaudit_bench_reference, the definitions of bench/check/check_bench.cc).

floor(snapshot) = max(KV bytes / read bandwidth,
                      R flops / fp64 FMA peak + P flops / fp32 FMA peak)
with the flops of one pass 4·D·Hq·(visible keys summed over rows and
queries); R and P each do one pass.
"""

import json
import os
import statistics
import subprocess
import time


def cpu_description():
    """The CPU model, core count, vector ISA and load, for the figures."""
    model, flags = "unknown CPU", set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "model name" and model == "unknown CPU":
                    model = value.strip()
                elif key.strip() == "flags" and not flags:
                    flags = set(value.split())
    except OSError:
        pass
    isa = ("AVX-512" if "avx512f" in flags else
           "AVX2" if "avx2" in flags else "SSE")
    return {"cpu": model, "cores": os.cpu_count(), "isa": isa,
            "load_average": [round(x, 2) for x in os.getloadavg()]}


def measure_floor(bin_dir, threads, repeats=5):
    """Runs attnaudit_bench_floor; returns its JSON object."""
    out = subprocess.run(
        [os.path.join(bin_dir, "attnaudit_bench_floor"), "--threads",
         str(threads), "--repeats", str(repeats), "--json"],
        check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def best_floor(*floors):
    """The best of several floor measurements, probe by probe (the
    conservative choice: the lowest floor, so the highest ratios)."""
    best = dict(floors[0])
    for f in floors[1:]:
        for key in ("read_bytes_per_second", "fp64_flops_per_second",
                    "fp32_flops_per_second"):
            best[key] = max(best[key], f[key])
    return best


def snapshot_work(bin_dir, path, dump_prefix=None, threads=0):
    """Runs attnaudit_bench_reference on a snapshot; returns its work JSON
    (and writes R as .npy when dump_prefix is given)."""
    cmd = [os.path.join(bin_dir, "attnaudit_bench_reference"), path]
    if dump_prefix:
        cmd += ["--dump", dump_prefix]
    if threads:
        cmd += ["--threads", str(threads)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def synth_snapshot(bin_dir, path, batch, context, permute_pages=True):
    """Writes a llama3-8b-shaped snapshot with `attnaudit synth` to path
    (pages permuted through the page table unless told otherwise)."""
    cmd = [os.path.join(bin_dir, "attnaudit"), "synth", "--preset",
           "llama3-8b", "--batch", str(batch), "--context", str(context),
           "-o", path]
    if permute_pages:
        cmd.append("--permute-pages")
    subprocess.run(cmd, check=True, stderr=subprocess.DEVNULL)


def floor_seconds(work, floor):
    """The snapshot's floor in seconds, and its memory and compute parts."""
    memory = work["kv_bytes"] / floor["read_bytes_per_second"]
    compute = (work["flops_per_pass"] / floor["fp64_flops_per_second"] +
               work["flops_per_pass"] / floor["fp32_flops_per_second"])
    return max(memory, compute), memory, compute


def run_child(cmd, ok_codes=(0,)):
    """Runs cmd as a child process; returns (wall seconds to exit, peak RSS
    bytes of the child, exit code, seconds until its first output byte).
    The last is when `attnaudit check` has handed over its report (it
    flushes the report before releasing the snapshot); a command that
    prints nothing reports its exit time. Raises when the exit code is not
    in ok_codes."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    first = os.read(proc.stdout.fileno(), 1)
    report = time.perf_counter() - start
    proc.stdout.read()  # the rest, so the child never blocks on the pipe
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    if not first:
        report = wall
    proc.returncode = os.waitstatus_to_exitcode(status)
    stderr = proc.stderr.read().decode(errors="replace")
    proc.stdout.close()
    proc.stderr.close()
    if proc.returncode not in ok_codes:
        raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}: "
                           f"{stderr.strip()[-2000:]}")
    # ru_maxrss is in KiB on Linux.
    return wall, usage.ru_maxrss * 1024, proc.returncode, report


def warm_page_cache(path):
    """Reads the file once so that timed runs find it in the page cache."""
    with open(path, "rb") as f:
        while f.read(1 << 24):
            pass


def summarize(seconds):
    """Median and min of a list of timings."""
    return {"median_s": statistics.median(seconds), "min_s": min(seconds),
            "runs": len(seconds)}

