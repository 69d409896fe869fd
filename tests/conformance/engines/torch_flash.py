"""torch's CPU flash attention, with its LSE.

`torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v,
dropout_p, is_causal, attn_mask=None, scale=...)` returns (out [B, H, Lq, D],
logsumexp [B, H, Lq] fp32, natural log): one of the few CPU kernels that
returns an LSE, so the page and LSE bugs can be told apart here.

A decode step: Lq = 1 over the row's whole K/V (is_causal False), GQA by
repeating the KV heads for the call, one call per row (rows have their own
lengths). The "engine" pages its cache: K/V live in a shuffled page pool
(page 16, NHD) and are gathered through the block table before the call,
so page bugs (a stale page, a duplicated or foreign block-table entry, a
wrong sequence length) are real reads of the pool.

RoPE is not torch's (it has none): q and K are rotated in fp32 with one
cast at the end (cast point "after_rope", the preset's), with the model's
RoPE (Llama 3 style, theta 500000, llama3 scaling), so every mode runs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Dict, Optional, Tuple

from .common import (Capture, CaseSpec, PagedRows, Unsupported, base_generator,
                     generator, gqa_mod_order, moved_heads, page_rows,
                     rope_declaration, torch_dtype)

ENGINE = "torch-flash-cpu"
PAGE = 16


@dataclass(frozen=True)
class Model:
    H: int = 8
    Hkv: int = 2
    D: int = 64
    lens: Tuple[int, ...] = (30, 47)
    theta: float = 500000.0
    offset: int = 50000
    q_gain: float = 1.0

    @property
    def scale(self) -> float:
        return self.D ** -0.5

    def rope_config(self) -> Dict[str, Any]:
        return {"theta": self.theta, "style": "neox", "rotary_dim": self.D,
                "scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                            "high_freq_factor": 4.0,
                            "original_max_position_embeddings": 8192}}


MODELS = {"llama": Model()}


# ----------------------------------------------------------------------
# RoPE (fp32, one cast): the engine's model code, not a kernel under test
# ----------------------------------------------------------------------


def llama3_inv_freq(m: Model):
    """Llama 3 scaled inverse frequencies, fp32, as HF / vLLM compute them."""
    import torch
    inv = 1.0 / (m.theta ** (torch.arange(0, m.D, 2, dtype=torch.float32) / m.D))
    factor, low, high, orig = 8.0, 1.0, 4.0, 8192
    wavelen = 2 * math.pi / inv
    smooth = (orig / wavelen - low) / (high - low)
    return torch.where(wavelen < orig / high, inv,
                       torch.where(wavelen > orig / low, inv / factor,
                                   (1 - smooth) * inv / factor + smooth * inv))


def rotate(x, positions, inv_freq):
    """NeoX rotation of x [T, H, D] at positions [T]: fp32 angles, cos/sin
    and rotation, one cast back to x's dtype."""
    import torch
    ang = positions.to(torch.float32)[:, None] * inv_freq[None, :]
    cos, sin = ang.cos()[:, None, :], ang.sin()[:, None, :]
    xf = x.to(torch.float32)
    half = x.shape[-1] // 2
    x1, x2 = xf[..., :half], xf[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1).to(x.dtype)


# ----------------------------------------------------------------------
# The kernel
# ----------------------------------------------------------------------


