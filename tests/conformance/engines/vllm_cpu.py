"""vLLM's CPU attention, end to end, on small random batches.

What runs is vLLM's own code, called the way vLLM's CPU backend
(vllm/v1/attention/backends/cpu_attn.py) calls it:

  RoPE     get_rope(...) -> RotaryEmbedding.forward_cpu, i.e.
           torch.ops._C.rotary_embedding with the cos/sin cache cast to the
           model dtype (cached keys rotated when they were written, this
           step's q and key rotated together);
  cache    ops.cpu_attn_reshape_and_cache into one [num_blocks, Hkv,
           2 * block, D] tensor per layer (K transposed per block and head),
           with shuffled block ids, a pool larger than needed and every slot
           first filled with an earlier request's values;
  decode   ops.cpu_attn_get_scheduler_metadata + ops.cpu_attention_with_kv_cache
           (scale, soft-cap, sliding window, sinks as s_aux, fp8 KV with
           k_scale / v_scale).

The snapshot is taken from the engine's own kv_cache with layout="vllm_cpu"
and the engine's output. Bugs are injected on the engine side (the kernel
computes with them) except "layout", a capture bug.

Model variants (MODELS): Llama-like (llama3 scaling, theta 500000),
Gemma2-like (D=256, soft-cap, sliding window, query_pre_attn_scalar, peaked
logits), GPT-OSS-like (sinks, sliding window, YaRN as GPT-OSS configures
it) and a GPT-J-like partial rotary model.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace
from typing import Any, Dict, Optional, Tuple

from .common import (Capture, CaseSpec, Unsupported, base_generator, generator,
                     gqa_mod_order, moved_heads, rope_declaration, torch_dtype,
                     unique_positions)

ENGINE = "vllm-cpu"


@dataclass(frozen=True)
class Model:
    """A vLLM-like attention layer."""

    H: int
    Hkv: int
    D: int
    block: int                   # block size (16: isa vec16, 32: vec)
    lens: Tuple[int, ...]        # KV length of each row at this decode step
    theta: float
    neox: bool = True
    rotary_dim: int = 0          # 0: D
    scaling: Optional[Dict[str, Any]] = None  # HF / vLLM rope_parameters terms
    max_position: int = 8192
    query_pre_attn_scalar: Optional[float] = None  # scale = this ** -0.5
    softcap: float = 0.0
    window: int = 0              # HF convention: W keys
    sinks: bool = False
    q_gain: float = 1.0          # > 1: peaked logits
    offset: int = 0              # default position of each row's first token

    @property
    def scale(self) -> float:
        return (self.query_pre_attn_scalar or self.D) ** -0.5

    @property
    def rdim(self) -> int:
        return self.rotary_dim or self.D

    def rope_parameters(self) -> Dict[str, Any]:
        """vLLM's get_rope rope_parameters."""
        p = {"rope_theta": self.theta}
        if self.rotary_dim:
            p["partial_rotary_factor"] = self.rotary_dim / self.D
        if self.scaling:
            p.update(self.scaling)
        return p

    def rope_config(self) -> Dict[str, Any]:
        """The model's true RoPE config in attnaudit terms."""
        out = {"theta": self.theta, "style": "neox" if self.neox else "gptj",
               "rotary_dim": self.rdim}
        if self.scaling:
            out["scaling"] = dict(self.scaling)
        return out


LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
          "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
# GPT-OSS's own rope_scaling (its config.json): YaRN without truncating the
# correction range (declared as such: rope.scaling.truncate).
GPT_OSS_YARN = {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0,
                "beta_slow": 1.0, "original_max_position_embeddings": 4096,
                "truncate": False}

MODELS: Dict[str, Model] = {
    "llama": Model(H=4, Hkv=2, D=64, block=16, lens=(37, 61), theta=500000.0,
                   scaling=LLAMA3, max_position=131072, offset=100000),
    "gemma2": Model(H=2, Hkv=1, D=256, block=16, lens=(20, 32), theta=10000.0,
                    query_pre_attn_scalar=224.0, softcap=50.0, window=16,
                    q_gain=12.0, max_position=8192),
    "gptoss": Model(H=4, Hkv=2, D=64, block=32, lens=(37, 61), theta=150000.0,
                    scaling=GPT_OSS_YARN, window=24, sinks=True, offset=70000),
    "partial": Model(H=4, Hkv=2, D=64, block=32, lens=(37, 61), theta=10000.0,
                     neox=False, rotary_dim=32, max_position=32768, offset=30000),
}

