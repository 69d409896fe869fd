"""torch's CPU flash attention at realistic shapes (engines/realistic.py).

`aten._scaled_dot_product_flash_attention_for_cpu` with its LSE, one call
per row over the row's K/V gathered from a shuffled page pool through the
block table (engines/torch_flash.py's flash_decode and PagedRows), so page
bugs are real reads of the pool. RoPE is the model code's: fp32 angles from
the model's inverse frequencies (transformers' RoPE init functions), fp32
rotation, one cast (cast point "after_rope", the preset's).

Extra engine bug for the pre-RoPE long-position catalogue:
  bf16-running-output  the row's keys in splits of 512, each split's flash
                       output merged into a running output kept in bf16
                       (LSE in fp32): a precision bug, `low-precision`
"""

from __future__ import annotations

import functools
import math
from typing import Any, Dict, Optional

from . import realistic as R
from . import torch_flash as TF
from .common import Capture, Unsupported, gqa_mod_order, moved_heads, page_rows

ENGINE = "torch-flash-cpu"
ARCHS = ("llama3-8b", "qwen2-7b", "qwen3-8b", "mha-7b", "gemma3-27b", "phi3-mini")
SPLIT = 512




def model_inv_freq(a: R.Arch):
    """The model's fp32 inverse frequencies, as transformers computes them."""
    return _model_inv_freq(a.name).clone()


@functools.lru_cache(maxsize=None)
def _model_inv_freq(name: str, theta: Optional[float] = None, scaling: Any = "model"):
    a = R.ARCHS[name]
    from .realistic_hf import make_config
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    import torch
    cfg = make_config(R.ARCHS[a.name], "eager", theta=theta, scaling=scaling)
    params = cfg.rope_parameters
    if "full_attention" in params:       # Gemma3: per layer type
        params = params["full_attention"]
        kind = params.get("rope_type", "default")
        base = params["rope_theta"]
        if kind == "default":
            return 1.0 / (base ** (torch.arange(0, a.D, 2, dtype=torch.int64)
                                   .to(torch.float32) / a.D))
    kind = params.get("rope_type", "default")
    if kind == "default":
        base = params["rope_theta"]
        rd = int(a.D * params.get("partial_rotary_factor", 1.0))
        return 1.0 / (base ** (torch.arange(0, rd, 2, dtype=torch.int64)
                               .to(torch.float32) / rd))
    inv, _ = ROPE_INIT_FUNCTIONS[kind](cfg, None)
    return inv.to(torch.float32)


def flash_rows(q, pool, k_pool, v_pool, block_table, seq_lens, scale, head_order=None,
               v_from_k=False, lse_base2=False, running_bf16=False):
    import torch
    outs, lses = [], []
    for b in range(int(q.shape[0])):
        L = int(seq_lens[b])
        k = pool.gather(k_pool, b, block_table, L)
        v = k if v_from_k else pool.gather(v_pool, b, block_table, L)
        if running_bf16:
            out, lse = None, None
            for s in range(0, L, SPLIT):
                o_c, l_c = TF.flash_decode(q[b], k[s:s + SPLIT], v[s:s + SPLIT], scale,
                                           head_order)
                o_c = o_c.float()
                if out is None:
                    out, lse = o_c.to(torch.bfloat16), l_c
                    continue
                new = torch.logaddexp(lse, l_c)
                merged = out.float() * torch.exp(lse - new)[:, None] + \
                    o_c * torch.exp(l_c - new)[:, None]
                out, lse = merged.to(torch.bfloat16), new     # the bug: bf16 between splits
            out = out.to(q.dtype)
        else:
            out, lse = TF.flash_decode(q[b], k, v, scale, head_order)
        outs.append(out)
        lses.append(lse * (1 / math.log(2)) if lse_base2 else lse)
    return torch.stack(outs), torch.stack(lses)


