"""From one vLLM attention call to an attnaudit Snapshot.

Pure functions over the tensors a backend's forward() received (torch
tensors in vLLM; numpy arrays work the same, which is how the fast tests
run without torch). No vLLM import: the seams (seams.py) read vLLM's objects
and hand plain values here.

Which rows: a vLLM batch mixes prefill chunks and decodes; an audit covers
the decode rows (one query token each, query_start_loc[i+1] - query_start_loc[i]
== 1), optionally narrowed to chosen requests and capped at max_rows.

Thread safety: none needed; every function is pure. Errors: ValueError with
the tensor's name for shapes the builders reject (the auditor counts them as
failed; the engine never sees them).
"""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
import os
import re
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from ..snapshot import Snapshot
from .precision import BackendKey

# Backend name -> (snapshot layout, precision preset). Every backend gets
# the layer's cache as vLLM's logical [num_blocks, Hkv, block, 2 D] tensor;
# the CPU kernel stores K transposed per block and head inside it (its own
# layout, "vllm_cpu"); FlashAttention and FlashInfer read token t of head h
# as K = cache[b, h, t, :D], V = cache[b, h, t, D:] (a strided [nb, block,
# Hkv, D] page pool each, "nhd").
BACKENDS = {
    "cpu_attn": ("vllm_cpu", "vllm-cpu"),
    "flash_attn": ("nhd", "vllm"),
    "flashinfer": ("nhd", "flash-decoding"),
}


@dataclasses.dataclass
class AttentionCall:
    """What one backend forward() saw, for one layer.

    query: [T, Hq, D] post-RoPE (T: the batch's tokens, padding included);
    kv_cache: the layer's cache as the backend received it; block_table
    [R, max_blocks]; seq_lens [R]; query_start_loc [R + 1] (host copies);
    output: [T, Hq * D] or [T, Hq, D], written by the kernel."""

    backend: str
    layer: int
    query: Any
    kv_cache: Any
    block_table: Any
    seq_lens: Any
    query_start_loc: Any
    output: Any
    scale: float
    sliding_window: Optional[int] = None  # None or <= 0: no window
    logits_soft_cap: Optional[float] = None
    sinks: Any = None
    kv_cache_dtype: str = "auto"
    k_scale: float = 1.0
    v_scale: float = 1.0
    isa: Optional[str] = None


@dataclasses.dataclass
class PreRope:
    """Pre-RoPE q [T, Hq * D] and k [T, Hkv * D] of one layer's call, only
    the rows `tokens` of the batch (a sampled step's decode tokens)."""

    tokens: Tuple[int, ...]
    q: Any
    k: Any


def decode_rows(query_start_loc: Any, num_reqs: int) -> Tuple[List[int], List[int]]:
    """(rows, tokens): the batch rows with exactly one query token, and that
    token's index in the flattened batch."""
    starts = [int(x) for x in _host_list(query_start_loc)[: num_reqs + 1]]
    rows, tokens = [], []
    for i in range(min(num_reqs, len(starts) - 1)):
        if starts[i + 1] - starts[i] == 1:
            rows.append(i)
            tokens.append(starts[i])
    return rows, tokens


def request_chosen(request_id: str, pattern: Optional[str],
                   fraction: Optional[float], seed: int = 0) -> bool:
    """Whether a request is audited: its id matches `pattern` (a regular
    expression, searched) and hashes below `fraction`. A hash, not a random
    draw: every step and every rank choose the same requests."""
    if pattern is not None and re.search(pattern, request_id) is None:
        return False
    if fraction is not None:
        return _unit_hash(f"{seed}:{request_id}") < fraction
    return True


def step_chosen(step: int, every: int, rate: Optional[float], seed: int = 0) -> bool:
    """Whether an engine step is sampled: with a rate, a hash of (seed,
    step) below it; else every `every`th step (0, every, 2 every, ...)."""
    if rate is not None:
        return _unit_hash(f"{seed}:step:{step}") < rate
    return step % every == 0