# The RoPE of the engine for each RoPE bug: what it changes in the model.
ROPE_BUGS = {
    "rope-style": lambda m: replace(m, neox=not m.neox),
    "rope-theta": lambda m: replace(m, theta=10000.0 if m.theta != 10000.0 else 500000.0),
    "rope-scaling-ignored": lambda m: replace(m, scaling=None),
    "rope-partial-rotary": lambda m: replace(m, rotary_dim=0),
}


# ----------------------------------------------------------------------
# vLLM pieces
# ----------------------------------------------------------------------


def _ops():
    import torch
    torch.set_num_threads(1)
    import vllm._custom_ops as ops
    return ops


@functools.lru_cache(maxsize=None)
def _vllm_config():
    from vllm.config import VllmConfig
    return VllmConfig()


def get_rope(m: Model, dtype):
    """vLLM's RotaryEmbedding for the model, as a vLLM model builds it."""
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.layers.rotary_embedding import get_rope as vllm_get_rope
    max_pos = m.max_position
    if m.scaling and m.scaling["rope_type"] == "yarn":
        max_pos = m.scaling["original_max_position_embeddings"]  # vLLM passes this
    with set_current_vllm_config(_vllm_config()):
        return vllm_get_rope(m.D, max_pos, is_neox_style=m.neox,
                             rope_parameters=m.rope_parameters(), dtype=dtype)


def rotate(rope, positions, x, Hx: int):
    """x [T, Hx, D] rotated by vLLM's RoPE at `positions` [T] (a copy)."""
    import torch
    T, D = int(x.shape[0]), int(x.shape[2])
    flat = x.reshape(T, Hx * D).clone()
    # forward_cpu rotates q (and key, here None) in place with
    # torch.ops._C.rotary_embedding after casting its cache to x's dtype.
    rope.forward_cpu(positions.to(torch.int64), flat, None)
    return flat.view(T, Hx, D)


def rotate_qk(rope, positions, q, k, H: int, Hkv: int):
    """This step's q [T, H, D] and key [T, Hkv, D] rotated together, as the
    model's forward does."""
    import torch
    T, D = int(q.shape[0]), int(q.shape[2])
    qf = q.reshape(T, H * D).clone()
    kf = k.reshape(T, Hkv * D).clone()
    rope.forward_cpu(positions.to(torch.int64), qf, kf)
    return qf.view(T, H, D), kf.view(T, Hkv, D)


def _has_avx512() -> bool:
    try:
        with open("/proc/cpuinfo") as f:
            return any(line.startswith("flags") and " avx512f" in line for line in f)
    except OSError:
        return False


def _isa(m: Model) -> str:
    # Never "amx" (SIGILL on CPUs without it); vec16 for 16-token blocks.
    return "vec" if m.block % 32 == 0 and m.D % 32 == 0 else "vec16"


def _kv_cache_dtype(dtype_name: str) -> str:
    return {"fp8_e4m3": "fp8_e4m3", "fp8_e5m2": "fp8_e5m2"}.get(dtype_name, "auto")


