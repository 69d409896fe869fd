"""vLLM's CPU attention at realistic shapes (engines/realistic.py).

Engines:
  vllm-cpu          vLLM's own bf16 / f16 / f32 path on this host: RoPE with
                    `rotary_embedding`, the cache with
                    `cpu_attn_reshape_and_cache`, the decode with
                    `cpu_attn_get_scheduler_metadata` (split-KV enabled, as
                    VLLM_CPU_ATTN_SPLIT_KV defaults, with the draw's OMP
                    thread count: more than one thread splits rows) and
                    `cpu_attention_with_kv_cache`. On a CPU without
                    AVX512_BF16 its fp32 -> bf16 narrowing truncates (the
                    capture measures it and records it)
  vllm-cpu-emu-rtz  the same kernels run in fp32 on the bf16 values, every
                    narrowing to bf16 (RoPE output, attention output) done
                    toward zero in software: the truncating path on any CPU
  vllm-cpu-emu-rne  the same, narrowing to nearest even: the AVX512_BF16
                    path on any CPU

Everything else is engines/vllm_cpu.py's (Cache, get_rope, rotate); the
snapshot is built from the engine's own cache with layout="vllm_cpu".
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Dict, Optional

from . import realistic as R
from . import vllm_cpu as V
from .common import Capture, Unsupported, unique_positions

ENGINES = ("vllm-cpu", "vllm-cpu-emu-rtz", "vllm-cpu-emu-rne")
ARCHS = ("llama3-8b", "qwen2-7b", "qwen3-8b", "mha-7b", "gemma2-9b", "gemma2-27b",
         "gptoss-20b")
ROPE_BUGS = ("rope-offset", "k-rope-twice", "rope-style", "rope-theta",
             "rope-scaling-ignored", "rope-partial-rotary")




def vmodel(a: R.Arch, d: R.Draw) -> V.Model:
    return V.Model(H=a.H, Hkv=a.Hkv, D=a.D, block=d.page, lens=d.lens, theta=a.theta,
                   neox=a.neox, rotary_dim=a.rotary_dim, scaling=a.scaling,
                   max_position=a.max_position, query_pre_attn_scalar=a.qpas,
                   softcap=a.softcap, window=a.window, sinks=a.sinks)


def inv_freq_of(rope):
    """The engine's fp32 inverse frequencies."""
    import torch
    arg = rope.scaling_factor if hasattr(rope, "mscale") else rope.base
    return rope._compute_inv_freq(arg).to(torch.float32)


def metadata_info(md) -> Dict[str, int]:
    """vLLM's AttentionMetadata header (csrc/cpu/cpu_attn_impl.hpp): the
    ISA, work items, and the KV splits the reduction merges."""
    a = md[64:88].view(__import__("torch").int32).tolist()
    return {"isa_code": a[0], "work_items": a[1], "split_rows": a[2], "kv_splits": a[3],
            "threads": a[4]}


class Engine:
    """One engine's arithmetic: vLLM in the model dtype (real), or in fp32
    with software narrowing (emulations)."""

    def __init__(self, engine: str, dtype_name: str, m: V.Model):
        import torch
        self.engine = engine
        self.emu = None if engine == "vllm-cpu" else engine.rsplit("-", 1)[1]  # rtz | rne
        if self.emu and dtype_name != "bf16":
            raise Unsupported(f"{engine}: emulates the bf16 narrowing (bf16 only)")
        self.dtype = V.torch_dtype(dtype_name)              # what the snapshot holds
        self.compute = torch.float32 if self.emu else self.dtype
        self.kv_dtype = V._kv_cache_dtype(dtype_name)
        self.m = m

    def narrow(self, x):
        if not self.emu:
            return x
        return R.to_bf16(x, "toward_zero" if self.emu == "rtz" else "nearest")

    def narrow_rope(self, x, neox: bool):
        """The RoPE op's narrowing: on a CPU without AVX512_BF16, vLLM's
        bf16 rotary_embedding truncates on its NeoX path and rounds to
        nearest on its GPT-J path (both measured bit for bit)."""
        if not self.emu:
            return x
        return R.to_bf16(x, "toward_zero" if self.emu == "rtz" and neox else "nearest")

    def rope(self, m: V.Model):
        rope = V.get_rope(m, self.compute)
        if self.emu:
            # vLLM's op casts its cos/sin cache to the model dtype (bf16).
            # get_rope returns a cached, shared object: change a copy.
            import copy
            import torch
            rope = copy.deepcopy(rope)
            rope.cos_sin_cache = rope.cos_sin_cache.to(torch.bfloat16).to(torch.float32)
        return rope

    def rotate(self, rope, pos, x, Hx):
        return self.narrow_rope(V.rotate(rope, pos, x.to(self.compute), Hx), rope.is_neox_style)

    def rotate_qk(self, rope, pos, q, k, H, Hkv):
        qq, kk = V.rotate_qk(rope, pos, q.to(self.compute), k.to(self.compute), H, Hkv)
        return (self.narrow_rope(qq, rope.is_neox_style),
                self.narrow_rope(kk, rope.is_neox_style))


