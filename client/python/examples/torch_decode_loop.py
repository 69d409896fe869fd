#!/usr/bin/env python3
"""A self-contained decode loop with a paged KV cache that audits itself.

A toy engine in torch (CPU): a few attention layers with random weights, a
vLLM-style paged KV cache per layer ([2, num_blocks, block_size, Hkv, D],
bf16), a block allocator that hands out pages in random order, NeoX RoPE
applied before the cache write (K is cached post-RoPE, as vLLM and SGLang
do), and a decode attention that computes in fp32 and writes a bf16 output
and a natural-log LSE. Every layer of every step offers its attention call to
an attnaudit.RolloutAuditor; sampled calls are built with
Snapshot.from_paged_kv from the very tensors the engine holds and audited by
attnaudit-server in the background. With --fault stale-page the engine, from
step --fault-step on, reads one page as it was before the last writes (a
stale copy), which the audits catch.

Run it against a server you started, or let it start one:

    build/bin/attnaudit-server &                       # localhost:50051
    python client/python/examples/torch_decode_loop.py --addr localhost:50051
    python client/python/examples/torch_decode_loop.py \\
        --server build/bin/attnaudit-server --fault stale-page

Needs torch (the bench venv has it: make bench-python).
"""

from __future__ import annotations

import argparse
import math
import os
import re
import subprocess
import sys
import tempfile
import time

import torch

import attnaudit


class PagedKvCache:
    """One layer's cache in vLLM's FlashAttention layout."""

    def __init__(self, num_blocks, block_size, kv_heads, head_dim):
        self.kv = torch.zeros(2, num_blocks, block_size, kv_heads, head_dim,
                              dtype=torch.bfloat16)
        self.block_size = block_size


class Allocator:
    """Hands out pages in a random order, like a long-running engine's free
    list."""

    def __init__(self, num_blocks, generator):
        self.free = torch.randperm(num_blocks, generator=generator).tolist()

    def take(self):
        return self.free.pop()