def flash_decode(q, k, v, scale: float, head_order=None):
    """One row: q [H, D], k/v [L, Hkv, D] -> (out [H, D], lse [H] fp32)."""
    import torch
    H, Hkv = int(q.shape[0]), int(k.shape[1])
    if head_order is not None:
        q = q[head_order]
    qq = q[None, :, None, :]                                   # [1, H, 1, D]
    kk = k.transpose(0, 1).repeat_interleave(H // Hkv, dim=0)[None]  # [1, H, L, D]
    vv = v.transpose(0, 1).repeat_interleave(H // Hkv, dim=0)[None]
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        qq.contiguous(), kk.contiguous(), vv.contiguous(), 0.0, False,
        attn_mask=None, scale=scale)
    out, lse = out[0, :, 0], lse[0, :, 0]
    if head_order is not None:
        fixed_out, fixed_lse = torch.empty_like(out), torch.empty_like(lse)
        fixed_out[head_order], fixed_lse[head_order] = out, lse
        out, lse = fixed_out, fixed_lse
    return out, lse


@dataclass
class Engine:
    """What the engine reads for each row (a bug changes it)."""

    q: Any                     # [B, H, D] post-RoPE
    pool: PagedRows            # the cache
    k_pool: Any
    v_pool: Any
    block_table: Any
    seq_lens: Any
    scale: float
    head_order: Optional[list] = None
    v_from_k: bool = False
    lse_base2: bool = False

    def run(self):
        import torch
        outs, lses = [], []
        for b in range(int(self.q.shape[0])):
            L = int(self.seq_lens[b])
            k = self.pool.gather(self.k_pool, b, self.block_table, L)
            v = k if self.v_from_k else self.pool.gather(self.v_pool, b, self.block_table, L)
            out, lse = flash_decode(self.q[b], k, v, self.scale, self.head_order)
            outs.append(out)
            lses.append(lse * (1 / math.log(2)) if self.lse_base2 else lse)
        return torch.stack(outs), torch.stack(lses)


BUGS = {None, "rope-offset", "k-rope-twice", "lse-base", "v-from-k", "gqa-mapping",
        "wrong-scale", "stale-page", "duplicate-page", "foreign-page",
        "seq-len-off-by-one"}


def capture(spec: CaseSpec) -> Capture:
    """Runs one case on torch's CPU flash attention (module docstring)."""
    import torch
    torch.set_num_threads(1)
    if spec.dtype.startswith("fp8"):
        raise Unsupported("torch's CPU flash attention takes no fp8 K/V")
    m = MODELS[spec.model]
    dtype = torch_dtype(spec.dtype)
    offset = m.offset if spec.offset is None else spec.offset
    g = base_generator(spec, 1)
    B = len(m.lens)
    q_pre = (torch.randn(B, m.H, m.D, generator=g) * m.q_gain).to(dtype)
    k_pre = [torch.randn(L, m.Hkv, m.D, generator=g).to(dtype) for L in m.lens]
    v = [torch.randn(L, m.Hkv, m.D, generator=g).to(dtype) for L in m.lens]
    T = max(m.lens)
    positions = torch.stack([offset + 13 * b + torch.arange(T) for b in range(B)])
    qpos = torch.tensor([int(positions[b, L - 1]) for b, L in enumerate(m.lens)])

    if spec.bug not in BUGS:
        raise Unsupported(f"{spec.bug}: not injected on this engine")
    inv = llama3_inv_freq(m)
    q_shift = 1 if spec.bug == "rope-offset" else 0      # q rotated at position + 1
    q_post = torch.stack([rotate(q_pre[b:b + 1], qpos[b:b + 1] + q_shift, inv)[0]
                          for b in range(B)])
    k_post = []
    for b, L in enumerate(m.lens):
        kb = rotate(k_pre[b], positions[b, :L], inv)
        if spec.bug == "k-rope-twice":
            kb = rotate(kb, positions[b, :L], inv)
        k_post.append(kb)

    pool = page_rows(k_post, v, PAGE, "nhd", base_generator(spec, 2))
    pre_pool = page_rows(k_pre, v, PAGE, "nhd", base_generator(spec, 2))
    engine = Engine(q=q_post, pool=pool, k_pool=pool.k_pool, v_pool=pool.v_pool,
                    block_table=pool.block_table.clone(), seq_lens=pool.seq_lens.clone(),
                    scale=m.scale)
    location = inject(spec, engine, pool, m)
    out, lse = engine.run()

    mode = spec.mode
    snap_pool = pre_pool if mode == "pre-qk" else pool
    args: Dict[str, Any] = dict(
        q=q_pre if mode in ("pre-q", "pre-qk") else q_post,
        k_cache=snap_pool.k_pool, v_cache=snap_pool.v_pool, layout="nhd",
        block_table=pool.block_table, seq_lens=pool.seq_lens,
        key_positions=positions, query_positions=qpos, engine=ENGINE,
        softmax_scale=m.scale, engine_out=out, engine_lse=lse, lse_base="e",
        rope=rope_declaration(m.rope_config(), mode),
        labels={"model": "llama-like", "engine": ENGINE,
                "backend": "aten._scaled_dot_product_flash_attention_for_cpu",
                "layer": 0, "step": 0})
    if mode == "post+rolling":
        args["pre_rope_q"] = q_pre
        args["pre_rope_k"] = torch.stack([k_pre[b][L - 1] for b, L in enumerate(m.lens)])
    if spec.rope_table == "inv_freq":
        args["rope_table"] = {"inv_freq": inv}
    return Capture(args=args, location=location, info={"offset": offset})


def inject(spec: CaseSpec, e: Engine, pool: PagedRows, m: Model):
    """The engine-side bugs of this engine; returns the truth location."""
    import torch
    bug, row = spec.bug, 1
    if bug in (None, "k-rope-twice", "rope-offset"):
        return None
    if bug == "lse-base":
        e.lse_base2 = True
        return None
    if bug == "v-from-k":
        e.v_from_k = True
        return None
    if bug == "gqa-mapping":
        e.head_order = gqa_mod_order(m.H, m.Hkv)
        return {"heads": moved_heads(m.H, m.Hkv)}
    if bug == "wrong-scale":
        e.scale = 1.0 / m.D            # 1/D instead of 1/sqrt(D)
        return None
    if bug == "stale-page":
        block = 2
        page = pool.page_of(row, block)
        g = generator(spec, 3)
        e.k_pool, e.v_pool = pool.k_pool.clone(), pool.v_pool.clone()
        e.k_pool[page] = torch.randn(e.k_pool[page].shape, generator=g).to(e.k_pool.dtype)
        e.v_pool[page] = torch.randn(e.v_pool[page].shape, generator=g).to(e.v_pool.dtype)
        return {"row": row, "logical_block": block, "page": page}
    if bug == "duplicate-page":
        e.block_table[row, 2] = pool.block_table[row, 1]
        return {"row": row, "logical_block": 2, "page": pool.page_of(row, 2)}
    if bug == "foreign-page":
        e.block_table[row, 1] = pool.block_table[0, 1]
        return {"row": row, "logical_block": 1}
    if bug == "seq-len-off-by-one":
        delta = -1 if spec.variant == "-1" else 1
        e.seq_lens[row] += delta
        return {"row": row}
    raise ValueError(f"torch-flash-cpu: no injection for bug {bug!r}")