def run_kernel(k: V.Kernel, cache: V.Cache, threads: int):
    """cpu_attention_with_kv_cache as vLLM's backend calls it, split-KV
    enabled, with `threads` OMP threads; (out, metadata info)."""
    import torch
    ops = V._ops()
    m = cache.m
    B = int(k.q.shape[0])
    q = k.q if k.head_order is None else k.q[:, k.head_order]
    q = q.contiguous()
    qsl = torch.arange(B + 1, dtype=torch.int32)
    kc, vc = cache.halves(k.kv)
    torch.set_num_threads(threads)
    try:
        md = ops.cpu_attn_get_scheduler_metadata(
            num_reqs=B, num_heads=m.H, num_kv_heads=m.Hkv, head_dim=m.D,
            seq_lens=k.seq_lens, dtype=q.dtype, query_start_loc=qsl, causal=True,
            sliding_window_size=k.window, isa=cache.isa, enable_kv_split=True,
            dynamic_causal=None, kv_cache_dtype=cache.kv_dtype)
        out = torch.empty_like(q)
        ops.cpu_attention_with_kv_cache(
            query=q, key_cache=kc, value_cache=vc, output=out, query_start_loc=qsl,
            seq_lens=k.seq_lens, scale=k.scale, causal=True, alibi_slopes=None,
            sliding_window=k.window, block_table=k.block_table,
            softcap=k.softcap, scheduler_metadata=md, s_aux=k.sinks,
            dynamic_causal=None, k_scale=k.k_scale, v_scale=k.v_scale,
            kv_cache_dtype=cache.kv_dtype)
    except RuntimeError as e:
        if "Unsupported CPU attention configuration" in str(e):
            raise Unsupported(f"vLLM's CPU kernels on this host: {e}") from None
        raise
    finally:
        torch.set_num_threads(1)
    if k.head_order is not None:
        fixed = torch.empty_like(out)
        fixed[:, k.head_order] = out
        out = fixed
    return out, metadata_info(md)


def _pass(spec: R.RSpec, d: R.Draw, data: R.Data, eng: Engine, m: V.Model,
          bug: Optional[str]):
    """One engine pass over the data, with `bug` (or clean): the engine's
    post-RoPE q, its cache (and a pre-RoPE twin), the kernel, the output."""
    import torch
    engine_m = m
    if bug == "rope-style":
        engine_m = replace(m, neox=not m.neox)
    elif bug == "rope-theta":
        engine_m = replace(m, theta=10000.0 if m.theta != 10000.0 else 500000.0)
    elif bug == "rope-scaling-ignored":
        engine_m = replace(m, scaling=None)
    elif bug == "rope-partial-rotary":
        engine_m = replace(m, rotary_dim=0)
    rope = eng.rope(engine_m)
    B = d.B
    q_post = torch.empty(B, m.H, m.D, dtype=eng.dtype)
    keys = []
    for b, L in enumerate(d.lens):
        pos = d.positions[b, :L]
        old = eng.rotate(rope, pos[:-1], data.k[b][:-1], m.Hkv)
        qb, kb = eng.rotate_qk(rope, pos[-1:], data.q[b:b + 1], data.k[b][-1:], m.H, m.Hkv)
        if bug == "rope-offset":
            qb = eng.rotate(rope, pos[-1:] + 1, data.q[b:b + 1], m.H)
        kk = torch.cat([old, kb])
        if bug == "k-rope-twice":
            kk = eng.rotate(rope, pos, kk, m.Hkv)
        keys.append(kk)
        q_post[b] = qb[0]
    # The cache, in the compute dtype (the emulations' fp32 cache holds
    # bf16 values exactly).
    cache = V.new_cache(m, eng.compute, eng.kv_dtype, R._rng(spec, "cache"),
                        extra_blocks=R.extra_pages(spec))
    pre_kv = cache.kv.clone()
    for b, L in enumerate(d.lens):
        slots = cache.slots(b, L)
        cache.write(keys[b].to(eng.compute), data.v[b].to(eng.compute), slots)
        cache.write(data.k[b].to(eng.compute), data.v[b].to(eng.compute), slots, kv=pre_kv)
    sinks = None
    if data.sinks is not None:
        sinks = data.sinks.to(torch.bfloat16 if eng.compute == torch.bfloat16
                              else torch.float32)
    kernel = V.Kernel(q=q_post.to(eng.compute), kv=cache.kv,
                      block_table=cache.block_table.clone(),
                      seq_lens=torch.tensor(d.lens, dtype=torch.int32), scale=m.scale,
                      softcap=m.softcap, window=m.window or -1, sinks=sinks,
                      k_scale=cache.k_scale, v_scale=cache.v_scale)
    location = inject(spec, bug, kernel, cache, d, eng) if bug else None
    out, md = run_kernel(kernel, cache, d.threads)
    return {"q_post": q_post, "cache": cache, "pre_kv": pre_kv, "rope": rope,
            "out": eng.narrow(out), "out_f32": out if eng.emu else None,
            "location": location, "metadata": md, "keys": keys}


