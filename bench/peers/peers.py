"""The peer benchmark: attnaudit next to what a user would otherwise run, on
the same snapshot, in one run, each as a ratio to the machine floor
measured in the same run (bench/common/benchlib.py states the floor).

Timed, each --repeats times after one untimed warm-up, median and min:
- attnaudit check FILE: the whole process (start, read and parse the
  file, validation, R + P + drift, print), the file in the page cache;
- numpy float64: attnaudit's R only (out and lse), written as a careful
  user would: per row, gather the row's pages through the block table,
  widen once to float64, one batched matmul per GQA group for the scores
  and one for the values, a max-shifted softmax;
- torch float64 and float32: torch.nn.functional.scaled_dot_product_attention
  over the gathered KV (GQA by enable_gqa); it returns out only, no lse;
- with --rlkernel PATH: the RL-Kernel harness's compare_decode_kv_replay
  (validation, its fp32 reference, its per-page replay and merge, drift).
The peers start from the parsed snapshot in memory and apply the queries'
RoPE themselves; parsing the file is timed once, apart ("python parse").
So attnaudit's figure includes work the peers' figures leave out.

Agreement: every peer's out (and lse, where it has one) is compared with
attnaudit's fp64 reference R dumped by attnaudit_bench_reference; the
table shows the max abs difference.

usage: peers.py --bin-dir build/bin [--snapshot FILE] [--repeats N]
                [--threads N] [--rlkernel PATH] [--json OUT] [--workdir DIR]
Without --snapshot it synthesises W1 (llama3-8b, B=8, 4,096 tokens,
permuted pages) in --workdir and deletes it afterwards.
"""

import argparse
import json
import warnings
import os
import sys
import statistics
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "common"))


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--bin-dir", required=True)
    p.add_argument("--snapshot")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--rlkernel", help="checkout of the RL-Kernel harness")
    p.add_argument("--rlkernel-repeats", type=int, default=3)
    p.add_argument("--json", help="write the results here as JSON")
    p.add_argument("--workdir", default="/tmp")
    return p.parse_args()


ARGS = parse_args()
# numpy's BLAS and torch read their thread counts at import.
for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[var] = str(ARGS.threads)

import numpy as np  # noqa: E402

# torch.from_numpy warns about the read-only views of the parsed message's
# bytes; the peers never write to them.
warnings.filterwarnings("ignore", message="The given NumPy array is not")
import benchlib  # noqa: E402
import snapshot_file as sf  # noqa: E402


def time_runs(fn, repeats):
    fn()  # warm-up: first-touch allocations, lazy imports, JIT caches
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        seconds.append(time.perf_counter() - start)
    return benchlib.summarize(seconds)


def numpy_reference(snap):
    """attnaudit's R in float64: out [B,Sq,Hq,D], lse (natural log) [B,Sq,Hq]."""
    b_rows, sq, hq, hkv, d, _ = snap.dims
    group = hq // hkv
    q = sf.rope_queries(snap)
    out = np.empty((b_rows, sq, hq, d))
    lse = np.empty((b_rows, sq, hq))
    for b in range(b_rows):
        # [Hkv, L, D] float64, contiguous: one gather, one widening.
        k = sf.widen(snap.k_pages.dtype, sf.gather_row(snap, snap.k_pages, b),
                     np.float64)
        v = sf.widen(snap.v_pages.dtype, sf.gather_row(snap, snap.v_pages, b),
                     np.float64)
        # Query heads h = g * group + j read KV head g: [Hkv, Sq*group, D].
        qb = q[b].reshape(sq, hkv, group, d).transpose(1, 0, 2, 3).reshape(
            hkv, sq * group, d)
        scores = np.matmul(qb, k.transpose(0, 2, 1))  # [Hkv, Sq*group, L]
        scores *= snap.scale
        positions = sf.row_positions(snap, b)
        hidden = positions[None, :] > snap.query_positions[b][:, None]
        if hidden.any():  # few-query rows: keys after a query are masked
            scores.reshape(hkv, sq, group, -1)[
                np.broadcast_to(hidden[None, :, None, :],
                                (hkv, sq, group, hidden.shape[1]))] = -np.inf
        peak = scores.max(axis=-1, keepdims=True)
        np.exp(scores - peak, out=scores)
        total = scores.sum(axis=-1, keepdims=True)
        o = np.matmul(scores, v) / total  # [Hkv, Sq*group, D]
        out[b] = o.reshape(hkv, sq, group, d).transpose(1, 0, 2, 3).reshape(
            sq, hq, d)
        lse[b] = (peak + np.log(total)).reshape(hkv, sq, group).transpose(
            1, 0, 2).reshape(sq, hq)
    return out, lse