@dataclass
class Cache:
    """A layer's CPU KV cache and how the batch's rows sit in it."""

    kv: Any                      # [nb, Hkv, block, 2D] (uint8 for fp8)
    block_table: Any             # int32 [B, max_blocks]
    m: Model
    isa: str
    kv_dtype: str                # vLLM's kv_cache_dtype
    k_scale: float = 1.0
    v_scale: float = 1.0

    def halves(self, kv=None):
        """(key_cache, value_cache) views, as the backend slices them."""
        kv = self.kv if kv is None else kv
        nb, hkv, bs, d2 = kv.shape
        return kv.view(nb, hkv, 2 * bs, d2 // 2).chunk(2, dim=2)

    def write(self, k, v, slots, kv=None):
        ops = _ops()
        kc, vc = self.halves(kv)
        ops.cpu_attn_reshape_and_cache(k.contiguous(), v.contiguous(), kc, vc, slots,
                                       self.isa, k_scale=self.k_scale,
                                       v_scale=self.v_scale,
                                       kv_cache_dtype=self.kv_dtype)

    def slots(self, row: int, count: int, first: int = 0):
        import torch
        bs = self.m.block
        return torch.tensor([int(self.block_table[row, i // bs]) * bs + i % bs
                             for i in range(first, first + count)], dtype=torch.int64)

    def snapshot_view(self, kv=None):
        """The fused tensor as the snapshot builder should see it (fp8 codes
        viewed as their float8 dtype)."""
        import torch
        kv = self.kv if kv is None else kv
        nb, hkv, bs, d2 = kv.shape
        kv = kv.view(nb, hkv, 2 * bs, d2 // 2)   # the builder's fused shape
        if self.kv_dtype == "fp8_e4m3":
            return kv.view(torch.float8_e4m3fn)
        if self.kv_dtype == "fp8_e5m2":
            return kv.view(torch.float8_e5m2)
        return kv


def new_cache(m: Model, dtype, kv_dtype: str, g, extra_blocks: int = 5) -> Cache:
    """A shuffled, over-sized pool whose every slot holds an earlier
    request's K/V, and a block table for the batch (stale ids past a row's
    blocks)."""
    import torch
    B = len(m.lens)
    nblocks = [(L + m.block - 1) // m.block for L in m.lens]
    nb = sum(nblocks) + extra_blocks
    fp8 = kv_dtype != "auto"
    kv = torch.zeros(nb, m.Hkv, m.block, 2 * m.D,
                     dtype=torch.uint8 if fp8 else dtype)
    ids = torch.randperm(nb, generator=g)
    table = torch.full((B, max(nblocks) + 1), int(ids[-1]), dtype=torch.int32)
    used = 0
    for b in range(B):
        table[b, :nblocks[b]] = ids[used:used + nblocks[b]].to(torch.int32)
        used += nblocks[b]
    scales = (0.0625, 0.03125) if fp8 else (1.0, 1.0)
    cache = Cache(kv, table, m, _isa(m), kv_dtype, *scales)
    stale = nb * m.block
    cache.write(torch.randn(stale, m.Hkv, m.D, generator=g).to(dtype),
                torch.randn(stale, m.Hkv, m.D, generator=g).to(dtype),
                torch.arange(stale, dtype=torch.int64))
    return cache


@dataclass
class Kernel:
    """The inputs of one cpu_attention_with_kv_cache call (what an engine
    bug changes)."""

    q: Any                       # [B, H, D]
    kv: Any                      # fused cache
    block_table: Any
    seq_lens: Any
    scale: float
    softcap: float
    window: int                  # -1: none
    sinks: Any = None
    k_scale: float = 1.0
    v_scale: float = 1.0
    head_order: Optional[list] = None  # gqa-mapping: q heads fed in this order

    def run(self, cache: Cache):
        import torch
        ops = _ops()
        m = cache.m
        B = int(self.q.shape[0])
        q = self.q if self.head_order is None else self.q[:, self.head_order]
        q = q.contiguous()
        qsl = torch.arange(B + 1, dtype=torch.int32)
        kc, vc = cache.halves(self.kv)
        md = ops.cpu_attn_get_scheduler_metadata(
            num_reqs=B, num_heads=m.H, num_kv_heads=m.Hkv, head_dim=m.D,
            seq_lens=self.seq_lens, dtype=q.dtype, query_start_loc=qsl, causal=True,
            sliding_window_size=self.window, isa=cache.isa, enable_kv_split=False,
            dynamic_causal=None, kv_cache_dtype=cache.kv_dtype)
        out = torch.empty_like(q)
        ops.cpu_attention_with_kv_cache(
            query=q, key_cache=kc, value_cache=vc, output=out, query_start_loc=qsl,
            seq_lens=self.seq_lens, scale=self.scale, causal=True, alibi_slopes=None,
            sliding_window=self.window, block_table=self.block_table,
            softcap=self.softcap, scheduler_metadata=md, s_aux=self.sinks,
            dynamic_causal=None, k_scale=self.k_scale, v_scale=self.v_scale,
            kv_cache_dtype=cache.kv_dtype)
        if self.head_order is not None:
            fixed = torch.empty_like(out)
            fixed[:, self.head_order] = out
            out = fixed
        return out


# ----------------------------------------------------------------------
# One case
# ----------------------------------------------------------------------


@dataclass
class Batch:
    """The batch's pre-RoPE tensors and positions (model dtype)."""

    q: Any                       # [B, H, D] this step's queries
    k: list                      # per row [L, Hkv, D]
    v: list
    positions: Any               # int64 [B, T] each row's token positions
    sinks: Any = None            # f32 [H]


def make_batch(m: Model, dtype, offset: int, g) -> Batch:
    import torch
    B, T = len(m.lens), max(m.lens)
    q = (torch.randn(B, m.H, m.D, generator=g) * m.q_gain).to(dtype)
    k = [torch.randn(L, m.Hkv, m.D, generator=g).to(dtype) for L in m.lens]
    v = [torch.randn(L, m.Hkv, m.D, generator=g).to(dtype) for L in m.lens]
    # Rows start at different offsets (their own requests).
    positions = torch.stack([offset + 13 * b + torch.arange(T, dtype=torch.int64)
                             for b in range(B)])
    sinks = None
    if m.sinks:
        # bf16-exact values, large enough to carry real mass.
        sinks = (2.0 + torch.randn(m.H, generator=g)).to(torch.bfloat16).float()
    return Batch(q, k, v, positions, sinks)


def engine_rope(bug: Optional[str], rope, m: Model, batch: Batch):
    """(q [B, H, D], per-row keys [L, Hkv, D]) rotated as the engine does:
    each row's earlier keys when they were written, this step's q and key
    together; "rope-offset" rotates q at position + 1, "k-rope-twice"
    rotates the cached keys again."""
    import torch
    q_post = torch.empty_like(batch.q)
    keys = []
    for b, L in enumerate(m.lens):
        pos = batch.positions[b, :L]
        old = rotate(rope, pos[:-1], batch.k[b][:-1], m.Hkv)
        qb, kb = rotate_qk(rope, pos[-1:], batch.q[b:b + 1], batch.k[b][-1:], m.H, m.Hkv)
        if bug == "rope-offset":
            qb = rotate(rope, pos[-1:] + 1, batch.q[b:b + 1], m.H)
        kk = torch.cat([old, kb])
        if bug == "k-rope-twice":
            kk = rotate(rope, pos, kk, m.Hkv)
        keys.append(kk)
        q_post[b] = qb[0]
    return q_post, keys


def capture(spec: CaseSpec) -> Capture:
    """Runs one case on vLLM's CPU kernels (see the module docstring)."""
    import torch
    _ops()
    m = MODELS[spec.model]
    dtype = torch_dtype(spec.dtype)
    kv_dtype = _kv_cache_dtype(spec.dtype)
    if kv_dtype != "auto" and m.block % 32:
        m = replace(m, block=32)   # vLLM's fp8 CPU path needs isa "vec"
    if kv_dtype != "auto" and not _has_avx512():
        # vLLM's backend refuses (_get_attn_isa: "FP8 KV cache on CPU requires
        # x86 with AVX-512 or AMX") and its kernels have no fp8 path for
        # this ISA ("Unsupported CPU attention configuration").
        raise Unsupported("host: fp8 KV needs AVX-512 or AMX on x86 (this CPU has neither)")
    offset = m.offset if spec.offset is None else spec.offset
    batch = make_batch(m, dtype, offset, base_generator(spec, 1))
    qpos = torch.tensor([int(batch.positions[b, L - 1]) for b, L in enumerate(m.lens)])

    # --- RoPE, as the engine applies it (with a RoPE bug, wrongly) ---------
    engine_m = ROPE_BUGS[spec.bug](m) if spec.bug in ROPE_BUGS else m
    rope = get_rope(engine_m, dtype)
    q_post, rot_k = engine_rope(spec.bug, rope, m, batch)

    # --- the cache ------------------------------------------------------
    cache = new_cache(m, dtype, kv_dtype, base_generator(spec, 2))
    pre_kv = cache.kv.clone()         # the same pool, for pre-RoPE keys
    for b, L in enumerate(m.lens):
        slots = cache.slots(b, L)
        cache.write(rot_k[b], batch.v[b], slots)
        cache.write(batch.k[b], batch.v[b], slots, kv=pre_kv)

    # --- the decode kernel, with the engine's bug -------------------------
    kernel = Kernel(q=q_post, kv=cache.kv, block_table=cache.block_table.clone(),
                    seq_lens=torch.tensor(m.lens, dtype=torch.int32),
                    scale=m.scale, softcap=m.softcap, window=m.window or -1,
                    sinks=None if batch.sinks is None else
                    batch.sinks.to(torch.bfloat16 if dtype == torch.bfloat16
                                   else torch.float32),
                    k_scale=cache.k_scale, v_scale=cache.v_scale)
    location = inject(spec, kernel, cache)
    out = kernel.run(cache)

    # --- the snapshot ---------------------------------------------------
    args = snapshot_args(spec, m, cache, batch, q_post, pre_kv, qpos, out, rope)
    info = {"isa": cache.isa, "kv_cache_dtype": kv_dtype, "offset": offset}
    return Capture(args=args, location=location, info=info)


def snapshot_args(spec: CaseSpec, m: Model, cache: Cache, batch: Batch, q_post,
                  pre_kv, qpos, out, rope) -> Dict[str, Any]:
    """from_paged_kv's arguments: what a correct capture hook sends."""
    import torch
    mode = spec.mode
    fp8 = cache.kv_dtype != "auto"
    kv = pre_kv if mode == "pre-qk" else cache.kv
    args: Dict[str, Any] = dict(
        q=batch.q if mode in ("pre-q", "pre-qk") else q_post,
        k_cache=cache.snapshot_view(kv), v_cache=None, layout="vllm_cpu",
        block_table=cache.block_table, seq_lens=torch.tensor(m.lens, dtype=torch.int32),
        key_positions=batch.positions, query_positions=qpos,
        engine=ENGINE, softmax_scale=m.scale, engine_out=out,
        labels={"model": f"{spec.model}-like", "engine": ENGINE,
                "backend": f"cpu_attn/{cache.isa}", "layer": 0, "step": 0})
    if spec.bug == "layout":   # capture bug: K pages read as [block, D]
        kc, vc = cache.halves(kv)
        args.update(k_cache=kc, v_cache=vc, layout="hnd")
    extra = {"k_output_dtype": torch_dtype(spec.dtype)} if fp8 else {}
    args["rope"] = rope_declaration(m.rope_config(), mode, **extra)
    if m.softcap:
        args["logit_softcap"] = m.softcap
    if m.window:
        args.update(sliding_window=m.window, window_convention="hf")
    if batch.sinks is not None:
        args["sinks"] = batch.sinks
    if fp8:
        args.update(k_scale=cache.k_scale, v_scale=cache.v_scale)
    if mode == "post+rolling":
        args["pre_rope_q"] = batch.q
        args["pre_rope_k"] = torch.stack([batch.k[b][L - 1] for b, L in enumerate(m.lens)])
    if spec.rope_table:
        args["rope_table"] = rope_table(spec.rope_table, rope, m, batch, qpos)
    return args


def rope_table(kind: str, rope, m: Model, batch: Batch, qpos) -> Dict[str, Any]:
    """The engine's own RoPE values: rows of its cos/sin cache (in the model
    dtype, as the op reads them) for every position of the step, or its
    inverse frequencies."""
    import torch
    if kind == "rows":
        pos = unique_positions(qpos, *[batch.positions[b, :L] for b, L in enumerate(m.lens)])
        cos, sin = rope.cos_sin_cache.index_select(0, pos).chunk(2, dim=-1)
        return {"positions": pos, "cos": cos.contiguous(), "sin": sin.contiguous()}
    if kind == "inv_freq":
        # YaRN's _compute_inv_freq takes the scaling factor, the others the base.
        arg = rope.scaling_factor if hasattr(rope, "mscale") else rope.base
        return {"inv_freq": rope._compute_inv_freq(arg).to(torch.float32)}
    raise ValueError(f"rope_table {kind!r}")


# ----------------------------------------------------------------------
# Engine-side bugs
# ----------------------------------------------------------------------


def inject(spec: CaseSpec, k: Kernel, cache: Cache) -> Optional[Dict[str, int]]:
    """Changes the kernel's inputs the way the bug would; returns the truth
    about where it is (row, logical_block, page = engine page id)."""
    import torch
    bug, m = spec.bug, cache.m
    if bug is None or bug in ROPE_BUGS or bug in ("rope-offset", "k-rope-twice", "layout"):
        return None
    row = 1
    table = cache.block_table
    if bug == "stale-page":
        # The kernel reads block 0 of row 1 from a page holding an earlier
        # request's K/V (the write of this request never reached it).
        block, page = 0, int(table[row, 0])
        g = generator(spec, 3)
        kv = cache.kv.clone()
        slots = torch.arange(page * m.block, (page + 1) * m.block, dtype=torch.int64)
        dtype = torch_dtype(spec.dtype)
        cache.write(torch.randn(m.block, m.Hkv, m.D, generator=g).to(dtype),
                    torch.randn(m.block, m.Hkv, m.D, generator=g).to(dtype), slots, kv=kv)
        k.kv = kv
        return {"row": row, "logical_block": block, "page": page}
    if bug == "duplicate-page":
        # Block 1's entry names block 0's page of the same row.
        k.block_table[row, 1] = table[row, 0]
        return {"row": row, "logical_block": 1, "page": int(table[row, 1])}
    if bug == "foreign-page":
        # Block 1's entry names block 1's page of row 0.
        k.block_table[row, 1] = table[0, 1]
        return {"row": row, "logical_block": 1}
    if bug == "seq-len-off-by-one":
        # -1: the new token's key is left out; +1: one stale slot past the
        # row's end is read (the row's last block has room for it).
        delta = -1 if spec.variant == "-1" else 1
        if delta > 0 and m.lens[row] % m.block == 0:
            raise Unsupported("no slot past the row's end in its last block")
        k.seq_lens = k.seq_lens.clone()
        k.seq_lens[row] += delta
        return {"row": row}
    if bug == "v-from-k":
        # The cache write passed the key as the value: V pages hold K.
        kv = cache.kv.clone()
        for b, L in enumerate(m.lens):
            keys = k_of_cache(cache, b, L)
            cache.write(keys, keys, cache.slots(b, L), kv=kv)
        k.kv = kv
        return None
    if bug == "kv-heads-permuted":
        k.kv = cache.kv.flip(1).contiguous()
        return None
    if bug == "gqa-mapping":
        k.head_order = gqa_mod_order(m.H, m.Hkv)
        return {"heads": moved_heads(m.H, m.Hkv)}
    if bug == "wrong-scale":
        # "twice": the scale applied twice; "sqrt-d": 1/sqrt(D) instead of
        # the model's query_pre_attn_scalar ** -0.5.
        k.scale = m.scale * m.scale if spec.variant == "twice" else m.D ** -0.5
        return None
    if bug == "softcap-missing":
        k.softcap = 0.0
        return None
    if bug == "sinks-missing":
        k.sinks = None
        return None
    if bug == "window-off-by-one":
        k.window = m.window + (1 if spec.variant != "-1" else -1)
        return None
    if bug == "window-ignored":
        k.window = -1
        return None
    if bug == "fp8-scale":
        if spec.variant == "missing":
            k.k_scale = k.v_scale = 1.0
        else:
            k.k_scale, k.v_scale = cache.v_scale, cache.k_scale
        return None
    raise ValueError(f"vllm-cpu: no injection for bug {bug!r}")


def k_of_cache(cache: Cache, row: int, L: int):
    """Row `row`'s keys [L, Hkv, D] as the cache holds them (post-RoPE),
    read through the logical view of the transposed K blocks (model dtype;
    fp8 caches are dequantised)."""
    import torch
    m = cache.m
    kc, _ = cache.halves()
    nb = kc.shape[0]
    st = kc.stride()
    kview = kc.as_strided((nb, m.Hkv, m.block, m.D), (st[0], st[1], 1, m.block),
                          kc.storage_offset())
    if cache.kv_dtype != "auto":
        f8 = torch.float8_e4m3fn if cache.kv_dtype == "fp8_e4m3" else torch.float8_e5m2
        kview = kview.view(f8).to(torch.float32) * cache.k_scale
    pages = [kview[int(cache.block_table[row, j])] for j in range((L + m.block - 1) // m.block)]
    keys = torch.cat([p.transpose(0, 1) for p in pages], 0)[:L]
    return keys.to(torch.bfloat16 if cache.kv_dtype != "auto" else kc.dtype).contiguous()
