#!/usr/bin/env python3
"""What the attnaudit hook costs a decode loop (docs/PERF.md, "Python client").

Measured in one run, on a W1 snapshot (B=8 rows of 4096 tokens, Llama-3-8B
attention: Hq=32, Hkv=8, D=128, pages of 16 tokens, bf16; 128 MiB of K/V
pages) held the way vLLM holds it: a fused [2, num_blocks, 16, 8, 128]
cache with 25% spare blocks and a shuffled block table.

  unsampled   RolloutAuditor.step(lambda: ..., layer=l) for a step the
              sampling skips (the lambda is created each call, as in a real
              loop); mean over many calls, and the same loop calling an
              empty function as the baseline.
  sampled     step() for a sampled step: the builder (page gather and one
              copy of every small tensor) plus the enqueue. The auditor's
              client is a sink that answers at once, so nothing else runs;
              then again with a real attnaudit-server (--server), each step
              taken after the previous audit finished.
  build       Snapshot.from_paged_kv alone, against the baselines "copy the
              snapshot's bytes once" (one contiguous copy of the same number
              of bytes, into a new buffer and into a reused one) and "gather
              the K/V pages" (np.take of the same pages, alone; with torch
              also torch's index_select into new torch buffers).
  encode      the second copy, on the background thread: the AuditStream
              chunks (what audit() sends for W1) and, for comparison, one
              unary request.

With torch installed (make bench-python) the engine tensors are torch CPU
tensors; without it, numpy arrays with ml_dtypes bf16 (reported as such).

usage: bench_hook.py [--server PATH] [--repeats N] [--numpy]
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

import attnaudit
from attnaudit import _calls
from attnaudit.report import Report
from attnaudit.v1 import report_pb2

B, L, HQ, HKV, D, P = 8, 4096, 32, 8, 128, 16


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            m = re.search(r"model name\s*:\s*(.*)", f.read())
        return f"{m.group(1).strip()}, {os.cpu_count()} cores" if m else platform.processor()
    except OSError:
        return platform.processor()


def w1_engine(use_torch: bool):
    rng = np.random.default_rng(0)
    blocks = L // P
    num_blocks = B * blocks * 5 // 4
    import ml_dtypes
    bf16 = ml_dtypes.bfloat16
    kv = rng.standard_normal((2, num_blocks, P, HKV, D), dtype=np.float32).astype(bf16)
    q = rng.standard_normal((B, HQ, D), dtype=np.float32).astype(bf16)
    out = rng.standard_normal((B, HQ, D), dtype=np.float32).astype(bf16)
    lse = rng.standard_normal((B, HQ), dtype=np.float32)
    table = rng.permutation(num_blocks)[: B * blocks].reshape(B, blocks).astype(np.int32)
    seq_lens = np.full(B, L, dtype=np.int32)
    if use_torch:
        import torch

        def t(a):
            if a.dtype == bf16:
                return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
            return torch.from_numpy(a)

        kv, q, out, lse = t(kv), t(q), t(out), t(lse)
    return dict(q=q, kv=kv, out=out, lse=lse, table=table, seq_lens=seq_lens)


def build(e):
    return attnaudit.Snapshot.from_paged_kv(
        e["q"], e["kv"], None, e["table"], e["seq_lens"], layout="vllm",
        engine_out=e["out"], engine_lse=e["lse"], lse_base="e",
        labels={"model": "llama3-8b", "engine": "bench"})


class Sink:
    """A client that accepts every snapshot at once (no network, no work)."""

    def __init__(self):
        self.report = Report(report_pb2.AuditReport(verdict=report_pb2.VERDICT_PASS))

    def audit(self, snapshot, **kw):
        return self.report


def timed(fn, repeats):
    times = []
    for _ in range(repeats):
        gc.collect()
        t0 = time.perf_counter_ns()
        fn()
        times.append(time.perf_counter_ns() - t0)
    return times


def ms(ns_list):
    return (f"median {statistics.median(ns_list) / 1e6:.1f} ms "
            f"(min {min(ns_list) / 1e6:.1f}, max {max(ns_list) / 1e6:.1f}, "
            f"n={len(ns_list)})")


def bench_unsampled(e, calls=200_000):
    auditor = attnaudit.RolloutAuditor(Sink(), sample_every=10**9, offset=-1)

    def noop(x, layer=None, step=None):
        return False

    layers = 32
    hooks = (("baseline (empty function)", noop), ("auditor.step", auditor.step))
    results = {}
    for _ in range(7):  # alternated, best of 7: the machine is shared
        for name, hook in hooks:
            t0 = time.perf_counter_ns()
            for i in range(calls):
                hook(lambda: build(e), layer=i % layers)
            per = (time.perf_counter_ns() - t0) / calls
            results[name] = min(per, results.get(name, per))
    auditor.close()
    return results


def bench_sampled(e, client, repeats):
    auditor = attnaudit.RolloutAuditor(client, sample_every=1, max_in_flight=1,
                                       timeout=600)
    times = []
    for i in range(repeats):
        assert auditor.flush(600)
        gc.collect()
        t0 = time.perf_counter_ns()
        taken = auditor.step(lambda: build(e), layer=0, step=i)
        times.append(time.perf_counter_ns() - t0)
        assert taken, "a sampled step was dropped"
    t0 = time.perf_counter_ns()
    assert auditor.flush(600)
    last_wait = time.perf_counter_ns() - t0
    c = auditor.counters
    auditor.close()
    return times, last_wait, c


def bench_build(e, use_torch, repeats):
    snap = build(e)
    nbytes = snap.nbytes
    ids = snap.tensor("page_ids").astype(np.int64)
    src = np.ones(nbytes, dtype=np.uint8)
    dst = np.empty_like(src)
    dst.fill(0)
    kv = e["kv"]
    extra = {}
    if use_torch:
        import torch
        idx = torch.from_numpy(ids)
        # torch's own gather into fresh torch buffers, for comparison: what
        # the builder did before it gathered through numpy views.
        extra["gather_torch"] = timed(lambda: (kv[0].index_select(0, idx),
                                               kv[1].index_select(0, idx)), repeats)
        kv = kv.view(torch.int16).numpy()
    results = {
        "build": timed(lambda: build(e), repeats),
        # One copy of the same bytes into a new buffer (what any copy that
        # outlives the step must pay), and into a buffer reused every time.
        "memcpy_fresh": timed(lambda: src.copy(), repeats),
        "memcpy_reused": timed(lambda: np.copyto(dst, src), repeats),
        "gather": timed(lambda: (np.take(kv[0], ids, axis=0),
                                 np.take(kv[1], ids, axis=0)), repeats),
        **extra,
    }
    chunk = 4 << 20
    encode = {
        "stream": timed(lambda: sum(len(m) for m in _calls.stream_messages(snap, None, 0, chunk)),
                        repeats),
        "unary": timed(lambda: _calls.audit_request(snap, None, 0), repeats),
    }
    return nbytes, results, encode


def start_server(binary):
    data = tempfile.mkdtemp(prefix="attnaudit_bench_")
    log_path = os.path.join(data, "server.log")
    log = open(log_path, "wb")
    proc = subprocess.Popen([binary, "--listen", "127.0.0.1:0", "--metrics-listen",
                             "127.0.0.1:0", "--data-dir", os.path.join(data, "db")],
                            stderr=log)
    for _ in range(400):
        with open(log_path, "rb") as f:
            m = re.search(rb'"grpc listening" addr=(127\.0\.0\.1:\d+)', f.read())
        if m:
            return proc, m.group(1).decode()
        time.sleep(0.05)
    proc.kill()
    raise SystemExit("attnaudit-server did not start; see " + log_path)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--server", help="attnaudit-server binary for the real-server runs")
    ap.add_argument("--repeats", type=int, default=11)
    ap.add_argument("--numpy", action="store_true",
                    help="engine tensors as numpy arrays even when torch is installed")
    args = ap.parse_args()
    try:
        if args.numpy:
            raise ImportError
        import torch
        use_torch = True
        torch.set_num_threads(1)  # the engine's thread: the hook runs on it
        arrays = f"torch {torch.__version__} CPU tensors"
    except ImportError:
        use_torch = False
        arrays = ("numpy arrays (ml_dtypes bf16)" if args.numpy else
                  "numpy arrays (ml_dtypes bf16): torch is not installed")
    print(f"machine: {cpu_name()}; Python {platform.python_version()}; {arrays}")
    e = w1_engine(use_torch)

    un = bench_unsampled(e)
    base, hook = un["baseline (empty function)"], un["auditor.step"]
    print(f"unsampled step: {hook:.0f} ns per call (loop with an empty function "
          f"instead: {base:.0f} ns; the hook adds {hook - base:.0f} ns)")

    nbytes, b, encode = bench_build(e, use_torch, args.repeats)
    print(f"W1 snapshot: {nbytes / 2**20:.1f} MiB of tensors")
    print(f"build from_paged_kv: {ms(b['build'])}")
    print(f"baseline: copy {nbytes / 2**20:.1f} MiB once into a new buffer: "
          f"{ms(b['memcpy_fresh'])}")
    print(f"baseline: copy {nbytes / 2**20:.1f} MiB once into a reused buffer: "
          f"{ms(b['memcpy_reused'])}")
    print(f"baseline: gather the K/V pages alone: {ms(b['gather'])}")
    if "gather_torch" in b:
        print(f"for comparison: the same gather with torch index_select into new "
              f"torch buffers: {ms(b['gather_torch'])}")
    print(f"ratio build / copy once (new buffer): "
          f"{statistics.median(b['build']) / statistics.median(b['memcpy_fresh']):.2f}")
    print(f"encode on the background thread, AuditStream chunks of 4 MiB (what audit() "
          f"sends for W1): {ms(encode['stream'])}")
    print(f"encode on the background thread, one unary request: {ms(encode['unary'])}")

    times, _, _ = bench_sampled(e, Sink(), args.repeats)
    print(f"sampled step (copy + enqueue), sink client: {ms(times)}")

    if args.server:
        proc, addr = start_server(args.server)
        try:
            client = attnaudit.AuditClient(addr, timeout=600)
            client.wait_for_ready(30)
            client.capabilities()
            times, wait, c = bench_sampled(e, client, max(3, args.repeats // 2))
            print(f"sampled step (copy + enqueue), real server, previous audit done: "
                  f"{ms(times)}")
            t0 = time.perf_counter_ns()
            report = client.audit(build(e), priority="sampled")
            # The W1 engine output here is random, so the verdict is DRIFT.
            print(f"one W1 audit end to end on this machine (build + send + audit): "
                  f"{(time.perf_counter_ns() - t0) / 1e6:.0f} ms (verdict "
                  f"{report.verdict.name}: the engine output is random); auditor "
                  f"counters {c}")
            client.close()
        finally:
            proc.terminate()
            proc.wait(timeout=60)


if __name__ == "__main__":
    sys.exit(main())