def torch_sdpa(snap, dtype):
    """scaled_dot_product_attention per row over the gathered KV: out only."""
    import torch
    import torch.nn.functional as F
    b_rows, sq, hq, hkv, d, _ = snap.dims
    tdtype = {np.float64: torch.float64, np.float32: torch.float32}[dtype]
    q = torch.from_numpy(sf.rope_queries(snap)).to(tdtype)
    pools = []
    for pool in (snap.k_pages, snap.v_pages):
        if pool.dtype == sf.T.DTYPE_F32:
            pools.append(torch.from_numpy(pool.data))
            continue
        t = torch.from_numpy(pool.data.view(np.int16))
        pools.append(t.view(torch.bfloat16 if pool.dtype == sf.T.DTYPE_BF16
                            else torch.float16))
    out = torch.empty((b_rows, sq, hq, d), dtype=tdtype)
    for b in range(b_rows):
        pages = torch.from_numpy(sf.row_pages(snap, b))
        length = int(snap.seq_lens[b])
        kv = []
        for pool in pools:
            rows = pool.index_select(0, pages)
            if snap.hnd:  # [n, Hkv, P, D] -> [Hkv, L, D]
                rows = rows.transpose(0, 1).reshape(hkv, -1, d)[:, :length]
            else:  # [n, P, Hkv, D] -> [Hkv, L, D]
                rows = rows.reshape(-1, hkv, d)[:length].transpose(0, 1)
            kv.append(rows.to(dtype=tdtype,
                              memory_format=torch.contiguous_format))
        mask = None
        positions = torch.from_numpy(sf.row_positions(snap, b))
        visible = positions[None, :] <= torch.from_numpy(
            snap.query_positions[b])[:, None]
        if not bool(visible.all()):
            mask = visible  # [Sq, L], True = attend
        o = F.scaled_dot_product_attention(
            q[b].transpose(0, 1)[None], kv[0][None], kv[1][None],
            attn_mask=mask, scale=snap.scale, enable_gqa=True)
        out[b] = o[0].transpose(0, 1)
    return out.numpy().astype(np.float64), None


def rlkernel_inputs(snap):
    """The snapshot as the harness's DecodeAttentionInputs: per-row paged
    caches [B, Hkv, C, D] (each row's pages in a fixed random order of its
    own), post-RoPE q and K, the snapshot's scale and output dtype."""
    import torch
    from rl_engine.testing import DecodeAttentionInputs, DecodeKVCacheMetadata
    b_rows, sq, hq, hkv, d, page = snap.dims
    blocks = [len(sf.row_pages(snap, b)) for b in range(b_rows)]
    capacity = max(blocks) * page
    rng = np.random.default_rng(1)
    k_cache = np.zeros((b_rows, hkv, capacity, d), dtype=np.float32)
    v_cache = np.zeros_like(k_cache)
    positions = np.full((b_rows, capacity), -1, dtype=np.int64)
    table = np.full((b_rows, max(blocks)), -1, dtype=np.int64)
    for b in range(b_rows):
        k = sf.widen(snap.k_pages.dtype, sf.gather_row(snap, snap.k_pages, b))
        v = sf.widen(snap.v_pages.dtype, sf.gather_row(snap, snap.v_pages, b))
        pos = sf.row_positions(snap, b)
        order = rng.permutation(blocks[b])
        for logical, physical in enumerate(order):
            lo, hi = logical * page, min((logical + 1) * page, len(pos))
            dst = slice(physical * page, physical * page + hi - lo)
            k_cache[b, :, dst] = k[:, lo:hi]
            v_cache[b, :, dst] = v[:, lo:hi]
            positions[b, dst] = pos[lo:hi]
        table[b, :blocks[b]] = order
    kv_torch = {sf.T.DTYPE_BF16: torch.bfloat16, sf.T.DTYPE_F16: torch.float16,
                sf.T.DTYPE_F32: torch.float32}
    q_dtype = snap.msg.rope.q_output_dtype or snap.msg.q.dtype
    out_dtype = snap.msg.output_dtype or (snap.msg.engine.out.dtype
                                          if snap.msg.HasField("engine")
                                          else snap.msg.q.dtype)
    qpos = torch.from_numpy(snap.query_positions)
    meta = DecodeKVCacheMetadata(
        cache_position=qpos, kv_seq_lens=torch.from_numpy(snap.seq_lens),
        block_table=torch.from_numpy(table),
        global_token_positions=torch.from_numpy(positions),
        query_position_ids=qpos.clone(),
        key_position_ids=torch.from_numpy(positions.copy()), page_size=page,
        q_rope_state="post_rope", k_cache_rope_state="post_rope")
    kv_dtype = kv_torch[snap.k_pages.dtype]
    q = torch.from_numpy(sf.rope_queries(snap)).to(kv_torch[q_dtype])
    return DecodeAttentionInputs(
        q=q.permute(0, 2, 1, 3).contiguous(),
        k_cache=torch.from_numpy(k_cache).to(kv_dtype),
        v_cache=torch.from_numpy(v_cache).to(kv_dtype), metadata=meta,
        scale=snap.scale, output_dtype=kv_torch[out_dtype])


