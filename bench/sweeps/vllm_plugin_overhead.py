"""The vLLM plugin's cost on vLLM's CPU engine (`make bench-vllm-plugin`).

usage: vllm_plugin_overhead.py --server BIN --work DIR [--rounds 5] [--json OUT]

One in-process vLLM engine (the tiny llama3 model of tests/vllm_plugin,
4 layers, bf16, block 32), one attnaudit-server on loopback (niced: it
shares the cores with the engine, as it would not in production). Modes,
switched between generate() calls of the same engine, interleaved over
--rounds rounds:

  off        vLLM's own methods (the plugin's wraps removed)
  unsampled  wraps installed, no step sampled (sample_rate 0)
  defaults   the plugin's default sampling (one step in sample_every = 100,
             one layer per sampled step)
  1 layer    every step sampled, one layer per step (rotate_layers)
  4 layers   every step sampled, every layer

Decode-step time: (time of a 72-token generate - time of an 8-token one)
/ 64, for a batch of 4 requests, so prefill and fixed costs cancel; the
median over rounds, with the spread (max - min) as the noise. The
engine-thread time inside the plugin's attention hook (snapshot build and
enqueue) is timed directly; the largest snapshot gives the memory the
plugin holds at most: max_in_flight x that.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import statistics
import subprocess
import sys
import time

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tests", "vllm_plugin"))

import e2e  # noqa: E402  (the model and the server helper)

PROMPTS = [[1] + [5 + (7 * i + 3 * b) % 400 for i in range(40 + 9 * b)] for b in range(4)]
MODES = ("off", "unsampled", "defaults", "1 layer", "4 layers")


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--server", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    os.makedirs(args.work, exist_ok=True)
    model = os.path.join(args.work, "tiny-llama3")
    e2e.make_model(model)
    server = e2e.Server(args.server, args.work)
    subprocess.run(["renice", "-n", "19", "-p", str(server.proc.pid)],
                   capture_output=True, check=False)
    os.environ["ATTNAUDIT_VLLM_SERVER"] = server.address
    os.environ["ATTNAUDIT_VLLM_LOG_SUMMARY"] = "0"
    os.environ["ATTNAUDIT_VLLM_MAX_IN_FLIGHT"] = "64"
    try:
        return measure(model, args)
    finally:
        server.stop()


def measure(model: str, args) -> int:
    from vllm import LLM, SamplingParams
    import attnaudit.vllm as av
    from attnaudit.vllm import seams

    llm = LLM(model=model, dtype="bfloat16", gpu_memory_utilization=0.1,
              max_model_len=512, enforce_eager=True, block_size=32, max_num_seqs=4,
              seed=0)
    plugin = av.plugin()
    assert plugin is not None, "the plugin did not load: is attnaudit installed in this venv?"
    base = plugin.settings
    hook = {"seconds": 0.0, "calls": 0, "max_bytes": 0}
    inner = plugin.on_attention

    def timed(st, call):
        t0 = time.perf_counter()
        inner(st, call)
        if st is not None and st.sampled and call.layer in st.layers:
            hook["seconds"] += time.perf_counter() - t0
            hook["calls"] += 1
    plugin.on_attention = timed
    original_step = plugin.auditor().step

    def sizing_step(builder, **kw):
        def sized():
            snap = builder()
            hook["max_bytes"] = max(hook["max_bytes"], snap.nbytes)
            return snap
        return original_step(sized, **kw)
    plugin.auditor().step = sizing_step

    def set_mode(mode: str) -> None:
        seams.uninstall()
        if mode == "off":
            return
        if mode == "unsampled":
            plugin.settings = dataclasses.replace(base, sample_rate=0.0)
        elif mode == "defaults":
            d = av.Settings()
            plugin.settings = dataclasses.replace(
                base, sample_every=d.sample_every, sample_rate=d.sample_rate,
                rotate_layers=d.rotate_layers, layers=d.layers)
        else:
            plugin.settings = dataclasses.replace(base, sample_every=1, sample_rate=None,
                                                  rotate_layers=(mode == "1 layer"))
        seams.install(plugin)

    def generate(tokens: int) -> float:
        params = SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True)
        t0 = time.perf_counter()
        llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params, use_tqdm=False)
        return time.perf_counter() - t0

    for mode in MODES:   # warm every path once
        set_mode(mode)
        generate(8)
    plugin.flush(300)
    per_step = {m: [] for m in MODES}
    hook_per_mode = {m: [0.0, 0] for m in MODES}
    for _ in range(args.rounds):
        for mode in MODES:
            set_mode(mode)
            before = (hook["seconds"], hook["calls"])
            short, long_ = generate(8), generate(72)
            per_step[mode].append((long_ - short) / 64)
            hook_per_mode[mode][0] += hook["seconds"] - before[0]
            hook_per_mode[mode][1] += hook["calls"] - before[1]
            plugin.flush(300)  # the server catches up outside the timing
    seams.uninstall()
    counters = plugin.counters()
    plugin.close(60)

    rows = []
    off = statistics.median(per_step["off"])
    for mode in MODES:
        xs = per_step[mode]
        med = statistics.median(xs)
        secs, calls = hook_per_mode[mode]
        rows.append({"mode": mode, "decode_step_ms": med * 1e3,
                     "spread_ms": (max(xs) - min(xs)) * 1e3,
                     "vs_off_ms": (med - off) * 1e3,
                     "hook_ms_per_audited_layer": secs / calls * 1e3 if calls else None,
                     "audited_layers": calls})
    result = {"cpu": cpu_name(), "cores": os.cpu_count(), "rounds": args.rounds,
              "batch": len(PROMPTS), "max_in_flight": base.max_in_flight,
              "largest_snapshot_bytes": hook["max_bytes"],
              "plugin_holds_at_most_bytes": hook["max_bytes"] * base.max_in_flight,
              "counters": counters, "modes": rows}
    print(f"CPU: {result['cpu']} ({result['cores']} cores); batch {len(PROMPTS)}, "
          f"{args.rounds} rounds")
    print(f"{'mode':<10} {'step ms':>8} {'spread':>7} {'vs off':>7} {'hook ms/layer':>14}")
    for r in rows:
        hook_ms = "-" if r["hook_ms_per_audited_layer"] is None else \
            f"{r['hook_ms_per_audited_layer']:.3f}"
        print(f"{r['mode']:<10} {r['decode_step_ms']:8.3f} {r['spread_ms']:7.3f} "
              f"{r['vs_off_ms']:+7.3f} {hook_ms:>14}")
    print(f"largest snapshot {hook['max_bytes']} B; held at most "
          f"{result['plugin_holds_at_most_bytes']} B (max_in_flight {base.max_in_flight})")
    print(f"audits: {counters}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