def _pass(spec: R.RSpec, d: R.Draw, data: R.Data, bug: Optional[str], inv):
    import torch
    a = d.arch
    engine_inv = inv
    q_shift = 1 if bug == "rope-offset" else 0
    q_post = torch.stack([TF.rotate(data.q[b:b + 1], d.qpos[b:b + 1] + q_shift, engine_inv)[0]
                          for b in range(d.B)])
    k_post = []
    for b, L in enumerate(d.lens):
        kb = TF.rotate(data.k[b], d.positions[b, :L], engine_inv)
        if bug == "k-rope-twice":
            kb = TF.rotate(kb, d.positions[b, :L], engine_inv)
        k_post.append(kb)
    pool = page_rows(k_post, list(data.v), d.page, "nhd", R._rng(spec, "pool"),
                     extra_pages=R.extra_pages(spec))
    pre_pool = page_rows(list(data.k), list(data.v), d.page, "nhd", R._rng(spec, "pool"),
                         extra_pages=R.extra_pages(spec))
    kw: Dict[str, Any] = {}
    k_pool, v_pool = pool.k_pool, pool.v_pool
    table, lens = pool.block_table.clone(), pool.seq_lens.clone()
    scale = a.scale
    location = None
    g = R._rng(spec, "bug")
    P = d.page
    nblocks = [(L + P - 1) // P for L in d.lens]

    def pick(items):
        return items[int(torch.randint(len(items), (), generator=g))]
    if bug == "lse-base":
        kw["lse_base2"] = True
    elif bug == "v-from-k":
        kw["v_from_k"] = True
    elif bug == "gqa-mapping":
        if a.H == a.Hkv or a.Hkv == 1:
            raise Unsupported("no GQA mapping to get wrong (MHA, or one KV head)")
        kw["head_order"] = gqa_mod_order(a.H, a.Hkv)
        location = {"heads": moved_heads(a.H, a.Hkv)}
    elif bug == "wrong-scale":
        scale = 1.0 / a.D
    elif bug == "bf16-running-output":
        kw["running_bf16"] = True
    elif bug == "stale-page":
        row = pick(list(range(d.B)))
        block = pick(list(range(nblocks[row])))
        page = pool.page_of(row, block)
        k_pool, v_pool = k_pool.clone(), v_pool.clone()
        k_pool[page] = torch.randn(k_pool[page].shape, generator=g).to(k_pool.dtype)
        v_pool[page] = torch.randn(v_pool[page].shape, generator=g).to(v_pool.dtype)
        location = {"row": row, "logical_block": block, "page": page}
    elif bug == "duplicate-page":
        rows = [b for b in range(d.B) if nblocks[b] >= 2]
        row = pick(rows)
        block = pick(list(range(1, nblocks[row])))
        table[row, block] = pool.block_table[row, block - 1]
        location = {"row": row, "logical_block": block, "page": pool.page_of(row, block)}
    elif bug == "foreign-page":
        row = pick(list(range(d.B)))
        other = pick([b for b in range(d.B) if b != row])
        block = pick(list(range(min(nblocks[row], nblocks[other]))))
        table[row, block] = pool.block_table[other, block]
        location = {"row": row, "logical_block": block}
    elif bug == "seq-len-off-by-one":
        delta = -1 if spec.variant == "-1" else 1
        rows = [b for b in range(d.B) if delta < 0 or d.lens[b] % P]
        if not rows:
            raise Unsupported("no slot past a row's end in its last block")
        row = pick(rows)
        lens[row] += delta
        location = {"row": row}
    elif bug not in (None, "rope-offset", "k-rope-twice"):
        raise ValueError(f"realistic torch-flash-cpu: no injection for {bug!r}")
    out, lse = flash_rows(q_post, pool, k_pool, v_pool, table, lens, scale, **kw)
    return {"out": out, "lse": lse, "q_post": q_post, "pool": pool, "pre_pool": pre_pool,
            "location": location}


def capture(spec: R.RSpec) -> Capture:
    import torch
    torch.set_num_threads(1)
    if spec.dtype.startswith("fp8"):
        raise Unsupported("torch's CPU flash attention takes no fp8 K/V")
    d = R.draw(spec, ARCHS, page_choices=(16, 32, 128),
               table_choices=(None, "inv_freq"), small_heads=R.small_heads)
    a = d.arch
    dtype = R_dtype(spec.dtype)
    inv = model_inv_freq(a)
    bug = spec.bug if spec.kind != "clean" else None
    # The data and the clean pass are shared with the other cases of the
    # seed that have the same memo key (their clean twins included).
    memo = R.memo_get(spec, d)
    if memo is not None:
        data, clean = memo
    else:
        data = R.make_data(spec, d, dtype, inv.double())
        clean = _pass(spec, d, data, None, inv)
        R.memo_put(spec, d, (data, clean))
    run = _pass(spec, d, data, bug, inv) if bug else clean
    info: Dict[str, Any] = {"draw": d.describe(), "design": data.design, "host": R.host()}
    if bug:
        info["bug_effect"] = float((run["out"].double() - clean["out"].double()).abs().max())
        info["bug_effect_lse"] = float((run["lse"].double() - clean["lse"].double()).abs().max())
    mode = spec.mode
    snap_pool = run["pre_pool"] if mode == "pre-qk" else run["pool"]
    args: Dict[str, Any] = dict(
        q=data.q if mode in ("pre-q", "pre-qk") else run["q_post"],
        k_cache=snap_pool.k_pool, v_cache=snap_pool.v_pool, layout="nhd",
        block_table=run["pool"].block_table, seq_lens=run["pool"].seq_lens,
        key_positions=d.positions, query_positions=d.qpos, engine=ENGINE,
        softmax_scale=a.scale, engine_out=run["out"], engine_lse=run["lse"], lse_base="e",
        rope=a.rope_config() | {"q_state": "pre" if mode in ("pre-q", "pre-qk") else "post",
                                "k_state": "pre" if mode == "pre-qk" else "post"},
        labels={"model": a.name, "engine": ENGINE,
                "backend": "aten._scaled_dot_product_flash_attention_for_cpu",
                "layer": 0, "step": spec.seed})
    if mode == "post+rolling":
        args["pre_rope_q"] = data.q
        args["pre_rope_k"] = torch.stack([data.k[b][L - 1] for b, L in enumerate(d.lens)])
    if d.table == "inv_freq":
        args["rope_table"] = {"inv_freq": inv}
    info["declaration"] = R.declare(args, spec, {"output_rounding": "nearest_even",
                                                 "rope_rounding": "nearest_even"})
    return Capture(args=args, location=run["location"], info=info)


def R_dtype(name: str):
    import torch
    return {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}[name]