def agreement(out, lse, ref_out, ref_lse):
    result = {"out_max_abs": float(np.abs(out - ref_out).max())}
    if lse is not None:
        result["lse_max_abs"] = float(np.abs(lse - ref_lse).max())
    return result


def run_rlkernel(snap, ref_out, ref_lse):
    import dataclasses
    import torch
    sys.path.insert(0, os.path.abspath(ARGS.rlkernel))
    from rl_engine.testing import (compare_decode_kv_replay,
                                   run_decode_full_prefill_reference)
    inputs = rlkernel_inputs(snap)
    timing = time_runs(lambda: compare_decode_kv_replay(inputs),
                       ARGS.rlkernel_repeats)
    # Agreement of its reference with R, at fp32 output (its timed run keeps
    # the snapshot's output dtype, as a user would).
    ref = run_decode_full_prefill_reference(
        dataclasses.replace(inputs, output_dtype=torch.float32))
    out = ref.out.permute(0, 2, 1, 3).double().numpy()
    lse = ref.lse.permute(0, 2, 1).double().numpy()
    return timing, agreement(out, lse, ref_out, ref_lse)


def main():
    bin_dir = ARGS.bin_dir
    cli = os.path.join(bin_dir, "attnaudit")
    machine = benchlib.cpu_description()
    made = None
    path = ARGS.snapshot
    if not path:
        path = made = os.path.join(ARGS.workdir, f"peers_w1_{os.getpid()}.pb")
        benchlib.synth_snapshot(bin_dir, path, 8, 4096)
    prefix = os.path.join(ARGS.workdir, f"peers_ref_{os.getpid()}")
    try:
        results = run_all(bin_dir, cli, path, prefix, machine)
    finally:
        for suffix in (".out.npy", ".lse.npy", ".q.npy"):
            if os.path.exists(prefix + suffix):
                os.remove(prefix + suffix)
        if made:
            os.remove(made)
    print_results(results)
    if ARGS.json:
        with open(ARGS.json, "w") as f:
            json.dump(results, f, indent=1)