def rope(x, positions, theta):
    """NeoX rotate-half RoPE in fp32, one cast back (what engines do)."""
    d = x.shape[-1]
    inv_freq = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float32) / d)
    angles = positions.to(torch.float32)[:, None] * inv_freq[None, :]  # [T, d/2]
    cos, sin = angles.cos()[:, None, :], angles.sin()[:, None, :]
    xf = x.float()
    x1, x2 = xf[..., : d // 2], xf[..., d // 2:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)


def decode_attention(q, cache, block_table, seq_lens, scale, stale=None):
    """The toy engine's kernel: gathers each row's keys page by page and
    computes softmax attention in fp32. Returns (out [B, Hq, D] bf16,
    lse [B, Hq] fp32, natural log). `stale` = (page, old K/V) makes it read
    that page's old contents."""
    B, Hq, D = q.shape
    Hkv = cache.kv.shape[3]
    P = cache.block_size
    out = torch.empty(B, Hq, D, dtype=torch.bfloat16)
    lse = torch.empty(B, Hq, dtype=torch.float32)
    for b in range(B):
        L = int(seq_lens[b])
        pages = block_table[b, : (L + P - 1) // P]
        k = cache.kv[0, pages].reshape(-1, Hkv, D)[:L].float()
        v = cache.kv[1, pages].reshape(-1, Hkv, D)[:L].float()
        if stale is not None:
            page, old = stale
            for j, p in enumerate(pages.tolist()):
                if p == page:
                    n = min(P, L - j * P)
                    k[j * P: j * P + n] = old[0, :n].float()
                    v[j * P: j * P + n] = old[1, :n].float()
        group = Hq // Hkv
        k = k.repeat_interleave(group, dim=1)  # [L, Hq, D]
        v = v.repeat_interleave(group, dim=1)
        s = torch.einsum("hd,lhd->hl", q[b].float(), k) * scale
        lse[b] = torch.logsumexp(s, dim=-1)
        out[b] = torch.einsum("hl,lhd->hd", torch.softmax(s, dim=-1), v).to(torch.bfloat16)
    return out, lse


def start_server(binary):
    data = tempfile.mkdtemp(prefix="attnaudit_example_")
    log = open(os.path.join(data, "server.log"), "wb")
    proc = subprocess.Popen([binary, "--listen", "127.0.0.1:0", "--metrics-listen",
                             "127.0.0.1:0", "--data-dir", os.path.join(data, "db")],
                            stderr=log)
    for _ in range(400):
        with open(log.name, "rb") as f:
            m = re.search(rb'"grpc listening" addr=(127\.0\.0\.1:\d+)', f.read())
        if m:
            return proc, m.group(1).decode()
        time.sleep(0.05)
    proc.kill()
    sys.exit("attnaudit-server did not start; see " + log.name)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--addr", help="a running attnaudit-server (HOST:PORT)")
    ap.add_argument("--server", help="path of attnaudit-server to start instead")
    ap.add_argument("--steps", type=int, default=48)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--prompt", type=int, default=100, help="tokens before decoding")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--sample-every", type=int, default=8)
    ap.add_argument("--max-in-flight", type=int, default=0,
                    help="snapshots held at once (default: one per layer)")
    ap.add_argument("--fault", choices=["none", "stale-page"], default="none")
    ap.add_argument("--fault-step", type=int, default=24)
    args = ap.parse_args()

    proc = None
    addr = args.addr
    if addr is None:
        if not args.server:
            sys.exit("give --addr HOST:PORT or --server PATH")
        proc, addr = start_server(args.server)

    g = torch.Generator().manual_seed(0)
    B, Hq, Hkv, D, P, theta = args.batch, 8, 2, 64, 16, 10000.0
    scale = 1.0 / math.sqrt(D)
    max_len = args.prompt + args.steps
    blocks_per_row = (max_len + P - 1) // P
    num_blocks = B * blocks_per_row + 8
    caches = [PagedKvCache(num_blocks, P, Hkv, D) for _ in range(args.layers)]
    alloc = Allocator(num_blocks, g)
    block_table = torch.full((B, blocks_per_row), -1, dtype=torch.int32)
    seq_lens = torch.zeros(B, dtype=torch.int32)
    hidden = torch.randn(B, Hq * D, generator=g)
    w_q = [torch.randn(Hq * D, Hq * D, generator=g) / math.sqrt(Hq * D) for _ in caches]
    w_kv = [torch.randn(Hq * D, 2 * Hkv * D, generator=g) / math.sqrt(Hq * D) for _ in caches]

    client = attnaudit.AuditClient(addr)
    client.wait_for_ready(20)
    # One slot per layer: a sampled step audits every layer. With fewer
    # slots the auditor drops what it cannot hold (counters.dropped).
    auditor = attnaudit.RolloutAuditor(client, sample_every=args.sample_every,
                                       max_in_flight=args.max_in_flight or args.layers)
    stale_page = None
    try:
        for t in range(max_len):
            decoding = t >= args.prompt
            positions = torch.full((B,), t, dtype=torch.int64)
            for b in range(B):  # a new token: maybe a new page
                if t % P == 0:
                    block_table[b, t // P] = alloc.take()
            seq_lens += 1
            slot_pages = block_table[:, t // P].long()
            x = hidden
            for layer, cache in enumerate(caches):
                q = (x @ w_q[layer]).view(B, Hq, D).to(torch.bfloat16)
                kv = (x @ w_kv[layer]).view(B, 2, Hkv, D).to(torch.bfloat16)
                q = rope(q, positions, theta)
                k = rope(kv[:, 0], positions, theta)
                if args.fault == "stale-page" and layer == 1 and t == args.fault_step + args.prompt:
                    # Keep row 0's current page as it is now, before this write.
                    page = int(slot_pages[0])
                    stale_page = (page, cache.kv[:, page].clone())
                cache.kv[0, slot_pages, t % P] = k
                cache.kv[1, slot_pages, t % P] = kv[:, 1]
                stale = stale_page if layer == 1 else None
                out, lse = decode_attention(q, cache, block_table, seq_lens, scale, stale)
                if decoding:
                    auditor.step(
                        lambda: attnaudit.Snapshot.from_paged_kv(
                            q, cache.kv, None, block_table, seq_lens, layout="vllm",
                            softmax_scale=scale, engine_out=out, engine_lse=lse,
                            lse_base="e", labels={"model": "toy", "engine": "torch-example",
                                                  "backend": "naive"}),
                        layer=layer, step=t - args.prompt)
                x = x + out.float().view(B, Hq * D)
            hidden = torch.tanh(x)
        auditor.flush(120)
    finally:
        auditor.close()
        client.close()
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=30)

    c = auditor.counters
    print(f"steps={c.steps} sampled={c.sampled} sent={c.sent} dropped={c.dropped} "
          f"passed={c.passed} drifted={c.drifted} failed={c.failed} invalid={c.invalid}")
    for r in auditor.results():
        line = f"step {r.step:3d} layer {r.layer}: {r.verdict.name if r.verdict else r.error}"
        if r.report is not None and r.report.drifted:
            line += "  " + "; ".join(r.report.reasons[:2])
        print(line)
    return 0 if c.failed == 0 and c.invalid == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