def choose_rows(rows: Sequence[int], request_ids: Optional[Sequence[str]], *,
                pattern: Optional[str], fraction: Optional[float], seed: int,
                max_rows: int, offset: int = 0) -> List[int]:
    """The positions (into `rows`) of the rows to audit: of the rows the
    filters keep, max_rows consecutive ones starting at `offset` (modulo
    their number, wrapping round). The plugin advances the offset by
    max_rows per sampled step, so that over ceil(n / max_rows) sampled
    steps every row of a batch of n is audited: max_rows bounds the cost,
    not which rows are seen."""
    eligible = []
    for k, row in enumerate(rows):
        if pattern is not None or fraction is not None:
            if request_ids is None or row >= len(request_ids):
                continue  # no id to choose by: not audited
            if not request_chosen(str(request_ids[row]), pattern, fraction, seed):
                continue
        eligible.append(k)
    if len(eligible) <= max_rows:
        return eligible
    start = offset % len(eligible)
    return [eligible[(start + i) % len(eligible)] for i in range(max_rows)]


def rows_within(call: AttentionCall, positions: Sequence[int], rows: Sequence[int],
                budget_bytes: float) -> List[int]:
    """The prefix of `positions` (into rows) whose K/V pages fit in
    budget_bytes: a row of L tokens holds ceil(L / block) pages."""
    nb, hkv, block, d2 = (int(x) for x in call.kv_cache.shape)
    page_bytes = hkv * block * d2 * _itemsize(call.kv_cache)
    lens = _host_list(call.seq_lens)
    kept, total = [], 0
    for k in positions:
        total += -(-int(lens[rows[k]]) // block) * page_bytes
        if total > budget_bytes:
            break
        kept.append(k)
    return kept


def rope_declaration(*, theta: float, rotary_dim: int, neox: bool,
                     rope_parameters: Optional[Dict[str, Any]]) -> Dict[str, Any]:
    """The snapshot's rope dict for a model's RoPE: vLLM's rotary module
    gives theta, rotary_dim and the style; the model config gives the
    scaling (its rope_parameters / rope_scaling, Hugging Face's keys)."""
    rope: Dict[str, Any] = {"theta": float(theta), "rotary_dim": int(rotary_dim),
                            "style": "neox" if neox else "gptj",
                            "q_state": "post", "k_state": "post"}
    scaling = _scaling(rope_parameters)
    if scaling:
        rope["scaling"] = scaling
    return rope


def engine_inv_freq(module: Any, rotary_dim: int) -> Optional[Any]:
    """The inverse frequencies vLLM's rotary module rotates with, from its
    own _compute_inv_freq, as an fp32 array [rotary_dim / 2]; None where
    they are not the whole story (linear, dynamic NTK and LongRoPE scale
    positions or switch factor sets) or the module is not vLLM's. The
    snapshot's rope_table: with it a pre-RoPE audit and the rope checks
    rotate with the engine's own frequencies (docs/PYTHON.md)."""
    fn = getattr(type(module), "_compute_inv_freq", None)
    if fn is None or not _cache_built_from_inv_freq(type(module)):
        return None
    try:
        params = list(inspect.signature(fn).parameters)[1:]
        if params == ["base"]:
            arg = module.base
        elif params == ["scaling_factor"]:
            arg = module.scaling_factor
        else:
            return None
        inv = fn(module, arg)
        if hasattr(inv, "detach"):  # a torch tensor
            inv = inv.detach().cpu().float().numpy()
        inv = np.asarray(inv, dtype=np.float32)
    except Exception:  # noqa: BLE001 - another vLLM's module: send no table
        return None
    if inv.shape != (rotary_dim // 2,) or not np.all(np.isfinite(inv)):
        return None
    return inv


def _cache_built_from_inv_freq(cls: type) -> bool:
    """Whether the class's cos/sin cache is built by a class that knows its
    _compute_inv_freq: a subclass that rebuilds the cache over an inherited
    inv_freq (linear scaling divides positions, dynamic NTK changes the
    base) rotates with frequencies the inv_freq alone does not give."""
    def owner(name: str) -> Optional[type]:
        return next((c for c in cls.__mro__ if name in vars(c)), None)
    inv, cache = owner("_compute_inv_freq"), owner("_compute_cos_sin_cache")
    return inv is not None and cache is not None and issubclass(inv, cache)


def model_label(name: str) -> str:
    """The model label for a served model name: a local path (absolute or
    relative, as vLLM serves a checkpoint directory) by its last component,
    a hub id ("org/model") as it is."""
    if name.startswith(("/", "./", "../", "~")):
        return os.path.basename(name.rstrip("/")) or name
    return name


def backend_key(call: AttentionCall) -> BackendKey:
    """What decides the arithmetic of the backend that made `call`."""
    block = int(call.kv_cache.shape[2]) if len(call.kv_cache.shape) == 4 else 0
    return BackendKey(backend=call.backend, dtype=_dtype_name(call.query),
                      head_dim=int(call.query.shape[-1]), isa=call.isa,
                      block_size=block if call.backend == "cpu_attn" else 0,
                      kv_cache_dtype=call.kv_cache_dtype or "auto")


def build_snapshot(call: AttentionCall, *, rows: Sequence[int], tokens: Sequence[int],
                   engine: Optional[str], rope: Optional[Dict[str, Any]],
                   pre_rope: Optional[PreRope], labels: Dict[str, Any],
                   precision: Optional[Dict[str, Any]] = None,
                   cast_point: Optional[str] = None,
                   inv_freq: Optional[Any] = None) -> Snapshot:
    """The snapshot of `rows` (batch rows) whose query tokens are `tokens`.
    precision / cast_point: the measured declaration (attnaudit.probe);
    None: the engine preset's. inv_freq: the engine's (engine_inv_freq),
    sent as the RoPE table with rope."""
    layout, preset = BACKENDS[call.backend]
    Hq = int(call.query.shape[-2])
    D = int(call.query.shape[-1])
    toks = list(tokens)
    q = call.query[toks]                              # [B, Hq, D]
    out = _reshape(call.output[toks], (len(toks), Hq, D))
    k_cache, v_cache = _fused_view(call, D)
    args: Dict[str, Any] = dict(
        block_table=call.block_table[list(rows)], seq_lens=_take(call.seq_lens, rows),
        layout=layout, engine=engine or preset, softmax_scale=float(call.scale),
        engine_out=out, labels=labels)
    if call.sliding_window is not None and call.sliding_window > 0:
        # vLLM's window: a query sees itself and the window - 1 keys before.
        args.update(sliding_window=int(call.sliding_window), window_convention="hf")
    if call.logits_soft_cap:
        args["logit_softcap"] = float(call.logits_soft_cap)
    if call.sinks is not None:
        args["sinks"] = call.sinks
    if call.kv_cache_dtype not in ("auto", None, ""):
        args.update(k_scale=float(call.k_scale), v_scale=float(call.v_scale))
        if rope is not None:
            rope = dict(rope, k_output_dtype=_dtype_name(call.query))
    if precision is not None:
        args["precision"] = precision
    if rope is not None:
        if cast_point:
            rope = dict(rope, cast_point=cast_point)
        args["rope"] = rope
        if inv_freq is not None:
            args["rope_table"] = {"inv_freq": inv_freq}
    if pre_rope is not None and rope is not None:
        index = {t: i for i, t in enumerate(pre_rope.tokens)}
        if all(t in index for t in toks):
            sel = [index[t] for t in toks]
            Hkv = int(pre_rope.k.shape[-1]) // D
            args["pre_rope_q"] = _reshape(pre_rope.q[sel], (len(toks), Hq, D))
            args["pre_rope_k"] = _reshape(pre_rope.k[sel], (len(toks), Hkv, D))
    return Snapshot.from_paged_kv(q, k_cache, v_cache, **args)


def snapshot_labels(*, model: Optional[str], backend: str, layer: int, step: int,
                    run: Optional[str], request_ids: Optional[Sequence[str]],
                    weight_version: Any = None) -> Dict[str, Any]:
    """The labels of a rollout snapshot: role rollout (with a run, layer and
    request ids, a side of a train-rollout pair the server joins with the
    trainer's) and the weight version in use, when known."""
    labels: Dict[str, Any] = {"engine": "vllm", "backend": backend, "layer": layer,
                              "step": step, "role": "rollout"}
    if weight_version is not None:
        labels["weight_version"] = str(weight_version)
    if model:
        labels["model"] = model
    if run:
        labels["run"] = run
    if request_ids:
        labels["request_ids"] = [str(r) for r in request_ids]
    return labels


# ----------------------------------------------------------------------


def _fused_view(call: AttentionCall, D: int):
    """(k_cache, v_cache) in the layout BACKENDS names."""
    kv = _as_fp8(call.kv_cache, call.kv_cache_dtype)
    nb, hkv, bs, d2 = (int(x) for x in kv.shape)
    if d2 != 2 * D:
        raise ValueError(f"kv_cache: last dim {d2} is not 2 x head dim {D} "
                         f"(shape {tuple(kv.shape)})")
    if call.backend == "cpu_attn":
        # The builder's fused [nb, Hkv, 2 block, D] view, as the kernel's.
        return _reshape(kv, (nb, hkv, 2 * bs, D)), None
    pages = kv.swapaxes(1, 2)  # [nb, block, Hkv, 2 D], a strided view
    return pages[..., :D], pages[..., D:]


def _as_fp8(kv, kv_cache_dtype: str):
    """An fp8 cache is stored as uint8 codes; the builder reads it as the
    float8 dtype it encodes."""
    if kv_cache_dtype in (None, "", "auto"):
        return kv
    name = {"fp8": "float8_e4m3fn", "fp8_e4m3": "float8_e4m3fn",
            "fp8_e5m2": "float8_e5m2"}.get(kv_cache_dtype)
    if name is None:
        raise ValueError(f"kv_cache_dtype {kv_cache_dtype!r} is not supported")
    try:
        import torch  # noqa: F401 - only torch tensors carry vLLM's fp8 cache
        if isinstance(kv, torch.Tensor):
            return kv.view(getattr(torch, name))
    except ImportError:
        pass
    import ml_dtypes
    return kv.view(getattr(ml_dtypes, name))


def _itemsize(x) -> int:
    size = getattr(x, "itemsize", None)
    if size is None:  # older torch
        size = x.element_size()
    return int(size)


def _reshape(x, shape):
    return x.reshape(shape)


def _take(x, rows: Sequence[int]):
    return x[list(rows)]


def _host_list(x) -> list:
    if hasattr(x, "tolist"):
        return x.tolist()
    return list(x)


def _dtype_name(x) -> str:
    name = str(x.dtype).replace("torch.", "")
    return {"bfloat16": "bf16", "float16": "f16", "float32": "f32"}.get(name, name)


def _unit_hash(text: str) -> float:
    digest = hashlib.blake2b(text.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2.0**64


def _scaling(params: Optional[Dict[str, Any]]) -> Optional[Dict[str, Any]]:
    """The scaling part of a Hugging Face rope_parameters / rope_scaling
    dict, in the keys Snapshot's rope accepts; None for plain RoPE."""
    if not params:
        return None
    kind = params.get("rope_type", params.get("type"))
    if kind in (None, "default"):
        return None
    keep = ("factor", "low_freq_factor", "high_freq_factor", "beta_fast",
            "beta_slow", "attention_factor", "original_max_position_embeddings",
            "truncate")
    out = {"rope_type": kind}
    out.update({k: params[k] for k in keep if params.get(k) is not None})
    return out