def run_all(bin_dir, cli, path, prefix, machine):
    work = benchlib.snapshot_work(bin_dir, path, dump_prefix=prefix,
                                  threads=ARGS.threads)
    ref_out = np.load(prefix + ".out.npy")
    ref_lse = np.load(prefix + ".lse.npy")
    ref_q = np.load(prefix + ".q.npy")
    floor_before = benchlib.measure_floor(bin_dir, ARGS.threads)

    benchlib.warm_page_cache(path)
    peers = []
    check_cmd = [cli, "check", path, "--threads", str(ARGS.threads)]
    benchlib.run_child(check_cmd, ok_codes=(0, 1))  # warm-up
    runs = [benchlib.run_child(check_cmd, ok_codes=(0, 1))
            for _ in range(ARGS.repeats)]
    # Timed to the process's exit, like the peers; when its report arrived
    # is kept beside it.
    peers.append({"peer": "attnaudit check (whole process)",
                  **benchlib.summarize([run[0] for run in runs]),
                  "report_median_s": statistics.median(run[3] for run in runs),
                  "agreement": "is R (and P, E)"})

    start = time.perf_counter()
    snap = sf.read(path)
    parse_s = time.perf_counter() - start
    q = sf.rope_queries(snap)
    rope_mismatches = int(np.count_nonzero(q != ref_q))

    out, lse = numpy_reference(snap)
    peers.append({"peer": "numpy float64 (R: out + lse)",
                  **time_runs(lambda: numpy_reference(snap), ARGS.repeats),
                  "agreement": agreement(out, lse, ref_out, ref_lse)})
    import torch
    torch.set_num_threads(ARGS.threads)
    for dtype, name in ((np.float64, "torch float64 SDPA (out only)"),
                        (np.float32, "torch float32 SDPA (out only)")):
        out, _ = torch_sdpa(snap, dtype)
        peers.append({"peer": name,
                      **time_runs(lambda: torch_sdpa(snap, dtype),
                                  ARGS.repeats),
                      "agreement": agreement(out, None, ref_out, ref_lse)})
    if ARGS.rlkernel:
        timing, agree = run_rlkernel(snap, ref_out, ref_lse)
        peers.append({"peer": "RL-Kernel compare_decode_kv_replay",
                      **timing, "agreement": agree})

    floor_after = benchlib.measure_floor(bin_dir, ARGS.threads)
    floor = benchlib.best_floor(floor_before, floor_after)
    floor_s, memory_s, compute_s = benchlib.floor_seconds(work, floor)
    for p in peers:
        p["x_floor"] = p["median_s"] / floor_s
    fastest_peer = min(p["median_s"] for p in peers[1:])
    machine["load_average_end"] = [round(x, 2) for x in os.getloadavg()]
    return {
        "machine": machine, "snapshot": work, "threads": ARGS.threads,
        "versions": {"numpy": np.__version__, "torch": torch.__version__,
                     "python": sys.version.split()[0]},
        "floor_probes": [floor_before, floor_after],
        "floor": {"seconds": floor_s, "memory_s": memory_s,
                  "compute_s": compute_s},
        "python_parse_s": parse_s, "peer_rope_mismatches": rope_mismatches,
        "peers": peers,
        "fastest_peer_over_check": fastest_peer / peers[0]["median_s"],
    }


def fmt_agreement(a):
    if isinstance(a, str):
        return a
    parts = [f"out {a['out_max_abs']:.2e}"]
    if "lse_max_abs" in a:
        parts.append(f"lse {a['lse_max_abs']:.2e}")
    return ", ".join(parts)


def print_results(r):
    m, w, f = r["machine"], r["snapshot"], r["floor"]
    fl = benchlib.best_floor(*r["floor_probes"])
    print(f"machine: {m['cpu']}, {m['cores']} cores, {m['isa']}, "
          f"{r['threads']} threads; load average {m['load_average']} at "
          f"start, {m['load_average_end']} at the end")
    print(f"snapshot: {w['file']} B={w['batch']} Hq={w['q_heads']} "
          f"Hkv={w['kv_heads']} D={w['head_dim']} tokens={w['tokens']} "
          f"KV {w['kv_bytes'] / 2**20:.1f} MiB {w['kv_dtype']}")
    print(f"floor probes (best of 2 runs): read "
          f"{fl['read_bytes_per_second'] / 1e9:.2f} GB/s, fp64 "
          f"{fl['fp64_flops_per_second'] / 1e9:.1f} GFLOP/s, fp32 "
          f"{fl['fp32_flops_per_second'] / 1e9:.1f} GFLOP/s")
    print(f"floor: memory {f['memory_s'] * 1e3:.2f} ms, compute "
          f"{f['compute_s'] * 1e3:.2f} ms -> {f['seconds'] * 1e3:.2f} ms")
    print(f"python parse of the file (not in the peers' times): "
          f"{r['python_parse_s'] * 1e3:.1f} ms; peer RoPE vs attnaudit's "
          f"post-RoPE q: {r['peer_rope_mismatches']} elements differ")
    print("\n| peer | median (ms) | min (ms) | runs | x floor | "
          "agreement with R (max abs) |\n|---|---|---|---|---|---|")
    for p in r["peers"]:
        print(f"| {p['peer']} | {p['median_s'] * 1e3:.1f} | "
              f"{p['min_s'] * 1e3:.1f} | {p['runs']} | {p['x_floor']:.1f} | "
              f"{fmt_agreement(p['agreement'])} |")
    print(f"\nfastest peer / attnaudit check: "
          f"{r['fastest_peer_over_check']:.2f}x (check's report arrives at "
          f"{r['peers'][0]['report_median_s'] * 1e3:.1f} ms, median)")


if __name__ == "__main__":
    main()