def inject(spec: R.RSpec, bug: str, k: V.Kernel, cache: V.Cache, d: R.Draw,
           eng: Engine) -> Optional[Dict[str, Any]]:
    """The engine-side bug at a place drawn from the seed; the truth."""
    import torch
    m = cache.m
    g = R._rng(spec, "bug")
    if bug in ROPE_BUGS or bug == "layout":
        return None
    P = m.block
    nblocks = [(L + P - 1) // P for L in d.lens]
    table = cache.block_table
    # A page fault where the kernel reads: a window layer reads its last W
    # keys only, so the faulty block is drawn among the blocks that hold them.
    first = [max(0, L - m.window) // P if m.window else 0 for L in d.lens]

    def pick(items):
        return items[int(torch.randint(len(items), (), generator=g))]
    if bug == "stale-page":
        row = pick(list(range(d.B)))
        block = pick(list(range(first[row], nblocks[row])))
        page = int(table[row, block])
        kv = cache.kv.clone()
        slots = torch.arange(page * P, (page + 1) * P, dtype=torch.int64)
        cache.write(torch.randn(P, m.Hkv, m.D, generator=g).to(eng.dtype).to(eng.compute),
                    torch.randn(P, m.Hkv, m.D, generator=g).to(eng.dtype).to(eng.compute),
                    slots, kv=kv)
        k.kv = kv
        return {"row": row, "logical_block": block, "page": page}
    if bug == "duplicate-page":
        rows = [b for b in range(d.B) if nblocks[b] >= 2]
        if not rows:
            raise Unsupported("no row with two blocks")
        row = pick(rows)
        block = pick(list(range(max(1, first[row]), nblocks[row])))
        k.block_table[row, block] = table[row, block - 1]
        return {"row": row, "logical_block": block, "page": int(table[row, block])}
    if bug == "foreign-page":
        row = pick(list(range(d.B)))
        others = [b for b in range(d.B) if b != row]
        other = pick(others)
        hi = min(nblocks[row], nblocks[other])
        block = pick(list(range(min(first[row], hi - 1), hi)))
        k.block_table[row, block] = table[other, block]
        return {"row": row, "logical_block": block}
    if bug == "seq-len-off-by-one":
        delta = -1 if spec.variant == "-1" else 1
        rows = [b for b in range(d.B) if delta < 0 or d.lens[b] % P]
        if not rows:
            raise Unsupported("no slot past a row's end in its last block")
        row = pick(rows)
        k.seq_lens = k.seq_lens.clone()
        k.seq_lens[row] += delta
        return {"row": row}
    if bug == "v-from-k":
        kv = cache.kv.clone()
        for b, L in enumerate(d.lens):
            keys = V.k_of_cache(cache, b, L)
            cache.write(keys, keys, cache.slots(b, L), kv=kv)
        k.kv = kv
        return None
    if bug == "kv-heads-permuted":
        k.kv = cache.kv.flip(1).contiguous()
        return None
    if bug == "gqa-mapping":
        if m.H == m.Hkv or m.Hkv == 1:
            raise Unsupported("no GQA mapping to get wrong (MHA, or one KV head)")
        k.head_order = V.gqa_mod_order(m.H, m.Hkv)
        return {"heads": V.moved_heads(m.H, m.Hkv)}
    if bug == "wrong-scale":
        k.scale = m.scale * m.scale if spec.variant == "twice" else m.D ** -0.5
        return None
    if bug == "softcap-missing":
        if not m.softcap:
            raise Unsupported("no soft-cap")
        k.softcap = 0.0
        return None
    if bug == "sinks-missing":
        if k.sinks is None:
            raise Unsupported("no sinks")
        k.sinks = None
        return None
    if bug == "window-off-by-one":
        if not m.window:
            raise Unsupported("no window")
        k.window = m.window + (1 if spec.variant != "-1" else -1)
        return None
    if bug == "window-ignored":
        if not m.window:
            raise Unsupported("no window")
        k.window = -1
        return None
    raise ValueError(f"realistic vllm-cpu: no injection for {bug!r}")


def narrowing_of(out, out_ref64) -> Dict[str, float]:
    """How the engine's bf16 output relates to the exact result: the share
    of elements equal to it rounded to nearest, and truncated."""
    import torch
    r = out_ref64.to(torch.float32)
    near = r.to(torch.bfloat16)
    trunc = R.to_bf16(r, "toward_zero")
    return {"equal_nearest": float((out == near).float().mean()),
            "equal_truncated": float((out == trunc).float().mean())}


def reference64(d: R.Draw, m: V.Model, q_post, keys, v, sinks=None):
    """fp64 attention over the engine's own post-RoPE q and keys (for the
    narrowing measurement only)."""
    import torch
    outs = []
    group = m.H // m.Hkv
    for b, L in enumerate(d.lens):
        lo = max(0, L - m.window) if m.window else 0
        qq = q_post[b].double()
        kk = keys[b][lo:L].double().repeat_interleave(group, 1)
        vv = v[b][lo:L].double().repeat_interleave(group, 1)
        s = torch.einsum("hd,lhd->hl", qq, kk) * m.scale
        if m.softcap:
            s = m.softcap * torch.tanh(s / m.softcap)
        if sinks is not None:
            s = torch.cat([s, sinks.double()[:, None]], 1)
        p = torch.softmax(s, -1)[:, : L - lo]
        outs.append(torch.einsum("hl,lhd->hd", p, vv))
    return torch.stack(outs)


def capture(spec: R.RSpec) -> Capture:
    import torch
    V._ops()
    if spec.engine not in ENGINES:
        raise ValueError(spec.engine)
    if spec.dtype.startswith("fp8") and "avx512f" not in R.host()["flags"]:
        raise Unsupported("host: fp8 KV: vLLM's CPU backend needs AVX-512 or AMX "
                          "(_get_attn_isa raises; the kernel has no fp8 path for "
                          "this ISA)")
    archs = ARCHS if spec.bug != "rope-partial-rotary" else ("partial-gptj",)
    d = R.draw(spec, archs, page_choices=(16, 32, 128), thread_choices=(1, 4, 8),
               table_choices=(None, "inv_freq", "rows"), small_heads=R.small_heads)
    m = vmodel(d.arch, d)
    if spec.bug in ("window-off-by-one", "window-ignored") and not m.window:
        raise Unsupported("the drawn layer has no window")
    if spec.dtype.startswith("fp8") and m.block % 32:
        m = replace(m, block=32)
    eng = Engine(spec.engine, spec.dtype, m)
    bug = spec.bug if spec.kind != "clean" else None
    # The data and the clean pass are shared with the other cases of the
    # seed that have the same memo key (their clean twins included).
    memo = R.memo_get(spec, d)
    if memo is not None:
        data, clean, narrowing = memo
    else:
        rope0 = eng.rope(m)
        inv64 = inv_freq_of(rope0).double()
        data = R.make_data(spec, d, eng.dtype, inv64)
        clean = _pass(spec, d, data, eng, m, None)
        narrowing = None
    run = _pass(spec, d, data, eng, m, bug) if bug else clean
    info: Dict[str, Any] = {"draw": d.describe(), "design": data.design,
                            "metadata": run["metadata"], "isa": run["cache"].isa,
                            "host": R.host()}
    if bug:
        info["bug_effect"] = float((run["out"].double() - clean["out"].double()).abs().max())
    # The narrowing this run shows (bf16 only; clean runs): the engine's
    # output against the exact attention over its own q and keys.
    if narrowing is not None:
        info["narrowing"] = narrowing
    elif spec.dtype == "bf16":
        b = min(range(d.B), key=lambda i: d.lens[i])      # the shortest row: cheap
        one = replace(d, B=1, lens=(d.lens[b],))
        ref = reference64(one, m, clean["q_post"][b:b + 1], clean["keys"][b:b + 1],
                          data.v[b:b + 1], data.sinks)
        info["narrowing"] = narrowing_of(clean["out"][b:b + 1], ref)
    if memo is None:
        R.memo_put(spec, d, (data, clean, info.get("narrowing")))
    args = snapshot_args(spec, d, m, eng, data, run)
    trunc = measured_truncation(spec, info)
    rounding = {"output_rounding": "toward_zero" if trunc else "nearest_even",
                # vLLM's GPT-J RoPE path rounds to nearest even where its
                # NeoX path truncates (Engine.narrow_rope)
                "rope_rounding": "toward_zero" if trunc and d.arch.neox else "nearest_even"}
    info["declaration"] = R.declare(args, spec, rounding,
                                    f"conformance: {spec.engine} on {R.host()['cpu']}")
    return Capture(args=args, location=run["location"], info=info)


def measured_truncation(spec: R.RSpec, info) -> bool:
    """Whether this engine narrows bf16 toward zero: the emulation says so;
    the real engine by the host's measured behaviour (a clean bf16 run's
    narrowing; the ISA's flag otherwise)."""
    if spec.dtype != "bf16":
        return False
    if spec.engine == "vllm-cpu-emu-rtz":
        return True
    if spec.engine == "vllm-cpu-emu-rne":
        return False
    n = info.get("narrowing")
    if n:
        return n["equal_truncated"] > n["equal_nearest"]
    return info["host"]["bf16_narrowing"] == "toward_zero"


def snapshot_args(spec: R.RSpec, d: R.Draw, m: V.Model, eng: Engine, data: R.Data,
                  run) -> Dict[str, Any]:
    import torch
    mode = spec.mode
    cache: V.Cache = run["cache"]
    kv = run["pre_kv"] if mode == "pre-qk" else cache.kv
    view = cache.snapshot_view(kv)
    if eng.emu:
        view = view.to(torch.bfloat16)          # exact: the values are bf16's
    args: Dict[str, Any] = dict(
        q=data.q if mode in ("pre-q", "pre-qk") else run["q_post"],
        k_cache=view, v_cache=None, layout="vllm_cpu",
        block_table=cache.block_table, seq_lens=torch.tensor(d.lens, dtype=torch.int32),
        key_positions=d.positions, query_positions=d.qpos,
        engine="vllm-cpu", softmax_scale=m.scale, engine_out=run["out"],
        labels={"model": d.arch.name, "engine": spec.engine,
                "backend": f"cpu_attn/{cache.isa}", "layer": 0, "step": spec.seed})
    if spec.bug == "layout":
        kc, vc = cache.halves(kv)
        if eng.emu:
            kc, vc = kc.to(torch.bfloat16), vc.to(torch.bfloat16)
        args.update(k_cache=kc, v_cache=vc, layout="hnd")
    args["rope"] = R.Arch.rope_config(d.arch) | {"q_state": "pre" if mode in ("pre-q", "pre-qk")
                                                 else "post",
                                                 "k_state": "pre" if mode == "pre-qk" else "post"}
    if m.softcap:
        args["logit_softcap"] = m.softcap
    if m.window:
        args.update(sliding_window=m.window, window_convention="hf")
    if data.sinks is not None:
        args["sinks"] = data.sinks
    if mode == "post+rolling":
        args["pre_rope_q"] = data.q
        args["pre_rope_k"] = torch.stack([data.k[b][L - 1] for b, L in enumerate(d.lens)])
    if d.table:
        rope = run["rope"] if spec.bug not in ROPE_BUGS else run["rope"]
        if d.table == "rows":
            pos = unique_positions(d.qpos, *[d.positions[b, :L] for b, L in enumerate(d.lens)])
            cos, sin = rope.cos_sin_cache.index_select(0, pos).chunk(2, dim=-1)
            cos, sin = cos.to(eng.dtype), sin.to(eng.dtype)
            args["rope_table"] = {"positions": pos, "cos": cos.contiguous(),
                                  "sin": sin.contiguous()}
        else:
            args["rope_table"] = {"inv_freq": inv_freq_of(rope)}
    return args
